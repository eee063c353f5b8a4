//! The last few minutes of one rule's decisions on one stripe: a ring of per-minute
//! Space-Saving summaries (refused and admitted apart), and their merge when read. Owns
//! the window's arithmetic and the merged error bound; not the locking or the rules.
//!
//! Must not allocate once its slots are warm: a slot that comes round again is cleared
//! and reused.

use std::collections::HashMap;

use super::sketch::Sketch;

/// Minutes kept: the current one and the ones before it.
pub const SLOTS: u64 = 5;

/// Which table a decision goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Refused,
    Admitted,
}

#[derive(Debug, Default)]
struct Slot {
    minute: u64,
    refused: Sketch,
    admitted: Sketch,
}

/// One stripe's ring, allocated at its first decision.
#[derive(Debug, Default)]
pub struct Ring {
    slots: Vec<Slot>,
}

impl Ring {
    /// Counts one decision made during `minute` (minutes since the board started).
    #[expect(
        clippy::indexing_slicing,
        reason = "an index modulo SLOTS, the length the ring is given just above"
    )]
    pub fn record(
        &mut self,
        minute: u64,
        side: Side,
        hash: u64,
        weight: u64,
        label: impl FnOnce(&mut String),
    ) {
        if self.slots.is_empty() {
            self.slots = (0..SLOTS).map(|_| Slot::default()).collect();
        }
        let slot = &mut self.slots[(minute % SLOTS) as usize];
        if slot.minute != minute {
            slot.minute = minute;
            slot.refused.clear();
            slot.admitted.clear();
        }
        match side {
            Side::Refused => slot.refused.record(hash, weight, label),
            Side::Admitted => slot.admitted.record(hash, weight, label),
        }
    }

    /// Adds this ring's minutes within the window ending at `now` to `into`.
    pub fn read(&self, now: u64, side: Side, into: &mut Merged) {
        for slot in &self.slots {
            if slot.minute > now || slot.minute + SLOTS <= now {
                continue;
            }
            into.add(match side {
                Side::Refused => &slot.refused,
                Side::Admitted => &slot.admitted,
            });
        }
    }

    pub fn heap_bytes(&self) -> usize {
        self.slots
            .iter()
            .map(|s| s.refused.heap_bytes() + s.admitted.heap_bytes())
            .sum::<usize>()
            + self.slots.capacity() * std::mem::size_of::<Slot>()
    }
}

/// One value's merged estimate.
#[derive(Debug, Clone)]
pub struct Estimate {
    pub label: String,
    pub count: u64,
    /// `|true weight - count| <= error`.
    pub error: u64,
}

/// Several summaries merged: a value's count is the sum of its counters; its error adds
/// each counter's error where it was held and the summary's floor where it was not (it
/// may have weighed that much there, uncounted).
#[derive(Debug, Default)]
pub struct Merged {
    values: HashMap<u64, (Estimate, u64)>,
    /// Sum of the floors of every summary added (a value missing from all of them may have
    /// weighed this much).
    floors: u64,
    total: u64,
}

impl Merged {
    fn add(&mut self, sketch: &Sketch) {
        if sketch.total() == 0 {
            return;
        }
        let floor = sketch.floor();
        self.floors += floor;
        self.total += sketch.total();
        for (hash, c) in sketch.held() {
            let (e, floor_held) = self.values.entry(hash).or_insert_with(|| {
                let label = c.label.clone();
                (
                    Estimate {
                        label,
                        count: 0,
                        error: 0,
                    },
                    0,
                )
            });
            e.count += c.count;
            e.error += c.error;
            // The floors of the summaries that held it do not apply to it.
            *floor_held += floor;
        }
    }

    /// The total weight counted, exact.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The `n` heaviest values, heaviest first (ties by label, for a stable page).
    pub fn top(self, n: usize) -> Vec<Estimate> {
        let floors = self.floors;
        let mut all: Vec<Estimate> = self
            .values
            .into_values()
            .map(|(mut e, floor_held)| {
                e.error += floors - floor_held;
                e
            })
            .collect();
        all.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.label.cmp(&b.label)));
        all.truncate(n);
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_leave_the_window_and_slots_are_reused() {
        let mut ring = Ring::default();
        ring.record(0, Side::Refused, 1, 5, |l| l.push('a'));
        ring.record(3, Side::Refused, 1, 2, |l| l.push('a'));
        ring.record(3, Side::Admitted, 2, 7, |l| l.push('b'));
        let read = |ring: &Ring, now, side| {
            let mut m = Merged::default();
            ring.read(now, side, &mut m);
            m.top(10)
                .into_iter()
                .map(|e| (e.label, e.count))
                .collect::<Vec<_>>()
        };
        assert_eq!(read(&ring, 4, Side::Refused), vec![("a".into(), 7)]);
        // Minute 0 is out of the window at minute 5; minute 3 still in.
        assert_eq!(read(&ring, 5, Side::Refused), vec![("a".into(), 2)]);
        assert_eq!(read(&ring, 5, Side::Admitted), vec![("b".into(), 7)]);
        // Minute 5 reuses minute 0's slot.
        ring.record(5, Side::Refused, 9, 1, |l| l.push('z'));
        assert_eq!(
            read(&ring, 5, Side::Refused),
            vec![("a".into(), 2), ("z".into(), 1)]
        );
        assert!(read(&ring, 10, Side::Refused).is_empty());
    }
}

//! One Space-Saving summary: the heaviest values of a stream in a fixed number of
//! counters. Owns the counting and its error bound; knows nothing of rules, time or locks.
//!
//! Must not grow past [`CAPACITY`] counters or [`LABEL_BYTES`] per label: it is fed by
//! request values, which a caller chooses, and its memory must not depend on how many
//! distinct ones it has seen.
//!
//! The bound (Metwally et al.'s Space-Saving, weighted): with `K` counters over a stream
//! of total weight `N`, a value's counter overstates it by at most its `error`, and every
//! `error` is at most the smallest counter, which is at most `N / K`. A value whose true
//! weight exceeds `N / K` is always held.

/// Counters per summary.
pub const CAPACITY: usize = 64;

/// The longest label kept (bytes, cut at a character boundary): the value is identified by
/// its hash, the label is only for people.
pub const LABEL_BYTES: usize = 160;

/// A held value's counter.
#[derive(Debug, Clone)]
pub struct Counter {
    pub count: u64,
    /// How much of `count` may belong to values evicted before this one took the slot.
    pub error: u64,
    pub label: String,
}

/// A fixed-size summary of the heaviest values seen.
#[derive(Debug, Default)]
pub struct Sketch {
    /// The held values' hashes, apart from the counters so that a lookup scans one
    /// contiguous run of `u64`s.
    hashes: Vec<u64>,
    counters: Vec<Counter>,
    total: u64,
}

impl Sketch {
    /// Counts `weight` for the value hashed `hash`; `label` writes its label when the
    /// value takes a slot (a held value's label is never rewritten).
    #[expect(
        clippy::indexing_slicing,
        reason = "`hashes` and `counters` are pushed and replaced together: an index of one is one of the other"
    )]
    pub fn record(&mut self, hash: u64, weight: u64, label: impl FnOnce(&mut String)) {
        self.total = self.total.saturating_add(weight);
        if let Some(i) = self.hashes.iter().position(|&h| h == hash) {
            let c = &mut self.counters[i];
            c.count = c.count.saturating_add(weight);
            return;
        }
        if self.hashes.len() < CAPACITY {
            let mut text = String::new();
            label(&mut text);
            cut(&mut text);
            self.hashes.push(hash);
            self.counters.push(Counter {
                count: weight,
                error: 0,
                label: text,
            });
            return;
        }
        // Full: the smallest counter's slot goes to the newcomer, which inherits its count
        // as its possible error. The label's buffer is reused (no allocation once warm).
        let i = self.smallest();
        let c = &mut self.counters[i];
        c.error = c.count;
        c.count = c.count.saturating_add(weight);
        c.label.clear();
        label(&mut c.label);
        cut(&mut c.label);
        self.hashes[i] = hash;
    }

    #[expect(
        clippy::indexing_slicing,
        reason = "`at` is 0 or an index the loop enumerated; called only with counters held"
    )]
    fn smallest(&self) -> usize {
        let mut at = 0;
        for (i, c) in self.counters.iter().enumerate() {
            if c.count < self.counters[at].count {
                at = i;
            }
        }
        at
    }

    /// The most a value not held may have weighed in this summary: the smallest counter
    /// once every slot is taken, else nothing (every value seen is held).
    #[expect(
        clippy::indexing_slicing,
        reason = "every slot taken: `smallest` indexes a full list"
    )]
    pub fn floor(&self) -> u64 {
        if self.hashes.len() < CAPACITY {
            0
        } else {
            self.counters[self.smallest()].count
        }
    }

    /// The total weight counted, exact.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// The held values: hash and counter.
    pub fn held(&self) -> impl Iterator<Item = (u64, &Counter)> {
        self.hashes.iter().copied().zip(&self.counters)
    }

    /// Forgets every value, keeping the buffers.
    pub fn clear(&mut self) {
        self.total = 0;
        self.hashes.clear();
        self.counters.clear();
    }

    /// Bytes held on the heap, for the memory bound's test and the page.
    pub fn heap_bytes(&self) -> usize {
        self.hashes.capacity() * std::mem::size_of::<u64>()
            + self.counters.capacity() * std::mem::size_of::<Counter>()
            + self
                .counters
                .iter()
                .map(|c| c.label.capacity())
                .sum::<usize>()
    }
}

/// Cuts `text` to at most [`LABEL_BYTES`], at a character boundary, marking the cut.
fn cut(text: &mut String) {
    if text.len() <= LABEL_BYTES {
        return;
    }
    let mut end = LABEL_BYTES - '…'.len_utf8();
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push('…');
    // A long value grew the buffer; give it back so a slot holds at most its bound.
    text.shrink_to(LABEL_BYTES);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_over_the_bound_is_held_and_errors_stay_under_it() {
        let mut s = Sketch::default();
        // One heavy value among 10 000 distinct light ones.
        for i in 0..10_000u64 {
            s.record(i + 1, 1, |l| l.push_str("light"));
            if i % 10 == 0 {
                s.record(0, 1, |l| l.push_str("heavy"));
            }
        }
        let bound = s.total() / CAPACITY as u64;
        let heavy = s.held().find(|(h, _)| *h == 0).expect("heavy value held");
        assert!(heavy.1.count >= 1_000 && heavy.1.count - heavy.1.error <= 1_000);
        assert!(s.held().all(|(_, c)| c.error <= bound), "bound {bound}");
        assert!(s.floor() <= bound);
        assert_eq!(s.held().count(), CAPACITY);
    }

    #[test]
    fn labels_are_cut_at_a_character_boundary() {
        let mut s = Sketch::default();
        s.record(1, 1, |l| l.push_str(&"é".repeat(500)));
        let label = &s.held().next().unwrap().1.label;
        assert!(
            label.len() <= LABEL_BYTES && label.ends_with('…'),
            "{label}"
        );
    }
}

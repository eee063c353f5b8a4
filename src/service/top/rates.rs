//! One rule's hits per 5-second tick, admitted and refused, over the last 15 minutes, on
//! one stripe: the page's charts. Owns the ring of ticks and its merge when read.
//!
//! Must not allocate after its first hit, nor keep more than [`TICKS`] ticks.

/// The length of one tick, in seconds.
pub const TICK_SECONDS: u64 = 5;

/// Ticks kept: 15 minutes.
pub const TICKS: u64 = 180;

#[derive(Debug, Default, Clone, Copy)]
struct Tick {
    at: u64,
    admitted: u64,
    refused: u64,
}

/// One stripe's ticks, allocated at its first hit.
#[derive(Debug, Default)]
pub struct Rates {
    ticks: Vec<Tick>,
}

impl Rates {
    /// Counts `weight` hits during tick `at` (ticks since the board started).
    #[expect(
        clippy::indexing_slicing,
        reason = "an index modulo TICKS, the length the ring is given just above"
    )]
    pub fn record(&mut self, at: u64, refused: bool, weight: u64) {
        if self.ticks.is_empty() {
            self.ticks = vec![Tick::default(); TICKS as usize];
        }
        let t = &mut self.ticks[(at % TICKS) as usize];
        if t.at != at {
            *t = Tick {
                at,
                admitted: 0,
                refused: 0,
            };
        }
        if refused {
            t.refused += weight;
        } else {
            t.admitted += weight;
        }
    }

    /// Adds this stripe's ticks to `series` (index 0: the tick `now - TICKS + 1`, the last:
    /// `now`), each `(admitted, refused)`.
    pub fn read(&self, now: u64, series: &mut [(u64, u64)]) {
        for t in &self.ticks {
            if t.at > now || t.at + TICKS <= now {
                continue;
            }
            let i = (TICKS - 1 - (now - t.at)) as usize;
            if let Some(s) = series.get_mut(i) {
                s.0 += t.admitted;
                s.1 += t.refused;
            }
        }
    }

    pub fn heap_bytes(&self) -> usize {
        self.ticks.capacity() * std::mem::size_of::<Tick>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_land_in_place_and_leave_after_fifteen_minutes() {
        let mut r = Rates::default();
        r.record(10, false, 3);
        r.record(10, true, 2);
        r.record(12, true, 1);
        let mut series = vec![(0, 0); TICKS as usize];
        r.read(12, &mut series);
        let last = TICKS as usize - 1;
        assert_eq!(series[last], (0, 1));
        assert_eq!(series[last - 2], (3, 2));
        let mut later = vec![(0, 0); TICKS as usize];
        r.read(10 + TICKS, &mut later);
        assert_eq!(later[1], (0, 1), "tick 12 is kept, tick 10 is not");
        assert_eq!(later.iter().map(|s| s.0 + s.1).sum::<u64>(), 1);
        // Tick 10 + TICKS reuses tick 10's slot.
        r.record(10 + TICKS, false, 7);
        let mut now = vec![(0, 0); TICKS as usize];
        r.read(10 + TICKS, &mut now);
        assert_eq!(now[last], (7, 0));
    }
}

//! What a bucket not in the book costs: a count in a small count-min sketch of its
//! partition, aged every demand window, that says when the bucket is asked for often
//! enough to be worth tracking. No allocation and no per-bucket state: a flood of
//! distinct cold buckets moves counters, never the book.
//!
//! A sketch only overestimates (two buckets sharing a counter add up; the lower of two
//! rows is kept, and only the counters at that minimum are raised), so a hot bucket is
//! never missed; a cold one let in by a collision is measured exactly once tracked, and
//! is the first to go.

use super::WINDOW_MS;

/// Counters per row (a power of two): wide enough that a partition's share of a server's
/// whole load of distinct cold buckets (3,000 requests a window at 400,000 a second over
/// 32 partitions) leaves a counter below the mark: about one request a window on each,
/// two with the halving's carry-over. 8 KiB a partition, 256 KiB a book.
const WIDTH: usize = 1 << 12;

/// Rows, each indexed by its own bits of the bucket's hash.
const ROWS: usize = 2;

/// Requests per bucket in the current window and about half the previous one's.
#[derive(Debug)]
pub(super) struct DemandSketch {
    counts: Box<[u8]>,
    /// The start of the current window: counters are halved at each window's end.
    window_start: i64,
}

impl Default for DemandSketch {
    fn default() -> Self {
        DemandSketch {
            counts: vec![0; ROWS * WIDTH].into_boxed_slice(),
            window_start: 0,
        }
    }
}

impl DemandSketch {
    /// Counts one request on the bucket of `hash` at `now`; returns its estimate: at least
    /// its requests in the current window plus half of the previous window's.
    pub(super) fn count(&mut self, hash: u64, now: i64) -> u8 {
        self.age(now);
        // Bits the partition choice (32 and up) and the table's index (the lowest) do
        // not decide for every bucket of a partition.
        let at = [
            (hash >> 8) as usize & (WIDTH - 1),
            WIDTH + ((hash >> 20) as usize & (WIDTH - 1)),
        ];
        // Both places are below `2 * WIDTH`, within `counts` (`ROWS * WIDTH`).
        let least = at.iter().filter_map(|&i| self.counts.get(i)).min();
        let counted = least.copied().unwrap_or(0).saturating_add(1);
        for i in at {
            // Conservative update: a counter already above the estimate holds others' counts.
            if let Some(c) = self.counts.get_mut(i).filter(|c| **c < counted) {
                *c = counted;
            }
        }
        counted
    }

    /// Halves every counter once per window ended since the last request (clears them
    /// after eight, or when the clock went back a window or more).
    fn age(&mut self, now: i64) {
        let elapsed = now - self.window_start;
        // A little before the window's start is still this window: requests read the
        // clock before they take the partition's lock, so one that read it a millisecond
        // before another crossed into a new window may count after it.
        if (1 - WINDOW_MS..WINDOW_MS).contains(&elapsed) {
            return;
        }
        let windows = elapsed / WINDOW_MS;
        if (1..8).contains(&windows) {
            for c in self.counts.iter_mut() {
                *c >>= windows;
            }
            self.window_start += windows * WINDOW_MS;
        } else {
            self.counts.fill(0);
            self.window_start = now;
        }
    }
}

/// Requests in a window that make a bucket worth tracking: its share of `hot_rate` (per
/// second) over one window, at least one.
pub(super) fn admission_count(hot_rate: u32) -> u8 {
    // Rounded up (signed `div_ceil` is not stable).
    let per_window = (i64::from(hot_rate) * WINDOW_MS + 999) / 1_000;
    u8::try_from(per_window.max(1)).unwrap_or(u8::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_800_000_000_000;

    #[test]
    fn a_steady_rate_is_estimated_within_a_window_or_two() {
        let mut s = DemandSketch::default();
        // 50 a second: 12.5 a window; the estimate passes 5 within the first window.
        let first_over = (0..100)
            .position(|i| s.count(42, T0 + i * 20) >= admission_count(20))
            .unwrap();
        assert!(first_over < 12, "{first_over}");
    }

    #[test]
    fn a_bucket_seen_now_and_then_stays_below_the_mark() {
        let mut s = DemandSketch::default();
        // 4 a second, for ten seconds.
        let most = (0..40).map(|i| s.count(7, T0 + i * 250)).max().unwrap();
        assert!(most < admission_count(20), "{most}");
    }

    #[test]
    fn a_flood_of_distinct_buckets_leaves_a_fresh_one_below_the_mark() {
        let mut s = DemandSketch::default();
        let hasher = foldhash::quality::FixedState::with_seed(1);
        let hash = |i: u64| std::hash::BuildHasher::hash_one(&hasher, i);
        // 200 distinct buckets a window in one partition (a churn of 25,000 a second over
        // 32 partitions), each seen once, for 4 s.
        for i in 0..3_200u64 {
            s.count(hash(i), T0 + i as i64 * 1_000 / 800);
        }
        let fresh = (0..1_000u64)
            .filter(|i| s.count(hash(1_000_000 + i), T0 + 4_000) >= admission_count(20))
            .count();
        assert!(fresh <= 5, "{fresh} of 1000 fresh buckets over the mark");
    }

    #[test]
    fn a_request_that_read_the_clock_just_before_a_new_window_keeps_the_counts() {
        let mut s = DemandSketch::default();
        for i in 0..10 {
            s.count(42, T0 + i * 20);
        }
        // Another request crosses into the next window; one that read the clock a
        // millisecond earlier counts after it.
        s.count(7, T0 + WINDOW_MS);
        let counted = s.count(42, T0 + WINDOW_MS - 1);
        assert!(counted >= 6, "the counts of the window survive: {counted}");
    }

    #[test]
    fn a_whole_servers_load_of_cold_buckets_stays_below_the_mark() {
        let mut s = DemandSketch::default();
        let hasher = foldhash::quality::FixedState::with_seed(2);
        let hash = |i: u64| std::hash::BuildHasher::hash_one(&hasher, i);
        // One partition's share of 400,000 requests a second over 100,000 buckets (each
        // at 4 a second, below the hot rate): 3,125 buckets, 3,125 requests a window.
        let over = (0..8 * 3_125u64)
            .filter(|i| {
                s.count(hash(i % 3_125), T0 + *i as i64 * 250 / 3_125) >= admission_count(20)
            })
            .count();
        assert!(
            over <= 8 * 3_125 / 100,
            "{over} requests found their bucket over the mark"
        );
    }

    #[test]
    fn the_mark_is_the_hot_rate_over_one_window() {
        assert_eq!(admission_count(20), 5);
        assert_eq!(admission_count(0), 1);
        assert_eq!(admission_count(1_000_000), u8::MAX);
    }
}

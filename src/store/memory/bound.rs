//! The memory store's bound: which items go first when a partition has no room left, the
//! store's coarse clock that marks when an item was last used, and the count of what was
//! evicted and why. It ranks and counts; the partition (`partition.rs`) charges items and
//! removes them, and nothing here holds a lock.
//!
//! Order. An item whose every limit has refilled to its ceiling by now (the `wcu` limit
//! too: a re-created item starts with a full one) is the same as no item: the engine
//! creates a missing shard full, so dropping it changes no decision. Those go first, the
//! longest unused first. Shard 0 of a bucket spread over several shards is never counted
//! among them: it carries the bucket's shard count, and one re-created by a server that
//! forgot the count would hold the whole capacity. Then, only when dropping full items
//! does not make room, the least recently used of the rest: each of those is re-created
//! full on its next request, which may admit up to a bucket's worth more than its limit,
//! so they are counted apart (`active`) and logged.
//!
//! Recency. Each item holds the second it was last debited, credited or written (a `u32`
//! in what was padding of the compact slot, so an item is no larger). A pass over the
//! partition sums the bytes of its items by (full or not, age), where ages are bucketed
//! exactly up to 16 s and within a quarter beyond; then it removes the lowest-ranked
//! until enough bytes are free. Within one age bucket the order is arbitrary: the bound
//! is LRU to within a quarter of an item's age, with no list to maintain on the request
//! path.
//!
//! Time. The store keeps the latest `now_s` a caller handed it (every fast-path debit and
//! every expiry sweep carry one), so it follows the engine's clock, manual clocks of tests
//! included. Fullness is judged at the start of that second, never later than the engine
//! would judge it.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use super::slot::CompactItem;
use crate::store::WCU_LIMIT;
use crate::support::throttle::LogThrottle;

/// Ages are bucketed one per second below this many seconds.
const EXACT_AGES: u32 = 16;
/// Age buckets: exact ones, then four per power of two up to `u32::MAX` seconds.
const AGE_BUCKETS: usize = EXACT_AGES as usize + 4 * (32 - 4);
/// Ranks: full items of every age bucket, then the rest.
const RANKS: usize = 2 * AGE_BUCKETS;

/// Where an item stands in the eviction order: lower goes first. A byte, so a pass
/// keeps one per item.
pub(super) type Rank = u8;

const _: () = assert!(RANKS <= 1 << Rank::BITS, "every rank fits a Rank");

/// The latest time (epoch s) a caller gave the store.
#[derive(Debug, Default)]
pub(super) struct Clock {
    now_s: AtomicI64,
}

impl Clock {
    /// Records `now_s` as the store's time. A store only when it moved: concurrent
    /// requests of the same second read one cache line and write none.
    #[inline]
    pub(super) fn saw(&self, now_s: i64) {
        if self.now_s.load(Ordering::Relaxed) != now_s {
            self.now_s.store(now_s, Ordering::Relaxed);
        }
    }

    #[inline]
    pub(super) fn now_s(&self) -> i64 {
        self.now_s.load(Ordering::Relaxed)
    }

    /// The recency mark of an item used now.
    #[inline]
    pub(super) fn mark(&self) -> u32 {
        mark_of(self.now_s())
    }
}

/// The recency mark of second `now_s`: epoch seconds fit a `u32` until 2106; times
/// outside it are clamped (only tests use them).
#[inline]
pub(super) fn mark_of(now_s: i64) -> u32 {
    now_s.clamp(0, i64::from(u32::MAX)) as u32
}

/// Whether an item may go without changing a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Class {
    /// Every limit refilled to its ceiling (or expired): the same as no item.
    Full,
    /// Anything else: re-created full if dropped.
    Active,
}

/// The moment a pass ranks items at.
#[derive(Debug, Clone, Copy)]
pub(super) struct Moment {
    pub(super) now_s: i64,
}

impl Moment {
    /// Whether `slot` (shard `shard` of its bucket) is the same as no item now.
    pub(super) fn class(&self, shard: u32, slot: &CompactItem) -> Class {
        if shard == 0 && slot.shard_count > 1 {
            return Class::Active;
        }
        if slot.ttl <= self.now_s {
            return Class::Full;
        }
        let now_ms = self.now_s.saturating_mul(1_000);
        let full = slot
            .shape
            .0
            .iter()
            .zip(&slot.balances)
            .all(|((name, params), b)| {
                // `wcu` is a shard's own write budget, never divided by the count.
                let count = if name == WCU_LIMIT {
                    1
                } else {
                    u32::from(slot.shard_count)
                };
                params.refilled_full(b.balance, slot.refilled_at, now_ms, count)
            });
        if full {
            Class::Full
        } else {
            Class::Active
        }
    }

    /// Where `slot` stands in the eviction order.
    pub(super) fn rank(&self, shard: u32, slot: &CompactItem) -> Rank {
        let age = mark_of(self.now_s).saturating_sub(slot.touched);
        // Older first within a class.
        let by_age = AGE_BUCKETS - 1 - age_bucket(age);
        let rank = match self.class(shard, slot) {
            Class::Full => by_age,
            Class::Active => AGE_BUCKETS + by_age,
        };
        rank as Rank
    }
}

/// Whether `rank` is of a full item.
pub(super) fn is_full_rank(rank: Rank) -> bool {
    usize::from(rank) < AGE_BUCKETS
}

/// Seconds exactly below [`EXACT_AGES`], then four buckets per power of two.
fn age_bucket(age: u32) -> usize {
    if age < EXACT_AGES {
        return age as usize;
    }
    let exponent = 31 - age.leading_zeros(); // ≥ 4
    let quarter = (age >> (exponent - 2)) & 3;
    EXACT_AGES as usize + 4 * (exponent as usize - 4) + quarter as usize
}

/// Bytes held at each rank of one partition.
#[derive(Debug)]
pub(super) struct Histogram {
    bytes: [usize; RANKS],
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { bytes: [0; RANKS] }
    }
}

impl Histogram {
    pub(super) fn add(&mut self, rank: Rank, bytes: usize) {
        self.bytes[usize::from(rank)] += bytes;
    }

    /// The cut that frees at least `wanted` bytes taking the lowest ranks first (all
    /// of them if they hold less).
    pub(super) fn cut(&self, wanted: usize) -> Cut {
        let mut below = 0;
        for (rank, &bytes) in self.bytes.iter().enumerate() {
            if below + bytes >= wanted {
                return Cut {
                    rank,
                    at_rank: wanted - below,
                };
            }
            below += bytes;
        }
        Cut {
            rank: RANKS,
            at_rank: 0,
        }
    }
}

/// Which items a pass removes: every one ranked below `rank`, and of those at `rank`
/// as many as make up `at_rank` bytes.
#[derive(Debug)]
pub(super) struct Cut {
    rank: usize,
    at_rank: usize,
}

impl Cut {
    /// Whether the item of this rank and charge goes (called once per item).
    pub(super) fn takes(&mut self, rank: Rank, bytes: usize) -> bool {
        let rank = usize::from(rank);
        if rank < self.rank {
            return true;
        }
        if rank == self.rank && self.at_rank > 0 {
            self.at_rank = self.at_rank.saturating_sub(bytes);
            return true;
        }
        false
    }
}

/// What one pass (or several) removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Evicted {
    /// Items the same as no item.
    pub(super) full: u64,
    /// Items still in use: re-created full.
    pub(super) active: u64,
}

impl std::ops::AddAssign for Evicted {
    fn add_assign(&mut self, other: Evicted) {
        self.full += other.full;
        self.active += other.active;
    }
}

/// How often the bound says in the log that it evicted.
const EVICTION_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Counts of items removed, by why, since the store started.
#[derive(Debug)]
pub(super) struct Evictions {
    pub(super) full: AtomicU64,
    pub(super) active: AtomicU64,
    pub(super) expired: AtomicU64,
    log: LogThrottle,
}

impl Default for Evictions {
    fn default() -> Self {
        Evictions {
            full: AtomicU64::new(0),
            active: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            log: LogThrottle::new(EVICTION_LOG_INTERVAL),
        }
    }
}

impl Evictions {
    /// Counts what the bound removed and says so, at most once per interval: a warning
    /// when items still in use went (each may over-admit once), else at debug.
    pub(super) fn record(&self, evicted: Evicted, max_bytes: u64) {
        if evicted == Evicted::default() {
            return;
        }
        let full = self.full.fetch_add(evicted.full, Ordering::Relaxed) + evicted.full;
        let active = self.active.fetch_add(evicted.active, Ordering::Relaxed) + evicted.active;
        if self.log.admit().is_none() {
            return;
        }
        if evicted.active > 0 {
            tracing::warn!(
                max_bytes,
                evicted_active_total = active,
                evicted_full_total = full,
                "memory store at its bound: buckets still in use evicted (each is re-created full and may admit up to its capacity again); raise --memory-max-bytes"
            );
        } else {
            tracing::debug!(
                max_bytes,
                evicted_full_total = full,
                "memory store at its bound: full buckets evicted (no decision changes)"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_bucket_exactly_then_by_quarters_in_order() {
        let buckets: Vec<usize> = (0..100_000u32).map(age_bucket).collect();
        assert!(buckets.windows(2).all(|w| w[0] <= w[1]), "monotone");
        assert_eq!(age_bucket(15), 15);
        assert_eq!(age_bucket(16), 16);
        assert_eq!(age_bucket(20), 17);
        assert_eq!(age_bucket(u32::MAX), AGE_BUCKETS - 1);
    }

    #[test]
    fn a_cut_takes_the_lowest_ranks_first_and_no_more_than_it_needs() {
        let mut h = Histogram::default();
        h.add(3, 100);
        h.add(7, 300);
        let mut cut = h.cut(250);
        assert!(cut.takes(3, 100));
        assert!(cut.takes(7, 100));
        assert!(cut.takes(7, 100), "150 bytes of rank 7 wanted: two items");
        assert!(!cut.takes(7, 100));
        assert!(!cut.takes(8, 1));
        let mut all = h.cut(10_000);
        assert!(all.takes(Rank::MAX, 1), "not enough: everything goes");
    }
}

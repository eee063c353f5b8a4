//! Shard counts this process has learnt, and how a shard is drawn.
//!
//! Counts only grow (a lagging item never lowers them). The cache is bounded: when a
//! partition fills up it is cleared, which is harmless because every store answer carries
//! the item's count and teaches it back.

use parking_lot::Mutex;
use rand::RngExt;
use smallvec::SmallVec;

use super::partitioned::Partitioned;
use super::MAX_SHARD_COUNT;

/// Shard counts held at most; a full part of the cache is cleared.
const CAPACITY: usize = 16 * 16_384;

/// A bucket whose shard count is cached.
#[derive(Debug, Hash, PartialEq, Eq)]
struct Sharded {
    entity: String,
    resource: String,
}

/// A lookup of [`Sharded`] without building one: hashes as it does (field by field, a
/// `&str` as its `String`).
#[derive(Hash)]
struct BucketRef<'a> {
    entity: &'a str,
    resource: &'a str,
}

impl hashbrown::Equivalent<Sharded> for BucketRef<'_> {
    fn equivalent(&self, key: &Sharded) -> bool {
        self.entity == key.entity && self.resource == key.resource
    }
}

/// A sharded bucket, as the metrics list the most sharded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotBucket {
    pub entity: String,
    pub resource: String,
    pub shard_count: u32,
}

/// Per (entity, resource) shard counts, monotone. Only buckets that ever sharded are
/// held: while none has (the usual case) a lookup takes no lock.
#[derive(Debug)]
pub(crate) struct ShardCounts {
    counts: Partitioned<Sharded, u32>,
}

impl Default for ShardCounts {
    fn default() -> Self {
        ShardCounts {
            counts: Partitioned::new(CAPACITY),
        }
    }
}

impl ShardCounts {
    /// The known count, 1 if none is known.
    pub(crate) fn get(&self, entity: &str, resource: &str) -> u32 {
        self.counts
            .with(&BucketRef { entity, resource }, |c| *c)
            .unwrap_or(1)
    }

    /// Up to `limit` buckets with the most shards.
    pub(crate) fn hottest(&self, limit: usize) -> Vec<HotBucket> {
        let mut all = Vec::new();
        self.counts.for_each(|b, c| {
            all.push(HotBucket {
                entity: b.entity.clone(),
                resource: b.resource.clone(),
                shard_count: *c,
            })
        });
        all.sort_by(|a, b| {
            (b.shard_count.cmp(&a.shard_count)).then_with(|| a.entity.cmp(&b.entity))
        });
        all.truncate(limit);
        all
    }

    /// Forgets every count (what a full part does to its own).
    pub(crate) fn clear(&self) {
        self.counts.clear();
    }

    /// Learns `count` if it is larger than what is known, at most [`MAX_SHARD_COUNT`]:
    /// the stores' decoders refuse a larger count already (`store/item.rs`), and the
    /// clamp keeps a count from anywhere else from making per-request work grow with it.
    pub(crate) fn learn(&self, entity: &str, resource: &str, count: u32) {
        let count = count.min(MAX_SHARD_COUNT);
        if count <= 1 {
            return;
        }
        let bucket = || Sharded {
            entity: entity.to_string(),
            resource: resource.to_string(),
        };
        self.counts.upsert(
            &BucketRef { entity, resource },
            || (bucket(), count),
            |known| *known = (*known).max(count),
        );
    }
}

/// Chooses a shard in `0..count`, avoiding `avoid` when it can.
pub trait ShardDraw: Send + Sync {
    fn draw(&self, count: u32, avoid: &[u32]) -> u32;
}

/// Uniform random draw (production).
#[derive(Debug, Default, Clone, Copy)]
pub struct RandomDraw;

impl ShardDraw for RandomDraw {
    /// Work in the size of `avoid` (a few shards), never in `count`: the `n`-th free shard
    /// is found by stepping `n` past each avoided shard at or below it, in order.
    fn draw(&self, count: u32, avoid: &[u32]) -> u32 {
        if count <= 1 {
            return 0;
        }
        let mut avoided: SmallVec<[u32; 8]> =
            avoid.iter().copied().filter(|&s| s < count).collect();
        avoided.sort_unstable();
        avoided.dedup();
        let mut rng = rand::rng();
        let free = count - avoided.len() as u32;
        if free == 0 {
            return rng.random_range(0..count);
        }
        let mut shard = rng.random_range(0..free);
        for &a in &avoided {
            if a <= shard {
                shard += 1;
            }
        }
        shard
    }
}

/// A draw that follows a script, then falls back to the lowest allowed shard (tests).
#[derive(Debug, Default)]
pub struct ScriptedDraw(Mutex<std::collections::VecDeque<u32>>);

impl ScriptedDraw {
    pub fn new(script: impl IntoIterator<Item = u32>) -> ScriptedDraw {
        ScriptedDraw(Mutex::new(script.into_iter().collect()))
    }

    pub fn push(&self, shard: u32) {
        self.0.lock().push_back(shard);
    }
}

impl ShardDraw for ScriptedDraw {
    fn draw(&self, count: u32, avoid: &[u32]) -> u32 {
        let mut q = self.0.lock();
        while let Some(s) = q.pop_front() {
            if s < count.max(1) {
                return s;
            }
        }
        // The lowest shard not avoided: at most `avoid.len()` steps, whatever the count.
        (0..count.min(avoid.len() as u32 + 1))
            .find(|s| !avoid.contains(s))
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_monotone() {
        let c = ShardCounts::default();
        assert_eq!(c.get("e", "r"), 1);
        c.learn("e", "r", 4);
        c.learn("e", "r", 2);
        assert_eq!(c.get("e", "r"), 4);
    }

    #[test]
    fn a_learnt_count_is_clamped_to_what_a_bucket_can_have() {
        let c = ShardCounts::default();
        c.learn("e", "r", u32::MAX);
        assert_eq!(c.get("e", "r"), MAX_SHARD_COUNT);
    }

    /// Every free shard is drawn, none avoided, and a count no bucket can have (which a
    /// draw once walked twice, shard by shard) costs what a small one does.
    #[test]
    fn a_draw_covers_the_free_shards_and_does_not_walk_the_count() {
        let mut seen = [0u32; 8];
        for _ in 0..4_000 {
            let s = RandomDraw.draw(8, &[6, 1, 1, 3, 40]);
            assert!(![1, 3, 6].contains(&s) && s < 8, "{s}");
            seen[s as usize] += 1;
        }
        for free in [0, 2, 4, 5, 7] {
            assert!(
                seen[free] > 500,
                "shard {free} drawn {} times of 4000",
                seen[free]
            );
        }
        // A walk of 2^32 shards per draw would keep this loop busy for hours.
        for _ in 0..1_000 {
            let s = RandomDraw.draw(u32::MAX, &[0, 1, 2]);
            assert!(s >= 3, "{s}");
        }
        assert_eq!(ScriptedDraw::default().draw(u32::MAX, &[0, 1]), 2);
    }

    #[test]
    fn random_draw_avoids() {
        for _ in 0..200 {
            let s = RandomDraw.draw(4, &[0, 1, 3]);
            assert_eq!(s, 2);
            assert!(RandomDraw.draw(4, &[]) < 4);
        }
        assert!(RandomDraw.draw(2, &[0, 1]) < 2);
    }
}

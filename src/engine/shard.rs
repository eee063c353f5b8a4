//! Shard counts this process has learnt, and how a shard is drawn.
//!
//! Counts only grow (a lagging item never lowers them). The cache is bounded: when a
//! partition fills up it is cleared, which is harmless because every store answer carries
//! the item's count and teaches it back.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use rand::Rng;

const PARTITIONS: usize = 16;
const ENTRIES_PER_PARTITION: usize = 16_384;

type Hasher = foldhash::quality::RandomState;

/// Shard counts of one partition, by entity then resource (so a lookup borrows both).
type Part = HashMap<String, HashMap<String, u32, Hasher>, Hasher>;

/// Per (entity, resource) shard counts, monotone.
#[derive(Debug)]
pub(crate) struct ShardCounts {
    parts: Vec<Mutex<Part>>,
    hasher: Hasher,
    /// Buckets known to have more than one shard: while 0 (no bucket ever sharded, the
    /// usual case) a lookup takes no lock.
    sharded: AtomicUsize,
}

impl Default for ShardCounts {
    fn default() -> Self {
        ShardCounts {
            parts: (0..PARTITIONS)
                .map(|_| Mutex::new(Part::default()))
                .collect(),
            hasher: Hasher::default(),
            sharded: AtomicUsize::new(0),
        }
    }
}

impl ShardCounts {
    fn part(&self, entity: &str, resource: &str) -> &Mutex<Part> {
        let h = self.hasher.hash_one((entity, resource));
        &self.parts[(h as usize) % PARTITIONS]
    }

    /// The known count, 1 if none is known. Only buckets that ever sharded are cached.
    pub(crate) fn get(&self, entity: &str, resource: &str) -> u32 {
        if self.sharded.load(Ordering::Relaxed) == 0 {
            return 1;
        }
        let g = self
            .part(entity, resource)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        g.get(entity)
            .and_then(|r| r.get(resource))
            .copied()
            .unwrap_or(1)
    }

    /// Up to `limit` buckets with the most shards.
    pub(crate) fn hottest(&self, limit: usize) -> Vec<(String, String, u32)> {
        let mut all: Vec<(String, String, u32)> = Vec::new();
        for p in &self.parts {
            let g = p.lock().unwrap_or_else(|e| e.into_inner());
            for (e, resources) in g.iter() {
                all.extend(resources.iter().map(|(r, c)| (e.clone(), r.clone(), *c)));
            }
        }
        all.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
        all.truncate(limit);
        all
    }

    /// Forgets every count (what a full partition does to its own).
    pub(crate) fn clear(&self) {
        for p in &self.parts {
            p.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }

    /// Learns `count` if it is larger than what is known.
    pub(crate) fn learn(&self, entity: &str, resource: &str, count: u32) {
        if count <= 1 {
            return;
        }
        let mut g = self
            .part(entity, resource)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(known) = g.get_mut(entity).and_then(|r| r.get_mut(resource)) {
            *known = (*known).max(count);
            return;
        }
        if g.len() >= ENTRIES_PER_PARTITION {
            g.clear();
        }
        g.entry(entity.to_string())
            .or_default()
            .insert(resource.to_string(), count);
        // Stays above 0 once anything sharded (clearing a full partition keeps it so).
        self.sharded.fetch_add(1, Ordering::Relaxed);
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
    fn draw(&self, count: u32, avoid: &[u32]) -> u32 {
        if count <= 1 {
            return 0;
        }
        let free = (0..count).filter(|s| !avoid.contains(s)).count() as u32;
        let mut rng = rand::rng();
        if free == 0 {
            return rng.random_range(0..count);
        }
        let nth = rng.random_range(0..free) as usize;
        (0..count)
            .filter(|s| !avoid.contains(s))
            .nth(nth)
            .unwrap_or(0)
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
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(shard);
    }
}

impl ShardDraw for ScriptedDraw {
    fn draw(&self, count: u32, avoid: &[u32]) -> u32 {
        let mut q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(s) = q.pop_front() {
            if s < count.max(1) {
                return s;
            }
        }
        (0..count).find(|s| !avoid.contains(s)).unwrap_or(0)
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
    fn random_draw_avoids() {
        for _ in 0..200 {
            let s = RandomDraw.draw(4, &[0, 1, 3]);
            assert_eq!(s, 2);
            assert!(RandomDraw.draw(4, &[]) < 4);
        }
        assert!(RandomDraw.draw(2, &[0, 1]) < 2);
    }
}

//! A bounded map in independently locked parts, for the engine's per-bucket caches (the
//! rejection cache, learnt shard counts): concurrent requests on different buckets do not
//! contend, and while the map is empty a lookup costs one atomic load, no hash, no lock.
//!
//! Bounded by clearing: a part that is full when a new key arrives is emptied first. That
//! suits only caches whose every entry a store answer teaches back, where losing entries
//! costs store calls, never a wrong decision.

use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicUsize, Ordering};

use hashbrown::{Equivalent, HashMap};
use parking_lot::{Mutex, MutexGuard};

/// The hash of every map the engine keeps keyed by request values (buckets, shards):
/// foldhash's quality variant, seeded per process, so values a client picks cannot be
/// chosen to collide.
pub(super) type Hasher = foldhash::quality::RandomState;

/// Independently locked parts.
pub(crate) const PARTS: usize = 16;

#[derive(Debug)]
pub(crate) struct Partitioned<K, V> {
    parts: Box<[Mutex<HashMap<K, V, Hasher>>]>,
    /// Chooses the part; each part's map hashes with its own state.
    hasher: Hasher,
    /// Entries per part, at most.
    per_part: usize,
    /// Entries held in all parts, kept with every insert and removal.
    len: AtomicUsize,
}

impl<K: Hash + Eq, V> Partitioned<K, V> {
    /// A map of about `capacity` entries (at least one per part).
    pub(crate) fn new(capacity: usize) -> Partitioned<K, V> {
        Partitioned {
            parts: (0..PARTS).map(|_| Mutex::new(HashMap::default())).collect(),
            hasher: Hasher::default(),
            per_part: capacity.div_ceil(PARTS).max(1),
            len: AtomicUsize::new(0),
        }
    }

    /// Entries held now.
    pub(crate) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    #[expect(
        clippy::indexing_slicing,
        reason = "reduced modulo PARTS, the parts' number"
    )]
    fn part<Q: Hash + ?Sized>(&self, key: &Q) -> MutexGuard<'_, HashMap<K, V, Hasher>> {
        self.parts[(self.hasher.hash_one(key) as usize) % PARTS].lock()
    }

    /// Runs `f` on the entry of `key`, if any (nothing is locked while the map is empty).
    pub(crate) fn with<Q, R>(&self, key: &Q, f: impl FnOnce(&mut V) -> R) -> Option<R>
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        if self.is_empty() {
            return None;
        }
        self.part(key).get_mut(key).map(f)
    }

    /// Updates the entry of `key` with `update`, or inserts `make()` (emptying the part
    /// first when it is full).
    pub(crate) fn upsert<Q>(
        &self,
        key: &Q,
        make: impl FnOnce() -> (K, V),
        update: impl FnOnce(&mut V),
    ) where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        let mut part = self.part(key);
        if let Some(v) = part.get_mut(key) {
            update(v);
            return;
        }
        if part.len() >= self.per_part {
            self.len.fetch_sub(part.len(), Ordering::Relaxed);
            part.clear();
        }
        let (k, v) = make();
        part.insert(k, v);
        self.len.fetch_add(1, Ordering::Relaxed);
    }

    /// Removes the entry of `key`; whether there was one.
    pub(crate) fn remove<Q>(&self, key: &Q) -> bool
    where
        Q: Hash + Equivalent<K> + ?Sized,
    {
        if self.is_empty() {
            return false;
        }
        let removed = self.part(key).remove(key).is_some();
        if removed {
            self.len.fetch_sub(1, Ordering::Relaxed);
        }
        removed
    }

    /// Keeps the entries `keep` says to; returns how many were dropped.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&K, &mut V) -> bool) -> usize {
        let mut dropped = 0;
        for part in &self.parts {
            let mut part = part.lock();
            let before = part.len();
            part.retain(|k, v| keep(k, v));
            dropped += before - part.len();
        }
        self.len.fetch_sub(dropped, Ordering::Relaxed);
        dropped
    }

    /// Visits every entry, one part locked at a time.
    pub(crate) fn for_each(&self, mut visit: impl FnMut(&K, &V)) {
        for part in &self.parts {
            for (k, v) in part.lock().iter() {
                visit(k, v);
            }
        }
    }

    /// Forgets every entry.
    pub(crate) fn clear(&self) {
        self.retain(|_, _| false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_follows_every_insert_removal_and_clearing() {
        // One entry per part: more keys than parts forces clears whatever the hash seed.
        let map: Partitioned<u32, u32> = Partitioned::new(1);
        for k in 0..3 * PARTS as u32 {
            map.upsert(&k, || (k, k), |_| unreachable!("a new key"));
        }
        let mut held = 0;
        map.for_each(|_, _| held += 1);
        assert!(held <= PARTS, "{held} entries held in {PARTS} parts of one");
        assert_eq!(map.len(), held);
        let some = (0..3 * PARTS as u32).find(|k| map.with(k, |_| ()).is_some());
        assert!(map.remove(&some.unwrap()));
        assert!(!map.remove(&some.unwrap()), "removed once");
        assert_eq!(map.len(), held - 1);
        map.clear();
        assert!(map.is_empty());
    }

    #[test]
    fn an_existing_key_is_updated_in_place() {
        let map: Partitioned<String, u32> = Partitioned::new(64);
        map.upsert("a", || ("a".to_string(), 1), |_| unreachable!());
        map.upsert("a", || unreachable!(), |v| *v += 1);
        assert_eq!(map.with("a", |v| *v), Some(2));
        assert_eq!(map.len(), 1);
        assert_eq!(map.retain(|_, v| *v > 5), 1);
        assert_eq!(map.with("a", |v| *v), None);
    }
}

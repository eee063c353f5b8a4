//! The rejection cache: the last image this process saw of each shard, trusted for a short
//! time to refuse a request that image proves cannot fit, without a store call.
//!
//! It only ever refuses or steers the shard draw; it never admits. Its error is bounded:
//! tokens returned by a path this process did not see (another server's refund) are
//! missed for at most the cache lifetime, which can only under-admit.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, MutexGuard};

use crate::store::{BucketItem, BucketKey};

/// Independently locked parts, so concurrent requests on different buckets do not contend.
const PARTS: usize = 16;

type Hasher = foldhash::quality::RandomState;

#[derive(Debug)]
struct Entry {
    image: BucketItem,
    stored_at: i64,
}

type Part = HashMap<BucketKey, Entry, Hasher>;

#[derive(Debug)]
pub(crate) struct RejectionCache {
    ttl_ms: i64,
    /// Entries per part.
    capacity: usize,
    parts: Vec<Mutex<Part>>,
    hasher: Hasher,
}

impl RejectionCache {
    pub(crate) fn new(ttl_ms: i64, capacity: usize) -> RejectionCache {
        RejectionCache {
            ttl_ms,
            capacity: capacity.div_ceil(PARTS).max(1),
            parts: (0..PARTS).map(|_| Mutex::new(Part::default())).collect(),
            hasher: Hasher::default(),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.ttl_ms > 0
    }

    fn part(&self, key: &BucketKey) -> MutexGuard<'_, Part> {
        let i = (self.hasher.hash_one(key) as usize) % PARTS;
        self.parts[i].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers the image of a shard seen at `now`.
    pub(crate) fn remember(&self, key: &BucketKey, image: &BucketItem, now: i64) {
        if !self.enabled() {
            return;
        }
        let mut g = self.part(key);
        if let Some(e) = g.get_mut(key) {
            e.image.clone_from(image);
            e.stored_at = now;
            return;
        }
        if g.len() >= self.capacity {
            // Full of recent refusals (many distinct buckets refused within the lifetime):
            // start over. Clearing costs one pass per `capacity` inserts, and losing
            // entries only sends requests to the store.
            g.clear();
        }
        g.insert(
            key.clone(),
            Entry {
                image: image.clone(),
                stored_at: now,
            },
        );
    }

    /// Applies a refund to the cached image of a shard, so the cache never refuses on a
    /// balance this process itself raised (each credit capped at its ceiling).
    pub(crate) fn credit(&self, key: &BucketKey, credits: &[crate::store::Credit]) {
        if !self.enabled() {
            return;
        }
        let mut g = self.part(key);
        if let Some(e) = g.get_mut(key) {
            for c in credits {
                if let Some(st) = e.image.limits.get_mut(&c.limit) {
                    st.tk = st.tk.saturating_add(c.amount).min(c.ceiling.max(st.tk));
                }
            }
        }
    }

    /// The last image seen of a shard, however old (for reporting, never for refusing).
    pub(crate) fn latest(&self, key: &BucketKey) -> Option<BucketItem> {
        if !self.enabled() {
            return None;
        }
        self.part(key).get(key).map(|e| e.image.clone())
    }

    /// A fresh image of a shard, if any.
    pub(crate) fn fresh(&self, key: &BucketKey, now: i64) -> Option<BucketItem> {
        if !self.enabled() {
            return None;
        }
        let g = self.part(key);
        let e = g.get(key)?;
        let age = now - e.stored_at;
        let expired = e.image.ttl.is_some_and(|t| t * 1_000 <= now);
        (age >= 0 && age < self.ttl_ms && !expired).then(|| e.image.clone())
    }
}

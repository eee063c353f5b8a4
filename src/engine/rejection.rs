//! The rejection cache: the last image this process saw of each shard, trusted for a short
//! time to refuse a request that image proves cannot fit, without a store call.
//!
//! It only ever refuses or steers the shard draw; it never admits. Its error is bounded:
//! tokens returned by a path this process did not see (another server's refund) are
//! missed for at most the cache lifetime, which can only under-admit.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// Entries held (approximately: a part cleared when full is not subtracted exactly);
    /// while 0, forgetting a key takes no lock.
    held: AtomicUsize,
}

impl RejectionCache {
    pub(crate) fn new(ttl_ms: i64, capacity: usize) -> RejectionCache {
        RejectionCache {
            ttl_ms,
            capacity: capacity.div_ceil(PARTS).max(1),
            parts: (0..PARTS).map(|_| Mutex::new(Part::default())).collect(),
            hasher: Hasher::default(),
            held: AtomicUsize::new(0),
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
            let dropped = g.len();
            g.clear();
            let _ = self
                .held
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_sub(dropped))
                });
        }
        g.insert(
            key.clone(),
            Entry {
                image: image.clone(),
                stored_at: now,
            },
        );
        self.held.fetch_add(1, Ordering::Relaxed);
    }

    /// Drops what is known of a shard (a debit just succeeded on it: an older refusing
    /// image must not refuse the next request).
    pub(crate) fn forget(&self, key: &BucketKey) {
        if !self.enabled() || self.held.load(Ordering::Relaxed) == 0 {
            return;
        }
        if self.part(key).remove(key).is_some() {
            let _ = self
                .held
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_sub(1))
                });
        }
    }

    /// Applies a refund to the cached image of a shard, so the cache never refuses on a
    /// balance this process itself raised (each credit capped at its ceiling).
    pub(crate) fn credit(&self, key: &BucketKey, credits: &[crate::store::Credit]) {
        if !self.enabled() || self.held.load(Ordering::Relaxed) == 0 {
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
        if !self.enabled() || self.held.load(Ordering::Relaxed) == 0 {
            return None;
        }
        self.part(key).get(key).map(|e| e.image.clone())
    }

    /// A fresh image of a shard, if any.
    pub(crate) fn fresh(&self, key: &BucketKey, now: i64) -> Option<BucketItem> {
        if !self.enabled() || self.held.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let g = self.part(key);
        let e = g.get(key)?;
        let age = now - e.stored_at;
        let expired = e.image.ttl.is_some_and(|t| t * 1_000 <= now);
        (age >= 0 && age < self.ttl_ms && !expired).then(|| e.image.clone())
    }
}

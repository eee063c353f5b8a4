//! The rejection cache: the last image this process saw of each shard, trusted for a short
//! time to refuse a request that image proves cannot fit, without a store call.
//!
//! It only ever refuses or steers the shard draw; it never admits. Its error is bounded:
//! tokens returned by a path this process did not see (another server's refund) are
//! missed for at most the cache lifetime, which can only under-admit.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::store::{BucketItem, BucketKey};

#[derive(Debug)]
struct Entry {
    image: BucketItem,
    stored_at: i64,
}

#[derive(Debug)]
pub(crate) struct RejectionCache {
    ttl_ms: i64,
    capacity: usize,
    entries: Mutex<HashMap<BucketKey, Entry, foldhash::quality::RandomState>>,
}

impl RejectionCache {
    pub(crate) fn new(ttl_ms: i64, capacity: usize) -> RejectionCache {
        RejectionCache {
            ttl_ms,
            capacity: capacity.max(1),
            entries: Mutex::new(HashMap::default()),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.ttl_ms > 0
    }

    /// Remembers the image of a shard seen at `now`.
    pub(crate) fn remember(&self, key: &BucketKey, image: &BucketItem, now: i64) {
        if !self.enabled() {
            return;
        }
        let mut g = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if g.len() >= self.capacity && !g.contains_key(key) {
            let ttl = self.ttl_ms;
            g.retain(|_, e| now - e.stored_at < ttl);
            if g.len() >= self.capacity {
                g.clear();
            }
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
        let mut g = self.entries.lock().unwrap_or_else(|e| e.into_inner());
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
        let g = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        g.get(key).map(|e| e.image.clone())
    }

    /// A fresh image of a shard, if any.
    pub(crate) fn fresh(&self, key: &BucketKey, now: i64) -> Option<BucketItem> {
        if !self.enabled() {
            return None;
        }
        let g = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let e = g.get(key)?;
        let age = now - e.stored_at;
        let expired = e.image.ttl.is_some_and(|t| t * 1_000 <= now);
        (age >= 0 && age < self.ttl_ms && !expired).then(|| e.image.clone())
    }
}

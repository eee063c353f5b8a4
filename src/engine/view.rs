//! A read-only handle on what an engine holds (counters, shard counts, the rejection
//! cache, leases), independent of the store type, for metrics. It changes nothing.

use std::sync::Arc;

use super::{lease, rejection, shard, EngineStats, HotBucket};

/// Read access to what an engine holds, for metrics, independent of the store type.
#[derive(Debug, Clone)]
pub struct EngineView {
    pub(super) stats: Arc<EngineStats>,
    pub(super) shards: Arc<shard::ShardCounts>,
    pub(super) rejections: Arc<rejection::RejectionCache>,
    pub(super) leases: Option<Arc<lease::LeaseBook>>,
}

impl EngineView {
    /// Millitokens held in leases now (0 with leases off).
    pub fn leased_outstanding(&self) -> i64 {
        self.leases.as_ref().map_or(0, |b| b.outstanding())
    }

    /// Whether this engine leases hot buckets.
    pub fn leases_on(&self) -> bool {
        self.leases.is_some()
    }

    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Up to `limit` sharded buckets, most shards first: `(entity, resource, count)`.
    pub fn hottest(&self, limit: usize) -> Vec<HotBucket> {
        self.shards.hottest(limit)
    }

    /// Shard images the rejection cache holds now.
    pub fn rejection_cache_entries(&self) -> usize {
        self.rejections.entries()
    }

    /// Forgets every shard count learnt, as a full cache partition is cleared (tests
    /// use it to clear the cache at a chosen moment).
    #[doc(hidden)]
    pub fn forget_shard_counts(&self) {
        self.shards.clear();
    }
}

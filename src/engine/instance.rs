//! The [`Engine`] itself: its parts (store, clock, shard draw, caches, leases, counters),
//! its construction, and the accessors the server and the tests use. The acquire
//! algorithm that runs on it is `acquire/` (the driver and its steps); the lease work is
//! `lease/`.

use std::sync::Arc;

use super::{
    inflight, lease, rejection, shard, Clock, EngineOptions, EngineStats, EngineView, LimitParams,
    RandomDraw, ShardDraw, SystemClock,
};
use crate::store::BucketStore;

/// The engine: one per process, shared by every request.
pub struct Engine<S: BucketStore> {
    pub(super) store: Arc<S>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) draw: Arc<dyn ShardDraw>,
    pub(super) options: EngineOptions,
    pub(super) wcu: LimitParams,
    pub(super) shards: Arc<shard::ShardCounts>,
    pub(super) rejections: Arc<rejection::RejectionCache>,
    pub(super) slow_passes: inflight::SlowPasses,
    pub(super) leases: Option<Arc<lease::LeaseBook>>,
    /// Set when the lease task died: no request is answered from (or waits for) a lease
    /// any more, every one goes to the store (see `lease/mod.rs`).
    pub(super) leasing_failed: std::sync::atomic::AtomicBool,
    pub(super) stats: Arc<EngineStats>,
    pub(super) ceiling_log: crate::support::throttle::LogThrottle,
}

impl<S: BucketStore> std::fmt::Debug for Engine<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl<S: BucketStore> Engine<S> {
    pub fn new(store: Arc<S>, options: EngineOptions) -> Engine<S> {
        Self::with_parts(store, options, Arc::new(SystemClock), Arc::new(RandomDraw))
    }

    /// An engine with an explicit clock and shard draw (tests freeze both).
    pub fn with_parts(
        store: Arc<S>,
        options: EngineOptions,
        clock: Arc<dyn Clock>,
        draw: Arc<dyn ShardDraw>,
    ) -> Engine<S> {
        let budget = options.partition_write_budget.max(1);
        Engine {
            store,
            clock,
            draw,
            wcu: LimitParams::new(budget, budget, 1_000),
            shards: Arc::default(),
            rejections: Arc::new(rejection::RejectionCache::new(
                options.rejection_cache_ms,
                options.rejection_cache_entries,
            )),
            slow_passes: inflight::SlowPasses::default(),
            leases: options
                .leases
                .clone()
                .map(|o| Arc::new(lease::LeaseBook::new(o))),
            leasing_failed: std::sync::atomic::AtomicBool::new(false),
            options,
            stats: Arc::default(),
            ceiling_log: crate::support::throttle::LogThrottle::new(
                std::time::Duration::from_secs(10),
            ),
        }
    }

    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    pub fn stats(&self) -> &Arc<EngineStats> {
        &self.stats
    }

    /// A handle on the engine's counters, shard counts and rejection cache, for metrics.
    pub fn view(&self) -> EngineView {
        EngineView {
            stats: self.stats.clone(),
            shards: self.shards.clone(),
            rejections: self.rejections.clone(),
            leases: self.leases.clone(),
        }
    }

    /// Drops the rejection-cache entries no request can use any more (the server calls
    /// this on a timer; see `rejection.rs`). Returns how many were dropped.
    pub fn prune_rejections(&self) -> usize {
        self.rejections.prune(self.clock.now_ms())
    }

    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// The shard count this process knows for (entity, resource).
    pub fn known_shard_count(&self, entity: &str, resource: &str) -> u32 {
        self.shards.get(entity, resource)
    }

    /// Teaches the shard count cache (tests set up scenarios with it).
    pub fn learn_shard_count(&self, entity: &str, resource: &str, count: u32) {
        self.shards.learn(entity, resource, count);
    }
}

//! The pre-shard token-bucket engine: token-bucket math, plans, and the acquire algorithm
//! (fast path, failure classification, slow path, consumption-only retry, `wcu`, shard
//! doubling, lazy shard creation, retry on another shard, cascade, rejection cache).
//!
//! The engine is written once against the [`BucketStore`] contract and never knows which
//! store it runs on, nor anything about gRPC. Time comes from a [`Clock`] so that tests
//! can freeze it.

mod acquire;
pub mod bucket;
mod cached;
mod clock;
mod inflight;
mod lease;
mod outcome;
mod partitioned;
mod pass;
pub mod plan;
mod refund;
mod rejection;
mod resolve;
mod shard;
mod slow;
mod stats;

use std::sync::Arc;

use smallvec::SmallVec;
use thiserror::Error;

pub use acquire::CONTENTION_RETRY_MS;
pub use bucket::{LimitParams, ShardShare};
pub use clock::{Clock, ManualClock, SystemClock};
pub use lease::LeaseOptions;
pub use shard::{HotBucket, RandomDraw, ScriptedDraw, ShardDraw};
pub use stats::{Counted, EngineStats};

use crate::store::{BucketStore, Name, Stamp, StoreError};
use crate::text::quote;

pub use crate::store::MAX_SHARD_COUNT;

/// Writes per second one shard item absorbs before the engine spreads the bucket wider:
/// DynamoDB's per-partition write ceiling.
pub const DEFAULT_PARTITION_WRITE_BUDGET: u64 = 1_000;

/// A budget so large it never triggers doubling (the memory store's default: one process
/// has no partitions to protect).
pub const UNLIMITED_PARTITION_WRITE_BUDGET: u64 = 1_000_000_000_000;

/// How long a refused image may answer repeat refusals without a store call.
pub const DEFAULT_REJECTION_CACHE_MS: i64 = 1_000;

/// One limit of a bucket that a request draws on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitClaim {
    /// The limit's name inside the bucket item.
    pub limit: Name,
    pub params: LimitParams,
    /// Millitokens to take; 0 checks without consuming (fails while in debt).
    pub amount: i64,
    /// Overdraft: always debited, may drive the balance negative; reported over when the
    /// balance was short.
    pub forced: bool,
}

impl LimitClaim {
    /// A gated claim larger than `share`'s ceiling: no shard of that size can ever admit
    /// it (the per-shard request ceiling).
    pub fn exceeds(&self, share: ShardShare) -> bool {
        !self.forced && self.amount > share.ceiling
    }
}

/// Everything one request takes from one (entity, resource) bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketClaim {
    pub entity: Name,
    pub resource: Name,
    /// Distinct limit names.
    pub limits: SmallVec<[LimitClaim; 2]>,
    /// This bucket is a cascading child: it never takes the child-only shard retry.
    pub cascades: bool,
    /// Never answered from a lease (a rule's `lease: false`): each request is its own
    /// store debit, so requests on several servers are decided in the store's order.
    pub strict: bool,
}

/// One all-or-nothing acquisition: every gated claim fits and is debited, or none is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Acquire {
    /// Distinct (entity, resource) pairs.
    pub buckets: SmallVec<[BucketClaim; 2]>,
}

/// How one limit came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOutcome {
    /// The limit covered its amount (for a forced claim: before the debit).
    pub fits: bool,
    /// Millitokens left on the shard after this request (refilled to now; not debited when
    /// the request was refused).
    pub remaining: i64,
    /// The shard's share of the limit.
    pub share: ShardShare,
    /// Undivided refill amount (the fallback rate for a share that floors to zero).
    pub ra: i64,
    /// Milliseconds until the claimed amount fits (`Some(0)` if it fits, `None` if never:
    /// the per-shard request ceiling or a limit that does not refill).
    pub wait_ms: Option<i64>,
}

/// How one bucket came out: the shard that answered and its limits, in claim order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketOutcome {
    pub shard: u32,
    pub shard_count: u32,
    /// The shard's item as this request left it, for a refund (see `BucketStore::credit`).
    pub stamp: Stamp,
    pub limits: SmallVec<[LimitOutcome; 2]>,
    /// Answered from a lease of this process: a refund goes back to the lease.
    pub from_lease: bool,
}

/// The engine's answer to an [`Acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Every gated claim was debited (and nothing otherwise).
    pub admitted: bool,
    /// Per bucket, in request order.
    pub buckets: SmallVec<[BucketOutcome; 2]>,
}

/// Engine failures: the store failed, with the bucket it concerned (its entity shown
/// elided: it holds request values).
#[derive(Debug, Error)]
pub enum EngineError {
    #[error("bucket of entity '{}' resource '{resource}': {source}", quote(entity))]
    Store {
        entity: String,
        resource: String,
        #[source]
        source: StoreError,
    },
    #[error("invalid acquire: {0}")]
    Invalid(String),
}

impl EngineError {
    /// Whether the error is the request's own (the store refused its key or item), not
    /// the store's: the request is answered as invalid, never by `failure_mode`.
    pub fn is_request_error(&self) -> bool {
        matches!(
            self,
            EngineError::Invalid(_)
                | EngineError::Store {
                    source: StoreError::Invalid { .. },
                    ..
                }
        )
    }
}

/// Tunables of the engine.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Writes/s one shard absorbs (the reserved `wcu` limit's capacity and refill).
    pub partition_write_budget: u64,
    /// Rejection cache lifetime in ms (0 disables it).
    pub rejection_cache_ms: i64,
    /// Rejection cache size in entries.
    pub rejection_cache_entries: usize,
    /// Item TTL = this × the longest time-to-full of its limits.
    pub ttl_multiplier: i64,
    /// Token leases for hot buckets (`None`: every decision is its own store debit).
    pub leases: Option<LeaseOptions>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            partition_write_budget: DEFAULT_PARTITION_WRITE_BUDGET,
            rejection_cache_ms: DEFAULT_REJECTION_CACHE_MS,
            rejection_cache_entries: 10_000,
            ttl_multiplier: 7,
            leases: None,
        }
    }
}

/// Read access to what an engine holds, for metrics, independent of the store type.
#[derive(Debug, Clone)]
pub struct EngineView {
    stats: Arc<EngineStats>,
    shards: Arc<shard::ShardCounts>,
    rejections: Arc<rejection::RejectionCache>,
    leases: Option<Arc<lease::LeaseBook>>,
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

/// The engine: one per process, shared by every request.
pub struct Engine<S: BucketStore> {
    store: Arc<S>,
    clock: Arc<dyn Clock>,
    draw: Arc<dyn ShardDraw>,
    options: EngineOptions,
    wcu: LimitParams,
    shards: Arc<shard::ShardCounts>,
    rejections: Arc<rejection::RejectionCache>,
    slow_passes: inflight::SlowPasses,
    leases: Option<Arc<lease::LeaseBook>>,
    /// Set when the lease task died: no request is answered from (or waits for) a lease
    /// any more, every one goes to the store (see `lease/mod.rs`).
    leasing_failed: std::sync::atomic::AtomicBool,
    stats: Arc<EngineStats>,
    ceiling_log: crate::throttle::LogThrottle,
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
            ceiling_log: crate::throttle::LogThrottle::new(std::time::Duration::from_secs(10)),
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

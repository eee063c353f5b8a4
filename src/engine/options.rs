//! The engine's tunables and their defaults: the write budget of one shard item, the
//! rejection cache, item lifetimes, leases.

use super::LeaseOptions;

/// Writes per second one shard item absorbs before the engine spreads the bucket wider:
/// DynamoDB's per-partition write ceiling.
pub const DEFAULT_PARTITION_WRITE_BUDGET: u64 = 1_000;

/// A budget so large it never triggers doubling (the memory store's default: one process
/// has no partitions to protect).
pub const UNLIMITED_PARTITION_WRITE_BUDGET: u64 = 1_000_000_000_000;

/// How long a refused image may answer repeat refusals without a store call.
pub const DEFAULT_REJECTION_CACHE_MS: i64 = 1_000;

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

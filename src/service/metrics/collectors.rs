//! What the metrics read only at scrape time: the engine's counters, the rejection
//! cache's size, outstanding lease tokens and the most sharded buckets (from an
//! `EngineView`), the capacity DynamoDB reported consumed (from the store's call
//! ledger), the memory store's size and evictions, the Redis store's calls per node (its
//! own count), and the store calls left running by callers that gave up (from the
//! detached store's `Pressure`). Must not record anything:
//! the request path never calls here.

use std::collections::BTreeMap;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::labels::OperationLabel;
use crate::engine::EngineView;
use crate::store::detached::Pressure;
use crate::store::memory::MemoryStats;
use crate::store::metered::{CallKind, CallTotals};

/// How many sharded buckets `shardgate_bucket_shards` lists.
const HOT_BUCKETS_LISTED: usize = 50;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NodeLabel {
    node: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BucketLabels {
    entity: String,
    resource: String,
}

/// Engine counters and learnt shard counts, read at scrape time.
#[derive(Debug)]
pub(super) struct EngineCollector {
    pub(super) engine: EngineView,
}

impl Collector for EngineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for counted in self.engine.stats().counted() {
            let c = ConstCounter::new(counted.value);
            let m = encoder.encode_descriptor(counted.name, counted.help, None, c.metric_type())?;
            c.encode(m)?;
        }
        let held = ConstGauge::new(
            i64::try_from(self.engine.rejection_cache_entries()).unwrap_or(i64::MAX),
        );
        held.encode(encoder.encode_descriptor(
            "rejection_cache_entries",
            "Shard images the rejection cache holds (buckets short or refused within about two cache lifetimes)",
            None,
            held.metric_type(),
        )?)?;
        if self.engine.leases_on() {
            let leased = ConstGauge::new(self.engine.leased_outstanding() as f64 / 1_000.0);
            leased.encode(encoder.encode_descriptor(
                "lease_tokens_outstanding",
                "Tokens this server holds in leases (taken from their shards, not used yet)",
                None,
                leased.metric_type(),
            )?)?;
        }
        let hot = self.engine.hottest(HOT_BUCKETS_LISTED);
        if !hot.is_empty() {
            let mut m = encoder.encode_descriptor(
                "bucket_shards",
                "Shard count of the most sharded buckets this server knows",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for bucket in hot {
                let labels = BucketLabels {
                    entity: bucket.entity,
                    resource: bucket.resource,
                };
                let g = ConstGauge::new(i64::from(bucket.shard_count));
                g.encode(m.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// DynamoDB's own account of the calls made: capacity units it reported consumed, by
/// operation (read at scrape time from the store's call ledger).
pub(super) struct CapacityCollector {
    pub(super) totals: Box<dyn Fn() -> BTreeMap<CallKind, CallTotals> + Send + Sync>,
}

impl std::fmt::Debug for CapacityCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CapacityCollector")
    }
}

impl Collector for CapacityCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut by_operation: BTreeMap<&'static str, f64> = BTreeMap::new();
        for (kind, t) in (self.totals)() {
            *by_operation.entry(kind.operation).or_default() += t.capacity;
        }
        let mut m = encoder.encode_descriptor(
            "store_consumed_capacity_units",
            "Capacity units DynamoDB reported consumed (ReturnConsumedCapacity), by operation",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (operation, units) in by_operation {
            let c = ConstCounter::new(units);
            c.encode(m.encode_family(&OperationLabel { operation })?)?;
        }
        Ok(())
    }
}

/// The memory store's items, the bytes charged against its bound, and what it evicted
/// (read at scrape time from the store).
pub(super) struct MemoryStoreCollector {
    pub(super) stats: Box<dyn Fn() -> MemoryStats + Send + Sync>,
}

impl std::fmt::Debug for MemoryStoreCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MemoryStoreCollector")
    }
}

impl Collector for MemoryStoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = (self.stats)();
        let gauges = [
            (
                "memory_store_items",
                "Bucket items the memory store holds",
                stats.items,
            ),
            (
                "memory_store_bytes",
                "Bytes the memory store's items are charged against its bound (an upper bound of what they take)",
                stats.bytes,
            ),
            (
                "memory_store_max_bytes",
                "The memory store's bound (--memory-max-bytes)",
                stats.max_bytes,
            ),
        ];
        for (name, help, value) in gauges {
            let g = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        let mut m = encoder.encode_descriptor(
            "memory_store_evictions",
            "Items the memory store dropped, by reason: full (every limit refilled: the same as no item) or active (still in use, re-created full: may over-admit) to stay within its bound, expired (the expiry sweep)",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (reason, value) in [
            ("full", stats.evicted_full),
            ("active", stats.evicted_active),
            ("expired", stats.expired),
        ] {
            let c = ConstCounter::new(value);
            c.encode(m.encode_family(&ReasonLabel { reason })?)?;
        }
        Ok(())
    }
}

/// Store calls whose callers gave up, still running, and calls shed because too many
/// were (see `store/detached.rs`).
#[derive(Debug)]
pub(super) struct PressureCollector {
    pub(super) pressure: Arc<Pressure>,
}

impl Collector for PressureCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let abandoned =
            ConstGauge::new(i64::try_from(self.pressure.abandoned()).unwrap_or(i64::MAX));
        abandoned.encode(encoder.encode_descriptor(
            "store_calls_abandoned",
            "Store calls still running whose callers gave up (each call ends by the store timeout and starts no retry meanwhile)",
            None,
            abandoned.metric_type(),
        )?)?;
        let shed = ConstCounter::new(self.pressure.shed());
        shed.encode(encoder.encode_descriptor(
            "store_calls_shed",
            "Store calls not sent because too many calls whose callers gave up were still running (answered by failure_mode)",
            None,
            shed.metric_type(),
        )?)?;
        Ok(())
    }
}

/// The Redis store's keyed calls by the node they were sent to (its address as the
/// cluster reports it; a bounded set, see `store/redis/nodes.rs`).
pub(super) struct RedisNodeCollector {
    pub(super) nodes: Box<dyn Fn() -> Vec<(String, u64)> + Send + Sync>,
}

impl std::fmt::Debug for RedisNodeCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RedisNodeCollector")
    }
}

impl Collector for RedisNodeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut m = encoder.encode_descriptor(
            "redis_node_operations",
            "Redis store calls (scripts, reads) sent to each node: on a Cluster the master owning the key's slot by the store's slot map",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (node, operations) in (self.nodes)() {
            let c = ConstCounter::new(operations);
            c.encode(m.encode_family(&NodeLabel { node })?)?;
        }
        let undo = ConstCounter::new(crate::store::counters::spread_undos_failed());
        undo.encode(encoder.encode_descriptor(
            "redis_spread_undo_failed",
            "Writes of a Redis Cluster commit over several slots, refused on a later slot, that were neither undone nor given back (their claim stays taken until the bucket refills: fewer admissions, never more)",
            None,
            undo.metric_type(),
        )?)?;
        Ok(())
    }
}

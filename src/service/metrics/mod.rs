//! Prometheus metrics: per-rule hit counters in envoyproxy/ratelimit's terms, config
//! loads, store calls by outcome (an error's class among them), the capacity DynamoDB
//! reported, store calls left running or shed, the memory store's size and evictions, the
//! engine's counters (named and described in `engine/stats.rs`), the most sharded buckets,
//! answers given by `failure_mode`, request latency and requests in flight, refused TLS
//! handshakes, connections the gRPC port failed to accept, and its connection-level
//! metrics and calls that panicked (`port.rs`); the Rate Limit Quota Service's streams,
//! buckets and assignments (`rlqs.rs`); and, when asked, the same
//! totals as statsd lines in envoyproxy/ratelimit's names (`statsd.rs`; the socket is
//! `server/statsd.rs`), or those names mapped by a statsd_exporter mapping file
//! (`statsd_mapping.rs`) into the page upstream's Prometheus port serves
//! (`statsd_prometheus.rs`; the listener is `server/upstream_prometheus.rs`).
//!
//! Recording is cheap and lock-free on the hot path except for the first sighting of a
//! label set: what every request moves is striped per thread (`support/striped.rs`), the rules'
//! counters are looked up once per config load (`rule_hits.rs`, which also caps the
//! distinct keys hostile descriptor values could create), and what is read only at
//! scrape time is collected then (`collectors.rs`).

mod collectors;
mod labels;
mod port;
mod registry;
mod rlqs;
mod rule_hits;
pub mod statsd;
pub mod statsd_mapping;
pub mod statsd_prometheus;
mod store_calls;
mod striped;

pub use port::{ConnectionClose, PanicEnd, PortMetrics};
pub use registry::Metrics;
pub use rlqs::RlqsMetrics;
pub use rule_hits::{HitOutcome, RuleCounters, MAX_RULE_KEYS};
pub use store_calls::StoreCalls;

//! Prometheus metrics: per-rule hit counters in envoyproxy/ratelimit's terms, config
//! loads, store calls and the capacity DynamoDB reported, the engine's counters (named
//! and described in `engine/stats.rs`), the most sharded buckets, answers given by
//! `failure_mode`, request latency and requests in flight, and refused TLS handshakes.
//!
//! Recording is cheap and lock-free on the hot path except for the first sighting of a
//! label set; the number of distinct rule keys is capped so hostile descriptor values
//! cannot grow memory without bound.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use arc_swap::ArcSwap;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::config::{hit_key, Config, DescriptorEntry, Rule};
use crate::engine::EngineView;
use crate::store::metered::CallObserver;
use crate::store::metered::{CallKind, CallTotals};

/// Most distinct rule keys tracked; further keys are counted under `_overflow_`.
pub const MAX_RULE_KEYS: usize = 10_000;

/// How many sharded buckets `shardgate_bucket_shards` lists.
const HOT_BUCKETS_LISTED: usize = 50;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    domain: String,
    key: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    operation: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HashLabel {
    hash: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BucketLabels {
    entity: String,
    resource: String,
}

/// How one limited descriptor came out, for its rule's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitOutcome {
    Within {
        near: bool,
    },
    Over,
    /// Over, but the rule (or the server) is in shadow mode.
    ShadowOver,
}

/// The counters of one rule's own stats key, looked up once per config load so that
/// counting a hit is a few atomic adds (no label strings, no map lookup).
#[derive(Debug, Clone)]
pub struct RuleCounters {
    total: Counter,
    over: Counter,
    near: Counter,
    within: Counter,
    shadow: Counter,
}

/// Every metric shardgate exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    total_hits: Family<RuleLabels, Counter>,
    over_limit: Family<RuleLabels, Counter>,
    near_limit: Family<RuleLabels, Counter>,
    within_limit: Family<RuleLabels, Counter>,
    shadow_mode: Family<RuleLabels, Counter>,
    rule_keys: Mutex<HashSet<(String, String)>>,
    domain_not_found: Counter,
    global_shadow_mode: Counter,
    config_load_success: Counter,
    config_load_error: Counter,
    config_info: Family<HashLabel, Gauge>,
    store_calls: Family<StoreLabels, Counter>,
    store_latency: Family<OperationLabel, Histogram>,
    /// The two families' series of each (operation, outcome) seen, so that recording a
    /// store call takes no lock (a `Family` lookup takes a read lock and hashes the labels).
    store_series: ArcSwap<StoreSeries>,
    request_latency: Histogram,
    in_flight: Gauge,
    store_failures: Family<FailureLabels, Counter>,
    store_refused_requests: Counter,
    tls_handshake_failures: Family<ReasonLabel, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

/// Labels of a request answered without the store: why, and how.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    /// `store` (it failed), `deadline` (no answer in time), `circuit_open`.
    cause: &'static str,
    /// `unavailable` (a `deny` rule: UNAVAILABLE) or `allowed` (OK, nothing counted).
    answer: &'static str,
}

/// Engine counters and learnt shard counts, read at scrape time.
#[derive(Debug)]
struct EngineCollector {
    engine: EngineView,
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
struct CapacityCollector {
    totals: Box<dyn Fn() -> BTreeMap<CallKind, CallTotals> + Send + Sync>,
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

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("shardgate");
        let m = Metrics {
            registry: Mutex::new(Registry::default()),
            total_hits: Family::default(),
            over_limit: Family::default(),
            near_limit: Family::default(),
            within_limit: Family::default(),
            shadow_mode: Family::default(),
            rule_keys: Mutex::new(HashSet::new()),
            domain_not_found: Counter::default(),
            global_shadow_mode: Counter::default(),
            config_load_success: Counter::default(),
            config_load_error: Counter::default(),
            config_info: Family::default(),
            store_calls: Family::default(),
            store_latency: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
            }),
            store_series: ArcSwap::default(),
            request_latency: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            in_flight: Gauge::default(),
            store_failures: Family::default(),
            store_refused_requests: Counter::default(),
            tls_handshake_failures: Family::default(),
        };
        registry.register(
            "rate_limit_total_hits",
            "Hits of a rule (descriptors × hits)",
            m.total_hits.clone(),
        );
        registry.register(
            "rate_limit_over_limit",
            "Hits refused by a rule",
            m.over_limit.clone(),
        );
        registry.register(
            "rate_limit_near_limit",
            "Hits admitted with 80% or more of the rule's capacity used",
            m.near_limit.clone(),
        );
        registry.register(
            "rate_limit_within_limit",
            "Hits admitted by a rule",
            m.within_limit.clone(),
        );
        registry.register(
            "rate_limit_shadow_mode",
            "Hits over a rule's limit that shadow mode let through",
            m.shadow_mode.clone(),
        );
        registry.register(
            "domain_not_found",
            "Requests for a domain no config defines",
            m.domain_not_found.clone(),
        );
        registry.register(
            "global_shadow_mode",
            "Requests over their limits answered OK by global shadow mode",
            m.global_shadow_mode.clone(),
        );
        registry.register(
            "config_load_success",
            "Configs loaded and put in force",
            m.config_load_success.clone(),
        );
        registry.register(
            "config_load_error",
            "Config loads rejected (the previous config stays)",
            m.config_load_error.clone(),
        );
        registry.register(
            "config_info",
            "The config in force, by content hash (value 1)",
            m.config_info.clone(),
        );
        registry.register(
            "store_calls",
            "Store calls by operation and outcome",
            m.store_calls.clone(),
        );
        registry.register(
            "store_call_duration_seconds",
            "Store call latency by operation",
            m.store_latency.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "ShouldRateLimit answer latency",
            m.request_latency.clone(),
        );
        registry.register(
            "requests_in_flight",
            "ShouldRateLimit calls being answered",
            m.in_flight.clone(),
        );
        registry.register(
            "store_failure_answers",
            "Requests answered by failure_mode because the store failed, gave no answer by the call's deadline, or its circuit was open",
            m.store_failures.clone(),
        );
        registry.register(
            "store_refused_requests",
            "Requests answered INVALID_ARGUMENT because the store refused their bucket (a key or item it cannot hold)",
            m.store_refused_requests.clone(),
        );
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes refused or failed on the gRPC port, by reason",
            m.tls_handshake_failures.clone(),
        );
        Metrics {
            registry: Mutex::new(registry),
            ..m
        }
    }

    /// Adds the engine's counters and shard counts (read at each scrape).
    pub fn attach_engine(&self, engine: EngineView) {
        self.registry
            .lock()
            .register_collector(Box::new(EngineCollector { engine }));
    }

    /// Adds DynamoDB's consumed capacity, read from `totals` (the store's call ledger) at
    /// each scrape.
    pub fn attach_capacity(
        &self,
        totals: impl Fn() -> BTreeMap<CallKind, CallTotals> + Send + Sync + 'static,
    ) {
        self.registry
            .lock()
            .register_collector(Box::new(CapacityCollector {
                totals: Box::new(totals),
            }));
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let registry = self.registry.lock();
        prometheus_client::encoding::text::encode(&mut out, &registry)
            .expect("writing to a String cannot fail");
        out
    }

    pub fn config_loaded(&self, hash: &str) {
        self.config_load_success.inc();
        self.config_info.clear();
        self.config_info
            .get_or_create(&HashLabel {
                hash: hash.to_string(),
            })
            .set(1);
    }

    pub fn config_rejected(&self) {
        self.config_load_error.inc();
    }

    /// A request answered by `failure_mode` (see [`FailureLabels`]).
    pub fn store_failure(&self, cause: &'static str, answer: &'static str) {
        self.store_failures
            .get_or_create(&FailureLabels { cause, answer })
            .inc();
    }

    /// A request whose bucket the store refused.
    pub fn request_refused_by_store(&self) {
        self.store_refused_requests.inc();
    }

    /// A TLS handshake on the gRPC port that did not complete, by reason (one of the
    /// fixed labels of `tls.rs`' `HandshakeFailure`).
    pub fn tls_handshake_failed(&self, reason: &'static str) {
        self.tls_handshake_failures
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }

    pub fn domain_not_found(&self) {
        self.domain_not_found.inc();
    }

    pub fn global_shadow_mode(&self) {
        self.global_shadow_mode.inc();
    }

    /// Marks a request in flight until the guard drops, then records its latency.
    pub fn request(&self) -> RequestTimer<'_> {
        self.in_flight.inc();
        RequestTimer {
            metrics: self,
            started: std::time::Instant::now(),
        }
    }

    /// The counters of every rule of `config` whose labels do not depend on the request
    /// (indexed by [`Rule::index`]); rules whose key carries request values
    /// ([`Rule::stats_key_varies`]) get none and are labelled per request.
    pub fn rule_counters(&self, config: &Config) -> Vec<Option<RuleCounters>> {
        let mut counters = vec![None; config.rule_count()];
        for rule in config.domains().flat_map(|d| d.rules()) {
            if rule.stats_key_varies() {
                continue;
            }
            if let Some(slot) = rule.index.and_then(|i| counters.get_mut(i)) {
                let labels = RuleLabels {
                    domain: rule.domain.to_string(),
                    key: rule.stats_key.clone(),
                };
                *slot = Some(self.counters_for(&labels));
            }
        }
        counters
    }

    fn counters_for(&self, labels: &RuleLabels) -> RuleCounters {
        RuleCounters {
            total: self.total_hits.get_or_create_owned(labels),
            over: self.over_limit.get_or_create_owned(labels),
            near: self.near_limit.get_or_create_owned(labels),
            within: self.within_limit.get_or_create_owned(labels),
            shadow: self.shadow_mode.get_or_create_owned(labels),
        }
    }

    /// Counts `hits` against `rule` for a descriptor with these entries; `counters` are
    /// the request's config's [`Metrics::rule_counters`].
    pub fn record_hit<E: DescriptorEntry>(
        &self,
        counters: &[Option<RuleCounters>],
        rule: &Rule,
        entries: &[E],
        hits: u64,
        outcome: HitOutcome,
    ) {
        if let Some(c) = rule
            .index
            .and_then(|i| counters.get(i))
            .and_then(Option::as_ref)
        {
            return count(c, hits, outcome);
        }
        // Labels from the request: only the counters that move are created.
        let labels = self.rule_labels(rule, entries);
        self.total_hits.get_or_create(&labels).inc_by(hits);
        match outcome {
            HitOutcome::Within { near } => {
                self.within_limit.get_or_create(&labels).inc_by(hits);
                if near {
                    self.near_limit.get_or_create(&labels).inc_by(hits);
                }
            }
            HitOutcome::Over => {
                self.over_limit.get_or_create(&labels).inc_by(hits);
            }
            HitOutcome::ShadowOver => {
                self.over_limit.get_or_create(&labels).inc_by(hits);
                self.shadow_mode.get_or_create(&labels).inc_by(hits);
            }
        }
    }

    /// envoyproxy/ratelimit's stats key ([`hit_key`]), capped in distinct values when it
    /// carries request values.
    fn rule_labels<E: DescriptorEntry>(&self, rule: &Rule, entries: &[E]) -> RuleLabels {
        let key = hit_key(rule, entries);
        let domain = rule.domain.to_string();
        if !rule.stats_key_varies() {
            // A rule's own key: as many as the config has rules, no cap needed.
            return RuleLabels { domain, key };
        }
        let mut seen = self.rule_keys.lock();
        let pair = (domain.clone(), key);
        if seen.contains(&pair) || seen.len() < MAX_RULE_KEYS {
            seen.insert(pair.clone());
            RuleLabels {
                domain,
                key: pair.1,
            }
        } else {
            RuleLabels {
                domain,
                key: "_overflow_".to_string(),
            }
        }
    }
}

fn count(c: &RuleCounters, hits: u64, outcome: HitOutcome) {
    c.total.inc_by(hits);
    match outcome {
        HitOutcome::Within { near } => {
            c.within.inc_by(hits);
            if near {
                c.near.inc_by(hits);
            }
        }
        HitOutcome::Over => {
            c.over.inc_by(hits);
        }
        HitOutcome::ShadowOver => {
            c.over.inc_by(hits);
            c.shadow.inc_by(hits);
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

/// Ends a request's in-flight span and records its latency when dropped.
pub struct RequestTimer<'a> {
    metrics: &'a Metrics,
    started: std::time::Instant,
}

impl Drop for RequestTimer<'_> {
    fn drop(&mut self) {
        self.metrics.in_flight.dec();
        self.metrics
            .request_latency
            .observe(self.started.elapsed().as_secs_f64());
    }
}

type StoreSeries =
    HashMap<(&'static str, &'static str), (Counter, Histogram), foldhash::fast::RandomState>;

impl CallObserver for Metrics {
    fn observe(&self, operation: &'static str, outcome: &'static str, elapsed: Duration) {
        let record = |(calls, latency): &(Counter, Histogram)| {
            calls.inc();
            latency.observe(elapsed.as_secs_f64());
        };
        if let Some(series) = self.store_series.load().get(&(operation, outcome)) {
            return record(series);
        }
        // First call of this kind: create its series (they appear in /metrics from now
        // on, as before) and publish them for the next calls.
        let series = (
            self.store_calls
                .get_or_create_owned(&StoreLabels { operation, outcome }),
            self.store_latency
                .get_or_create_owned(&OperationLabel { operation }),
        );
        record(&series);
        self.store_series.rcu(|known| {
            let mut known = StoreSeries::clone(known);
            known.insert((operation, outcome), series.clone());
            known
        });
    }
}

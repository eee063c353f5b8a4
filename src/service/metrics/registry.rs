//! The registry: every metric shardgate records ([`Metrics`]), its labels, and what each
//! request, config load and store call moves in it. What is read only at scrape time is
//! `collectors.rs`'s; upstream's statsd and Prometheus names are `statsd*.rs`'s.

use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use super::labels::{FailureLabels, HashLabel, OperationLabel, ReasonLabel, StoreLabels};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::exponential_buckets;
use prometheus_client::registry::Registry;

use super::rule_hits::{HitOutcome, RuleCounters, RuleHits};
use super::store_calls::{StoreCallSeries, StoreCalls};
use super::{collectors, statsd, statsd_mapping, statsd_prometheus};
use crate::config::{Config, DescriptorEntry, Rule};
use crate::engine::EngineView;
use crate::store::memory::MemoryStats;
use crate::store::metered::CallObserver;
use crate::store::metered::{CallKind, CallTotals};
use crate::support::striped::{StripedCounter, StripedGauge, StripedHistogram};

/// Every metric shardgate exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Mutex<Registry>,
    rule_hits: Arc<RuleHits>,
    domain_not_found: Counter,
    global_shadow_mode: Counter,
    config_load_success: Counter,
    config_load_error: Counter,
    config_info: Family<HashLabel, Gauge>,
    store_calls: Family<StoreLabels, StripedCounter>,
    store_latency: Family<OperationLabel, StripedHistogram>,
    /// The two families' series of each (operation, outcome) seen, so that recording a
    /// store call takes no lock (a `Family` lookup takes a read lock and hashes the labels).
    store_series: ArcSwap<StoreSeries>,
    request_latency: StripedHistogram,
    in_flight: StripedGauge,
    store_failures: Family<FailureLabels, Counter>,
    store_refused_requests: Counter,
    tls_handshake_failures: Family<ReasonLabel, Counter>,
    grpc_accept_failures: Counter,
    statsd_send_failures: Counter,
    statsd_lines_dropped: Counter,
    port: super::port::PortMetrics,
    rlqs: super::rlqs::RlqsMetrics,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("shardgate");
        let m = Metrics {
            registry: Mutex::new(Registry::default()),
            rule_hits: Arc::default(),
            domain_not_found: Counter::default(),
            global_shadow_mode: Counter::default(),
            config_load_success: Counter::default(),
            config_load_error: Counter::default(),
            config_info: Family::default(),
            store_calls: Family::default(),
            store_latency: Family::new_with_constructor(|| {
                StripedHistogram::new(store_latency_bounds())
            }),
            store_series: ArcSwap::default(),
            request_latency: StripedHistogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            in_flight: StripedGauge::default(),
            store_failures: Family::default(),
            store_refused_requests: Counter::default(),
            tls_handshake_failures: Family::default(),
            grpc_accept_failures: Counter::default(),
            statsd_send_failures: Counter::default(),
            statsd_lines_dropped: Counter::default(),
            port: Default::default(),
            rlqs: Default::default(),
        };
        m.register_requests_and_config(&mut registry);
        m.register_calls_and_ports(&mut registry);
        m.port.register(&mut registry);
        m.rlqs.register(&mut registry);
        registry.register_collector(Box::new(m.rule_hits.clone()));
        Metrics {
            registry: Mutex::new(registry),
            ..m
        }
    }

    /// Registers the answers' and the config's metrics (the first on the page).
    fn register_requests_and_config(&self, registry: &mut Registry) {
        registry.register(
            "build",
            "The shardgate answering: its version and optional features (value 1)",
            prometheus_client::metrics::info::Info::new(vec![
                ("version", crate::support::build::VERSION),
                ("features", crate::support::build::FEATURES),
            ]),
        );
        registry.register(
            "domain_not_found",
            "Requests for a domain no config defines (answered OK, unlimited)",
            self.domain_not_found.clone(),
        );
        registry.register(
            "global_shadow_mode",
            "Requests over their limits answered OK by global shadow mode",
            self.global_shadow_mode.clone(),
        );
        registry.register(
            "config_load_success",
            "Configs loaded and put in force",
            self.config_load_success.clone(),
        );
        registry.register(
            "config_load_error",
            "Config loads rejected (the previous config stays)",
            self.config_load_error.clone(),
        );
        registry.register(
            "config_info",
            "The config in force, by content hash (value 1)",
            self.config_info.clone(),
        );
    }

    /// Registers the store calls', the latencies', the failure answers' and the gRPC
    /// port's metrics, after [`Self::register_requests_and_config`]'s.
    fn register_calls_and_ports(&self, registry: &mut Registry) {
        registry.register(
            "store_calls",
            "Store calls by operation and outcome",
            self.store_calls.clone(),
        );
        registry.register(
            "store_call_duration_seconds",
            "Store call latency by operation",
            self.store_latency.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "ShouldRateLimit answer latency",
            self.request_latency.clone(),
        );
        registry.register(
            "requests_in_flight",
            "ShouldRateLimit calls being answered",
            self.in_flight.clone(),
        );
        registry.register(
            "store_failure_answers",
            "Requests answered by failure_mode because the store failed, gave no answer by the call's deadline, or its circuit was open",
            self.store_failures.clone(),
        );
        registry.register(
            "store_refused_requests",
            "Requests answered INVALID_ARGUMENT because the store refused their bucket (a key or item it cannot hold)",
            self.store_refused_requests.clone(),
        );
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes refused or failed on the gRPC port, by reason",
            self.tls_handshake_failures.clone(),
        );
        registry.register(
            "grpc_accept_failures",
            "Connections the gRPC port failed to accept (out of file descriptors, most often); each pauses accepting",
            self.grpc_accept_failures.clone(),
        );
        registry.register(
            "statsd_send_failures",
            "Flushes to statsd that failed (their deltas are sent with the next flush that succeeds)",
            self.statsd_send_failures.clone(),
        );
        registry.register(
            "statsd_lines_dropped",
            "statsd lines never sent: those of the last flush at shutdown when statsd could not be reached",
            self.statsd_lines_dropped.clone(),
        );
    }

    /// What statsd is sent at a flush (`statsd.rs`): the totals under upstream's names.
    pub(crate) fn statsd_reading(&self) -> statsd::Reading {
        let mut counters = Vec::new();
        self.rule_hits.statsd_totals(&mut counters);
        counters.push((
            "ratelimit.service.config_load_success".to_string(),
            self.config_load_success.get(),
        ));
        counters.push((
            "ratelimit.service.config_load_error".to_string(),
            self.config_load_error.get(),
        ));
        let (latency_sum, requests, latency) = self.request_latency.totals();
        counters.push((
            "ratelimit_server.ShouldRateLimit.total_requests".to_string(),
            requests,
        ));
        statsd::Reading {
            counters,
            latency,
            latency_sum,
        }
    }

    /// envoyproxy/ratelimit's Prometheus page: the totals statsd is sent, under
    /// upstream's names, mapped by `mapping` (`statsd_prometheus.rs`).
    pub fn render_statsd_mapped(&self, mapping: &statsd_mapping::StatsdMapping) -> String {
        statsd_prometheus::render(&self.statsd_reading(), mapping)
    }

    /// Adds the engine's counters and shard counts (read at each scrape).
    pub fn attach_engine(&self, engine: EngineView) {
        self.registry
            .lock()
            .register_collector(Box::new(collectors::EngineCollector { engine }));
    }

    /// Adds DynamoDB's consumed capacity, read from `totals` (the store's call ledger) at
    /// each scrape.
    pub fn attach_capacity(
        &self,
        totals: impl Fn() -> BTreeMap<CallKind, CallTotals> + Send + Sync + 'static,
    ) {
        self.registry
            .lock()
            .register_collector(Box::new(collectors::CapacityCollector {
                totals: Box::new(totals),
            }));
    }

    /// Adds the memory store's items, bytes and evictions, read from `stats` (the
    /// store's own account) at each scrape.
    pub fn attach_memory_store(&self, stats: impl Fn() -> MemoryStats + Send + Sync + 'static) {
        self.registry
            .lock()
            .register_collector(Box::new(collectors::MemoryStoreCollector {
                stats: Box::new(stats),
            }));
    }

    /// Adds the Redis store's calls per node, read from `nodes` (the store's own count:
    /// `(address, operations)`) at each scrape.
    pub fn attach_redis_nodes(
        &self,
        nodes: impl Fn() -> Vec<(String, u64)> + Send + Sync + 'static,
    ) {
        self.registry
            .lock()
            .register_collector(Box::new(collectors::RedisNodeCollector {
                nodes: Box::new(nodes),
            }));
    }

    /// Adds the store calls left running by callers that gave up, and those shed (read at
    /// each scrape).
    pub fn attach_pressure(&self, pressure: Arc<crate::store::detached::Pressure>) {
        self.registry
            .lock()
            .register_collector(Box::new(collectors::PressureCollector { pressure }));
    }

    /// The Prometheus text exposition of every metric.
    #[expect(clippy::expect_used, reason = "writing to a String cannot fail")]
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

    /// The gRPC port's connection-level metrics (`port.rs`).
    pub fn port(&self) -> &super::port::PortMetrics {
        &self.port
    }

    pub fn rlqs(&self) -> &super::rlqs::RlqsMetrics {
        &self.rlqs
    }

    /// A connection the gRPC port failed to accept (`accept.rs`).
    pub fn grpc_accept_failed(&self) {
        self.grpc_accept_failures.inc();
    }

    /// Adds a collector read at every scrape (the top values' gauges, when asked for).
    pub fn register_collector(&self, collector: Box<dyn prometheus_client::collector::Collector>) {
        self.registry.lock().register_collector(collector);
    }

    /// Store calls by (operation, outcome) since start, with their latency, for the
    /// operator's page.
    pub fn store_call_totals(&self) -> Vec<StoreCalls> {
        let mut totals: Vec<_> = self
            .store_series
            .load()
            .iter()
            .map(|(&(op, outcome), series)| series.summary(op, outcome))
            .collect();
        totals.sort_unstable_by_key(|c| (c.operation, c.outcome));
        totals
    }

    /// A flush to statsd failed; its deltas wait for the next.
    pub fn statsd_send_failed(&self) {
        self.statsd_send_failures.inc();
    }

    /// `lines` of statsd's were given up on.
    pub fn statsd_dropped(&self, lines: usize) {
        self.statsd_lines_dropped.inc_by(lines as u64);
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
                *slot = Some(self.rule_hits.for_rule(rule));
            }
        }
        counters
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
        match rule
            .index
            .and_then(|i| counters.get(i))
            .and_then(Option::as_ref)
        {
            Some(c) => c.count(hits, outcome),
            None => self
                .rule_hits
                .count_from_request(rule, entries, hits, outcome),
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
        self.metrics.request_latency.observe(self.started.elapsed());
    }
}

/// Each kind of store call's series, striped: every decision makes at least one call.
type StoreSeries =
    HashMap<(&'static str, &'static str), StoreCallSeries, foldhash::fast::RandomState>;

impl CallObserver for Metrics {
    fn observe(&self, operation: &'static str, outcome: &'static str, elapsed: Duration) {
        if let Some(series) = self.store_series.load().get(&(operation, outcome)) {
            return series.record(elapsed);
        }
        // First call of this kind: create its series (they appear in /metrics from now
        // on, as before) and publish them for the next calls.
        let series = StoreCallSeries {
            calls: self
                .store_calls
                .get_or_create_owned(&StoreLabels { operation, outcome }),
            operation_latency: self
                .store_latency
                .get_or_create_owned(&OperationLabel { operation }),
            latency: StripedHistogram::new(store_latency_bounds()),
        };
        series.record(elapsed);
        self.store_series.rcu(|known| {
            let mut known = StoreSeries::clone(known);
            known.insert((operation, outcome), series.clone());
            known
        });
    }
}

/// A store call's latency buckets (seconds): 50 µs doubling to 1.6 s.
fn store_latency_bounds() -> impl Iterator<Item = f64> {
    exponential_buckets(0.000_05, 2.0, 16)
}

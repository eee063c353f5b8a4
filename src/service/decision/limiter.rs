//! The rate limiter ([`RateLimiter`]): the rules in force (a [`Snapshot`] swapped whole on
//! reload), the answer options, readiness, and a call's entry points with its span. The
//! steps it runs are `steps.rs`'s.

use std::sync::Arc;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tokio::time::Instant;
use tracing::Instrument;

use super::call::{CallError, CallState};
use super::events::ConfigEvents;
use crate::config::Config;
use crate::engine::Engine;
use crate::service::answer_options::AnswerOptions;
use crate::service::metrics::{Metrics, RuleCounters};
use crate::service::request::RequestLimits;
use crate::service::response_encoding::Reply;
use crate::service::rlqs::board::RlqsBoard;
use crate::service::top::{RuleTop, TopBoard, TopMetric};
use crate::service::wire::RequestView;
use crate::store::{calls, BucketKey, BucketStore, DEFAULT_STORE_TIMEOUT};
use crate::support::throttle::LogThrottle;

/// At most one warning per this interval about requests for an unknown domain.
const UNKNOWN_DOMAIN_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// The most domain names the unknown-domain warning lists.
const KNOWN_DOMAINS_LISTED: usize = 20;

/// A config in force with the metric counters and the top-values tables of its rules.
pub(super) struct Snapshot {
    pub(super) config: Arc<Config>,
    pub(super) counters: Vec<Option<RuleCounters>>,
    pub(super) top: Vec<Option<Arc<RuleTop>>>,
}

impl Snapshot {
    fn new(config: Arc<Config>, metrics: &Metrics, top: &TopBoard) -> Snapshot {
        Snapshot {
            counters: metrics.rule_counters(&config),
            top: top.for_config(&config),
            config,
        }
    }
}

/// The rate limiter behind the gRPC service: a config snapshot and the engine.
pub struct RateLimiter<S: BucketStore> {
    pub(super) snapshot: ArcSwap<Snapshot>,
    pub(super) engine: Arc<Engine<S>>,
    pub(super) limits: RequestLimits,
    /// The deployment's switches around the decision (global shadow mode, metadata,
    /// headers).
    pub(super) answer: AnswerOptions,
    /// Every rule decided in quota mode (`--global-quota-mode`).
    pub(super) global_quota: bool,
    /// The longest a call may wait for the store, and the deadline of a caller that sets
    /// none (`--store-timeout`).
    pub(super) store_timeout: std::time::Duration,
    pub(super) metrics: Arc<Metrics>,
    /// Each rule's most refused and admitted values (`/top`, the page).
    pub(super) top: Arc<TopBoard>,
    /// When the rules were loaded, and the last load refused.
    pub(super) events: parking_lot::Mutex<ConfigEvents>,
    pub(super) store_failure_log: LogThrottle,
    /// Requests for a domain no rule defines: answered OK, so a domain misspelled between
    /// Envoy and the rules would otherwise turn limiting off silently.
    pub(super) unknown_domain_log: LogThrottle,
    /// The store has answered since start-up (the server's warm-up); health says
    /// NOT_SERVING until it has.
    pub(super) ready: std::sync::atomic::AtomicBool,
    /// The RLQS service's state, once the gRPC port serves it (for `/rlconfig`, `explain`).
    pub(super) rlqs: std::sync::OnceLock<Arc<RlqsBoard>>,
}

impl<S: BucketStore> RateLimiter<S> {
    pub fn new(config: Arc<Config>, engine: Arc<Engine<S>>) -> RateLimiter<S> {
        let metrics = Arc::new(Metrics::new());
        let top = Arc::new(TopBoard::new(true));
        RateLimiter {
            snapshot: ArcSwap::from_pointee(Snapshot::new(config, &metrics, &top)),
            top,
            events: parking_lot::Mutex::new(ConfigEvents::new()),
            engine,
            limits: RequestLimits::default(),
            answer: AnswerOptions::default(),
            global_quota: false,
            store_timeout: DEFAULT_STORE_TIMEOUT,
            metrics,
            store_failure_log: LogThrottle::new(std::time::Duration::from_secs(10)),
            unknown_domain_log: LogThrottle::new(UNKNOWN_DOMAIN_LOG_INTERVAL),
            ready: std::sync::atomic::AtomicBool::new(true),
            rlqs: std::sync::OnceLock::new(),
        }
    }

    /// The RLQS board: the one made first by `make` (the gRPC port's RLQS service), and
    /// whether this call made it.
    pub fn rlqs_board(&self, make: impl FnOnce() -> RlqsBoard) -> (Arc<RlqsBoard>, bool) {
        let mut made = false;
        let board = self.rlqs.get_or_init(|| {
            made = true;
            Arc::new(make())
        });
        (board.clone(), made)
    }

    /// The RLQS board, once a port serves RLQS.
    pub fn rlqs(&self) -> Option<&Arc<RlqsBoard>> {
        self.rlqs.get()
    }

    /// Records into these metrics (shared with the store wrapper and the HTTP surface).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        let config = self.config();
        self.snapshot
            .store(Arc::new(Snapshot::new(config, &metrics, &self.top)));
        self.metrics = metrics;
        self
    }

    /// Keeps each rule's top values (`true`, the default) or not (`--no-top-values`).
    pub fn with_top_values(mut self, on: bool) -> Self {
        self.top = Arc::new(TopBoard::new(on));
        let config = self.config();
        self.snapshot
            .store(Arc::new(Snapshot::new(config, &self.metrics, &self.top)));
        self
    }

    /// Exports each rule's top `n` refused and admitted values as gauges on `/metrics`
    /// (`--top-values-metric`; 0, the default: none). Call after [`Self::with_metrics`].
    pub fn with_top_metric(self, n: usize) -> Self {
        if n > 0 && self.top.enabled() {
            self.metrics
                .register_collector(Box::new(TopMetric::new(self.top.clone(), n)));
        }
        self
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Each rule's most refused and admitted values over the last minutes.
    pub fn top(&self) -> &TopBoard {
        &self.top
    }

    /// Marks whether the store has answered since start-up (see [`Self::readiness`]).
    pub fn set_ready(&self, ready: bool) {
        self.ready
            .store(ready, std::sync::atomic::Ordering::Release);
    }

    /// Whether this server is ready for calls: once its store has answered after
    /// start-up (the server warms it up), and from then on whatever the store does. A
    /// store outage is answered by each rule's `failure_mode`, which only a server that
    /// stays in its callers' endpoints can give; a server taken out instead would leave
    /// Envoy's filter-level failure mode to answer for every rule alike.
    pub fn readiness(&self) -> Result<(), String> {
        if self.ready.load(std::sync::atomic::Ordering::Acquire) {
            Ok(())
        } else {
            Err("warming up: the store has not answered yet".to_string())
        }
    }

    /// Whether the store answers: not before it has since start-up, then one read of a
    /// key no bucket uses, bounded in time.
    pub async fn check_store(&self) -> Result<(), String> {
        self.readiness()?;
        let probe = [BucketKey::new("%health", "%health", 0)];
        match tokio::time::timeout(
            std::time::Duration::from_secs(2),
            self.engine.store().read(&probe),
        )
        .await
        {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(crate::support::text::with_causes(&e)),
            Err(_) => Err("store did not answer within 2 s".to_string()),
        }
    }

    /// The deployment's switches: global shadow mode (the overall code is OK, each
    /// descriptor keeps its own), dynamic metadata and `RateLimit-*` headers.
    pub fn with_answer(mut self, answer: AnswerOptions) -> Self {
        self.answer = answer;
        self
    }

    /// Decides every rule in quota mode: the request is refused only when every quota
    /// descriptor is over (envoyproxy/ratelimit's `QUOTA_MODE`).
    pub fn with_global_quota(mut self, on: bool) -> Self {
        self.global_quota = on;
        self
    }

    pub fn with_request_limits(mut self, limits: RequestLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The bounds on what one request may carry.
    pub fn request_limits(&self) -> &RequestLimits {
        &self.limits
    }

    /// The longest a call waits for the store (and a caller without a deadline's).
    pub fn with_store_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.store_timeout = timeout;
        self
    }

    pub fn store_timeout(&self) -> std::time::Duration {
        self.store_timeout
    }

    pub fn engine(&self) -> &Arc<Engine<S>> {
        &self.engine
    }

    /// The config snapshot in force.
    pub fn config(&self) -> Arc<Config> {
        self.snapshot.load().config.clone()
    }

    /// Swaps in a new config snapshot from `source` (the config path, or the xDS push's
    /// version); requests in flight finish on the old one.
    pub fn replace_config(&self, config: Arc<Config>, source: &str) {
        self.snapshot
            .store(Arc::new(Snapshot::new(config, &self.metrics, &self.top)));
        self.events.lock().loaded(source);
    }

    /// Names where the rules it started with came from (for the page).
    pub fn config_came_from(&self, source: &str) {
        self.events.lock().came_from(source);
    }

    /// A load from `source` refused with `error`: the rules in force stay (counted and
    /// kept for the page).
    pub fn config_rejected(&self, source: &str, error: &str) {
        self.metrics.config_rejected();
        self.events.lock().rejected(source, error);
    }

    /// When the rules in force were loaded, and the last load refused.
    pub fn config_events(&self) -> ConfigEvents {
        self.events.lock().clone()
    }

    /// Counts a request for a domain `config` does not define and warns about it, once per
    /// interval, naming the domain asked for and the ones known (answered OK: no rule
    /// limits it, as upstream answers).
    pub(super) fn unknown_domain(&self, config: &Config, domain: &str) {
        self.metrics.domain_not_found();
        let Some(suppressed) = self.unknown_domain_log.admit() else {
            return;
        };
        let mut known: Vec<&str> = config.domains().map(|d| &*d.name).collect();
        known.sort_unstable();
        let more = known.len().saturating_sub(KNOWN_DOMAINS_LISTED);
        known.truncate(KNOWN_DOMAINS_LISTED);
        let mut known = known.join(", ");
        if more > 0 {
            known.push_str(&format!(" and {more} more"));
        }
        tracing::warn!(
            target: "shardgate::service::decision",
            domain = %crate::support::text::elide(domain, 64),
            known_domains = %known,
            similar_not_logged = suppressed,
            "request for a domain no rule defines, answered OK (a misspelled domain turns limiting off)"
        );
    }

    /// Answers one request from a caller that set no deadline (the store timeout is).
    pub async fn should_rate_limit(
        &self,
        req: &RateLimitRequest,
    ) -> Result<RateLimitResponse, CallError> {
        let deadline = Instant::now() + self.store_timeout;
        self.should_rate_limit_by(&RequestView::from(req), deadline)
            .await
            .map(|reply| reply.to_response())
    }

    /// Answers one request; the store must have answered by `deadline`, else the request
    /// is answered by its rules' `failure_mode` (see `deadline.rs`).
    ///
    /// Each call is a `decision` span at debug level (docs/operations.md, Tracing) with
    /// the domain, the matched rules' stats keys, the outcome, the number of store calls
    /// the call made (`store/calls.rs`: a decision answered from a lease or the rejection
    /// cache makes none) and the cause of a `failure_mode` answer. Disabled, as it is by
    /// default, the span costs a check of the level filter: the fields are recorded and
    /// the store calls counted only when it is enabled, and nothing is formatted or
    /// allocated otherwise (`tests/decision_alloc.rs`).
    pub async fn should_rate_limit_by(
        &self,
        req: &RequestView<'_>,
        deadline: Instant,
    ) -> Result<Reply, CallError> {
        let span = tracing::debug_span!(
            "decision",
            domain = req.domain,
            rules = tracing::field::Empty,
            outcome = tracing::field::Empty,
            store_calls = tracing::field::Empty,
            failure_mode = tracing::field::Empty,
        );
        let progress = CallState::new(deadline);
        if span.is_disabled() {
            // The usual case: the decision awaited as it is, with no wrapper to move it
            // through (each would copy its few KB once more on every request).
            return self.decide(req, &progress, &span).await;
        }
        // Traced: the span entered on every poll and the store calls counted, in a box of
        // its own so that this rarer path does not grow the usual one's future.
        let (result, store_calls) =
            Box::pin(calls::counted(self.decide(req, &progress, &span)).instrument(span.clone()))
                .await;
        span.record("outcome", progress.outcome(&result));
        // As a signed integer: OpenTelemetry has no unsigned one, and tracing-opentelemetry
        // would export an unsigned value as text.
        span.record("store_calls", i64::from(store_calls));
        if let Some(cause) = progress.failure.get() {
            span.record("failure_mode", *cause);
        }
        result
    }
}

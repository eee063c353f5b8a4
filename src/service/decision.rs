//! One `ShouldRateLimit` call, end to end: validate the request (`request.rs`), decide
//! how each descriptor is handled (`treatment.rs`), hand each group's plan to the engine
//! under the call's deadline, count the hits, and build the answer (`descriptor_status.rs`). Store
//! failures are answered here, by the rules' `failure_mode`.
//!
//! This is the envoyproxy/ratelimit contract; it holds no bucket logic (that is the
//! engine's) and no transport (that is `grpc.rs`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use thiserror::Error;
use tokio::time::Instant;
use tracing::Instrument;

use super::answer_options::AnswerOptions;
use super::deadline::Bounded;
use super::descriptor_status::{self, record, Placed, Placements, Verdict};
use super::metrics::{HitOutcome, Metrics, RuleCounters};
use super::request::{validate, RequestLimits};
use super::response_encoding::Reply;
use super::treatment::{any_in, treatments, Group, PerDescriptor, Treatment};
use super::wire::RequestView;
use crate::config::{Config, FailureMode};
use crate::engine::plan::Plan;
use crate::engine::{Acquire, Decision, Engine, EngineError, LimitOutcome};
use crate::store::{calls, BucketKey, BucketStore, StoreError, DEFAULT_STORE_TIMEOUT};
use crate::support::throttle::LogThrottle;

/// Why a call was not answered with statuses.
#[derive(Debug, Error)]
pub enum CallError {
    /// The request is malformed; the message names the field.
    #[error("{0}")]
    InvalidArgument(String),
    /// The store failed and the rules involved fail closed.
    #[error("rate-limit store unavailable: {0}")]
    Unavailable(#[source] StoreFailure),
}

/// How the store failed a call.
#[derive(Debug, Error)]
pub enum StoreFailure {
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The store did not answer by the call's deadline (see `deadline.rs`).
    #[error("no answer from the store within the call's deadline")]
    Deadline,
}

impl StoreFailure {
    /// The metric label of the failure's cause.
    fn cause(&self) -> &'static str {
        match self {
            StoreFailure::Engine(EngineError::Store {
                source: StoreError::CircuitOpen { .. },
                ..
            }) => "circuit_open",
            StoreFailure::Engine(EngineError::Store {
                source: StoreError::Shed { .. },
                ..
            }) => "shed",
            StoreFailure::Engine(_) => "store",
            StoreFailure::Deadline => "deadline",
        }
    }
}

/// One call as it goes: its deadline, and what its span reports at the end.
struct CallState {
    deadline: Instant,
    /// The cause of the first store failure (`StoreFailure::cause`), answered by
    /// `failure_mode`.
    failure: OnceLock<&'static str>,
    unknown_domain: AtomicBool,
}

impl CallState {
    fn new(deadline: Instant) -> CallState {
        CallState {
            deadline,
            failure: OnceLock::new(),
            unknown_domain: AtomicBool::new(false),
        }
    }

    /// The span's `outcome`: the answer's code, or the gRPC status of a failed call.
    fn outcome(&self, result: &Result<Reply, CallError>) -> &'static str {
        match result {
            Ok(_) if self.unknown_domain.load(Ordering::Relaxed) => "UNKNOWN_DOMAIN",
            Ok(r) if r.overall() == Code::OverLimit => "OVER_LIMIT",
            Ok(_) => "OK",
            Err(CallError::InvalidArgument(_)) => "INVALID_ARGUMENT",
            Err(CallError::Unavailable(_)) => "UNAVAILABLE",
        }
    }
}

/// The span's `rules`: each descriptor's rule stats key, in request order, `-` for one no
/// rule matched (or replaced) and `unlimited` for an unlimited rule's. Written straight
/// into the subscriber's buffer, only when the span is enabled.
struct RuleKeys<'a>(&'a [Treatment<'a>]);

impl std::fmt::Display for RuleKeys<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, t) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match t {
                Treatment::Limited { rule, .. } => f.write_str(&rule.stats_key)?,
                Treatment::Free { unlimited: true } => f.write_str("unlimited")?,
                Treatment::Free { unlimited: false } => f.write_str("-")?,
            }
        }
        Ok(())
    }
}

/// A plan of some of a request's descriptors, with where each one's limit sits in it.
struct Planned {
    plan: Plan,
    placed: Placements,
}

/// A config in force with the metric counters of its rules.
struct Snapshot {
    config: Arc<Config>,
    counters: Vec<Option<RuleCounters>>,
}

impl Snapshot {
    fn new(config: Arc<Config>, metrics: &Metrics) -> Snapshot {
        Snapshot {
            counters: metrics.rule_counters(&config),
            config,
        }
    }
}

/// The rate limiter behind the gRPC service: a config snapshot and the engine.
pub struct RateLimiter<S: BucketStore> {
    snapshot: ArcSwap<Snapshot>,
    engine: Arc<Engine<S>>,
    limits: RequestLimits,
    /// The deployment's switches around the decision (global shadow mode, metadata,
    /// headers).
    answer: AnswerOptions,
    /// Every rule decided in quota mode (`--global-quota-mode`).
    global_quota: bool,
    /// The longest a call may wait for the store, and the deadline of a caller that sets
    /// none (`--store-timeout`).
    store_timeout: std::time::Duration,
    metrics: Arc<Metrics>,
    store_failure_log: LogThrottle,
    /// The store has answered since start-up (the server's warm-up); health says
    /// NOT_SERVING until it has.
    ready: std::sync::atomic::AtomicBool,
}

impl<S: BucketStore> RateLimiter<S> {
    pub fn new(config: Arc<Config>, engine: Arc<Engine<S>>) -> RateLimiter<S> {
        let metrics = Arc::new(Metrics::new());
        RateLimiter {
            snapshot: ArcSwap::from_pointee(Snapshot::new(config, &metrics)),
            engine,
            limits: RequestLimits::default(),
            answer: AnswerOptions::default(),
            global_quota: false,
            store_timeout: DEFAULT_STORE_TIMEOUT,
            metrics,
            store_failure_log: LogThrottle::new(std::time::Duration::from_secs(10)),
            ready: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// Records into these metrics (shared with the store wrapper and the HTTP surface).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        let config = self.config();
        self.snapshot
            .store(Arc::new(Snapshot::new(config, &metrics)));
        self.metrics = metrics;
        self
    }

    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
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
            Ok(Err(e)) => Err(e.to_string()),
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

    /// Swaps in a new config snapshot; requests in flight finish on the old one.
    pub fn replace_config(&self, config: Arc<Config>) {
        self.snapshot
            .store(Arc::new(Snapshot::new(config, &self.metrics)));
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

    /// The decision itself (see `should_rate_limit_by`); `span` is the call's, given the
    /// matched rules once they are known.
    async fn decide(
        &self,
        req: &RequestView<'_>,
        progress: &CallState,
        span: &tracing::Span,
    ) -> Result<Reply, CallError> {
        let _timer = self.metrics.request();
        validate(&self.limits, req).map_err(CallError::InvalidArgument)?;
        let snapshot = self.snapshot.load();
        let Some(domain) = snapshot.config.domain(req.domain) else {
            progress.unknown_domain.store(true, Ordering::Relaxed);
            self.metrics.domain_not_found();
            let statuses = descriptor_status::unknown_domain(req.len());
            let mut overall = Code::Ok;
            let applied = self.answer.apply(req, &[], &statuses, &mut overall);
            return Ok(Reply::new(overall, &statuses, &applied.extras));
        };
        let treatments = treatments(domain, req, self.global_quota);
        if !span.is_disabled() {
            span.record("rules", tracing::field::display(RuleKeys(&treatments)));
        }
        let mut verdicts: PerDescriptor<Option<Verdict>> = (0..req.len()).map(|_| None).collect();
        let over = self
            .decide_groups(req, &treatments, &mut verdicts, progress)
            .await?;
        self.count_hits(&snapshot, req, &treatments, &verdicts);
        let statuses = descriptor_status::statuses(&treatments, &verdicts);
        let mut overall = if over { Code::OverLimit } else { Code::Ok };
        let applied = self.answer.apply(req, &treatments, &statuses, &mut overall);
        if applied.shadowed {
            self.metrics.global_shadow_mode();
        }
        Ok(Reply::new(overall, &statuses, &applied.extras))
    }

    /// Decides the request's limited descriptors group by group; returns whether the
    /// request is refused.
    async fn decide_groups(
        &self,
        req: &RequestView<'_>,
        treatments: &[Treatment<'_>],
        verdicts: &mut [Option<Verdict>],
        progress: &CallState,
    ) -> Result<bool, CallError> {
        let mut over = false;
        // The groups other than the enforced one are rare; each is stepped through in its
        // own boxed future, which keeps this one (moved into the server's box on every
        // request) small.
        // 1. Overdraft usage happened already: always recorded.
        if any_in(treatments, Group::Forced) {
            over |= !Box::pin(self.forced(req, treatments, verdicts, progress)).await?;
        }
        // 2. The all-or-nothing group; only looked at when the answer is already no.
        let enforced = self.plan(req, treatments, |g| g == Group::Enforced)?;
        let mut enforced_decision = None;
        if !enforced.plan.is_empty() {
            if over {
                self.acquire_or_peek(&enforced, treatments, false, verdicts, progress)
                    .await?;
            } else {
                let decision = self
                    .acquire_recorded(&enforced, treatments, verdicts, progress)
                    .await?;
                over |= !decision.admitted;
                enforced_decision = Some(decision);
            }
        }
        // 3 and 4: quota and shadow descriptors.
        if any_in(treatments, Group::Quota) || any_in(treatments, Group::Shadow) {
            let enforced = enforced_decision
                .as_ref()
                .map(|d| (&enforced.plan.acquire, d));
            over = Box::pin(
                self.quota_and_shadow(req, treatments, verdicts, over, enforced, progress),
            )
            .await?;
        }
        Ok(over)
    }

    /// Counts each limited descriptor's hits by how it came out.
    fn count_hits(
        &self,
        snapshot: &Snapshot,
        req: &RequestView<'_>,
        treatments: &[Treatment<'_>],
        verdicts: &[Option<Verdict>],
    ) {
        for (i, (t, v)) in treatments.iter().zip(verdicts).enumerate() {
            if let (Treatment::Limited { rule, hits, group }, Some(v)) = (t, v) {
                let outcome = if v.fits() {
                    // 80 % or more of the capacity used after this request.
                    let near = |l: &LimitOutcome| l.remaining.saturating_mul(5) <= l.share.ceiling;
                    HitOutcome::Within {
                        near: near(&v.own) || v.parent.as_ref().is_some_and(near),
                    }
                } else if *group == Group::Shadow {
                    HitOutcome::ShadowOver
                } else {
                    HitOutcome::Over
                };
                self.metrics.record_hit(
                    &snapshot.counters,
                    rule,
                    req.descriptor(i).entries,
                    (*hits).max(1),
                    outcome,
                );
            }
        }
    }

    /// A plan of the descriptors whose group passes `keep`.
    fn plan(
        &self,
        req: &RequestView<'_>,
        treatments: &[Treatment<'_>],
        keep: impl Fn(Group) -> bool,
    ) -> Result<Planned, CallError> {
        let mut planned = Planned {
            plan: Plan::new(),
            placed: Placements::new(),
        };
        for (i, t) in treatments.iter().enumerate() {
            if let Treatment::Limited { group, .. } = t {
                if keep(*group) {
                    self.place(&mut planned, req, treatments, i)?;
                }
            }
        }
        Ok(planned)
    }

    /// A plan of descriptor `index` alone.
    fn plan_one(
        &self,
        req: &RequestView<'_>,
        treatments: &[Treatment<'_>],
        index: usize,
    ) -> Result<Planned, CallError> {
        let mut planned = Planned {
            plan: Plan::new(),
            placed: Placements::new(),
        };
        self.place(&mut planned, req, treatments, index)?;
        Ok(planned)
    }

    /// Adds descriptor `i` (if limited) to `planned`.
    fn place(
        &self,
        planned: &mut Planned,
        req: &RequestView<'_>,
        treatments: &[Treatment<'_>],
        i: usize,
    ) -> Result<(), CallError> {
        if let Treatment::Limited { rule, hits, .. } = &treatments[i] {
            let slot = planned
                .plan
                .add(rule, req.descriptor(i).entries, *hits)
                .map_err(|e| {
                    CallError::InvalidArgument(format!("descriptors[{i}].hits_addend: {e}"))
                })?;
            planned.placed.push(Placed {
                descriptor: i,
                slot,
            });
        }
        Ok(())
    }

    /// Step 1 of a decision: debits the descriptors whose overdraft usage already happened
    /// (always recorded). Returns whether every claim fit.
    async fn forced(
        &self,
        req: &RequestView<'_>,
        treatments: &[Treatment<'_>],
        verdicts: &mut [Option<Verdict>],
        progress: &CallState,
    ) -> Result<bool, CallError> {
        let planned = self.plan(req, treatments, |g| g == Group::Forced)?;
        self.acquire_or_peek(&planned, treatments, true, verdicts, progress)
            .await
    }

    /// Steps 3 and 4 of a decision, after the enforced group (`over`: the answer so far;
    /// `enforced`: that group's plan and decision, refunded if the quota group turns the
    /// answer to no). Returns the answer.
    async fn quota_and_shadow(
        &self,
        req: &RequestView<'_>,
        treatments: &[Treatment<'_>],
        verdicts: &mut [Option<Verdict>],
        mut over: bool,
        enforced: Option<(&Acquire, &Decision)>,
        progress: &CallState,
    ) -> Result<bool, CallError> {
        // 3. Quota descriptors: over only if all of them are.
        let mut quota_seen = 0;
        let mut quota_over = 0;
        for (i, t) in treatments.iter().enumerate() {
            if let Treatment::Limited {
                group: Group::Quota,
                ..
            } = t
            {
                quota_seen += 1;
                let single = self.plan_one(req, treatments, i)?;
                if over {
                    self.acquire_or_peek(&single, treatments, false, verdicts, progress)
                        .await?;
                    quota_over += 1;
                } else {
                    let d = self
                        .acquire_recorded(&single, treatments, verdicts, progress)
                        .await?;
                    if !d.admitted {
                        quota_over += 1;
                    }
                }
            }
        }
        if quota_seen > 0 && quota_seen == quota_over && !over {
            over = true;
            if let Some((acquire, d)) = enforced {
                self.engine.refund(acquire, d).await;
            }
        }
        // 4. Shadow rules: evaluated and counted, never enforced; they take tokens only
        // when the request is admitted.
        for (i, t) in treatments.iter().enumerate() {
            if let Treatment::Limited {
                group: Group::Shadow,
                ..
            } = t
            {
                let single = self.plan_one(req, treatments, i)?;
                if over {
                    self.acquire_or_peek(&single, treatments, false, verdicts, progress)
                        .await?;
                } else {
                    self.acquire_recorded(&single, treatments, verdicts, progress)
                        .await?;
                }
            }
        }
        Ok(over)
    }

    /// Acquires `plan` and records each descriptor's verdict.
    async fn acquire_recorded(
        &self,
        planned: &Planned,
        treatments: &[Treatment<'_>],
        verdicts: &mut [Option<Verdict>],
        progress: &CallState,
    ) -> Result<Decision, CallError> {
        let answer = Bounded::new(
            self.engine
                .acquire_by(&planned.plan.acquire, Some(progress.deadline)),
            progress.deadline,
        );
        match Self::by_deadline(answer.await) {
            Ok(decision) => {
                record(&decision, &planned.placed, verdicts);
                Ok(decision)
            }
            Err(e) => self.on_store_failure(e, &planned.placed, treatments, progress),
        }
    }

    /// Acquires (`write`) or only looks (`!write`); returns whether every claim fit.
    async fn acquire_or_peek(
        &self,
        planned: &Planned,
        treatments: &[Treatment<'_>],
        write: bool,
        verdicts: &mut [Option<Verdict>],
        progress: &CallState,
    ) -> Result<bool, CallError> {
        let acquire = &planned.plan.acquire;
        let result = if write {
            Self::by_deadline(
                Bounded::new(
                    self.engine.acquire_by(acquire, Some(progress.deadline)),
                    progress.deadline,
                )
                .await,
            )
        } else {
            Self::by_deadline(Bounded::new(self.engine.peek(acquire), progress.deadline).await)
        };
        match result {
            Ok(decision) => {
                record(&decision, &planned.placed, verdicts);
                Ok(planned
                    .placed
                    .iter()
                    .all(|p| verdicts[p.descriptor].as_ref().is_none_or(Verdict::fits)))
            }
            Err(e) => self
                .on_store_failure(e, &planned.placed, treatments, progress)
                .map(|d| d.admitted),
        }
    }

    /// The engine's answer, if it came by the call's deadline (`Bounded`'s output). The
    /// callers await `Bounded` directly and map its output here: a wrapping future, or an
    /// `async fn` taking the engine's future, would hold or move that future once more on
    /// every request.
    fn by_deadline(
        answer: Option<Result<Decision, EngineError>>,
    ) -> Result<Decision, StoreFailure> {
        match answer {
            Some(result) => result.map_err(StoreFailure::Engine),
            None => Err(StoreFailure::Deadline),
        }
    }

    /// A store failure: fail closed if any rule involved says `deny`, else answer OK. A
    /// request-specific error (the store refused this request's key) is the request's:
    /// INVALID_ARGUMENT, whatever the rules say.
    fn on_store_failure(
        &self,
        e: StoreFailure,
        placed: &[Placed],
        treatments: &[Treatment<'_>],
        progress: &CallState,
    ) -> Result<Decision, CallError> {
        if let StoreFailure::Engine(e) = &e {
            if e.is_request_error() {
                self.metrics.request_refused_by_store();
                return Err(CallError::InvalidArgument(format!(
                    "a descriptor's bucket cannot be stored: {e}"
                )));
            }
        }
        let deny = placed.iter().any(|p| match &treatments[p.descriptor] {
            Treatment::Limited { rule, .. } => rule.failure_mode == FailureMode::Deny,
            Treatment::Free { .. } => false,
        });
        let _ = progress.failure.set(e.cause());
        self.metrics
            .store_failure(e.cause(), if deny { "unavailable" } else { "allowed" });
        if let Some(suppressed) = self.store_failure_log.admit() {
            tracing::warn!(
                error = %e,
                answered = if deny { "UNAVAILABLE (failure_mode: deny)" } else { "OK (failure_mode: allow)" },
                similar_failures_not_logged = suppressed,
                "store failed"
            );
        }
        if deny {
            return Err(CallError::Unavailable(e));
        }
        Ok(Decision {
            admitted: true,
            buckets: Default::default(),
        })
    }
}

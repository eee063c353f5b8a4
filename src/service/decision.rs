//! One `ShouldRateLimit` call, end to end: validate the request, match each descriptor,
//! apply the envoyproxy/ratelimit request rules (hits, `replaces`, shadow, quota,
//! unlimited, overrides), hand the plans to the engine, and build the response.
//!
//! This is the envoyproxy/ratelimit contract; it holds no bucket logic (that is the
//! engine's) and no transport (that is `grpc.rs`).

use std::sync::Arc;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as ProtoRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Duration, ListValue, Struct, Value};
use smallvec::SmallVec;
use thiserror::Error;

use crate::config::{
    entries_key, Config, DescriptorEntry, FailureMode, Level, RateLimit, Rule, RuleLimit, Unit,
};
use crate::engine::bucket::{self, whole_tokens};
use crate::engine::plan::{Plan, Slot};
use crate::engine::{Acquire, Decision, Engine, EngineError, LimitOutcome};
use crate::store::{BucketKey, BucketStore, StoreError, DEFAULT_STORE_TIMEOUT};
use tokio::time::Instant;

use super::deadline::Bounded;
use super::metrics::{HitOutcome, Metrics, RuleCounters};
use crate::throttle::LogThrottle;

impl DescriptorEntry for Entry {
    fn key(&self) -> &str {
        &self.key
    }
    fn value(&self) -> &str {
        &self.value
    }
}

/// Bounds on what one request may carry (hostile-input protection).
#[derive(Debug, Clone)]
pub struct RequestLimits {
    pub max_descriptors: usize,
    pub max_entries: usize,
    pub max_key_bytes: usize,
    pub max_value_bytes: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_descriptors: 64,
            max_entries: 16,
            max_key_bytes: 256,
            max_value_bytes: 1_024,
        }
    }
}

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
            StoreFailure::Engine(_) => "store",
            StoreFailure::Deadline => "deadline",
        }
    }
}

/// Per-descriptor working state of one call: inline for the usual few descriptors.
type PerDescriptor<T> = SmallVec<[T; 4]>;

/// Each planned descriptor's index and slot.
type Slots = SmallVec<[(usize, Slot); 4]>;

/// How one request descriptor is handled.
enum Treatment {
    /// No rule, replaced, or unlimited: answered without the store.
    Free { unlimited: bool },
    Limited {
        rule: Arc<Rule>,
        hits: u64,
        group: Group,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Group {
    /// Overdraft usage: always debited.
    Forced,
    /// The all-or-nothing group.
    Enforced,
    Quota,
    Shadow,
}

/// Outcome of one descriptor: its own limit and its cascade parent's.
struct Verdict {
    own: LimitOutcome,
    parent: Option<LimitOutcome>,
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
    global_shadow: bool,
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
            global_shadow: false,
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

    /// Marks whether the store has answered since start-up (see `check_store`).
    pub fn set_ready(&self, ready: bool) {
        self.ready
            .store(ready, std::sync::atomic::Ordering::Release);
    }

    /// Whether the store answers: not before it has since start-up (the server warms it
    /// up), then one read of a key no bucket uses, bounded in time.
    pub async fn check_store(&self) -> Result<(), String> {
        if !self.ready.load(std::sync::atomic::Ordering::Acquire) {
            return Err("warming up: the store has not answered yet".to_string());
        }
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

    /// Reports every OVER_LIMIT as OK (evaluated and counted, never enforced).
    pub fn with_global_shadow(mut self, on: bool) -> Self {
        self.global_shadow = on;
        self
    }

    pub fn with_request_limits(mut self, limits: RequestLimits) -> Self {
        self.limits = limits;
        self
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

    fn validate(&self, req: &RateLimitRequest) -> Result<(), CallError> {
        let bad = |m: String| Err(CallError::InvalidArgument(m));
        if req.domain.is_empty() {
            return bad("domain must not be empty".into());
        }
        if req.descriptors.is_empty() {
            return bad("descriptors must not be empty".into());
        }
        let l = &self.limits;
        if req.descriptors.len() > l.max_descriptors {
            return bad(format!(
                "descriptors: {} exceeds the maximum of {}",
                req.descriptors.len(),
                l.max_descriptors
            ));
        }
        for (i, d) in req.descriptors.iter().enumerate() {
            if d.entries.is_empty() {
                return bad(format!("descriptors[{i}].entries must not be empty"));
            }
            if d.entries.len() > l.max_entries {
                return bad(format!(
                    "descriptors[{i}].entries: {} exceeds the maximum of {}",
                    d.entries.len(),
                    l.max_entries
                ));
            }
            for (j, e) in d.entries.iter().enumerate() {
                if e.key.is_empty() {
                    return bad(format!(
                        "descriptors[{i}].entries[{j}].key must not be empty"
                    ));
                }
                if e.key.len() > l.max_key_bytes {
                    return bad(format!(
                        "descriptors[{i}].entries[{j}].key: {} bytes exceeds the maximum of {}",
                        e.key.len(),
                        l.max_key_bytes
                    ));
                }
                if e.value.len() > l.max_value_bytes {
                    return bad(format!(
                        "descriptors[{i}].entries[{j}].value: {} bytes exceeds the maximum of {}",
                        e.value.len(),
                        l.max_value_bytes
                    ));
                }
            }
            if let Some(limit) = &d.limit {
                if Unit::from_proto(limit.unit).is_none() {
                    return bad(format!(
                        "descriptors[{i}].limit.unit: unknown unit {}",
                        limit.unit
                    ));
                }
            }
        }
        Ok(())
    }

    /// Answers one request from a caller that set no deadline (the store timeout is).
    pub async fn should_rate_limit(
        &self,
        req: &RateLimitRequest,
    ) -> Result<RateLimitResponse, CallError> {
        let deadline = Instant::now() + self.store_timeout;
        self.should_rate_limit_by(req, deadline).await
    }

    /// Answers one request; the store must have answered by `deadline`, else the request
    /// is answered by its rules' `failure_mode` (see `deadline.rs`).
    pub async fn should_rate_limit_by(
        &self,
        req: &RateLimitRequest,
        deadline: Instant,
    ) -> Result<RateLimitResponse, CallError> {
        let _timer = self.metrics.request();
        self.validate(req)?;
        let snapshot = self.snapshot.load();
        let Some(domain) = snapshot.config.domain(&req.domain) else {
            self.metrics.domain_not_found();
            return Ok(RateLimitResponse {
                overall_code: Code::Ok as i32,
                statuses: req
                    .descriptors
                    .iter()
                    .map(|_| ok_status(None, None))
                    .collect(),
                ..Default::default()
            });
        };

        // Match, then apply `replaces` across the matched rules.
        let matched: PerDescriptor<Option<Arc<Rule>>> = req
            .descriptors
            .iter()
            .map(|d| match &d.limit {
                Some(o) => Some(Arc::new(override_rule(
                    &domain.name,
                    d,
                    o.requests_per_unit,
                    o.unit,
                ))),
                None => domain.match_descriptor(&d.entries).cloned(),
            })
            .collect();
        let replaced: PerDescriptor<&str> = matched
            .iter()
            .flatten()
            .flat_map(|r| r.replaces.iter().map(String::as_str))
            .collect();
        let treatments: PerDescriptor<Treatment> = req
            .descriptors
            .iter()
            .zip(&matched)
            .map(|(d, rule)| {
                let Some(rule) = rule.clone() else {
                    return Treatment::Free { unlimited: false };
                };
                if rule.name.as_deref().is_some_and(|n| replaced.contains(&n)) {
                    return Treatment::Free { unlimited: false };
                }
                let RuleLimit::Limited(limit) = &rule.limit else {
                    return Treatment::Free { unlimited: true };
                };
                let hits = match &d.hits_addend {
                    Some(h) => h.value,
                    None if req.hits_addend == 0 => 1,
                    None => u64::from(req.hits_addend),
                };
                let group = if rule.shadow_mode {
                    Group::Shadow
                } else if limit.overdraft && hits > 0 {
                    Group::Forced
                } else if rule.quota_mode {
                    Group::Quota
                } else {
                    Group::Enforced
                };
                Treatment::Limited { rule, hits, group }
            })
            .collect();

        let mut verdicts: PerDescriptor<Option<Verdict>> =
            (0..req.descriptors.len()).map(|_| None).collect();
        let mut over = false;

        // The groups other than the enforced one are rare; each is stepped through in its
        // own boxed future, which keeps this one (moved into the server's box on every
        // request) small.
        let in_group = |g: Group| {
            treatments
                .iter()
                .any(|t| matches!(t, Treatment::Limited { group, .. } if *group == g))
        };
        // 1. Overdraft usage happened already: always recorded.
        if in_group(Group::Forced) {
            over |= !Box::pin(self.forced(req, &treatments, &mut verdicts, deadline)).await?;
        }
        // 2. The all-or-nothing group; only looked at when the answer is already no.
        let enforced = self.plan(req, &treatments, |g| g == Group::Enforced)?;
        let mut enforced_decision = None;
        if !enforced.0.is_empty() {
            if over {
                self.run(
                    &enforced.0,
                    &enforced.1,
                    &treatments,
                    false,
                    &mut verdicts,
                    deadline,
                )
                .await?;
            } else {
                let decision = self
                    .decide(
                        &enforced.0,
                        &enforced.1,
                        &treatments,
                        &mut verdicts,
                        deadline,
                    )
                    .await?;
                over |= !decision.admitted;
                enforced_decision = Some(decision);
            }
        }
        // 3 and 4: quota and shadow descriptors.
        if in_group(Group::Quota) || in_group(Group::Shadow) {
            let enforced = enforced_decision.as_ref().map(|d| (&enforced.0.acquire, d));
            over = Box::pin(self.quota_and_shadow(
                req,
                &treatments,
                &mut verdicts,
                over,
                enforced,
                deadline,
            ))
            .await?;
        }

        for (i, (t, v)) in treatments.iter().zip(&verdicts).enumerate() {
            if let (Treatment::Limited { rule, hits, group }, Some(v)) = (t, v) {
                let fits = v.own.fits && v.parent.is_none_or(|p| p.fits);
                let outcome = if fits {
                    // 80 % or more of the capacity used after this request.
                    let near = |l: &LimitOutcome| l.remaining.saturating_mul(5) <= l.share.ceiling;
                    HitOutcome::Within {
                        near: near(&v.own) || v.parent.as_ref().is_some_and(near),
                    }
                } else if *group == Group::Shadow || self.global_shadow {
                    HitOutcome::ShadowOver
                } else {
                    HitOutcome::Over
                };
                self.metrics.record_hit(
                    &snapshot.counters,
                    rule,
                    &req.descriptors[i].entries,
                    (*hits).max(1),
                    outcome,
                );
            }
        }

        let statuses: Vec<DescriptorStatus> = treatments
            .iter()
            .zip(&verdicts)
            .map(|(t, v)| match (t, v) {
                (Treatment::Free { unlimited }, _) => {
                    ok_status(None, unlimited.then_some(u32::MAX))
                }
                (Treatment::Limited { rule, group, .. }, Some(v)) => {
                    let mut s = status_of(rule, v);
                    if *group == Group::Shadow || self.global_shadow {
                        s.code = Code::Ok as i32;
                    }
                    s
                }
                // Failed open: nothing was counted, so no limit is quoted either.
                (Treatment::Limited { .. }, None) => ok_status(None, None),
            })
            .collect();
        let overall = if over && !self.global_shadow {
            Code::OverLimit
        } else {
            Code::Ok
        };
        let dynamic_metadata = passing_metadata(&treatments, &statuses);
        Ok(RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            dynamic_metadata,
            ..Default::default()
        })
    }

    /// A plan of the descriptors whose group passes `keep`, with each one's slot.
    fn plan(
        &self,
        req: &RateLimitRequest,
        treatments: &[Treatment],
        keep: impl Fn(Group) -> bool,
    ) -> Result<(Plan, Slots), CallError> {
        let mut plan = Plan::new();
        let mut slots = Slots::new();
        for (i, t) in treatments.iter().enumerate() {
            if let Treatment::Limited { rule, hits, group } = t {
                if keep(*group) {
                    let slot = plan
                        .add(rule, &req.descriptors[i].entries, *hits)
                        .map_err(|e| {
                            CallError::InvalidArgument(format!("descriptors[{i}].hits_addend: {e}"))
                        })?;
                    slots.push((i, slot));
                }
            }
        }
        Ok((plan, slots))
    }

    fn plan_one(
        &self,
        req: &RateLimitRequest,
        treatments: &[Treatment],
        index: usize,
    ) -> Result<(Plan, Slots), CallError> {
        let mut plan = Plan::new();
        let mut slots = Slots::new();
        if let Treatment::Limited { rule, hits, .. } = &treatments[index] {
            let slot = plan
                .add(rule, &req.descriptors[index].entries, *hits)
                .map_err(|e| {
                    CallError::InvalidArgument(format!("descriptors[{index}].hits_addend: {e}"))
                })?;
            slots.push((index, slot));
        }
        Ok((plan, slots))
    }

    /// Step 1 of a decision: debits the descriptors whose overdraft usage already happened
    /// (always recorded). Returns whether every claim fit.
    async fn forced(
        &self,
        req: &RateLimitRequest,
        treatments: &[Treatment],
        verdicts: &mut [Option<Verdict>],
        deadline: Instant,
    ) -> Result<bool, CallError> {
        let (plan, slots) = self.plan(req, treatments, |g| g == Group::Forced)?;
        self.run(&plan, &slots, treatments, true, verdicts, deadline)
            .await
    }

    /// Steps 3 and 4 of a decision, after the enforced group (`over`: the answer so far;
    /// `enforced`: that group's plan and decision, refunded if the quota group turns the
    /// answer to no). Returns the answer.
    async fn quota_and_shadow(
        &self,
        req: &RateLimitRequest,
        treatments: &[Treatment],
        verdicts: &mut [Option<Verdict>],
        mut over: bool,
        enforced: Option<(&Acquire, &Decision)>,
        deadline: Instant,
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
                    self.run(&single.0, &single.1, treatments, false, verdicts, deadline)
                        .await?;
                    quota_over += 1;
                } else {
                    let d = self
                        .decide(&single.0, &single.1, treatments, verdicts, deadline)
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
                    self.run(&single.0, &single.1, treatments, false, verdicts, deadline)
                        .await?;
                } else {
                    self.decide(&single.0, &single.1, treatments, verdicts, deadline)
                        .await?;
                }
            }
        }
        Ok(over)
    }

    /// Acquires `plan` and records each descriptor's verdict.
    async fn decide(
        &self,
        plan: &Plan,
        slots: &[(usize, Slot)],
        treatments: &[Treatment],
        verdicts: &mut [Option<Verdict>],
        deadline: Instant,
    ) -> Result<Decision, CallError> {
        match self.by(deadline, self.engine.acquire(&plan.acquire)).await {
            Ok(decision) => {
                record(&decision, slots, verdicts);
                Ok(decision)
            }
            Err(e) => self.on_store_failure(e, slots, treatments),
        }
    }

    /// Acquires (`write`) or only looks (`!write`); returns whether every claim fit.
    async fn run(
        &self,
        plan: &Plan,
        slots: &[(usize, Slot)],
        treatments: &[Treatment],
        write: bool,
        verdicts: &mut [Option<Verdict>],
        deadline: Instant,
    ) -> Result<bool, CallError> {
        let result = if write {
            self.by(deadline, self.engine.acquire(&plan.acquire)).await
        } else {
            self.by(deadline, self.engine.peek(&plan.acquire)).await
        };
        match result {
            Ok(decision) => {
                record(&decision, slots, verdicts);
                Ok(slots.iter().all(|(i, _)| {
                    verdicts[*i]
                        .as_ref()
                        .is_none_or(|v| v.own.fits && v.parent.is_none_or(|p| p.fits))
                }))
            }
            Err(e) => self
                .on_store_failure(e, slots, treatments)
                .map(|d| d.admitted),
        }
    }

    /// The engine's answer to `call`, if it comes by `deadline` (see `Bounded`). Not an
    /// `async fn`: one would hold `call` twice (its argument, and moved into the bound).
    fn by(
        &self,
        deadline: Instant,
        call: impl std::future::Future<Output = Result<Decision, EngineError>>,
    ) -> impl std::future::Future<Output = Result<Decision, StoreFailure>> {
        futures::FutureExt::map(Bounded::new(call, deadline), |answer| match answer {
            Some(result) => result.map_err(StoreFailure::Engine),
            None => Err(StoreFailure::Deadline),
        })
    }

    /// A store failure: fail closed if any rule involved says `deny`, else answer OK. A
    /// request-specific error (the store refused this request's key) is the request's:
    /// INVALID_ARGUMENT, whatever the rules say.
    fn on_store_failure(
        &self,
        e: StoreFailure,
        slots: &[(usize, Slot)],
        treatments: &[Treatment],
    ) -> Result<Decision, CallError> {
        if let StoreFailure::Engine(e) = &e {
            if e.is_request_error() {
                self.metrics.request_refused_by_store();
                return Err(CallError::InvalidArgument(format!(
                    "a descriptor's bucket cannot be stored: {e}"
                )));
            }
        }
        let deny = slots.iter().any(|(i, _)| match &treatments[*i] {
            Treatment::Limited { rule, .. } => rule.failure_mode == FailureMode::Deny,
            Treatment::Free { .. } => false,
        });
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

/// The `metadata` maps of the rules of passing descriptors, merged in request order
/// (a later descriptor's key wins), for Envoy's dynamic metadata.
fn passing_metadata(treatments: &[Treatment], statuses: &[DescriptorStatus]) -> Option<Struct> {
    let mut merged = Struct::default();
    for (t, s) in treatments.iter().zip(statuses) {
        if let Treatment::Limited { rule, .. } = t {
            if let (Some(serde_json::Value::Object(map)), true) =
                (&rule.metadata, s.code == Code::Ok as i32)
            {
                for (k, v) in map {
                    merged.fields.insert(k.clone(), json_to_proto(v));
                }
            }
        }
    }
    (!merged.fields.is_empty()).then_some(merged)
}

fn json_to_proto(v: &serde_json::Value) -> Value {
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(json_to_proto).collect(),
        }),
        serde_json::Value::Object(o) => Kind::StructValue(Struct {
            fields: o
                .iter()
                .map(|(k, v)| (k.clone(), json_to_proto(v)))
                .collect(),
        }),
    };
    Value { kind: Some(kind) }
}

/// Copies each slot's outcome out of a decision.
fn record(decision: &Decision, slots: &[(usize, Slot)], verdicts: &mut [Option<Verdict>]) {
    if decision.buckets.is_empty() {
        return; // failed open: no outcome to report
    }
    for (i, slot) in slots {
        let own = decision.buckets[slot.bucket].limits[slot.limit];
        let parent = slot.parent.map(|(b, l)| decision.buckets[b].limits[l]);
        verdicts[*i] = Some(Verdict { own, parent });
    }
}

fn proto_limit(rule: &Rule) -> Option<ProtoRateLimit> {
    match &rule.limit {
        RuleLimit::Limited(l) => Some(ProtoRateLimit {
            name: rule.name.clone().unwrap_or_default(),
            requests_per_unit: l.requests_per_unit,
            unit: l.unit.proto_value(),
        }),
        RuleLimit::Unlimited => None,
    }
}

fn ok_status(rule: Option<&Rule>, remaining: Option<u32>) -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        current_limit: rule.and_then(proto_limit),
        limit_remaining: remaining.unwrap_or(0),
        ..Default::default()
    }
}

fn duration_ms(ms: i64) -> Duration {
    let ms = ms.max(0);
    Duration {
        seconds: ms / 1_000,
        nanos: ((ms % 1_000) * 1_000_000) as i32,
    }
}

fn remaining_tokens(l: &LimitOutcome) -> u32 {
    whole_tokens(l.remaining).clamp(0, i64::from(u32::MAX)) as u32
}

/// The status of one descriptor: the tighter of its own limit and its cascade parent's.
fn status_of(rule: &Rule, v: &Verdict) -> DescriptorStatus {
    let parent_rule = rule.cascade_parent.as_deref();
    // Which limit speaks for the descriptor: one that refused, else the one with less left.
    let parent_speaks = match (&v.parent, parent_rule) {
        (Some(p), Some(_)) => {
            (!p.fits && v.own.fits) || (p.fits == v.own.fits && p.remaining < v.own.remaining)
        }
        _ => false,
    };
    let (speaker, speaker_rule) = if parent_speaks {
        (
            v.parent.as_ref().expect("checked"),
            parent_rule.expect("checked"),
        )
    } else {
        (&v.own, rule)
    };
    let fits = v.own.fits && v.parent.is_none_or(|p| p.fits);
    let duration = if fits {
        let full = |l: &LimitOutcome| bucket::time_to_full(l.remaining, l.share);
        full(&v.own).max(v.parent.as_ref().map_or(0, full))
    } else {
        let wait = |l: &LimitOutcome| if l.fits { 0 } else { l.wait_ms.unwrap_or(0) };
        wait(&v.own).max(v.parent.as_ref().map_or(0, wait))
    };
    DescriptorStatus {
        code: if fits { Code::Ok } else { Code::OverLimit } as i32,
        current_limit: proto_limit(speaker_rule),
        limit_remaining: remaining_tokens(speaker),
        duration_until_reset: Some(duration_ms(duration)),
        ..Default::default()
    }
}

/// The rule for a descriptor that carries its own limit: it applies regardless of the
/// tree, keyed by all of the descriptor's entries.
fn override_rule(domain: &Arc<str>, d: &RateLimitDescriptor, rpu: u32, unit: i32) -> Rule {
    let levels: Vec<Level> = d
        .entries
        .iter()
        .map(|e| Level {
            key: e.key.clone(),
            value: Some(e.value.clone()),
            share_threshold: false,
        })
        .collect();
    let stats_key = entries_key(domain, &d.entries);
    Rule {
        index: None,
        domain: domain.clone(),
        levels,
        limit: RuleLimit::Limited(RateLimit {
            unit: Unit::from_proto(unit).unwrap_or(Unit::Second),
            requests_per_unit: rpu,
            burst: None,
            overdraft: false,
        }),
        name: Some("override".into()),
        replaces: Vec::new(),
        shadow_mode: false,
        quota_mode: false,
        detailed_metric: false,
        value_to_metric: false,
        metadata: None,
        entity: None,
        resource: domain.to_string(),
        cascade_parent: None,
        failure_mode: FailureMode::default(),
        stats_key,
        source: Arc::from("request limit override"),
    }
}

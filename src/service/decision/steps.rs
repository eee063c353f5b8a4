//! The decision's steps, in call order: validate, treat each descriptor, plan each
//! group, run it through the engine under the deadline (or peek, for quota and shadow
//! rules), count the hits, and answer store failures by the rules' `failure_mode`.
//! `mod.rs` holds the rate limiter and its entry points; this file only decides.

use std::sync::atomic::Ordering;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;

use crate::config::FailureMode;
use crate::engine::plan::Plan;
use crate::engine::{Acquire, Decision, EngineError, LimitOutcome};
use crate::service::deadline::Bounded;
use crate::service::deny_rule::{never_admits, refuse_denied};
use crate::service::descriptor_status::{self, record, Placed, Placements, Verdict};
use crate::service::metrics::HitOutcome;
use crate::service::request::validate;
use crate::service::response_encoding::Reply;
use crate::service::treatment::{any_in, treatments, Group, PerDescriptor, Treatment};
use crate::service::wire::{EntryView, RequestView};
use crate::store::BucketStore;

use super::call::{log_decision, CallError, CallState, RuleKeys, StoreFailure};
use super::limiter::{RateLimiter, Snapshot};

/// A plan of some of a request's descriptors, with where each one's limit sits in it.
struct Planned {
    plan: Plan,
    placed: Placements,
}

impl<S: BucketStore> RateLimiter<S> {
    /// The decision itself (see `should_rate_limit_by`); `span` is the call's, given the
    /// matched rules once they are known.
    pub(super) async fn decide(
        &self,
        req: &RequestView<'_>,
        progress: &CallState,
        span: &tracing::Span,
    ) -> Result<Reply, CallError> {
        let _timer = self.metrics.request();
        validate(&self.limits, req).map_err(CallError::InvalidArgument)?;
        // An owned snapshot, not arc-swap's guard: the guard is a per-thread debt slot
        // meant for short reads, and this one lives across every await of the decision.
        let snapshot = self.snapshot.load_full();
        let Some(domain) = snapshot.config.domain(req.domain) else {
            progress.unknown_domain.store(true, Ordering::Relaxed);
            self.unknown_domain(&snapshot.config, req.domain);
            let statuses = descriptor_status::unknown_domain(req.len());
            let mut overall = Code::Ok;
            let applied = self.answer.apply(req, &[], &statuses, &mut overall);
            log_decision(req, &[], &statuses, overall);
            return Ok(Reply::new(overall, &statuses, &applied.extras));
        };
        let treatments = treatments(domain, req, self.global_quota);
        if !span.is_disabled() {
            span.record("rules", tracing::field::display(RuleKeys(&treatments)));
        }
        let mut verdicts: PerDescriptor<Option<Verdict>> = (0..req.len()).map(|_| None).collect();
        // Deny rules (`requests_per_unit: 0`) are refused before any store call.
        let denied = refuse_denied(&treatments, &mut verdicts);
        let over = self
            .decide_groups(req, &treatments, &mut verdicts, denied, progress)
            .await?;
        self.count_hits(&snapshot, req, &treatments, &verdicts);
        let statuses = descriptor_status::statuses(&treatments, &verdicts);
        let mut overall = if over { Code::OverLimit } else { Code::Ok };
        let applied = self.answer.apply(req, &treatments, &statuses, &mut overall);
        if applied.shadowed {
            self.metrics.global_shadow_mode();
        }
        log_decision(req, &treatments, &statuses, overall);
        Ok(Reply::new(overall, &statuses, &applied.extras))
    }

    /// Decides the request's limited descriptors group by group; returns whether the
    /// request is refused (`denied`: a deny rule of the all-or-nothing group refused it
    /// already).
    async fn decide_groups(
        &self,
        req: &RequestView<'_>,
        treatments: &[Treatment<'_>],
        verdicts: &mut [Option<Verdict>],
        denied: bool,
        progress: &CallState,
    ) -> Result<bool, CallError> {
        let mut over = denied;
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
        // `treatments` and `verdicts` hold one item per descriptor of `req`, in order.
        for ((t, v), d) in treatments.iter().zip(verdicts).zip(req.descriptors()) {
            if let (Treatment::Limited { rule, hits, group }, Some(v)) = (t, v) {
                let outcome = if v.fits() {
                    // 80 % or more of the capacity used after this request.
                    let near = |l: &LimitOutcome| l.remaining.saturating_mul(5) <= l.share.ceiling;
                    HitOutcome::Within {
                        near: v.all().any(near),
                    }
                } else if *group == Group::Shadow {
                    HitOutcome::ShadowOver
                } else {
                    HitOutcome::Over
                };
                let entries = d.entries;
                self.metrics
                    .record_hit(&snapshot.counters, rule, entries, (*hits).max(1), outcome);
                // Shadow mode's "over" counts as refused: it is who would be refused.
                let refused = !matches!(outcome, HitOutcome::Within { .. });
                self.top
                    .record(&snapshot.top, rule, entries, (*hits).max(1), refused);
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
        for (i, (t, d)) in treatments.iter().zip(req.descriptors()).enumerate() {
            if let Treatment::Limited { group, .. } = t {
                if keep(*group) {
                    self.place(&mut planned, i, t, d.entries)?;
                }
            }
        }
        Ok(planned)
    }

    /// A plan of descriptor `index` (treated `t`, with `entries`) alone.
    fn plan_one(
        &self,
        index: usize,
        t: &Treatment<'_>,
        entries: &[EntryView<'_>],
    ) -> Result<Planned, CallError> {
        let mut planned = Planned {
            plan: Plan::new(),
            placed: Placements::new(),
        };
        self.place(&mut planned, index, t, entries)?;
        Ok(planned)
    }

    /// Adds descriptor `i` (treated `t`, with `entries`), if limited and not refused by a
    /// deny rule already, to `planned`.
    fn place(
        &self,
        planned: &mut Planned,
        i: usize,
        t: &Treatment<'_>,
        entries: &[EntryView<'_>],
    ) -> Result<(), CallError> {
        if never_admits(t) {
            return Ok(());
        }
        if let Treatment::Limited { rule, hits, .. } = t {
            let slot = planned.plan.add(rule, entries, *hits).map_err(|e| {
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
        for (i, (t, d)) in treatments.iter().zip(req.descriptors()).enumerate() {
            if let Treatment::Limited {
                group: Group::Quota,
                ..
            } = t
            {
                quota_seen += 1;
                if never_admits(t) {
                    quota_over += 1;
                    continue;
                }
                let single = self.plan_one(i, t, d.entries)?;
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
                self.refund_off_the_answer(acquire, d).await;
            }
        }
        // 4. Shadow rules: evaluated and counted, never enforced; they take tokens only
        // when the request is admitted.
        for (i, (t, d)) in treatments.iter().zip(req.descriptors()).enumerate() {
            if let Treatment::Limited {
                group: Group::Shadow,
                ..
            } = t
            {
                if never_admits(t) {
                    continue;
                }
                let single = self.plan_one(i, t, d.entries)?;
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

    /// Gives back what the enforced group took once the quota group turned the answer to
    /// no: best effort, off the answer's path. The answer is decided already, and a
    /// refund awaited on a slow store would hold it past the caller's deadline (the
    /// refund has none of its own). Polled once here — a store that answers at once (the
    /// memory store) is refunded before the answer, as before — and, if still pending,
    /// finished by a task of its own, bounded by the store's own timeout. A lost refund
    /// under-admits, never over-admits.
    async fn refund_off_the_answer(&self, acquire: &Acquire, decision: &Decision) {
        let engine = self.engine.clone();
        let (acquire, decision) = (acquire.clone(), decision.clone());
        let mut refund = Box::pin(async move { engine.refund(&acquire, &decision).await });
        if futures::poll!(refund.as_mut()).is_pending() {
            tokio::spawn(refund);
        }
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
                Ok(planned.placed.iter().all(|p| {
                    let verdict = verdicts.get(p.descriptor).and_then(Option::as_ref);
                    verdict.is_none_or(Verdict::fits)
                }))
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
        let deny = placed.iter().any(|p| match treatments.get(p.descriptor) {
            Some(Treatment::Limited { rule, .. }) => rule.failure_mode == FailureMode::Deny,
            Some(Treatment::Free { .. }) | None => false,
        });
        let _ = progress.failure.set(e.cause());
        self.metrics
            .store_failure(e.cause(), if deny { "unavailable" } else { "allowed" });
        if let Some(suppressed) = self.store_failure_log.admit() {
            // The decision's target, as before the module was split: log filters and
            // alerts on it keep working.
            tracing::warn!(
                target: "shardgate::service::decision",
                error = %crate::support::text::with_causes(&e),
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

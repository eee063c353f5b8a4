//! The acquire algorithm: one all-or-nothing decision over several buckets. This file
//! drives it (and holds its per-request state); `cached.rs` answers from the rejection
//! cache, `resolve.rs` takes a refused debit on (classification, doubling, retries),
//! `pass.rs` plans a slow pass, `outcome.rs` builds what a decision reports.
//!
//! 1. Rejection cache: a fresh image proving every shard of some bucket short refuses
//!    with no store call.
//! 2. Fast path: one conditional debit per bucket, concurrently, on a drawn shard.
//! 3. Each refused debit is classified from its old image and resolved on its own: fast
//!    rejection when a refill would not help, `wcu` projection and doubling, retry on up
//!    to two other shards, or a slow path on a chosen shard.
//! 4. Slow path: one read of every unresolved bucket, refill in memory, one atomic
//!    commit under the `rf` lock with additive deltas (creates are conditional), and the
//!    consumption-only retry when a lock or a create race is lost.
//! 5. If anything refuses, debits already applied are refunded: nothing is taken.

use futures::future::join_all;
use smallvec::SmallVec;

/// Shards of one bucket known short, not to be drawn.
pub(super) type Avoid = SmallVec<[u32; 4]>;

/// Per-bucket working state of one decision: inline for up to four buckets, as many
/// descriptors as the service keeps inline, so that a request of three or four buckets
/// does not allocate for it either.
pub(super) type PerBucket<T> = SmallVec<[T; 4]>;

use super::pass::{self, BucketPlan, PassContext};
use super::{Acquire, BucketClaim, BucketOutcome, Decision, Engine, EngineError, EngineStats};
use crate::store::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Credit, Debit, DebitMode, DebitOutcome,
    Stamp, StoreError, Write,
};

/// How long a request refused because its bucket is contended is told to wait (the
/// reference engine's contention answer).
pub const CONTENTION_RETRY_MS: i64 = 100;

/// A shard drawn for a bucket, and the shard count it was drawn under: the count its
/// balance must be sized for, whatever the count cache says later (it can be cleared).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Draw {
    pub shard: u32,
    pub count: u32,
}

/// State of one bucket while a request is being decided.
#[derive(Debug)]
pub(super) enum Progress {
    /// Not looked at yet, or its store call failed.
    Pending,
    /// Debited (by the fast path, or a retry on another shard); `image` as the debit left it.
    Applied { shard: u32, image: BucketItem },
    /// The image proves a gated claim cannot fit.
    Rejected { shard: u32, image: BucketItem },
    /// Needs the slow path on `shard`, sized for `count` shards; `seen` is the image its
    /// fast-path refusal returned (of that shard or, after a doubling, another).
    Slow {
        shard: u32,
        count: u32,
        seen: Option<(u32, BucketItem)>,
    },
}

/// One bucket a slow pass plans: its index in the request, the shard, the shard count
/// its plan is sized for.
#[derive(Debug, Clone, Copy)]
pub(super) struct SlowTarget {
    pub bucket: usize,
    pub shard: u32,
    pub count: u32,
}

pub(super) fn now_s(now_ms: i64) -> i64 {
    now_ms.div_euclid(1_000)
}

pub(super) fn wrap(b: &BucketClaim) -> impl Fn(StoreError) -> EngineError + '_ {
    move |source| EngineError::Store {
        entity: b.entity.to_string(),
        resource: b.resource.to_string(),
        source,
    }
}

impl<S: BucketStore> Engine<S> {
    /// Decides `req`: debits every gated claim (and every forced one), or nothing.
    pub async fn acquire(&self, req: &Acquire) -> Result<Decision, EngineError> {
        let decision = match self.decide(req).await {
            Ok(d) => d,
            // A bucket too busy to write is a refusal with a short wait, not an outage
            // (every debit applied was refunded before the error came back).
            Err(EngineError::Store {
                entity,
                resource,
                source: StoreError::Contention { .. },
            }) => {
                EngineStats::bump(&self.stats.contended);
                return Ok(self.contended(req, &entity, &resource));
            }
            Err(e) => return Err(e),
        };
        if !decision.admitted {
            self.note_per_shard_ceiling(req, &decision);
        }
        Ok(decision)
    }

    async fn decide(&self, req: &Acquire) -> Result<Decision, EngineError> {
        if req.buckets.is_empty() {
            return Ok(Decision {
                admitted: true,
                buckets: SmallVec::new(),
            });
        }
        let now = self.clock.now_ms();

        let mut avoid: PerBucket<Avoid> = (0..req.buckets.len()).map(|_| Avoid::new()).collect();
        if self.rejections.holds_any() {
            for (i, shards) in avoid.iter_mut().enumerate() {
                if let Some(decision) = self.cached_refusal(req, i, shards, now) {
                    EngineStats::bump(&self.stats.rejection_cache_hits);
                    return Ok(decision);
                }
            }
        }

        // Fast path, every bucket concurrently.
        let draws: PerBucket<Draw> = req
            .buckets
            .iter()
            .zip(&avoid)
            .map(|(b, a)| {
                let count = self.shards.get(&b.entity, &b.resource);
                Draw {
                    shard: self.draw.draw(count, a),
                    count,
                }
            })
            .collect();
        // A drawn shard this process is refilling has just run dry: wait for the refill
        // rather than send a debit it would refuse, and decide at the time it ended.
        let mut now = now;
        if self.slow_passes.any() && Box::pin(self.await_slow_passes(req, &draws)).await {
            now = self.clock.now_ms();
        }
        // One bucket (the common request) is awaited directly, and two (a cascade pair)
        // joined in place: `join_all` allocates.
        let fast: SmallVec<[_; 2]> = if let [b] = &req.buckets[..] {
            smallvec::smallvec![self.fast_debit(b, draws[0], now).await]
        } else if let [a, b] = &req.buckets[..] {
            let (x, y) = futures::join!(
                self.fast_debit(a, draws[0], now),
                self.fast_debit(b, draws[1], now)
            );
            smallvec::smallvec![x, y]
        } else {
            // Three or more: `join_all` allocates its output, which is kept as it is.
            SmallVec::from_vec(
                join_all(
                    req.buckets
                        .iter()
                        .zip(&draws)
                        .map(|(b, &d)| self.fast_debit(b, d, now)),
                )
                .await,
            )
        };

        // The common case: every debit applied. Everything else goes on in a boxed future,
        // which keeps this one (moved into the request's future, itself moved into the
        // server's box) small.
        if fast
            .iter()
            .all(|r| matches!(r, Ok(DebitOutcome::Applied(_))))
        {
            let buckets = req
                .buckets
                .iter()
                .zip(&draws)
                .zip(&fast)
                .filter_map(|((b, d), r)| match r {
                    Ok(DebitOutcome::Applied(image)) => {
                        EngineStats::bump(&self.stats.fast_path_hits);
                        Some(self.outcome_from_image(b, d.shard, image, now, true))
                    }
                    _ => None,
                })
                .collect();
            return Ok(Decision {
                admitted: true,
                buckets,
            });
        }
        Box::pin(self.settle(req, &draws, fast, &avoid, now)).await
    }

    /// Takes a request on from fast-path answers of which at least one was not applied:
    /// resolves each refusal, follows or leads slow passes, refunds on refusal or error.
    async fn settle(
        &self,
        req: &Acquire,
        draws: &[Draw],
        fast: SmallVec<[Result<DebitOutcome, StoreError>; 2]>,
        avoid: &[Avoid],
        mut now: i64,
    ) -> Result<Decision, EngineError> {
        let mut progress: SmallVec<[Progress; 2]> = SmallVec::new();
        let mut first_error = None;
        for ((b, &draw), result) in req.buckets.iter().zip(draws).zip(fast) {
            let idx = progress.len();
            progress.push(match result {
                Ok(DebitOutcome::Applied(image)) => {
                    EngineStats::bump(&self.stats.fast_path_hits);
                    Progress::Applied {
                        shard: draw.shard,
                        image,
                    }
                }
                Ok(DebitOutcome::Refused(image)) => {
                    match Box::pin(self.resolve(b, draw, image, &avoid[idx], now)).await {
                        Ok(p) => p,
                        Err(e) => {
                            first_error = first_error.or(Some(e));
                            Progress::Pending
                        }
                    }
                }
                Err(e) => {
                    first_error = first_error.or(Some(wrap(b)(e)));
                    Progress::Pending
                }
            });
        }
        if let Some(e) = first_error {
            Box::pin(self.refund_applied(req, &progress, now)).await;
            return Err(e);
        }
        if progress.iter().any(|p| matches!(p, Progress::Slow { .. })) {
            match Box::pin(self.follow_slow_passes(req, &mut progress, avoid)).await {
                // Having waited, the request is decided at the time the wait ended.
                Ok(Some(later)) => now = later,
                Ok(None) => {}
                Err(e) => {
                    Box::pin(self.refund_applied(req, &progress, now)).await;
                    return Err(e);
                }
            }
        }

        if progress
            .iter()
            .any(|p| matches!(p, Progress::Rejected { .. }))
        {
            EngineStats::bump(&self.stats.fast_rejections);
            Box::pin(self.refund_applied(req, &progress, now)).await;
            return Ok(self.refused_decision(req, &progress, now));
        }

        let slow: Vec<SlowTarget> = progress
            .iter()
            .enumerate()
            .filter_map(|(bucket, p)| match *p {
                Progress::Slow { shard, count, .. } => Some(SlowTarget {
                    bucket,
                    shard,
                    count,
                }),
                _ => None,
            })
            .collect();
        if slow.is_empty() {
            let buckets = req
                .buckets
                .iter()
                .zip(&progress)
                .map(|(b, p)| match p {
                    Progress::Applied { shard, image } => {
                        self.outcome_from_image(b, *shard, image, now, true)
                    }
                    _ => unreachable!("only applied buckets remain"),
                })
                .collect();
            return Ok(Decision {
                admitted: true,
                buckets,
            });
        }

        EngineStats::bump(&self.stats.slow_paths);
        let _leading = self.slow_passes.lead(slow.iter().map(|t| {
            let b = &req.buckets[t.bucket];
            BucketKey::new(&b.entity, &b.resource, t.shard)
        }));
        match Box::pin(self.slow_path(req, &slow)).await {
            Ok((admitted, outcomes)) => {
                let now = self.clock.now_ms();
                if !admitted {
                    Box::pin(self.refund_applied(req, &progress, now)).await;
                }
                let mut outcomes = outcomes.into_iter();
                let buckets = req
                    .buckets
                    .iter()
                    .zip(&progress)
                    .map(|(b, p)| match p {
                        Progress::Applied { shard, image } => {
                            self.outcome_from_image(b, *shard, image, now, admitted)
                        }
                        _ => outcomes.next().expect("one outcome per slow bucket"),
                    })
                    .collect();
                Ok(Decision { admitted, buckets })
            }
            Err(e) => {
                Box::pin(self.refund_applied(req, &progress, now)).await;
                Err(e)
            }
        }
    }

    /// Waits for the slow passes in flight on the shards drawn for `req`'s fast path;
    /// returns whether it waited for any.
    async fn await_slow_passes(&self, req: &Acquire, draws: &[Draw]) -> bool {
        let mut waited = false;
        for (b, d) in req.buckets.iter().zip(draws) {
            let key = BucketKey::new(&b.entity, &b.resource, d.shard);
            if let Some(pass_done) = self.slow_passes.in_flight(&key) {
                EngineStats::bump(&self.stats.slow_passes_followed);
                pass_done.await;
                waited = true;
            }
        }
        waited
    }

    /// Buckets bound for the slow path on a shard this process is already refilling wait
    /// for that pass, then try the fast path there again (see `inflight`). On an error,
    /// `progress` still records every debit applied, for the refund.
    async fn follow_slow_passes(
        &self,
        req: &Acquire,
        progress: &mut [Progress],
        avoid: &[Avoid],
    ) -> Result<Option<i64>, EngineError> {
        let mut waited_until = None;
        for (i, p) in progress.iter_mut().enumerate() {
            let Progress::Slow { shard, count, .. } = *p else {
                continue;
            };
            let b = &req.buckets[i];
            let key = BucketKey::new(&b.entity, &b.resource, shard);
            let Some(pass_done) = self.slow_passes.in_flight(&key) else {
                continue;
            };
            EngineStats::bump(&self.stats.slow_passes_followed);
            pass_done.await;
            let now = self.clock.now_ms();
            waited_until = Some(now);
            let draw = Draw { shard, count };
            *p = match self.fast_debit(b, draw, now).await.map_err(wrap(b))? {
                DebitOutcome::Applied(image) => {
                    EngineStats::bump(&self.stats.fast_path_hits);
                    Progress::Applied { shard, image }
                }
                DebitOutcome::Refused(image) => {
                    self.resolve(b, draw, image, &avoid[i], now).await?
                }
            };
        }
        Ok(waited_until)
    }

    /// Answers `req` from the store without writing: what each bucket would say now.
    pub async fn peek(&self, req: &Acquire) -> Result<Decision, EngineError> {
        let now = self.clock.now_ms();
        let keys: Vec<BucketKey> = req
            .buckets
            .iter()
            .map(|b| BucketKey::new(&b.entity, &b.resource, 0))
            .collect();
        let images = self
            .store
            .read(&keys)
            .await
            .map_err(|e| wrap(&req.buckets[0])(e))?;
        let buckets: Vec<BucketOutcome> = req
            .buckets
            .iter()
            .zip(&keys)
            .zip(&images)
            .map(|((b, key), img)| {
                let count = img
                    .as_ref()
                    .map_or(1, |i| i.shard_count)
                    .max(self.shards.get(&b.entity, &b.resource));
                pass::plan_bucket(b, key, img.as_ref(), count, &self.pass_context(now)).refused
            })
            .collect();
        let admitted = buckets.iter().zip(&req.buckets).all(|(o, b)| {
            o.limits
                .iter()
                .zip(&b.limits)
                .all(|(l, c)| l.fits || c.forced)
        });
        Ok(Decision {
            admitted,
            buckets: buckets.into_iter().collect(),
        })
    }

    /// Gives back what an admitted decision took (best effort; used when a request turns
    /// out refused after its debits, e.g. every quota-mode descriptor over).
    pub async fn refund(&self, req: &Acquire, decision: &Decision) {
        if !decision.admitted {
            return;
        }
        join_all(
            req.buckets
                .iter()
                .zip(&decision.buckets)
                .map(|(b, o)| self.credit_bucket(b, o.shard, o.shard_count, o.stamp)),
        )
        .await;
    }

    pub(super) async fn fast_debit(
        &self,
        b: &BucketClaim,
        draw: Draw,
        now: i64,
    ) -> Result<DebitOutcome, StoreError> {
        let key = BucketKey::new(&b.entity, &b.resource, draw.shard);
        let debits: SmallVec<[Debit; 2]> = b
            .limits
            .iter()
            .map(|c| Debit {
                limit: c.limit.clone(),
                amount: c.amount,
                gated: true,
                params: Some(c.params),
            })
            .collect();
        let out = self
            .store
            .debit(
                &key,
                &debits,
                DebitMode::Fast {
                    now_s: now_s(now),
                    shard_count: draw.count,
                },
            )
            .await?;
        match &out {
            DebitOutcome::Applied(image) => {
                self.shards.learn(&b.entity, &b.resource, image.shard_count);
                let short = b
                    .limits
                    .iter()
                    .any(|c| image.limit(&c.limit).is_some_and(|st| st.tk < c.amount));
                self.rejections.remember_admitted(&key, image, now, short);
            }
            DebitOutcome::Refused(Some(image)) => {
                self.shards.learn(&b.entity, &b.resource, image.shard_count);
                self.rejections.remember(&key, image, now);
            }
            DebitOutcome::Refused(None) => {}
        }
        Ok(out)
    }

    /// The slow path over the buckets `targets`. Returns whether everything fit and was
    /// committed, and their outcomes.
    async fn slow_path(
        &self,
        req: &Acquire,
        targets: &[SlowTarget],
    ) -> Result<(bool, Vec<BucketOutcome>), EngineError> {
        let keys: Vec<BucketKey> = targets
            .iter()
            .map(|t| {
                let b = &req.buckets[t.bucket];
                BucketKey::new(&b.entity, &b.resource, t.shard)
            })
            .collect();
        let first = &req.buckets[targets[0].bucket];
        let images = self.store.read(&keys).await.map_err(wrap(first))?;
        let ctx = self.pass_context(self.clock.now_ms());
        let now = ctx.now;
        let plans: Vec<BucketPlan> = targets
            .iter()
            .zip(&keys)
            .zip(&images)
            .map(|((t, key), img)| {
                let (b, count) = (&req.buckets[t.bucket], t.count);
                if let Some(img) = img {
                    self.shards.learn(&b.entity, &b.resource, img.shard_count);
                }
                pass::plan_bucket(b, key, img.as_ref(), count, &ctx)
            })
            .collect();

        if !plans.iter().all(|p| p.fits) {
            for (key, img) in keys.iter().zip(&images) {
                if let Some(img) = img {
                    self.rejections.remember(key, img, now);
                }
            }
            return Ok((false, plans.into_iter().map(|p| p.refused).collect()));
        }

        let mut writes: Vec<Write> = plans.iter().map(|p| p.write.clone()).collect();
        let mut admitted: Vec<BucketOutcome> = plans.iter().map(|p| p.admitted.clone()).collect();
        for round in 0..3 {
            match self.store.commit(&writes).await.map_err(wrap(first))? {
                CommitOutcome::Committed => return Ok((true, admitted)),
                CommitOutcome::Conflict(failed) => {
                    if round == 2 {
                        break;
                    }
                    EngineStats::bump(&self.stats.consumption_only_retries);
                    for (idx, current) in failed {
                        let SlowTarget {
                            bucket,
                            shard,
                            count,
                        } = targets[idx];
                        let b = &req.buckets[bucket];
                        if let Write::Debit { .. } = writes[idx] {
                            // The balance no longer covers the request.
                            let mut outcomes: Vec<BucketOutcome> =
                                plans.into_iter().map(|p| p.refused).collect();
                            if let Some(img) = &current {
                                outcomes[idx] = self.outcome_from_image(b, shard, img, now, false);
                                self.rejections.remember(&keys[idx], img, now);
                            }
                            return Ok((false, outcomes));
                        }
                        writes[idx] = match &current {
                            // Lost the lock or the create race: take the tokens only if the
                            // item as it stands covers them, with no refill. What it
                            // reports is that item after the debit.
                            Some(img) => {
                                admitted[idx] = self.retry_outcome(b, shard, img, now);
                                pass::retry_debit(b, &keys[idx], img, &ctx)
                            }
                            // The item vanished (evicted) since the read: create it again.
                            None => {
                                let plan = pass::plan_bucket(b, &keys[idx], None, count, &ctx);
                                admitted[idx] = plan.admitted;
                                plan.write
                            }
                        };
                    }
                }
            }
        }
        // Persistent contention: refuse rather than spin.
        Ok((false, plans.into_iter().map(|p| p.refused).collect()))
    }

    /// What a slow pass knows at `now`.
    pub(super) fn pass_context(&self, now: i64) -> PassContext {
        PassContext {
            now,
            wcu: self.wcu,
            ttl_multiplier: self.options.ttl_multiplier,
        }
    }

    /// Refunds every bucket of `progress` that was debited.
    async fn refund_applied(&self, req: &Acquire, progress: &[Progress], now: i64) {
        join_all(
            req.buckets
                .iter()
                .zip(progress)
                .filter_map(|(b, p)| match p {
                    Progress::Applied { shard, image } => {
                        // Held first, so that the refund below lands on it and a repeat of
                        // this request, refused from the cache, reports this bucket's real
                        // balance (an admitted image is otherwise kept only when short).
                        let key = BucketKey::new(&b.entity, &b.resource, *shard);
                        self.rejections.remember(&key, image, now);
                        Some(self.credit_bucket(b, *shard, image.shard_count, Stamp::of(image)))
                    }
                    _ => None,
                }),
        )
        .await;
    }

    /// Refunds what `b`'s claims took from `shard`, on condition that nothing refilled
    /// or doubled it since the debit whose image bore `stamp` (see `BucketStore::credit`).
    async fn credit_bucket(&self, b: &BucketClaim, shard: u32, count: u32, stamp: Stamp) {
        let key = BucketKey::new(&b.entity, &b.resource, shard);
        let count = count.max(self.shards.get(&b.entity, &b.resource));
        let credits: Vec<Credit> = b
            .limits
            .iter()
            .filter(|c| c.amount > 0)
            .map(|c| Credit {
                limit: c.limit.clone(),
                amount: c.amount,
                ceiling: c.params.share(count).ceiling,
            })
            .collect();
        if credits.is_empty() {
            return;
        }
        self.rejections.credit(&key, &credits);
        EngineStats::bump(&self.stats.refunds);
        if let Err(e) = self.store.credit(&key, stamp, &credits).await {
            // A lost refund costs this bucket one request's tokens; never an over-admission.
            tracing::warn!(resource = %b.resource, error = %e, "refund of a voided debit failed");
        }
    }
}

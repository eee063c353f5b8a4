//! The driver of a decision, top to bottom: the rejection cache's answer, the fast path's
//! debits (one per bucket, concurrently), and — when any was refused — each refusal
//! resolved, slow passes followed or led, and the refund of what was taken when the
//! request is refused or fails. Its steps are the sibling files; this one only orders
//! them and merges what they report.

use futures::future::join_all;
use smallvec::SmallVec;

use super::pass;
use super::state::{wrap, Avoid, Deciding, Draw, PerBucket, Progress, SlowTarget};
use crate::engine::bucket::now_s;
use crate::engine::{BucketClaim, BucketOutcome, Decision, EngineError, EngineStats};
use crate::store::{BucketKey, BucketStore, Debit, DebitMode, DebitOutcome, StoreError};

/// The fast path's answer for each bucket, in request order.
type FastAnswers = SmallVec<[Result<DebitOutcome, StoreError>; 2]>;

/// A request that failed while taking its buckets on: the error, and where each bucket
/// stood (what was applied is refunded before the error goes back).
struct Refunding {
    progress: SmallVec<[Progress; 2]>,
    error: EngineError,
}

impl<S: BucketStore> Deciding<'_, S> {
    /// Decides the request: the rejection cache, the fast path, and [`Self::settle`] for
    /// anything the fast path did not apply.
    pub(crate) async fn decide(&self) -> Result<Decision, EngineError> {
        if self.req.buckets.is_empty() {
            return Ok(Decision {
                admitted: true,
                buckets: SmallVec::new(),
            });
        }
        let mut now = self.engine.clock.now_ms();
        let mut avoid: PerBucket<Avoid> =
            (0..self.req.buckets.len()).map(|_| Avoid::new()).collect();
        if let Some(decision) = self.refused_from_cache(&mut avoid, now) {
            return Ok(decision);
        }

        let draws = self.draw_shards(&avoid);
        self.claim_cached(&draws);
        // A drawn shard this process is refilling has just run dry: wait for the refill
        // rather than send a debit it would refuse, and decide at the time it ended.
        if self.engine.slow_passes.any() && Box::pin(self.await_slow_passes(&draws)).await {
            now = self.engine.clock.now_ms();
        }
        let fast = self.fast_debits(&draws, now).await;

        // The common case: every debit applied. Everything else goes on in a boxed future,
        // which keeps this one (moved into the request's future, itself moved into the
        // server's box) small.
        if fast
            .iter()
            .all(|r| matches!(r, Ok(DebitOutcome::Applied(_))))
        {
            return Ok(self.all_applied(&draws, &fast, now));
        }
        Box::pin(self.settle(&draws, fast, &avoid, now)).await
    }

    /// The rejection cache's refusal of the request, if it holds one; fills `avoid` with
    /// the shards it knows short either way.
    fn refused_from_cache(&self, avoid: &mut [Avoid], now: i64) -> Option<Decision> {
        if !self.engine.rejections.holds_any() {
            return None;
        }
        for (i, shards) in avoid.iter_mut().enumerate() {
            if let Some(decision) = self.cached_refusal(i, shards, now) {
                EngineStats::bump(&self.engine.stats.rejection_cache_hits);
                return Some(decision);
            }
        }
        None
    }

    /// Takes what the request will debit from the cached images of the shards drawn, so
    /// that the requests in flight after it see those tokens gone (`rejection.rs`).
    fn claim_cached(&self, draws: &[Draw]) {
        if !self.engine.rejections.holds_any() {
            return;
        }
        for (b, d) in self.req.buckets.iter().zip(draws) {
            let key = BucketKey::new(&b.entity, &b.resource, d.shard);
            self.engine.rejections.claim(&key, &b.limits);
        }
    }

    /// A shard for each bucket, drawn under the count this process knows, away from the
    /// shards known short.
    fn draw_shards(&self, avoid: &[Avoid]) -> PerBucket<Draw> {
        self.req
            .buckets
            .iter()
            .zip(avoid)
            .map(|(b, a)| {
                let count = self.engine.shards.get(&b.entity, &b.resource);
                Draw {
                    shard: self.engine.draw.draw(count, a),
                    count,
                }
            })
            .collect()
    }

    /// The fast path: one debit per bucket on its drawn shard, every bucket concurrently.
    /// One bucket (the common request) is awaited directly, and two (a cascade pair)
    /// joined in place: `join_all` allocates.
    async fn fast_debits(&self, draws: &[Draw], now: i64) -> FastAnswers {
        let buckets = &self.req.buckets[..];
        if let ([b], &[d]) = (buckets, draws) {
            smallvec::smallvec![self.fast_debit(b, d, now).await]
        } else if let ([a, b], &[da, db]) = (buckets, draws) {
            let (x, y) = futures::join!(self.fast_debit(a, da, now), self.fast_debit(b, db, now));
            smallvec::smallvec![x, y]
        } else {
            // Three or more: `join_all` allocates its output, which is kept as it is.
            let debits = buckets
                .iter()
                .zip(draws)
                .map(|(b, &d)| self.fast_debit(b, d, now));
            SmallVec::from_vec(join_all(debits).await)
        }
    }

    /// The admission of a request whose every fast debit applied, reported from the
    /// images the debits returned.
    fn all_applied(&self, draws: &[Draw], fast: &FastAnswers, now: i64) -> Decision {
        let buckets = self
            .req
            .buckets
            .iter()
            .zip(draws)
            .zip(fast)
            .filter_map(|((b, d), r)| match r {
                Ok(DebitOutcome::Applied(image)) => {
                    EngineStats::bump(&self.engine.stats.fast_path_hits);
                    Some(self.outcome_from_image(b, d.shard, image, now, true))
                }
                _ => None,
            })
            .collect();
        Decision {
            admitted: true,
            buckets,
        }
    }

    /// Takes a request on from fast-path answers of which at least one was not applied:
    /// resolves each refusal, follows or leads slow passes, refunds on refusal or error.
    async fn settle(
        &self,
        draws: &[Draw],
        fast: FastAnswers,
        avoid: &[Avoid],
        mut now: i64,
    ) -> Result<Decision, EngineError> {
        let progress = Box::pin(self.take_on(draws, fast, avoid, now)).await;
        let mut progress = match progress {
            Ok(progress) => progress,
            Err(Refunding { progress, error }) => {
                Box::pin(self.refund_applied(&progress, now)).await;
                return Err(error);
            }
        };
        if progress.iter().any(|p| matches!(p, Progress::Slow { .. })) {
            match Box::pin(self.follow_slow_passes(&mut progress, avoid)).await {
                // Having waited, the request is decided at the time the wait ended.
                Ok(Some(later)) => now = later,
                Ok(None) => {}
                Err(e) => {
                    Box::pin(self.refund_applied(&progress, now)).await;
                    return Err(e);
                }
            }
        }
        if progress
            .iter()
            .any(|p| matches!(p, Progress::Rejected { .. }))
        {
            EngineStats::bump(&self.engine.stats.fast_path_refusals);
            Box::pin(self.refund_applied(&progress, now)).await;
            return Ok(self.refused_decision(&progress, now));
        }
        Box::pin(self.finish(&progress, now)).await
    }

    /// Where each bucket stands after its fast-path answer: applied, or its refusal
    /// resolved (`resolve.rs`). On an error, what was applied, for the refund.
    async fn take_on(
        &self,
        draws: &[Draw],
        fast: FastAnswers,
        avoid: &[Avoid],
        now: i64,
    ) -> Result<SmallVec<[Progress; 2]>, Refunding> {
        let mut progress: SmallVec<[Progress; 2]> = SmallVec::new();
        let mut first_error = None;
        // `draws`, `fast` and `avoid` hold one item per bucket, in order.
        let per_bucket = self.req.buckets.iter().zip(draws).zip(fast).zip(avoid);
        for (((b, &draw), result), avoid) in per_bucket {
            let next = match result {
                Ok(DebitOutcome::Applied(image)) => {
                    EngineStats::bump(&self.engine.stats.fast_path_hits);
                    Ok(Progress::Applied {
                        shard: draw.shard,
                        image,
                    })
                }
                Ok(DebitOutcome::Refused(image)) => {
                    Box::pin(self.resolve(b, draw, image, avoid, now)).await
                }
                // The partition refused the write for its rate: the bucket doubles if it can
                // (resolve.rs), else the throttle is this bucket's refusal.
                Err(throttled @ StoreError::Throttled { .. }) if first_error.is_none() => {
                    Box::pin(self.relieve_throttled(b, draw, throttled)).await
                }
                Err(e) => Err(wrap(b)(e)),
            };
            progress.push(next.unwrap_or_else(|e| {
                first_error.get_or_insert(e);
                Progress::Pending
            }));
        }
        match first_error {
            Some(error) => Err(Refunding { progress, error }),
            None => Ok(progress),
        }
    }

    /// The end of a request no bucket refused: admitted at once when nothing needs the
    /// slow path, else the slow path over those buckets (led here: other requests on
    /// the same shards follow it) decides, and a refusal refunds the rest.
    async fn finish(&self, progress: &[Progress], now: i64) -> Result<Decision, EngineError> {
        let slow: Vec<SlowTarget> = progress
            .iter()
            .zip(&self.req.buckets)
            .filter_map(|(p, claim)| match *p {
                Progress::Slow {
                    shard,
                    count,
                    absent,
                    ..
                } => Some(SlowTarget {
                    claim,
                    shard,
                    count,
                    absent,
                }),
                _ => None,
            })
            .collect();
        if slow.is_empty() {
            let buckets = self.merged_outcomes(progress, now, true, std::iter::empty());
            return Ok(Decision {
                admitted: true,
                buckets,
            });
        }

        EngineStats::bump(&self.engine.stats.slow_paths);
        let _leading = self.engine.slow_passes.lead(
            slow.iter()
                .map(|t| BucketKey::new(&t.claim.entity, &t.claim.resource, t.shard)),
        );
        match Box::pin(self.slow_path(&slow)).await {
            Ok((admitted, outcomes)) => {
                let now = self.engine.clock.now_ms();
                if !admitted {
                    Box::pin(self.refund_applied(progress, now)).await;
                }
                let buckets = self.merged_outcomes(progress, now, admitted, outcomes);
                Ok(Decision { admitted, buckets })
            }
            Err(e) => {
                Box::pin(self.refund_applied(progress, now)).await;
                Err(e)
            }
        }
    }

    /// A bucket too busy to write (its item contended by transactions, or its partition
    /// throttled) is refused with a short wait, that bucket alone: it is busy, the store
    /// is not down, so no `failure_mode` answers it. Every debit applied was refunded
    /// before the error came back. Any other error is returned as it is.
    pub(crate) fn busy_refusal(&self, e: EngineError) -> Result<Decision, EngineError> {
        let EngineError::Store {
            entity,
            resource,
            source,
        } = &e
        else {
            return Err(e);
        };
        match source {
            StoreError::Contention { .. } => {
                EngineStats::bump(&self.engine.stats.contended_refusals);
                Ok(self.contended(entity, resource))
            }
            StoreError::Throttled { key } => {
                EngineStats::bump(&self.engine.stats.throttled_refusals);
                // The throttled item's own bucket: a call may have carried several.
                let named = self
                    .req
                    .buckets
                    .iter()
                    .any(|b| b.entity == key.entity && b.resource == key.resource);
                Ok(if named {
                    self.contended(&key.entity, &key.resource)
                } else {
                    self.contended(entity, resource)
                })
            }
            _ => Err(e),
        }
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
        let mode = DebitMode::Fast {
            now_s: now_s(now),
            shard_count: draw.count,
        };
        // Shard 0 missing is created with the debit where the store can (one call for a
        // bucket's first request), sized for the count drawn under, as a slow pass would
        // create it. Any other shard is not: created, it must take the count shard 0
        // holds, which a slow pass reads first (`slow.rs`).
        let out = if draw.shard == 0 {
            let seed = || pass::seed_item(b, draw.count, &self.pass_context(now));
            self.engine
                .store
                .debit_or_create(&key, &debits, mode, &seed)
                .await?
        } else {
            self.engine.store.debit(&key, &debits, mode).await?
        };
        match &out {
            DebitOutcome::Applied(image) => {
                self.engine
                    .shards
                    .learn(&b.entity, &b.resource, image.shard_count);
                let short = b.limits.iter().any(|c| {
                    image
                        .limit(&c.limit)
                        .is_some_and(|st| st.balance < c.amount)
                });
                self.engine
                    .rejections
                    .remember_admitted(&key, image, now, short);
            }
            DebitOutcome::Refused(Some(image)) => {
                self.engine
                    .shards
                    .learn(&b.entity, &b.resource, image.shard_count);
                self.engine.rejections.remember(&key, image, now);
            }
            DebitOutcome::Refused(None) => {}
        }
        Ok(out)
    }

    /// Every bucket's outcome in request order: the fast path's applied buckets from the
    /// images their debits returned, the others from `slow` (one per slow bucket, in
    /// order).
    #[expect(clippy::expect_used, reason = "one outcome per slow bucket")]
    fn merged_outcomes(
        &self,
        progress: &[Progress],
        now: i64,
        admitted: bool,
        slow: impl IntoIterator<Item = BucketOutcome>,
    ) -> SmallVec<[BucketOutcome; 2]> {
        let mut slow = slow.into_iter();
        self.req
            .buckets
            .iter()
            .zip(progress)
            .map(|(b, p)| match p {
                Progress::Applied { shard, image } => {
                    self.outcome_from_image(b, *shard, image, now, admitted)
                }
                _ => slow.next().expect("one outcome per slow bucket"),
            })
            .collect()
    }
}

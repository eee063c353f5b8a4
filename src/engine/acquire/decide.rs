//! The driver of a decision, top to bottom: the rejection cache's answer, the fast path's
//! debits (one per bucket, concurrently), and — when any was refused — each refusal
//! resolved, slow passes followed or led, and the refund of what was taken when the
//! request is refused or fails. Its steps are the sibling files; this one only orders
//! them and merges what they report.

use futures::future::join_all;
use smallvec::SmallVec;

use super::state::{wrap, Avoid, Deciding, Draw, PerBucket, Progress, SlowTarget};
use crate::engine::bucket::now_s;
use crate::engine::{BucketClaim, BucketOutcome, Decision, EngineError, EngineStats};
use crate::store::{BucketKey, BucketStore, Debit, DebitMode, DebitOutcome, StoreError};

impl<S: BucketStore> Deciding<'_, S> {
    pub(crate) async fn decide(&self) -> Result<Decision, EngineError> {
        if self.req.buckets.is_empty() {
            return Ok(Decision {
                admitted: true,
                buckets: SmallVec::new(),
            });
        }
        let now = self.engine.clock.now_ms();

        let mut avoid: PerBucket<Avoid> =
            (0..self.req.buckets.len()).map(|_| Avoid::new()).collect();
        if self.engine.rejections.holds_any() {
            for (i, shards) in avoid.iter_mut().enumerate() {
                if let Some(decision) = self.cached_refusal(i, shards, now) {
                    EngineStats::bump(&self.engine.stats.rejection_cache_hits);
                    return Ok(decision);
                }
            }
        }

        // Fast path, every bucket concurrently.
        let draws: PerBucket<Draw> = self
            .req
            .buckets
            .iter()
            .zip(&avoid)
            .map(|(b, a)| {
                let count = self.engine.shards.get(&b.entity, &b.resource);
                Draw {
                    shard: self.engine.draw.draw(count, a),
                    count,
                }
            })
            .collect();
        // A drawn shard this process is refilling has just run dry: wait for the refill
        // rather than send a debit it would refuse, and decide at the time it ended.
        let mut now = now;
        if self.engine.slow_passes.any() && Box::pin(self.await_slow_passes(&draws)).await {
            now = self.engine.clock.now_ms();
        }
        // One bucket (the common request) is awaited directly, and two (a cascade pair)
        // joined in place: `join_all` allocates.
        let fast: SmallVec<[_; 2]> = if let [b] = &self.req.buckets[..] {
            smallvec::smallvec![self.fast_debit(b, draws[0], now).await]
        } else if let [a, b] = &self.req.buckets[..] {
            let (x, y) = futures::join!(
                self.fast_debit(a, draws[0], now),
                self.fast_debit(b, draws[1], now)
            );
            smallvec::smallvec![x, y]
        } else {
            // Three or more: `join_all` allocates its output, which is kept as it is.
            SmallVec::from_vec(
                join_all(
                    self.req
                        .buckets
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
            let buckets = self
                .req
                .buckets
                .iter()
                .zip(&draws)
                .zip(&fast)
                .filter_map(|((b, d), r)| match r {
                    Ok(DebitOutcome::Applied(image)) => {
                        EngineStats::bump(&self.engine.stats.fast_path_hits);
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
        Box::pin(self.settle(&draws, fast, &avoid, now)).await
    }

    /// Takes a request on from fast-path answers of which at least one was not applied:
    /// resolves each refusal, follows or leads slow passes, refunds on refusal or error.
    async fn settle(
        &self,
        draws: &[Draw],
        fast: SmallVec<[Result<DebitOutcome, StoreError>; 2]>,
        avoid: &[Avoid],
        mut now: i64,
    ) -> Result<Decision, EngineError> {
        let mut progress: SmallVec<[Progress; 2]> = SmallVec::new();
        let mut first_error = None;
        for ((b, &draw), result) in self.req.buckets.iter().zip(draws).zip(fast) {
            let idx = progress.len();
            progress.push(match result {
                Ok(DebitOutcome::Applied(image)) => {
                    EngineStats::bump(&self.engine.stats.fast_path_hits);
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
                // The partition refused the write for its rate: the bucket doubles if it can
                // (resolve.rs), else the throttle is this bucket's refusal.
                Err(throttled @ StoreError::Throttled { .. }) if first_error.is_none() => {
                    match Box::pin(self.relieve_throttled(b, draw, throttled)).await {
                        Ok(p) => p,
                        Err(e) => {
                            first_error = Some(e);
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
            Box::pin(self.refund_applied(&progress, now)).await;
            return Err(e);
        }
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

        let slow: Vec<SlowTarget> = progress
            .iter()
            .enumerate()
            .filter_map(|(bucket, p)| match *p {
                Progress::Slow {
                    shard,
                    count,
                    absent,
                    ..
                } => Some(SlowTarget {
                    bucket,
                    shard,
                    count,
                    absent,
                }),
                _ => None,
            })
            .collect();
        if slow.is_empty() {
            let buckets = self.merged_outcomes(&progress, now, true, std::iter::empty());
            return Ok(Decision {
                admitted: true,
                buckets,
            });
        }

        EngineStats::bump(&self.engine.stats.slow_paths);
        let _leading = self.engine.slow_passes.lead(slow.iter().map(|t| {
            let b = &self.req.buckets[t.bucket];
            BucketKey::new(&b.entity, &b.resource, t.shard)
        }));
        match Box::pin(self.slow_path(&slow)).await {
            Ok((admitted, outcomes)) => {
                let now = self.engine.clock.now_ms();
                if !admitted {
                    Box::pin(self.refund_applied(&progress, now)).await;
                }
                let buckets = self.merged_outcomes(&progress, now, admitted, outcomes);
                Ok(Decision { admitted, buckets })
            }
            Err(e) => {
                Box::pin(self.refund_applied(&progress, now)).await;
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
        let out = self
            .engine
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
                self.engine
                    .shards
                    .learn(&b.entity, &b.resource, image.shard_count);
                let short = b
                    .limits
                    .iter()
                    .any(|c| image.limit(&c.limit).is_some_and(|st| st.tk < c.amount));
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

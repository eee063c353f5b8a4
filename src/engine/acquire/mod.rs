//! The acquire algorithm: one all-or-nothing decision over several buckets. This file
//! drives it (and holds its per-request state) and makes the fast path's debits; its
//! steps are its children, which use its state and never each other's driver:
//! `cached.rs` answers from the rejection cache, `resolve.rs` takes a refused debit on
//! (classification, doubling, retries), `slow.rs` runs the slow path and `pass.rs` plans
//! it, `refund.rs` gives back what a refused decision took, `outcome.rs` builds what a
//! decision reports.
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

mod cached;
mod outcome;
mod pass;
mod refund;
mod resolve;
mod slow;

use super::{Acquire, BucketClaim, BucketOutcome, Decision, Engine, EngineError, EngineStats};
use crate::engine::bucket::now_s;
use crate::store::{
    BucketItem, BucketKey, BucketStore, Debit, DebitMode, DebitOutcome, StoreError,
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
        /// The fast debit found no item on `shard`: the pass creates it without reading
        /// it first (a create racing another is refused by the store, and retried).
        absent: bool,
    },
}

/// One bucket a slow pass plans: its index in the request, the shard, the shard count
/// its plan is sized for.
#[derive(Debug, Clone, Copy)]
pub(super) struct SlowTarget {
    pub bucket: usize,
    pub shard: u32,
    pub count: u32,
    /// Known absent (see `Progress::Slow`): not read.
    pub absent: bool,
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
        self.acquire_by(req, None).await
    }

    /// [`Self::acquire`] for a caller that gives up at `deadline`: a wait for a lease
    /// move takes at most a small part of what is left, so the store still decides in
    /// time (see `lease/mod.rs`). The deadline bounds nothing else: the caller holds the
    /// whole call to it.
    pub async fn acquire_by(
        &self,
        req: &Acquire,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Decision, EngineError> {
        if self.leasing() {
            if let Some(decision) = Box::pin(self.answer_from_leases(req, deadline)).await {
                return Ok(decision);
            }
        }
        let decision = match self.decide(req).await {
            Ok(mut d) if self.leasing() => {
                self.saw_decision(req, &mut d);
                d
            }
            Ok(d) => d,
            Err(e) => return self.busy_refusal(req, e),
        };
        if !decision.admitted {
            self.note_per_shard_ceiling(req, &decision);
        }
        Ok(decision)
    }

    pub(super) async fn decide(&self, req: &Acquire) -> Result<Decision, EngineError> {
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
            EngineStats::bump(&self.stats.fast_path_refusals);
            Box::pin(self.refund_applied(req, &progress, now)).await;
            return Ok(self.refused_decision(req, &progress, now));
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
            let buckets = self.merged_outcomes(req, &progress, now, true, std::iter::empty());
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
                let buckets = self.merged_outcomes(req, &progress, now, admitted, outcomes);
                Ok(Decision { admitted, buckets })
            }
            Err(e) => {
                Box::pin(self.refund_applied(req, &progress, now)).await;
                Err(e)
            }
        }
    }

    /// A bucket too busy to write (its item contended by transactions, or its partition
    /// throttled) is refused with a short wait, that bucket alone: it is busy, the store
    /// is not down, so no `failure_mode` answers it. Every debit applied was refunded
    /// before the error came back. Any other error is returned as it is.
    fn busy_refusal(&self, req: &Acquire, e: EngineError) -> Result<Decision, EngineError> {
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
                EngineStats::bump(&self.stats.contended_refusals);
                Ok(self.contended(req, entity, resource))
            }
            StoreError::Throttled { key } => {
                EngineStats::bump(&self.stats.throttled_refusals);
                // The throttled item's own bucket: a call may have carried several.
                let named = req
                    .buckets
                    .iter()
                    .any(|b| b.entity == key.entity && b.resource == key.resource);
                Ok(if named {
                    self.contended(req, &key.entity, &key.resource)
                } else {
                    self.contended(req, entity, resource)
                })
            }
            _ => Err(e),
        }
    }

    /// Answers `req` from the store without writing: what each bucket would say now.
    pub async fn peek(&self, req: &Acquire) -> Result<Decision, EngineError> {
        let now = self.clock.now_ms();
        let keys: Vec<BucketKey> = req
            .buckets
            .iter()
            .map(|b| BucketKey::new(&b.entity, &b.resource, 0))
            .collect();
        let images = match self.store.read(&keys).await {
            Ok(images) => images,
            Err(e) => return self.busy_refusal(req, wrap(&req.buckets[0])(e)),
        };
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
}

impl<S: BucketStore> Engine<S> {
    /// Every bucket's outcome in request order: the fast path's applied buckets from the
    /// images their debits returned, the others from `slow` (one per slow bucket, in
    /// order).
    fn merged_outcomes(
        &self,
        req: &Acquire,
        progress: &[Progress],
        now: i64,
        admitted: bool,
        slow: impl IntoIterator<Item = BucketOutcome>,
    ) -> SmallVec<[BucketOutcome; 2]> {
        let mut slow = slow.into_iter();
        req.buckets
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

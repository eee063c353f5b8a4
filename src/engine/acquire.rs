//! The acquire algorithm: one all-or-nothing decision over several buckets.
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
type Avoid = SmallVec<[u32; 4]>;

/// Per-bucket working state of one decision: inline for up to four buckets, as many
/// descriptors as the service keeps inline, so that a request of three or four buckets
/// does not allocate for it either.
type PerBucket<T> = SmallVec<[T; 4]>;

use super::bucket::{self, refill, MILLI};
use super::pass::{self, BucketPlan, PassContext};
use super::{
    Acquire, BucketClaim, BucketOutcome, Decision, Engine, EngineError, EngineStats, LimitClaim,
    LimitOutcome, MAX_SHARD_COUNT,
};
use crate::store::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Credit, Debit, DebitMode, DebitOutcome,
    Stamp, StoreError, Write, WCU_LIMIT,
};

/// How long a request refused because its bucket is contended is told to wait (the
/// reference engine's contention answer).
pub const CONTENTION_RETRY_MS: i64 = 100;

/// A shard drawn for a bucket, and the shard count it was drawn under: the count its
/// balance must be sized for, whatever the count cache says later (it can be cleared).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Draw {
    shard: u32,
    count: u32,
}

/// Why the fast path refused, judged from the old image alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// Expired, a claimed limit missing, parameters changed, no `wcu`, or a shard count
    /// other than the one drawn under: only a slow pass can fix the item (or, for a count
    /// larger than this process knew, size the request for it).
    Stale,
    WcuExhausted,
    BothExhausted,
    LimitExhausted,
}

/// Where a refused bucket goes next.
#[derive(Debug)]
enum Resolution {
    /// A retry on another shard succeeded.
    Applied { shard: u32, image: BucketItem },
    /// The image proves a gated claim cannot fit.
    Rejected { shard: u32, image: BucketItem },
    /// Needs the slow path on this shard, sized for this count.
    Slow { shard: u32, count: u32 },
}

/// State of one bucket while a request is being decided.
#[derive(Debug)]
enum Progress {
    Applied {
        shard: u32,
        image: BucketItem,
    },
    Rejected {
        shard: u32,
        image: BucketItem,
    },
    /// Needs the slow path; `seen` is the image its fast-path refusal returned.
    Slow {
        shard: u32,
        count: u32,
        seen: Option<(u32, BucketItem)>,
    },
}

impl Progress {
    /// Where a refused bucket stands once resolved; `seen` is its fast-path refusal's image.
    fn resolved(r: Resolution, seen: Option<(u32, BucketItem)>) -> Progress {
        match r {
            Resolution::Applied { shard, image } => Progress::Applied { shard, image },
            Resolution::Rejected { shard, image } => Progress::Rejected { shard, image },
            Resolution::Slow { shard, count } => Progress::Slow { shard, count, seen },
        }
    }
}

fn now_s(now_ms: i64) -> i64 {
    now_ms.div_euclid(1_000)
}

fn wrap(b: &BucketClaim) -> impl Fn(StoreError) -> EngineError + '_ {
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

    /// The refusal of a request whose bucket (`entity`, `resource`) stayed contended.
    fn contended(&self, req: &Acquire, entity: &str, resource: &str) -> Decision {
        let buckets = req
            .buckets
            .iter()
            .map(|b| {
                let mut o = self.unknown_outcome(b);
                if b.entity == entity && b.resource == resource {
                    for l in o.limits.iter_mut() {
                        l.fits = false;
                        l.wait_ms = Some(CONTENTION_RETRY_MS);
                    }
                }
                o
            })
            .collect();
        Decision {
            admitted: false,
            buckets,
        }
    }

    /// Counts and logs a refusal that no shard could ever admit: a gated claim larger
    /// than one shard's share (the per-shard request ceiling).
    fn note_per_shard_ceiling(&self, req: &Acquire, decision: &Decision) {
        for (b, o) in req.buckets.iter().zip(&decision.buckets) {
            for (c, l) in b.limits.iter().zip(&o.limits) {
                if c.exceeds(l.share) {
                    EngineStats::bump(&self.stats.per_shard_ceiling_rejections);
                    if let Some(suppressed) = self.ceiling_log.admit() {
                        tracing::warn!(
                            resource = %b.resource,
                            limit = %c.limit,
                            requested_milli = c.amount,
                            shard_share_milli = l.share.ceiling,
                            shard_count = o.shard_count,
                            similar_not_logged = suppressed,
                            "request larger than one shard's share can never be admitted"
                        );
                    }
                    return;
                }
            }
        }
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
        let mut progress: SmallVec<[Option<Progress>; 2]> = SmallVec::new();
        let mut first_error = None;
        for ((b, &draw), result) in req.buckets.iter().zip(draws).zip(fast) {
            let shard = draw.shard;
            match result {
                Ok(DebitOutcome::Applied(image)) => {
                    EngineStats::bump(&self.stats.fast_path_hits);
                    progress.push(Some(Progress::Applied { shard, image }));
                }
                Ok(DebitOutcome::Refused(image)) => {
                    progress.push(None);
                    let idx = progress.len() - 1;
                    let seen = image.clone().map(|i| (shard, i));
                    match Box::pin(self.resolve(b, draw, image, &avoid[idx], now)).await {
                        Ok(r) => progress[idx] = Some(Progress::resolved(r, seen)),
                        Err(e) => first_error = first_error.or(Some(e)),
                    }
                }
                Err(e) => {
                    progress.push(None);
                    first_error = first_error.or(Some(wrap(b)(e)));
                }
            }
        }
        if let Some(e) = first_error {
            Box::pin(self.refund_applied(req, &progress, now)).await;
            return Err(e);
        }
        let mut progress: SmallVec<[Progress; 2]> =
            progress.into_iter().map(|p| p.expect("set")).collect();
        if progress.iter().any(|p| matches!(p, Progress::Slow { .. })) {
            match Box::pin(self.follow_slow_passes(req, &mut progress, avoid)).await {
                // Having waited, the request is decided at the time the wait ended.
                Ok(Some(later)) => now = later,
                Ok(None) => {}
                Err(e) => {
                    let opt: SmallVec<[Option<Progress>; 2]> =
                        progress.into_iter().map(Some).collect();
                    Box::pin(self.refund_applied(req, &opt, now)).await;
                    return Err(e);
                }
            }
        }

        if progress
            .iter()
            .any(|p| matches!(p, Progress::Rejected { .. }))
        {
            EngineStats::bump(&self.stats.fast_rejections);
            let opt: SmallVec<[Option<Progress>; 2]> = progress.into_iter().map(Some).collect();
            Box::pin(self.refund_applied(req, &opt, now)).await;
            return Ok(self.refused_decision(req, &opt, now));
        }

        let slow: Vec<(usize, u32, u32)> = progress
            .iter()
            .enumerate()
            .filter_map(|(i, p)| match p {
                Progress::Slow { shard, count, .. } => Some((i, *shard, *count)),
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
        let _leading = self.slow_passes.lead(slow.iter().map(|&(i, shard, _)| {
            BucketKey::new(&req.buckets[i].entity, &req.buckets[i].resource, shard)
        }));
        match Box::pin(self.slow_path(req, &slow)).await {
            Ok((admitted, outcomes)) => {
                let opt: SmallVec<[Option<Progress>; 2]> = progress.into_iter().map(Some).collect();
                let now = self.clock.now_ms();
                if !admitted {
                    Box::pin(self.refund_applied(req, &opt, now)).await;
                }
                let mut outcomes = outcomes.into_iter();
                let buckets = req
                    .buckets
                    .iter()
                    .zip(&opt)
                    .map(|(b, p)| match p {
                        Some(Progress::Applied { shard, image }) => {
                            self.outcome_from_image(b, *shard, image, now, admitted)
                        }
                        _ => outcomes.next().expect("one outcome per slow bucket"),
                    })
                    .collect();
                Ok(Decision { admitted, buckets })
            }
            Err(e) => {
                let opt: SmallVec<[Option<Progress>; 2]> = progress.into_iter().map(Some).collect();
                Box::pin(self.refund_applied(req, &opt, now)).await;
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
                    let seen = image.clone().map(|i| (shard, i));
                    Progress::resolved(self.resolve(b, draw, image, &avoid[i], now).await?, seen)
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

    /// A refusal from the rejection cache for bucket `i`, if every shard of it is proven
    /// short; otherwise fills `avoid` with the shards known short.
    fn cached_refusal(
        &self,
        req: &Acquire,
        i: usize,
        avoid: &mut Avoid,
        now: i64,
    ) -> Option<Decision> {
        let b = &req.buckets[i];
        if b.limits.iter().any(|c| c.forced) {
            return None;
        }
        let mut count = self.shards.get(&b.entity, &b.resource);
        let mut best: Option<(i64, u32, BucketItem)> = None;
        let mut shard = 0;
        while shard < count {
            let key = BucketKey::new(&b.entity, &b.resource, shard);
            let image = self.rejections.fresh(&key, now)?;
            count = count.max(image.shard_count);
            let outcome = self.outcome_from_image(b, shard, &image, now, false);
            if outcome.limits.iter().all(|l| l.fits) {
                return None;
            }
            avoid.push(shard);
            let wait = outcome
                .limits
                .iter()
                .map(|l| l.wait_ms.unwrap_or(i64::MAX))
                .max()
                .unwrap_or(0);
            if best.as_ref().is_none_or(|(w, _, _)| wait < *w) {
                best = Some((wait, shard, image));
            }
            shard += 1;
        }
        let (_, shard, image) = best?;
        // Every other bucket is reported from the last image this process saw of any of
        // its shards (projected to now); it decides nothing here. A bucket with no image
        // held sends the request to the store, which reports its real balance and leaves
        // its image here for the next refusal.
        let buckets = req
            .buckets
            .iter()
            .enumerate()
            .map(|(j, other)| {
                if j == i {
                    return Some(self.outcome_from_image(b, shard, &image, now, false));
                }
                let count = self.shards.get(&other.entity, &other.resource);
                (0..count).find_map(|s| {
                    let key = BucketKey::new(&other.entity, &other.resource, s);
                    let img = self.rejections.latest(&key)?;
                    Some(self.outcome_from_image(other, s, &img, now, false))
                })
            })
            .collect::<Option<_>>()?;
        Some(Decision {
            admitted: false,
            buckets,
        })
    }

    /// What to report for a bucket nothing is known about (a request refused elsewhere
    /// before it was looked at): its full share.
    fn unknown_outcome(&self, b: &BucketClaim) -> BucketOutcome {
        BucketOutcome {
            shard: 0,
            shard_count: 1,
            stamp: Stamp::default(),
            limits: b
                .limits
                .iter()
                .map(|c| {
                    let share = c.params.share(1);
                    LimitOutcome {
                        fits: share.ceiling >= c.amount,
                        remaining: share.ceiling,
                        share,
                        ra: c.params.ra,
                        wait_ms: bucket::wait_for(share.ceiling, c.amount, share, c.params.ra),
                    }
                })
                .collect(),
        }
    }

    async fn fast_debit(
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

    fn classify(&self, b: &BucketClaim, draw: Draw, image: &BucketItem, now: i64) -> Refusal {
        if image.ttl.is_some_and(|t| t <= now_s(now)) || image.shard_count != draw.count {
            return Refusal::Stale;
        }
        let mut short = false;
        for c in &b.limits {
            match image.limit(&c.limit) {
                Some(st) if st.params() == c.params => short |= st.tk < c.amount,
                _ => return Refusal::Stale,
            }
        }
        match image.limit(WCU_LIMIT) {
            None => Refusal::Stale,
            Some(w) if w.tk < MILLI => {
                if short {
                    Refusal::BothExhausted
                } else {
                    Refusal::WcuExhausted
                }
            }
            Some(_) => Refusal::LimitExhausted,
        }
    }

    /// True when refilling the image to `now` would still leave a gated claim short.
    fn refill_would_not_help(
        &self,
        b: &BucketClaim,
        shard: u32,
        image: &BucketItem,
        now: i64,
    ) -> bool {
        let outcome = self.outcome_from_image(b, shard, image, now, false);
        outcome
            .limits
            .iter()
            .zip(&b.limits)
            .any(|(l, c)| !l.fits && !c.forced)
    }

    async fn resolve(
        &self,
        b: &BucketClaim,
        draw: Draw,
        image: Option<BucketItem>,
        avoid: &[u32],
        now: i64,
    ) -> Result<Resolution, EngineError> {
        let shard = draw.shard;
        // Never smaller than the count the shard was drawn under: the cache may have been
        // cleared since, and a shard sized for fewer shards would hold too large a share.
        let known = self.shards.get(&b.entity, &b.resource).max(draw.count);
        let Some(image) = image else {
            return Ok(Resolution::Slow {
                shard,
                count: known,
            });
        };
        let count = known.max(image.shard_count);
        match self.classify(b, draw, &image, now) {
            Refusal::Stale => Ok(Resolution::Slow { shard, count }),
            Refusal::WcuExhausted | Refusal::BothExhausted => {
                // A bucket at its own limit never drives doubling.
                if self.refill_would_not_help(b, shard, &image, now) {
                    return Ok(Resolution::Rejected { shard, image });
                }
                let wcu = image.limit(WCU_LIMIT).expect("classified with wcu");
                let (projected, _) = refill(wcu.tk, image.rf, now, wcu.params().share(1));
                if projected >= MILLI {
                    // Not a hot partition: the slow pass refills `wcu`.
                    return Ok(Resolution::Slow { shard, count });
                }
                let grown = self.double(b, &image, count).await?;
                if grown > count {
                    let old: Vec<u32> = (0..count).collect();
                    let fresh = self.draw.draw(grown, &old);
                    Ok(Resolution::Slow {
                        shard: fresh,
                        count: grown,
                    })
                } else {
                    Ok(Resolution::Slow { shard, count })
                }
            }
            Refusal::LimitExhausted => {
                let mut tried: Vec<u32> = avoid.to_vec();
                tried.push(shard);
                if count > 1 && b.cascades {
                    // A cascading child takes the slow path on an untried shard instead
                    // of a child-only retry (the reference engine's rule).
                    if self.refill_would_not_help(b, shard, &image, now) {
                        return Ok(Resolution::Rejected { shard, image });
                    }
                    let other = self.draw.draw(count, &tried);
                    return Ok(Resolution::Slow {
                        shard: other,
                        count,
                    });
                }
                if count > 1 {
                    for _ in 0..2 {
                        if (0..count).all(|s| tried.contains(&s)) {
                            break;
                        }
                        let other = Draw {
                            shard: self.draw.draw(count, &tried),
                            count,
                        };
                        tried.push(other.shard);
                        EngineStats::bump(&self.stats.shard_retries);
                        match self.fast_debit(b, other, now).await.map_err(wrap(b))? {
                            DebitOutcome::Applied(image) => {
                                return Ok(Resolution::Applied {
                                    shard: other.shard,
                                    image,
                                })
                            }
                            DebitOutcome::Refused(None) => {
                                return Ok(Resolution::Slow {
                                    shard: other.shard,
                                    count,
                                })
                            }
                            DebitOutcome::Refused(Some(img)) => {
                                if self.classify(b, other, &img, now) == Refusal::Stale {
                                    return Ok(Resolution::Slow {
                                        shard: other.shard,
                                        count: count.max(img.shard_count),
                                    });
                                }
                            }
                        }
                    }
                }
                if self.refill_would_not_help(b, shard, &image, now) {
                    Ok(Resolution::Rejected { shard, image })
                } else {
                    Ok(Resolution::Slow { shard, count })
                }
            }
        }
    }

    /// Doubles the bucket's shard count on shard 0, passes the new count to the existing
    /// shards (each clamped to its new share as it learns it), and returns the count now
    /// in force. Declines at 32 shards, and when a doubled share could no longer hold the
    /// claims the bucket carries.
    async fn double(
        &self,
        b: &BucketClaim,
        hot: &BucketItem,
        count: u32,
    ) -> Result<u32, EngineError> {
        if count >= MAX_SHARD_COUNT {
            EngineStats::bump(&self.stats.doubling_refused_at_max);
            return Ok(count);
        }
        let new = (count * 2).min(MAX_SHARD_COUNT);
        // Shards never merge back: a doubling that leaves a shard's share smaller than the
        // claims the bucket carries would refuse them on every shard for good. The shard
        // stays hot instead, and its slow passes refill `wcu`, as at the maximum. Judged
        // by the usual claim, not only this request's: a check-only request (0 hits)
        // must not spread the bucket until an ordinary one no longer fits.
        if b.limits
            .iter()
            .any(|c| !c.forced && usual_claim(c, hot) > c.params.share(new).ceiling)
        {
            EngineStats::bump(&self.stats.doubling_refused_small_share);
            return Ok(count);
        }
        let keys: Vec<BucketKey> = (0..count)
            .map(|s| BucketKey::new(&b.entity, &b.resource, s))
            .collect();
        let mut images = self.store.read(&keys).await.map_err(wrap(b))?;
        // Only the bucket's limits are rewritten (refilled, clamped); no claim is taken.
        let clamp = BucketClaim {
            limits: SmallVec::new(),
            ..b.clone()
        };
        let ctx = self.pass_context(self.clock.now_ms());
        // Shard 0 holds the count: it moves from what it holds to `new` in one write under
        // its `rf` lock, which also clamps its balances to the new share (left as they
        // were, shard 0 would hold a share sized for fewer shards while new ones are
        // created with theirs: more than the capacity in all).
        let mut won = false;
        for _ in 0..3 {
            let Some(zero) = &images[0] else {
                return Ok(count);
            };
            if zero.shard_count >= new {
                // Someone else doubled first: adopt their count.
                self.shards.learn(&b.entity, &b.resource, zero.shard_count);
                return Ok(count.max(zero.shard_count));
            }
            let plan = pass::plan_bucket(&clamp, &keys[0], Some(zero), new, &ctx);
            match self.store.commit(&[plan.write]).await.map_err(wrap(b))? {
                CommitOutcome::Committed => {
                    won = true;
                    break;
                }
                CommitOutcome::Conflict(failed) => {
                    images[0] = failed.into_iter().next().and_then(|(_, image)| image);
                }
            }
        }
        if !won {
            // Shard 0 kept changing under us: the next exhaustion tries again.
            return Ok(count);
        }
        EngineStats::bump(&self.stats.shard_doublings);
        tracing::info!(resource = %b.resource, from = count, to = new, "bucket doubled its shards");
        // The other existing shards learn the count the same way, each under its own
        // lock. One that changed since the read is left to its next slow pass: the fast
        // path refuses a shard whose count is behind the drawer's, and that pass clamps.
        join_all(keys.iter().zip(&images).skip(1).filter_map(|(key, image)| {
            let image = image.as_ref()?;
            let plan = pass::plan_bucket(&clamp, key, Some(image), new, &ctx);
            let write = [plan.write];
            Some(async move {
                if let Err(e) = self.store.commit(&write).await {
                    tracing::debug!(error = %e, "a shard could not learn the doubled count");
                }
            })
        }))
        .await;
        self.shards.learn(&b.entity, &b.resource, new);
        Ok(new)
    }

    /// The slow path over the buckets `targets` (index into `req`, shard, count).
    /// Returns whether everything fit and was committed, and their outcomes.
    async fn slow_path(
        &self,
        req: &Acquire,
        targets: &[(usize, u32, u32)],
    ) -> Result<(bool, Vec<BucketOutcome>), EngineError> {
        let keys: Vec<BucketKey> = targets
            .iter()
            .map(|&(i, s, _)| BucketKey::new(&req.buckets[i].entity, &req.buckets[i].resource, s))
            .collect();
        let first = &req.buckets[targets[0].0];
        let images = self.store.read(&keys).await.map_err(wrap(first))?;
        let ctx = self.pass_context(self.clock.now_ms());
        let now = ctx.now;
        let plans: Vec<BucketPlan> = targets
            .iter()
            .zip(&keys)
            .zip(&images)
            .map(|((&(i, _, count), key), img)| {
                let b = &req.buckets[i];
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
                        let (i, shard, count) = targets[idx];
                        let b = &req.buckets[i];
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
    fn pass_context(&self, now: i64) -> PassContext {
        PassContext {
            now,
            wcu: self.wcu,
            ttl_multiplier: self.options.ttl_multiplier,
        }
    }

    /// What a consumption-only retry on `image` reports once applied: the image less
    /// this request's claims, not refilled (the retry does not refill).
    fn retry_outcome(
        &self,
        b: &BucketClaim,
        shard: u32,
        image: &BucketItem,
        now: i64,
    ) -> BucketOutcome {
        let mut after = image.clone();
        for c in &b.limits {
            if let Some(st) = after.limits.get_mut(&c.limit) {
                st.tk = st.tk.saturating_sub(c.amount);
            }
        }
        self.outcome_from_image(b, shard, &after, now, true)
    }

    /// The outcome of bucket `b` according to an image; `debited` says whether the image
    /// already includes this request's debit.
    fn outcome_from_image(
        &self,
        b: &BucketClaim,
        shard: u32,
        image: &BucketItem,
        now: i64,
        debited: bool,
    ) -> BucketOutcome {
        let count = image
            .shard_count
            .max(self.shards.get(&b.entity, &b.resource));
        let limits = b
            .limits
            .iter()
            .map(|c| {
                let share = c.params.share(count);
                let tk = image.limit(&c.limit).map_or(share.ceiling, |s| s.tk);
                let (now_tk, _) = refill(tk, image.rf, now, share);
                if debited {
                    LimitOutcome {
                        fits: true,
                        remaining: now_tk,
                        share,
                        ra: c.params.ra,
                        wait_ms: Some(0),
                    }
                } else {
                    LimitOutcome {
                        fits: now_tk >= c.amount,
                        remaining: now_tk,
                        share,
                        ra: c.params.ra,
                        wait_ms: bucket::wait_for(now_tk, c.amount, share, c.params.ra),
                    }
                }
            })
            .collect();
        BucketOutcome {
            shard,
            shard_count: count,
            stamp: Stamp::of(image),
            limits,
        }
    }

    /// The decision for a request refused after some buckets were looked at.
    fn refused_decision(&self, req: &Acquire, progress: &[Option<Progress>], now: i64) -> Decision {
        let buckets = req
            .buckets
            .iter()
            .zip(progress)
            .map(|(b, p)| match p {
                Some(Progress::Applied { shard, image }) => {
                    // Report the balance as it was before the refunded debit.
                    let mut o = self.outcome_from_image(b, *shard, image, now, false);
                    for (l, c) in o.limits.iter_mut().zip(&b.limits) {
                        l.remaining = l.remaining.saturating_add(c.amount).min(l.share.ceiling);
                        l.fits = true;
                        l.wait_ms = Some(0);
                    }
                    o
                }
                Some(Progress::Rejected { shard, image })
                | Some(Progress::Slow {
                    seen: Some((shard, image)),
                    ..
                }) => self.outcome_from_image(b, *shard, image, now, false),
                _ => self.unknown_outcome(b),
            })
            .collect();
        Decision {
            admitted: false,
            buckets,
        }
    }

    /// Refunds every bucket of `progress` that was debited.
    async fn refund_applied(&self, req: &Acquire, progress: &[Option<Progress>], now: i64) {
        join_all(
            req.buckets
                .iter()
                .zip(progress)
                .filter_map(|(b, p)| match p {
                    Some(Progress::Applied { shard, image }) => {
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

/// The claim a bucket's limit usually carries, judged from a hot shard's image: this
/// request's, at least one token (an ordinary request: Envoy's default `hits_addend`),
/// and at least the average taken per fast-path write on that shard (`tc` over the
/// writes `wcu` counted) — so check-only or small requests cannot spread a bucket until
/// its ordinary requests no longer fit a shard's share.
fn usual_claim(c: &LimitClaim, hot: &BucketItem) -> i64 {
    let writes = hot.limit(WCU_LIMIT).map_or(0, |w| w.tc / MILLI);
    let average = match hot.limit(&c.limit) {
        Some(st) if writes > 0 && st.tc > 0 => st.tc / writes,
        _ => 0,
    };
    c.amount.max(MILLI).max(average)
}

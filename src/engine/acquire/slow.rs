//! The slow path of a decision: following a slow pass this process already runs on a
//! shard (see `inflight.rs`), or running one — one read of every unresolved bucket (but
//! those its fast debit just found absent, which are created unread), the
//! plan (`pass.rs`), one commit under the `rf` lock, and the consumption-only retries
//! when a lock or a create race is lost.

use super::pass::{self, BucketPlan, PassContext};
use super::state::{wrap, Avoid, Deciding, Draw, Progress, SlowTarget};
use crate::engine::{BucketOutcome, EngineError, EngineStats};
use crate::store::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, DebitOutcome, StoreError, Write,
};

impl<S: BucketStore> Deciding<'_, S> {
    /// Waits for the slow passes in flight on the shards drawn for `req`'s fast path;
    /// returns whether it waited for any.
    pub(super) async fn await_slow_passes(&self, draws: &[Draw]) -> bool {
        let mut waited = false;
        for (b, d) in self.req.buckets.iter().zip(draws) {
            let key = BucketKey::new(&b.entity, &b.resource, d.shard);
            if let Some(pass_done) = self.engine.slow_passes.in_flight(&key) {
                EngineStats::bump(&self.engine.stats.slow_passes_followed);
                pass_done.await;
                waited = true;
            }
        }
        waited
    }

    /// Buckets bound for the slow path on a shard this process is already refilling wait
    /// for that pass, then try the fast path there again (see `inflight`). On an error,
    /// `progress` still records every debit applied, for the refund.
    pub(super) async fn follow_slow_passes(
        &self,
        progress: &mut [Progress],
        avoid: &[Avoid],
    ) -> Result<Option<i64>, EngineError> {
        let mut waited_until = None;
        for (i, p) in progress.iter_mut().enumerate() {
            let Progress::Slow { shard, count, .. } = *p else {
                continue;
            };
            let b = &self.req.buckets[i];
            let key = BucketKey::new(&b.entity, &b.resource, shard);
            let Some(pass_done) = self.engine.slow_passes.in_flight(&key) else {
                continue;
            };
            EngineStats::bump(&self.engine.stats.slow_passes_followed);
            pass_done.await;
            let now = self.engine.clock.now_ms();
            waited_until = Some(now);
            let draw = Draw { shard, count };
            *p = match self.fast_debit(b, draw, now).await.map_err(wrap(b))? {
                DebitOutcome::Applied(image) => {
                    EngineStats::bump(&self.engine.stats.fast_path_hits);
                    Progress::Applied { shard, image }
                }
                DebitOutcome::Refused(image) => {
                    self.resolve(b, draw, image, &avoid[i], now).await?
                }
            };
        }
        Ok(waited_until)
    }

    /// The slow path over the buckets `targets`. Returns whether everything fit and was
    /// committed, and their outcomes.
    pub(super) async fn slow_path(
        &self,
        targets: &[SlowTarget],
    ) -> Result<(bool, Vec<BucketOutcome>), EngineError> {
        let keys: Vec<BucketKey> = targets
            .iter()
            .map(|t| {
                let b = &self.req.buckets[t.bucket];
                BucketKey::new(&b.entity, &b.resource, t.shard)
            })
            .collect();
        let first = &self.req.buckets[targets[0].bucket];
        let images = self
            .read_present(&keys, targets)
            .await
            .map_err(wrap(first))?;
        let counts = self.creation_counts(targets, &images).await?;
        let ctx = self.pass_context(self.engine.clock.now_ms());
        let plans = self.plan_targets(targets, &keys, &images, &counts, &ctx);
        if !plans.iter().all(|p| p.fits) {
            for (key, img) in keys.iter().zip(&images) {
                if let Some(img) = img {
                    self.engine.rejections.remember(key, img, ctx.now);
                }
            }
            return Ok((false, plans.into_iter().map(|p| p.refused).collect()));
        }
        self.commit_plans(targets, &keys, &counts, plans, &ctx)
            .await
            .map_err(wrap(first))
    }

    /// Each target's plan, from its image (learning the shard count it holds).
    fn plan_targets(
        &self,
        targets: &[SlowTarget],
        keys: &[BucketKey],
        images: &[Option<BucketItem>],
        counts: &[u32],
        ctx: &PassContext,
    ) -> Vec<BucketPlan> {
        targets
            .iter()
            .zip(keys)
            .zip(images)
            .zip(counts)
            .map(|(((t, key), img), &count)| {
                let b = &self.req.buckets[t.bucket];
                if let Some(img) = img {
                    self.engine
                        .shards
                        .learn(&b.entity, &b.resource, img.shard_count);
                }
                pass::plan_bucket(b, key, img.as_ref(), count, ctx)
            })
            .collect()
    }

    /// Commits plans that all fit, in one atomic write; when a lock or a create race is
    /// lost, retries the lost buckets consumption-only (at most twice), and refuses when a
    /// plain debit is what failed (the balance no longer covers the request) or the
    /// contention persists.
    async fn commit_plans(
        &self,
        targets: &[SlowTarget],
        keys: &[BucketKey],
        counts: &[u32],
        plans: Vec<BucketPlan>,
        ctx: &PassContext,
    ) -> Result<(bool, Vec<BucketOutcome>), StoreError> {
        let now = ctx.now;
        let mut writes: Vec<Write> = plans.iter().map(|p| p.write.clone()).collect();
        let mut admitted: Vec<BucketOutcome> = plans.iter().map(|p| p.admitted.clone()).collect();
        for round in 0..3 {
            let CommitOutcome::Conflict(failed) = self.engine.store.commit(&writes).await? else {
                return Ok((true, admitted));
            };
            if round == 2 {
                break;
            }
            EngineStats::bump(&self.engine.stats.consumption_only_retries);
            for (idx, current) in failed {
                let SlowTarget { bucket, shard, .. } = targets[idx];
                let (b, count) = (&self.req.buckets[bucket], counts[idx]);
                if let Write::Debit { .. } = writes[idx] {
                    // The balance no longer covers the request.
                    let mut outcomes: Vec<BucketOutcome> =
                        plans.into_iter().map(|p| p.refused).collect();
                    if let Some(img) = &current {
                        outcomes[idx] = self.outcome_from_image(b, shard, img, now, false);
                        self.engine.rejections.remember(&keys[idx], img, now);
                    }
                    return Ok((false, outcomes));
                }
                writes[idx] = match &current {
                    // Lost the lock or the create race: take the tokens only if the item
                    // as it stands covers them, with no refill. What it reports is that
                    // item after the debit.
                    Some(img) => {
                        admitted[idx] = self.retry_outcome(b, shard, img, now);
                        pass::retry_debit(b, &keys[idx], img, ctx)
                    }
                    // The item vanished (evicted) since the read: create it again.
                    None => {
                        let plan = pass::plan_bucket(b, &keys[idx], None, count, ctx);
                        admitted[idx] = plan.admitted;
                        plan.write
                    }
                };
            }
        }
        // Persistent contention: refuse rather than spin.
        Ok((false, plans.into_iter().map(|p| p.refused).collect()))
    }

    /// The images of `keys`, read in one call, except those of targets whose fast debit
    /// just found them absent: a new bucket costs its refused debit and its create, not a
    /// read between them too.
    async fn read_present(
        &self,
        keys: &[BucketKey],
        targets: &[SlowTarget],
    ) -> Result<Vec<Option<BucketItem>>, crate::store::StoreError> {
        if !targets.iter().any(|t| t.absent) {
            return self.engine.store.read(keys).await;
        }
        let present: Vec<BucketKey> = keys
            .iter()
            .zip(targets)
            .filter(|(_, t)| !t.absent)
            .map(|(k, _)| k.clone())
            .collect();
        let mut read = if present.is_empty() {
            Vec::new()
        } else {
            self.engine.store.read(&present).await?
        }
        .into_iter();
        Ok(targets
            .iter()
            .map(|t| {
                if t.absent {
                    None
                } else {
                    read.next().flatten()
                }
            })
            .collect())
    }

    /// The count each target's pass sizes its shard for: the target's own, except that a
    /// shard about to be created (absent from `images`) other than shard 0 is sized for at
    /// least the count shard 0 holds. Shard 0 holds the bucket's authoritative count (a
    /// doubling raises it there first), and the target's count may be stale: this process
    /// may not have seen the doubling, and a shard created for fewer shards would hold a
    /// share too large, an over-admission no later pass takes back. Costs one more read,
    /// only when a shard is created. (Existing shards need none: their own item carries a
    /// count at least the one they were last written under, and the plan keeps the larger.)
    async fn creation_counts(
        &self,
        targets: &[SlowTarget],
        images: &[Option<BucketItem>],
    ) -> Result<Vec<u32>, EngineError> {
        let mut counts: Vec<u32> = targets.iter().map(|t| t.count).collect();
        let created: Vec<usize> = (0..targets.len())
            .filter(|&i| images[i].is_none() && targets[i].shard > 0)
            .collect();
        let Some(&first) = created.first() else {
            return Ok(counts);
        };
        let zeros: Vec<BucketKey> = created
            .iter()
            .map(|&i| {
                let b = &self.req.buckets[targets[i].bucket];
                BucketKey::new(&b.entity, &b.resource, 0)
            })
            .collect();
        let b = &self.req.buckets[targets[first].bucket];
        let zero_images = self.engine.store.read(&zeros).await.map_err(wrap(b))?;
        for (&i, zero) in created.iter().zip(&zero_images) {
            if let Some(zero) = zero {
                let b = &self.req.buckets[targets[i].bucket];
                self.engine
                    .shards
                    .learn(&b.entity, &b.resource, zero.shard_count);
                counts[i] = counts[i].max(zero.shard_count);
            }
        }
        Ok(counts)
    }

    /// What a slow pass knows at `now`.
    pub(super) fn pass_context(&self, now: i64) -> PassContext {
        PassContext {
            now,
            wcu: self.engine.wcu,
            ttl_multiplier: self.engine.options.ttl_multiplier,
        }
    }
}

//! The slow path of a decision: following a slow pass this process already runs on a
//! shard (see `inflight.rs`), or running one — one read of every unresolved bucket (but
//! those its fast debit just found absent, which are created unread), the
//! plan (`pass.rs`), one commit under the `rf` lock, and the consumption-only retries
//! when a lock or a create race is lost.

use super::pass::{self, BucketPlan, PassContext};
use super::split;
use super::state::{wrap, Avoid, Deciding, Draw, Progress, SlowTarget};
use crate::engine::{BucketClaim, BucketOutcome, EngineError, EngineStats};
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
        // `progress` and `avoid` hold one item per bucket, in order.
        for ((p, b), avoid) in progress.iter_mut().zip(&self.req.buckets).zip(avoid) {
            let Progress::Slow { shard, count, .. } = *p else {
                continue;
            };
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
                DebitOutcome::Refused(image) => self.resolve(b, draw, image, avoid, now).await?,
            };
        }
        Ok(waited_until)
    }

    /// The slow path over the buckets `targets`. Returns whether everything fit and was
    /// committed, and their outcomes.
    pub(super) async fn slow_path(
        &self,
        targets: &[SlowTarget<'_>],
    ) -> Result<(bool, Vec<BucketOutcome>), EngineError> {
        let keys: Vec<BucketKey> = targets
            .iter()
            .map(|t| BucketKey::new(&t.claim.entity, &t.claim.resource, t.shard))
            .collect();
        // `finish` sends one target at least; none would fit, with nothing to write.
        let Some(first) = targets.first().map(|t| t.claim) else {
            return Ok((true, Vec::new()));
        };
        let mut images = self
            .read_present(&keys, targets)
            .await
            .map_err(wrap(first))?;
        let mut given_up = vec![0; targets.len()];
        let counts = self
            .prepare_shards(targets, &keys, &mut images, &mut given_up)
            .await?;
        let ctx = self.pass_context(self.engine.clock.now_ms());
        let plans = self.plan_targets(targets, &keys, &images, &counts, &given_up, &ctx);
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

    /// Each target's plan, from its image (learning the shard count it holds); a missing
    /// shard that `given_up` says a raise gave up (epoch ms, 0: none) is created as if
    /// empty since then (see `split_owner`).
    fn plan_targets(
        &self,
        targets: &[SlowTarget<'_>],
        keys: &[BucketKey],
        images: &[Option<BucketItem>],
        counts: &[u32],
        given_up: &[i64],
        ctx: &PassContext,
    ) -> Vec<BucketPlan> {
        targets
            .iter()
            .zip(keys)
            .zip(images)
            .zip(counts.iter().zip(given_up))
            .map(|(((t, key), img), (&count, &given_up_at))| {
                let b = t.claim;
                match img {
                    Some(img) => {
                        self.engine
                            .shards
                            .learn(&b.entity, &b.resource, img.shard_count);
                        pass::plan_bucket(b, key, Some(img), count, ctx)
                    }
                    None if given_up_at > 0 => pass::plan_given_up(b, key, count, given_up_at, ctx),
                    None => pass::plan_bucket(b, key, None, count, ctx),
                }
            })
            .collect()
    }

    /// Commits plans that all fit, in one atomic write; when a lock or a create race is
    /// lost, retries the lost buckets consumption-only (at most twice), and refuses when a
    /// plain debit is what failed (the balance no longer covers the request) or the
    /// contention persists.
    async fn commit_plans(
        &self,
        targets: &[SlowTarget<'_>],
        keys: &[BucketKey],
        counts: &[u32],
        plans: Vec<BucketPlan>,
        ctx: &PassContext,
    ) -> Result<(bool, Vec<BucketOutcome>), StoreError> {
        let now = ctx.now;
        let total = plans.len();
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
                // The store names places in `writes`, each one a plan's: a place past
                // them is a broken answer, this request's error.
                let (Some(t), Some(key), Some(&count), Some(write), Some(outcome)) = (
                    targets.get(idx),
                    keys.get(idx),
                    counts.get(idx),
                    writes.get_mut(idx),
                    admitted.get_mut(idx),
                ) else {
                    return Err(refusal_out_of_range(keys, idx, total));
                };
                let SlowTarget {
                    claim: b, shard, ..
                } = *t;
                if let Write::Debit { .. } = write {
                    // The balance no longer covers the request.
                    let mut outcomes: Vec<BucketOutcome> =
                        plans.into_iter().map(|p| p.refused).collect();
                    if let Some(img) = &current {
                        if let Some(outcome) = outcomes.get_mut(idx) {
                            *outcome = self.outcome_from_image(b, shard, img, now, false);
                        }
                        self.engine.rejections.remember(key, img, now);
                    }
                    return Ok((false, outcomes));
                }
                *write = match &current {
                    // Lost the lock or the create race: take the tokens only if the item
                    // as it stands covers them, with no refill. What it reports is that
                    // item after the debit.
                    Some(img) => {
                        *outcome = self.retry_outcome(b, shard, img, now);
                        pass::retry_debit(b, key, img, ctx)
                    }
                    // The item vanished (evicted, or a Cluster's spread commit undid
                    // the create that made it) since the read: create it again — shard
                    // 0 full (no shard owns it), any other as if empty since now (it
                    // may be a split's part, taken back: never full).
                    None => {
                        let plan = if shard == 0 {
                            pass::plan_bucket(b, key, None, count, ctx)
                        } else {
                            pass::plan_given_up(b, key, count, now, ctx)
                        };
                        *outcome = plan.admitted;
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
        targets: &[SlowTarget<'_>],
    ) -> Result<Vec<Option<BucketItem>>, crate::store::StoreError> {
        if !targets.iter().any(|t| t.absent) {
            let images = self.engine.store.read(keys).await?;
            return one_per_key(keys, images);
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
            one_per_key(&present, self.engine.store.read(&present).await?)?
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

    /// Readies each target's shard for its pass and returns the count each is planned
    /// for (see `split.rs`). A shard that holds fewer shards than the target's count is
    /// split to that count first (its pass then finds it holding its part and the count).
    /// A missing shard other than 0 is created by the split of the shard that owns it, if
    /// one exists (its ancestors are read in one call, shard 0 among them: the bucket's
    /// count is at least the one shard 0 holds, and a shard created for fewer shards would
    /// hold a share too large); otherwise the pass creates it: full, or as if empty
    /// since the raise that gave it up (`given_up`, see `split_owner`). Splits are rare
    /// (after a doubling, on a shard no pass has touched since): the usual pass reads
    /// nothing more.
    async fn prepare_shards(
        &self,
        targets: &[SlowTarget<'_>],
        keys: &[BucketKey],
        images: &mut [Option<BucketItem>],
        given_up: &mut [i64],
    ) -> Result<Vec<u32>, EngineError> {
        let mut counts: Vec<u32> = targets.iter().map(|t| t.count).collect();
        // `keys`, `images` and `counts` hold one item per target, in order.
        let per_target = targets.iter().zip(keys).zip(
            images
                .iter_mut()
                .zip(counts.iter_mut().zip(given_up.iter_mut())),
        );
        for ((t, key), (image, (count, given_up))) in per_target {
            let b = t.claim;
            let split = match image.as_ref() {
                Some(img) if img.shard_count < t.count => {
                    self.split_shard(b, t.shard, image.clone(), t.count).await?;
                    true
                }
                Some(_) => false,
                None if t.shard > 0 => self.split_owner(b, t.shard, count, given_up).await?,
                None => false,
            };
            if split {
                let again = self.engine.store.read(std::slice::from_ref(key));
                *image = again.await.map_err(wrap(b))?.pop().flatten();
                if image.is_none() && t.shard > 0 {
                    self.still_missing(b, key, image, count, given_up).await?;
                }
            }
            if let Some(img) = image {
                // An existing shard is planned at the count it holds: only a split raises it.
                *count = img.shard_count;
            }
        }
        Ok(counts)
    }

    /// Shard `key` of `b`, still missing after a split meant to create it: another
    /// server's split raised its owner first and its create has not landed (a Redis Cluster
    /// commits a split slot by slot), or the split gave up. Looked at once more: with no
    /// owner now, `given_up` says since when it is empty and the pass creates it so; with
    /// an owner still holding its tokens it is split again, and if it is still missing the
    /// request is refused as contention — created full (the expired shard's way), it would
    /// hold its share on top of what the owner or the other split still carries.
    async fn still_missing(
        &self,
        b: &BucketClaim,
        key: &BucketKey,
        image: &mut Option<BucketItem>,
        count: &mut u32,
        given_up: &mut i64,
    ) -> Result<(), EngineError> {
        if !self.split_owner(b, key.shard, count, given_up).await? {
            return Ok(());
        }
        let again = self.engine.store.read(std::slice::from_ref(key));
        *image = again.await.map_err(wrap(b))?.pop().flatten();
        if image.is_some() {
            return Ok(());
        }
        Err(wrap(b)(StoreError::Contention {
            key: key.to_string(),
        }))
    }

    /// For missing shard `k` of `b`: raises `count` to what shard 0 holds, and splits the
    /// existing shard that owns `k` (if any) to that count. Returns whether it split one.
    ///
    /// When none owns it, `given_up` is set to the latest raise among its ancestors
    /// (`count_raised_at`; 0: none). Such a shard has expired full — or a raise gave it
    /// up and its create has not landed: a Redis Cluster commits a split's update and
    /// its creates one slot at a time, and a raise without a split (`pass.rs`) creates
    /// nothing. Created full, it would hold its share on top of the part its split
    /// still carries (issue 50); created as if empty at the raise and refilled since, it
    /// holds no more than refill could have given it, and a shard that expired long
    /// after its raise comes back full all the same.
    async fn split_owner(
        &self,
        b: &BucketClaim,
        k: u32,
        count: &mut u32,
        given_up: &mut i64,
    ) -> Result<bool, EngineError> {
        let ancestors = split::ancestors(k);
        let keys: Vec<BucketKey> = ancestors
            .iter()
            .map(|&a| BucketKey::new(&b.entity, &b.resource, a))
            .collect();
        let found = self.engine.store.read(&keys).await.map_err(wrap(b))?;
        if let Some(zero) = found.first().and_then(Option::as_ref) {
            self.engine
                .shards
                .learn(&b.entity, &b.resource, zero.shard_count);
            *count = (*count).max(zero.shard_count);
        }
        let held: Vec<(u32, u32)> = ancestors
            .iter()
            .zip(&found)
            .filter_map(|(&a, img)| Some((a, img.as_ref()?.shard_count)))
            .collect();
        let Some((q, _)) = split::owner(k, &held) else {
            *given_up = found
                .iter()
                .flatten()
                .map(|img| img.count_raised_at)
                .max()
                .unwrap_or(0);
            return Ok(false);
        };
        let at = ancestors.iter().position(|&a| a == q);
        let image = at.and_then(|at| found.into_iter().nth(at)).flatten();
        self.split_shard(b, q, image, *count).await?;
        Ok(true)
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

/// A store's read answer, checked to hold one image per key (the contract's): a store
/// answering another count is broken, and that is this request's error, never a panic
/// or a bucket planned without its image.
fn one_per_key(
    keys: &[BucketKey],
    images: Vec<Option<BucketItem>>,
) -> Result<Vec<Option<BucketItem>>, StoreError> {
    if images.len() == keys.len() {
        return Ok(images);
    }
    Err(StoreError::Corrupt {
        key: keys.first().map(ToString::to_string).unwrap_or_default(),
        reason: format!(
            "a read of {} keys answered {} items",
            keys.len(),
            images.len()
        ),
        source: None,
    })
}

/// A commit's refusal naming write `idx` of `total`: a broken answer.
fn refusal_out_of_range(keys: &[BucketKey], idx: usize, total: usize) -> StoreError {
    StoreError::Corrupt {
        key: keys.first().map(ToString::to_string).unwrap_or_default(),
        reason: format!("a commit of {total} writes refused write {idx}"),
        source: None,
    }
}

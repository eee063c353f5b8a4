//! A refused fast debit, taken on: what its old image says (classification), and where
//! the bucket goes next — a fast rejection when a refill would not help, a doubling when
//! its shard's `wcu` ran dry with no refill in sight (or the store throttled the debit on
//! its partition), a retry on up to two other shards, or a slow pass. Decides from images
//! and, for a doubling or a retry, store calls; it reports no outcome (that is
//! `outcome.rs`).

use futures::future::join_all;

use super::split::Split;
use super::state::{wrap, Deciding, Draw, Progress};
use crate::engine::bucket::now_s;
use crate::engine::bucket::{refill, LimitParams, MILLI};
use crate::engine::{BucketClaim, EngineError, EngineStats, MAX_SHARD_COUNT};
use crate::store::{BucketItem, BucketKey, BucketStore, DebitOutcome, StoreError, WCU_LIMIT};

/// The hot shard a doubling answers: its image as a refusal returned it, or only its
/// number (a throttled debit returns no image; the doubling's read brings it).
#[derive(Debug, Clone, Copy)]
enum Hot<'a> {
    Seen(&'a BucketItem),
    Unread(u32),
}

/// A refused fast debit with the image its refusal returned: what every branch of its
/// resolution reads, and the two ways it ends without a store call of its own.
struct Seen<'a> {
    b: &'a BucketClaim,
    draw: Draw,
    /// The shard count the bucket is known to have: the drawn one, or larger.
    count: u32,
    image: BucketItem,
}

impl Seen<'_> {
    /// On to the slow path on `shard`, sized for `count`, the refusal's image kept to
    /// report from.
    fn slow_on(self, shard: u32, count: u32) -> Progress {
        Progress::Slow {
            shard,
            count,
            seen: Some((self.draw.shard, self.image)),
            absent: false,
        }
    }

    /// Refused on the image: no refill would let the claim fit.
    fn rejected(self) -> Progress {
        Progress::Rejected {
            shard: self.draw.shard,
            image: self.image,
        }
    }
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

impl<S: BucketStore> Deciding<'_, S> {
    fn classify(&self, b: &BucketClaim, draw: Draw, image: &BucketItem, now: i64) -> Refusal {
        if image.ttl.is_some_and(|t| t <= now_s(now)) || image.shard_count != draw.count {
            return Refusal::Stale;
        }
        let mut short = false;
        for c in &b.limits {
            match image.limit(&c.limit) {
                Some(st) if st.params() == c.params => short |= st.balance < c.amount,
                _ => return Refusal::Stale,
            }
        }
        match image.limit(WCU_LIMIT) {
            None => Refusal::Stale,
            Some(w) if w.balance < MILLI => {
                if short {
                    Refusal::BothExhausted
                } else {
                    Refusal::WcuExhausted
                }
            }
            Some(_) => Refusal::LimitExhausted,
        }
    }

    /// True when refilling the image to `now` would still leave a gated claim short, the
    /// refill of the last few milliseconds held back (`bucket::held_refill`).
    fn refill_would_not_help(
        &self,
        b: &BucketClaim,
        shard: u32,
        image: &BucketItem,
        now: i64,
    ) -> bool {
        let outcome = self.held_outcome(b, shard, image, now);
        outcome
            .limits
            .iter()
            .zip(&b.limits)
            .any(|(l, c)| !l.fits && !c.forced)
    }

    /// Where a bucket whose fast debit on `draw` was refused (`image`: the item as the
    /// refusal returned it) goes next.
    pub(super) async fn resolve(
        &self,
        b: &BucketClaim,
        draw: Draw,
        image: Option<BucketItem>,
        avoid: &[u32],
        now: i64,
    ) -> Result<Progress, EngineError> {
        let shard = draw.shard;
        // Never smaller than the count the shard was drawn under: the cache may have been
        // cleared since, and a shard sized for fewer shards would hold too large a share.
        let known = self
            .engine
            .shards
            .get(&b.entity, &b.resource)
            .max(draw.count);
        let Some(image) = image else {
            return Ok(Progress::Slow {
                shard,
                count: known,
                seen: None,
                absent: true,
            });
        };
        let count = known.max(image.shard_count);
        let seen = Seen {
            b,
            draw,
            count,
            image,
        };
        match self.classify(b, draw, &seen.image, now) {
            Refusal::Stale => Ok(seen.slow_on(shard, count)),
            Refusal::WcuExhausted | Refusal::BothExhausted => self.relieve_wcu(seen, now).await,
            Refusal::LimitExhausted => self.retry_elsewhere(seen, avoid, now).await,
        }
    }

    /// A refusal whose shard's `wcu` ran dry: a fast rejection when the bucket is at its
    /// own limit too (a bucket at its own limit never drives doubling), the slow pass when
    /// `wcu` refills in time (not a hot partition), else a doubling, the request going on
    /// to one of the new shards.
    #[expect(clippy::expect_used, reason = "classified with wcu")]
    async fn relieve_wcu(&self, seen: Seen<'_>, now: i64) -> Result<Progress, EngineError> {
        let Seen { b, draw, count, .. } = seen;
        let shard = draw.shard;
        if self.refill_would_not_help(b, shard, &seen.image, now) {
            return Ok(seen.rejected());
        }
        let wcu = seen.image.limit(WCU_LIMIT).expect("classified with wcu");
        let (projected, _) = refill(
            wcu.balance,
            seen.image.refilled_at,
            now,
            wcu.params().share(1),
        );
        if projected >= MILLI {
            return Ok(seen.slow_on(shard, count));
        }
        let grown = self.double(b, Hot::Seen(&seen.image), count).await?;
        if grown > count {
            let old: Vec<u32> = (0..count).collect();
            let fresh = self.engine.draw.draw(grown, &old);
            Ok(seen.slow_on(fresh, grown))
        } else {
            Ok(seen.slow_on(shard, count))
        }
    }

    /// A refusal for the bucket's own limit on one shard of several: a retry on up to two
    /// untried shards, or the slow pass where a refill would help. A cascading child takes
    /// the slow path on an untried shard instead of a child-only retry (the reference
    /// engine's rule).
    async fn retry_elsewhere(
        &self,
        seen: Seen<'_>,
        avoid: &[u32],
        now: i64,
    ) -> Result<Progress, EngineError> {
        let Seen { b, draw, count, .. } = seen;
        let shard = draw.shard;
        let mut tried: Vec<u32> = avoid.to_vec();
        tried.push(shard);
        if count > 1 && b.cascades {
            if self.refill_would_not_help(b, shard, &seen.image, now) {
                return Ok(seen.rejected());
            }
            let other = self.engine.draw.draw(count, &tried);
            return Ok(seen.slow_on(other, count));
        }
        for _ in 0..2 {
            if count <= 1 || (0..count).all(|s| tried.contains(&s)) {
                break;
            }
            let other = Draw {
                shard: self.engine.draw.draw(count, &tried),
                count,
            };
            tried.push(other.shard);
            EngineStats::bump(&self.engine.stats.shard_retries);
            match self.fast_debit(b, other, now).await.map_err(wrap(b))? {
                DebitOutcome::Applied(image) => {
                    return Ok(Progress::Applied {
                        shard: other.shard,
                        image,
                    })
                }
                DebitOutcome::Refused(None) => return Ok(seen.slow_on(other.shard, count)),
                DebitOutcome::Refused(Some(img)) => {
                    if self.classify(b, other, &img, now) == Refusal::Stale {
                        let count = count.max(img.shard_count);
                        return Ok(seen.slow_on(other.shard, count));
                    }
                }
            }
        }
        if self.refill_would_not_help(b, shard, &seen.image, now) {
            Ok(seen.rejected())
        } else {
            Ok(seen.slow_on(shard, count))
        }
    }

    /// A fast debit on `draw` that the store throttled on its shard's partition
    /// (`throttled`): the partition's own word that the shard takes more writes than it
    /// absorbs, a stronger sign than a `wcu` run dry (this server's estimate). The bucket
    /// doubles as for `wcu` (the same doubling), and the request goes on to the slow path
    /// on one of the new shards. A bucket that cannot double (32 shards, shares too small
    /// for its claims, or a doubling that lost) answers the throttle as its own refusal
    /// (see `acquire`), never as the store failing.
    pub(super) async fn relieve_throttled(
        &self,
        b: &BucketClaim,
        draw: Draw,
        throttled: StoreError,
    ) -> Result<Progress, EngineError> {
        let count = self
            .engine
            .shards
            .get(&b.entity, &b.resource)
            .max(draw.count);
        let grown = self.double(b, Hot::Unread(draw.shard), count).await?;
        if grown <= count {
            return Err(wrap(b)(throttled));
        }
        let old: Vec<u32> = (0..count).collect();
        Ok(Progress::Slow {
            shard: self.engine.draw.draw(grown, &old),
            count: grown,
            seen: None,
            absent: false,
        })
    }

    /// Doubles the bucket's shard count on shard 0, passes the new count to the existing
    /// shards (each clamped to its new share as it learns it), and returns the count now
    /// in force. Declines at 32 shards, and when a doubled share of any of the bucket's
    /// limits could no longer hold [`MIN_CLAIMS_PER_SHARD`] of the claims it usually carries.
    async fn double(&self, b: &BucketClaim, hot: Hot<'_>, count: u32) -> Result<u32, EngineError> {
        if count >= MAX_SHARD_COUNT {
            EngineStats::bump(&self.engine.stats.shard_doublings_declined_at_max);
            return Ok(count);
        }
        let new = (count * 2).min(MAX_SHARD_COUNT);
        if let Hot::Seen(hot) = hot {
            if self.share_too_small(b, Some(hot), new) {
                return Ok(count);
            }
        }
        let keys: Vec<BucketKey> = (0..count)
            .map(|s| BucketKey::new(&b.entity, &b.resource, s))
            .collect();
        let mut images = self.engine.store.read(&keys).await.map_err(wrap(b))?;
        if let Hot::Unread(shard) = hot {
            let hot = images.get(shard as usize).and_then(Option::as_ref);
            if self.share_too_small(b, hot, new) {
                return Ok(count);
            }
        }
        // Shard 0 holds the bucket's authoritative count: split it first, so that no
        // server creates a shard for the new count before shard 0 has given up its part.
        let shard0 = images.first_mut().and_then(Option::take);
        match self.split_shard(b, 0, shard0, new).await? {
            Split::Raised => {}
            Split::Kept => return Ok(count),
            // Someone else doubled first: adopt their count.
            Split::Found(theirs) => return Ok(count.max(theirs)),
        }
        EngineStats::bump(&self.engine.stats.shard_doublings);
        tracing::info!(resource = %b.resource, from = count, to = new, "bucket doubled its shards");
        // The other existing shards split the same way, each under its own lock. One that
        // changed under every try is left to its next slow pass: the fast path refuses a
        // shard whose count is behind the drawer's, and that pass splits it.
        join_all(
            images
                .into_iter()
                .enumerate()
                .skip(1)
                .map(|(s, image)| async move {
                    if let Err(e) = self.split_shard(b, s as u32, image, new).await {
                        tracing::debug!(error = %e, "a shard could not split to the doubled count");
                    }
                }),
        )
        .await;
        self.engine.shards.learn(&b.entity, &b.resource, new);
        Ok(new)
    }

    /// Whether a doubling to `new` shards would leave a shard's share of any of the
    /// bucket's limits smaller than [`MIN_CLAIMS_PER_SHARD`] of the claims it usually
    /// carries (counted when it does). Shards never merge back: a share that small would
    /// refuse ordinary requests on every shard for good, or leave each shard a few claims
    /// that the random draw spreads unevenly. The shard stays hot instead, and its slow
    /// passes refill `wcu`, as at the maximum. Judged on every limit the hot shard holds,
    /// not only those this request names, and by the usual claim, not only this
    /// request's: check-only (0 hits) or one-token traffic must not spread a bucket that
    /// its ordinary requests, or its other limits, cannot be spread over.
    fn share_too_small(&self, b: &BucketClaim, hot: Option<&BucketItem>, new: u32) -> bool {
        let too_small = |usual: i64, params: LimitParams| {
            MIN_CLAIMS_PER_SHARD * usual > params.share(new).ceiling
        };
        let claimed = b
            .limits
            .iter()
            .any(|c| !c.forced && too_small(usual_claim(c.amount, &c.limit, hot), c.params));
        // Limits the shard holds that this request does not name (another rule's).
        let stored = hot.is_some_and(|hot| {
            hot.limits.iter().any(|(name, st)| {
                name != WCU_LIMIT
                    && !b.limits.iter().any(|c| c.limit == name)
                    && too_small(usual_claim(0, name, Some(hot)), st.params())
            })
        });
        let small = claimed || stored;
        if small {
            EngineStats::bump(&self.engine.stats.shard_doublings_declined_small_share);
        }
        small
    }
}

/// Usual claims a shard's share of each limit must hold for the bucket to double: with
/// fewer, the random draw leaves some shards short while others hold tokens, and each
/// such refusal costs retries on other shards. Four keeps a 100-token bucket of one-token
/// requests at 16 shards (6.25 tokens each) where 32 would leave 3.125 each.
pub(super) const MIN_CLAIMS_PER_SHARD: i64 = 4;

/// The claim a bucket's limit `limit` usually carries, judged from a hot shard's image
/// (when there is one): this request's `amount`, at least one token (an ordinary request:
/// Envoy's default `hits_addend`), and at least the average taken per fast-path write on
/// that shard (`tc` over the writes `wcu` counted) — so check-only or small requests
/// cannot spread a bucket until its ordinary requests no longer fit a shard's share.
fn usual_claim(amount: i64, limit: &str, hot: Option<&BucketItem>) -> i64 {
    let average = hot.map_or(0, |hot| {
        let writes = hot.limit(WCU_LIMIT).map_or(0, |w| w.taken / MILLI);
        match hot.limit(limit) {
            Some(st) if writes > 0 && st.taken > 0 => st.taken / writes,
            _ => 0,
        }
    });
    amount.max(MILLI).max(average)
}

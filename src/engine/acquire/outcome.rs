//! What a decision reports per bucket: each limit's balance refilled to now, the shard's
//! share, and how long until the claim would fit — from an image, for a bucket nothing
//! is known of, after a consumption-only retry, for a refused or contended request; and
//! the count and log line of a refusal no shard could ever admit.

use super::state::{Deciding, Progress};
use crate::engine::bucket::{self, refill};
use crate::engine::{
    BucketClaim, BucketOutcome, Decision, EngineStats, LimitOutcome, CONTENTION_RETRY_MS,
};
use crate::store::{BucketItem, BucketStore, Stamp};

impl<S: BucketStore> Deciding<'_, S> {
    /// The refusal of a request whose bucket (`entity`, `resource`) stayed contended.
    pub(super) fn contended(&self, entity: &str, resource: &str) -> Decision {
        let buckets = self
            .req
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
    pub(crate) fn note_per_shard_ceiling(&self, decision: &Decision) {
        for (b, o) in self.req.buckets.iter().zip(&decision.buckets) {
            for (c, l) in b.limits.iter().zip(&o.limits) {
                if c.exceeds(l.share) {
                    EngineStats::bump(&self.engine.stats.per_shard_ceiling_rejections);
                    if let Some(suppressed) = self.engine.ceiling_log.admit() {
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

    /// What to report for a bucket nothing is known about (a request refused elsewhere
    /// before it was looked at): its full share.
    pub(super) fn unknown_outcome(&self, b: &BucketClaim) -> BucketOutcome {
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
                        refill_amount: c.params.refill_amount,
                        wait_ms: bucket::wait_for(
                            share.ceiling,
                            c.amount,
                            share,
                            c.params.refill_amount,
                        ),
                    }
                })
                .collect(),
            from_lease: false,
        }
    }

    /// What a consumption-only retry on `image` reports once applied: the image less
    /// this request's claims, not refilled (the retry does not refill).
    pub(super) fn retry_outcome(
        &self,
        b: &BucketClaim,
        shard: u32,
        image: &BucketItem,
        now: i64,
    ) -> BucketOutcome {
        let mut after = image.clone();
        for c in &b.limits {
            if let Some(st) = after.limits.get_mut(&c.limit) {
                st.balance = st.balance.saturating_sub(c.amount);
            }
        }
        self.outcome_from_image(b, shard, &after, now, true)
    }

    /// The outcome of bucket `b` according to an image; `debited` says whether the image
    /// already includes this request's debit.
    pub(super) fn outcome_from_image(
        &self,
        b: &BucketClaim,
        shard: u32,
        image: &BucketItem,
        now: i64,
        debited: bool,
    ) -> BucketOutcome {
        let count = image
            .shard_count
            .max(self.engine.shards.get(&b.entity, &b.resource));
        let limits = b
            .limits
            .iter()
            .map(|c| {
                let share = c.params.share(count);
                let balance = image.limit(&c.limit).map_or(share.ceiling, |s| s.balance);
                let (now_balance, _) = refill(balance, image.refilled_at, now, share);
                if debited {
                    LimitOutcome {
                        fits: true,
                        remaining: now_balance,
                        share,
                        refill_amount: c.params.refill_amount,
                        wait_ms: Some(0),
                    }
                } else {
                    LimitOutcome {
                        fits: now_balance >= c.amount,
                        remaining: now_balance,
                        share,
                        refill_amount: c.params.refill_amount,
                        wait_ms: bucket::wait_for(
                            now_balance,
                            c.amount,
                            share,
                            c.params.refill_amount,
                        ),
                    }
                }
            })
            .collect();
        BucketOutcome {
            shard,
            shard_count: count,
            stamp: Stamp::of(image),
            limits,
            from_lease: false,
        }
    }

    /// What an image says of `b` for a request not debited, at `now`, with the refill of
    /// the last [`bucket::REFILL_HOLD_MS`] after the shard's last refill held back
    /// ([`bucket::held_refill`]): a limit that fits only on that refill does not fit yet,
    /// and its wait is the end of the hold. Decides whether a refused request needs a
    /// store write (a refill) at all; what the request is then answered is this outcome.
    pub(super) fn held_outcome(
        &self,
        b: &BucketClaim,
        shard: u32,
        image: &BucketItem,
        now: i64,
    ) -> BucketOutcome {
        let mut outcome = self.outcome_from_image(b, shard, image, now, false);
        for (l, c) in outcome.limits.iter_mut().zip(&b.limits) {
            if !l.fits {
                continue;
            }
            let balance = image.limit(&c.limit).map_or(l.share.ceiling, |s| s.balance);
            if let (held, Some(until)) =
                bucket::held_refill(balance, image.refilled_at, now, l.share)
            {
                if held < c.amount {
                    l.fits = false;
                    l.remaining = held;
                    l.wait_ms = Some((until - now).max(1));
                }
            }
        }
        outcome
    }

    /// The decision for a request refused after some buckets were looked at.
    pub(super) fn refused_decision(&self, progress: &[Progress], now: i64) -> Decision {
        let buckets = self
            .req
            .buckets
            .iter()
            .zip(progress)
            .map(|(b, p)| match p {
                Progress::Applied { shard, image } => {
                    // Report the balance as it was before the refunded debit.
                    let mut o = self.outcome_from_image(b, *shard, image, now, false);
                    for (l, c) in o.limits.iter_mut().zip(&b.limits) {
                        l.remaining = l.remaining.saturating_add(c.amount).min(l.share.ceiling);
                        l.fits = true;
                        l.wait_ms = Some(0);
                    }
                    o
                }
                // Refused on the image, perhaps on a held refill: reported as decided.
                Progress::Rejected { shard, image } => self.held_outcome(b, *shard, image, now),
                Progress::Slow {
                    seen: Some((shard, image)),
                    ..
                } => self.outcome_from_image(b, *shard, image, now, false),
                _ => self.unknown_outcome(b),
            })
            .collect();
        Decision {
            admitted: false,
            buckets,
        }
    }
}

//! Refunds: when a decision refuses, every debit it already applied is given back, on
//! condition that nothing refilled or doubled the shard since (see
//! `BucketStore::credit`). Best effort: a lost refund under-admits, never over-admits.

use crate::support::text::with_causes;
use futures::future::join_all;

use super::state::{Deciding, Progress};
use crate::engine::{BucketClaim, EngineStats};
use crate::store::{BucketKey, BucketStore, Credit, CreditGuard, Stamp};

impl<S: BucketStore> Deciding<'_, S> {
    /// Refunds every bucket of `progress` that was debited.
    pub(super) async fn refund_applied(&self, progress: &[Progress], now: i64) {
        join_all(
            self.req
                .buckets
                .iter()
                .zip(progress)
                .filter_map(|(b, p)| match p {
                    Progress::Applied { shard, image } => {
                        // Held first, so that the refund below lands on it and a repeat of
                        // this request, refused from the cache, reports this bucket's real
                        // balance (an admitted image is otherwise kept only when short).
                        let key = BucketKey::new(&b.entity, &b.resource, *shard);
                        self.engine.rejections.remember(&key, image, now);
                        Some(self.credit_bucket(b, *shard, image.shard_count, Stamp::of(image)))
                    }
                    _ => None,
                }),
        )
        .await;
    }

    /// Refunds what `b`'s claims took from `shard`, on condition that nothing refilled
    /// or doubled it since the debit whose image bore `stamp` (see `BucketStore::credit`).
    pub(crate) async fn credit_bucket(
        &self,
        b: &BucketClaim,
        shard: u32,
        count: u32,
        stamp: Stamp,
    ) {
        let key = BucketKey::new(&b.entity, &b.resource, shard);
        let count = count.max(self.engine.shards.get(&b.entity, &b.resource));
        let credits = credits_of(b, count);
        if credits.is_empty() {
            return;
        }
        self.engine.rejections.credit(&key, &credits);
        EngineStats::bump(&self.engine.stats.refunds);
        self.credit_or_log(b, &key, stamp.into(), &credits).await;
    }

    /// Returns tokens `b`'s claims took from `shard` of `count` and never spent, as a
    /// lease's rest is returned: a refill since changes nothing (the tokens were taken),
    /// only the shard count must be the same (`CreditGuard::SameCount`).
    pub(crate) async fn return_taken(&self, b: &BucketClaim, shard: u32, count: u32) {
        let key = BucketKey::new(&b.entity, &b.resource, shard);
        let credits = credits_of(b, count);
        if credits.is_empty() {
            return;
        }
        self.engine.rejections.credit(&key, &credits);
        EngineStats::bump(&self.engine.stats.refunds);
        self.credit_or_log(b, &key, CreditGuard::SameCount(count), &credits)
            .await;
    }

    async fn credit_or_log(
        &self,
        b: &BucketClaim,
        key: &BucketKey,
        guard: CreditGuard,
        credits: &[Credit],
    ) {
        if let Err(e) = self.engine.store.credit(key, guard, credits).await {
            // A lost refund costs this bucket one request's tokens; never an over-admission.
            if let Some(suppressed) = self.engine.refund_log.admit() {
                tracing::warn!(resource = %b.resource, error = %with_causes(&e), similar_not_logged = suppressed, "refund of unspent tokens failed");
            }
        }
    }
}

/// What `b`'s claims took, as credits to a shard of a bucket of `count` shards (each under
/// its share's ceiling).
fn credits_of(b: &BucketClaim, count: u32) -> Vec<Credit> {
    b.limits
        .iter()
        .filter(|c| c.amount > 0)
        .map(|c| Credit {
            limit: c.limit.clone(),
            amount: c.amount,
            ceiling: c.params.share(count).ceiling,
            params: c.params,
        })
        .collect()
}

//! A refusal from the rejection cache: a request is refused with no store call when the
//! fresh images the cache holds prove every shard of one of its buckets short even after
//! refill (the other buckets are reported from the last image seen of them). The cache
//! itself, what it keeps and for how long, is `rejection.rs`.

use super::state::{Avoid, Deciding};
use crate::engine::Decision;
use crate::store::{BucketItem, BucketKey, BucketStore};

impl<S: BucketStore> Deciding<'_, S> {
    /// A refusal from the rejection cache for bucket `i`, if every shard of it is proven
    /// short; otherwise fills `avoid` with the shards known short.
    pub(super) fn cached_refusal(&self, i: usize, avoid: &mut Avoid, now: i64) -> Option<Decision> {
        let b = self.req.buckets.get(i)?;
        if b.limits.iter().any(|c| c.forced) {
            return None;
        }
        let mut count = self.engine.shards.get(&b.entity, &b.resource);
        let mut best: Option<(i64, u32, BucketItem)> = None;
        let mut shard = 0;
        while shard < count {
            let key = BucketKey::new(&b.entity, &b.resource, shard);
            let image = self.engine.rejections.fresh(&key, now)?;
            count = count.max(image.shard_count);
            let outcome = self.held_outcome(b, shard, &image, now);
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
        let buckets = self
            .req
            .buckets
            .iter()
            .enumerate()
            .map(|(j, other)| {
                if j == i {
                    return Some(self.held_outcome(b, shard, &image, now));
                }
                let count = self.engine.shards.get(&other.entity, &other.resource);
                (0..count).find_map(|s| {
                    let key = BucketKey::new(&other.entity, &other.resource, s);
                    let img = self.engine.rejections.latest(&key)?;
                    Some(self.outcome_from_image(other, s, &img, now, false))
                })
            })
            .collect::<Option<_>>()?;
        Some(Decision {
            admitted: false,
            buckets,
        })
    }
}

//! A decision's read-only twin: what each bucket of a request would say now, from one
//! read of its shard 0, without a write (for a request that must not take tokens).

use super::pass;
use super::state::{wrap, Deciding};
use crate::engine::{BucketOutcome, Decision, EngineError};
use crate::store::{BucketKey, BucketStore};

impl<S: BucketStore> Deciding<'_, S> {
    /// Answers `req` from the store without writing: what each bucket would say now.
    pub(crate) async fn peek(&self) -> Result<Decision, EngineError> {
        let now = self.engine.clock.now_ms();
        let keys: Vec<BucketKey> = self
            .req
            .buckets
            .iter()
            .map(|b| BucketKey::new(&b.entity, &b.resource, 0))
            .collect();
        let images = match self.engine.store.read(&keys).await {
            Ok(images) => images,
            Err(e) => {
                // One read for every bucket: its failure is named for the first.
                let error = match self.req.buckets.first() {
                    Some(b) => wrap(b)(e),
                    None => EngineError::Store {
                        entity: String::new(),
                        resource: String::new(),
                        source: e,
                    },
                };
                return self.busy_refusal(error);
            }
        };
        let buckets: Vec<BucketOutcome> = self
            .req
            .buckets
            .iter()
            .zip(&keys)
            .zip(&images)
            .map(|((b, key), img)| {
                let count = img
                    .as_ref()
                    .map_or(1, |i| i.shard_count)
                    .max(self.engine.shards.get(&b.entity, &b.resource));
                pass::plan_bucket(b, key, img.as_ref(), count, &self.pass_context(now)).refused
            })
            .collect();
        let admitted = buckets.iter().zip(&self.req.buckets).all(|(o, b)| {
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
}

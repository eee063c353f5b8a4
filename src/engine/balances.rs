//! A bucket's balance summed over every shard it has, for `explain`: what the whole
//! bucket holds now, where a decision sees one shard's share. Each existing shard is
//! refilled to now by the engine's own arithmetic ([`refill`]); a shard not created yet
//! is counted apart (it is created when a request first draws it). Reads, never writes.

use crate::store::{inspect, BucketStore, InspectedShard, LimitParams, WCU_LIMIT};

use super::bucket::refill;
use super::{Engine, EngineError};

/// One limit of a bucket, over the shards that exist.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitTotal {
    /// The limit's name in the item.
    pub limit: String,
    /// Millitokens the existing shards hold now, refilled.
    pub tokens: i64,
    /// The most they could hold: the sum of their shares' ceilings.
    pub ceiling: i64,
}

/// A bucket summed over its shards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketBalances {
    /// The largest shard count any of its shards records (shards `0..shard_count`).
    pub shard_count: u32,
    /// How many of them exist in the store.
    pub existing: u32,
    /// Each limit the existing shards hold, in the order of the first shard that holds
    /// it (the store's own limit, `wcu`, left out: it is not a rule's).
    pub limits: Vec<LimitTotal>,
}

/// Sums `shards` (as the store holds them) at `now` (epoch ms): each limit of each
/// existing shard refilled to `now` against that shard's share of its recorded count.
pub fn sum_shards(shards: &[InspectedShard], now: i64) -> BucketBalances {
    let mut limits: Vec<LimitTotal> = Vec::new();
    let mut existing = 0;
    let mut shard_count = 1;
    for item in shards.iter().filter_map(|s| s.image.as_ref()) {
        existing += 1;
        shard_count = shard_count.max(item.shard_count);
        for (name, l) in item.limits.iter() {
            if name == WCU_LIMIT {
                continue;
            }
            let params = LimitParams {
                capacity: l.capacity,
                refill_amount: l.refill_amount,
                refill_period_ms: l.refill_period_ms,
            };
            let share = params.share(item.shard_count);
            let (tokens, _) = refill(l.balance, item.refilled_at, now, share);
            match limits.iter_mut().find(|t| t.limit == name) {
                Some(t) => {
                    t.tokens = t.tokens.saturating_add(tokens);
                    t.ceiling = t.ceiling.saturating_add(share.ceiling);
                }
                None => limits.push(LimitTotal {
                    limit: name.to_string(),
                    tokens,
                    ceiling: share.ceiling,
                }),
            }
        }
    }
    BucketBalances {
        shard_count: shard_count.max(u32::try_from(shards.len()).unwrap_or(u32::MAX)),
        existing,
        limits,
    }
}

impl<S: BucketStore> Engine<S> {
    /// `(entity, resource)` summed over every shard it has, read from the store now.
    pub async fn balances(
        &self,
        entity: &str,
        resource: &str,
    ) -> Result<BucketBalances, EngineError> {
        let shards = inspect(self.store.as_ref(), entity, resource)
            .await
            .map_err(|source| EngineError::Store {
                entity: entity.to_string(),
                resource: resource.to_string(),
                source,
            })?;
        Ok(sum_shards(&shards, self.clock.now_ms()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{BucketItem, LimitState, Limits, MILLI};

    /// A shard of `count` holding `tokens` of a 10-token limit refilled 1 token a second,
    /// last refilled at `rf`.
    fn shard(shard: u32, count: u32, tokens: i64, rf: i64) -> InspectedShard {
        let mut item = BucketItem {
            refilled_at: rf,
            shard_count: count,
            count_raised_at: 0,
            ttl: None,
            limits: Limits::new(),
        };
        item.limits.insert(
            "rpm",
            LimitState {
                balance: tokens * MILLI,
                capacity: 10 * MILLI,
                refill_amount: MILLI,
                refill_period_ms: 1_000,
                taken: 0,
            },
        );
        item.limits.insert(
            WCU_LIMIT,
            LimitState {
                balance: 1_000 * MILLI,
                capacity: 1_000 * MILLI,
                refill_amount: 1_000 * MILLI,
                refill_period_ms: 1_000,
                taken: 0,
            },
        );
        InspectedShard {
            shard,
            image: Some(item),
        }
    }

    #[test]
    fn shards_are_refilled_to_now_each_against_its_own_share_then_summed() {
        // Two shards of 2: each holds at most 5 and refills half a token a second.
        let shards = [shard(0, 2, 1, 0), shard(1, 2, 4, 0)];
        let b = sum_shards(&shards, 4_000);
        assert_eq!((b.shard_count, b.existing), (2, 2));
        // Shard 0: 1 + 4 s × 0.5 = 3; shard 1: 4 + 2 = 6, clamped to its ceiling of 5.
        assert_eq!(
            b.limits,
            vec![LimitTotal {
                limit: "rpm".into(),
                tokens: 8 * MILLI,
                ceiling: 10 * MILLI
            }]
        );
    }

    #[test]
    fn a_shard_not_created_is_counted_apart_and_the_write_budget_left_out() {
        let shards = [
            shard(0, 4, 2, 1_000),
            InspectedShard {
                shard: 1,
                image: None,
            },
            shard(2, 4, 0, 1_000),
            InspectedShard {
                shard: 3,
                image: None,
            },
        ];
        let b = sum_shards(&shards, 1_000);
        assert_eq!((b.shard_count, b.existing), (4, 2));
        assert_eq!(b.limits.len(), 1, "{b:?}");
        // Two existing shards of a quarter each: 2 + 0 tokens of 2.5 + 2.5.
        assert_eq!(b.limits[0].tokens, 2 * MILLI);
        assert_eq!(b.limits[0].ceiling, 5 * MILLI);
    }

    #[test]
    fn no_shard_at_all_is_one_shard_not_created() {
        let b = sum_shards(
            &[InspectedShard {
                shard: 0,
                image: None,
            }],
            0,
        );
        assert_eq!((b.shard_count, b.existing, b.limits.len()), (1, 0, 0));
    }
}

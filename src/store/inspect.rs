//! Reading one bucket's every shard, for `shardgate inspect` and tests: which shards
//! exist and what each holds. Read-only; the engine never calls it.

use super::{BucketItem, BucketKey, BucketStore, StoreError, MAX_SHARD_COUNT, MILLI};

/// One shard of a bucket as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InspectedShard {
    pub shard: u32,
    /// `None`: the shard was never created (shards are created lazily, on first draw).
    pub image: Option<BucketItem>,
}

impl InspectedShard {
    /// As `shardgate inspect` prints it: balances in tokens and in the stored
    /// millitokens, so an operator can compare with the item in the table.
    pub fn to_json(&self) -> serde_json::Value {
        let Some(item) = &self.image else {
            return serde_json::json!({ "shard": self.shard, "exists": false });
        };
        let limits: serde_json::Map<String, serde_json::Value> = item
            .limits
            .iter()
            .map(|(name, l)| {
                let state = serde_json::json!({
                    "tokens": l.balance as f64 / MILLI as f64,
                    "tk": l.balance, "cp": l.capacity, "ra": l.refill_amount, "rp": l.refill_period_ms, "tc": l.taken,
                });
                (name.to_string(), state)
            })
            .collect();
        serde_json::json!({
            "shard": self.shard, "exists": true, "shard_count": item.shard_count,
            "rf": item.refilled_at, "ttl": item.ttl, "limits": limits,
            "count_raised_at": (item.count_raised_at != 0).then_some(item.count_raised_at),
        })
    }
}

/// Every shard of one bucket, shards `0..count`, where `count` is the largest shard count
/// any existing shard records (shard 0 is the source of truth, but a shard created later
/// may know more).
pub async fn inspect<S: BucketStore>(
    store: &S,
    entity: &str,
    resource: &str,
) -> Result<Vec<InspectedShard>, StoreError> {
    let mut count = 1;
    let mut shards = Vec::new();
    let mut next = 0;
    while next < count {
        let keys: Vec<BucketKey> = (next..count)
            .map(|s| BucketKey::new(entity, resource, s))
            .collect();
        let images = store.read(&keys).await?;
        for (key, image) in keys.into_iter().zip(images) {
            if let Some(i) = &image {
                count = count.max(i.shard_count.min(MAX_SHARD_COUNT));
            }
            shards.push(InspectedShard {
                shard: key.shard,
                image,
            });
        }
        next = shards.len() as u32;
    }
    Ok(shards)
}

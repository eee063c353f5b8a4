//! Bucket items as DynamoDB stores them: the key of a shard
//! (`{namespace}/BUCKET#{entity}#{resource}#{shard}`, `SK = #STATE`) and the attributes
//! of an item (`rf`, `shard_count`, `sa` (when the count was raised), `ttl`, `entity_id`, `resource`, and per limit
//! `b_{limit}_{tk,cp,ra,rp,tc}`, every number an integer), both ways. A corrupt item is
//! an error naming its key and the reason: that bucket's error, never the store's.
//!
//! A number read from the table is taken only within what the engine can work with: the
//! check every store's decoder makes (`store/item.rs`, [`validate_stored`]) refuses a
//! shard count outside 1..=32 and a refill period below 1 ms as a corrupt item.

use std::collections::{BTreeMap, HashMap};

use aws_sdk_dynamodb::types::AttributeValue;

use super::expr::{attr, n, s};
use super::DynamoStore;
use crate::store::{
    stored_shard_count, validate_stored, BucketItem, BucketKey, LimitState, Limits, StoreError,
};

/// A limit's consumed counter (`tc`), saturated at the bounds of `i64` as the other
/// stores keep it: DynamoDB's `ADD` has no ceiling, so a counter that passed `i64::MAX`
/// is stored past it, and reads as `i64::MAX` rather than making its bucket corrupt.
fn parse_counter(attr: &str, v: &AttributeValue) -> Result<i64, String> {
    match v {
        AttributeValue::N(text) => {
            let digits = text.strip_prefix('-').unwrap_or(text);
            match text.parse::<i64>() {
                Ok(n) => Ok(n),
                Err(_) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
                    Ok(if text.starts_with('-') {
                        i64::MIN
                    } else {
                        i64::MAX
                    })
                }
                Err(_) => Err(format!("'{attr}' is not an integer: {text}")),
            }
        }
        _ => parse_n(attr, v),
    }
}

/// One item as the SDK carries it.
pub(super) type Item = HashMap<String, AttributeValue>;

/// An item's number attribute; the error is the reason it is corrupt.
fn parse_n(attr: &str, v: &AttributeValue) -> Result<i64, String> {
    match v {
        AttributeValue::N(text) => text
            .parse::<i64>()
            .map_err(|_| format!("'{attr}' is not an integer in range: {text}")),
        other => Err(format!("'{attr}' is not a number: {other:?}")),
    }
}

/// Decodes a bucket item. A limit is recognised when its `tk` and `cp` exist. The error
/// is the reason the item is corrupt; the caller names the key (only then: formatting it
/// on every decode showed in profiles).
pub(super) fn decode(item: &Item) -> Result<BucketItem, String> {
    let rf = item
        .get("rf")
        .map(|v| parse_n("rf", v))
        .transpose()?
        .ok_or_else(|| "no 'rf'".to_string())?;
    let shard_count = match item.get("shard_count") {
        Some(v) => stored_shard_count("shard_count", parse_n("shard_count", v)?)?,
        None => 1,
    };
    let ttl = item.get("ttl").map(|v| parse_n("ttl", v)).transpose()?;
    let count_raised_at = item.get("sa").map(|v| parse_n("sa", v)).transpose()?;
    let mut fields: BTreeMap<&str, [Option<i64>; 5]> = BTreeMap::new();
    for (name, v) in item {
        let Some(rest) = name.strip_prefix("b_") else {
            continue;
        };
        let Some((limit, field)) = rest.rsplit_once('_') else {
            continue;
        };
        let slot = match field {
            "tk" => 0,
            "cp" => 1,
            "ra" => 2,
            "rp" => 3,
            "tc" => 4,
            _ => continue,
        };
        let value = if slot == 4 {
            parse_counter(name, v)?
        } else {
            parse_n(name, v)?
        };
        fields.entry(limit).or_default()[slot] = Some(value);
    }
    let mut limits = Limits::new();
    for (limit, [tk, cp, ra, rp, tc]) in fields {
        let (Some(tk), Some(cp)) = (tk, cp) else {
            continue;
        };
        limits.insert(
            limit,
            LimitState {
                balance: tk,
                capacity: cp,
                refill_amount: ra.unwrap_or(0),
                // Absent: 0, which the shared check refuses.
                refill_period_ms: rp.unwrap_or(0),
                taken: tc.unwrap_or(0),
            },
        );
    }
    let item = BucketItem {
        refilled_at: rf,
        shard_count,
        count_raised_at: count_raised_at.unwrap_or(0),
        ttl,
        limits,
    };
    validate_stored(&item)?;
    Ok(item)
}

impl DynamoStore {
    /// The partition key of a bucket shard.
    pub fn pk(&self, key: &BucketKey) -> String {
        format!(
            "{}/BUCKET#{}#{}#{}",
            self.namespace, key.entity, key.resource, key.shard
        )
    }

    pub(super) fn key_of(&self, key: &BucketKey) -> Item {
        HashMap::from([
            ("PK".to_string(), s(self.pk(key))),
            ("SK".to_string(), s("#STATE")),
        ])
    }

    pub(super) fn decode_opt(
        &self,
        key: &BucketKey,
        item: Option<&Item>,
    ) -> Result<Option<BucketItem>, StoreError> {
        item.filter(|i| !i.is_empty())
            .map(|i| {
                decode(i).map_err(|reason| StoreError::Corrupt {
                    key: self.pk(key),
                    reason,
                    source: None,
                })
            })
            .transpose()
    }

    pub(super) fn encode(&self, key: &BucketKey, item: &BucketItem) -> Item {
        let mut out = self.key_of(key);
        out.insert("entity_id".into(), s(key.entity.clone()));
        out.insert("resource".into(), s(key.resource.clone()));
        out.insert("rf".into(), n(item.refilled_at));
        out.insert("shard_count".into(), n(i64::from(item.shard_count)));
        if item.count_raised_at != 0 {
            out.insert("sa".into(), n(item.count_raised_at));
        }
        if let Some(t) = item.ttl {
            out.insert("ttl".into(), n(t));
        }
        for (limit, st) in item.limits.iter() {
            for (field, v) in [
                ("tk", st.balance),
                ("cp", st.capacity),
                ("ra", st.refill_amount),
                ("rp", st.refill_period_ms),
                ("tc", st.taken),
            ] {
                out.insert(attr(limit, field), n(v));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn decode_splits_limit_names_on_the_last_underscore() {
        let mut item: Item = HashMap::new();
        item.insert("rf".into(), n(7));
        for (f, v) in [("tk", 1), ("cp", 2), ("ra", 3), ("rp", 4), ("tc", 5)] {
            item.insert(format!("b_my_limit_{f}"), n(v));
        }
        let it = decode(&item).unwrap();
        assert_eq!(
            *it.limits.get("my_limit").unwrap(),
            LimitState {
                balance: 1,
                capacity: 2,
                refill_amount: 3,
                refill_period_ms: 4,
                taken: 5
            }
        );
        assert_eq!(it.shard_count, 1);
    }

    #[test]
    fn a_counter_past_i64_reads_saturated() {
        let mut item: Item = HashMap::new();
        item.insert("rf".into(), AttributeValue::N("1".into()));
        item.insert("b_l_tk".into(), AttributeValue::N("1".into()));
        item.insert("b_l_cp".into(), AttributeValue::N("2".into()));
        item.insert("b_l_rp".into(), AttributeValue::N("4".into()));
        for (stored, read) in [
            ("9223372036854775813", i64::MAX),
            ("-9223372036854775813", i64::MIN),
            ("12", 12),
        ] {
            item.insert("b_l_tc".into(), AttributeValue::N(stored.into()));
            assert_eq!(decode(&item).unwrap().limits["l"].taken, read);
        }
        item.insert("b_l_tc".into(), AttributeValue::N("1e3".into()));
        assert!(decode(&item).unwrap_err().contains("'b_l_tc'"));
        // A balance past i64 is still corrupt: no write of this store makes one.
        item.insert("b_l_tc".into(), AttributeValue::N("0".into()));
        item.insert(
            "b_l_tk".into(),
            AttributeValue::N("9223372036854775813".into()),
        );
        assert!(decode(&item).unwrap_err().contains("'b_l_tk'"));
    }

    #[test]
    fn decode_rejects_corrupt_numbers() {
        let mut item: Item = HashMap::new();
        item.insert("rf".into(), AttributeValue::N("1.5".into()));
        assert_eq!(
            decode(&item).unwrap_err(),
            "'rf' is not an integer in range: 1.5"
        );
        item.insert("rf".into(), n(1));
        item.insert("b_x_tk".into(), n(1));
        item.insert("b_x_cp".into(), n(1));
        item.insert("b_x_rp".into(), n(0));
        assert_eq!(decode(&item).unwrap_err(), "limit 'x' has refill period 0");
    }

    #[test]
    fn decode_refuses_a_shard_count_outside_what_a_bucket_can_have() {
        let mut item: Item = HashMap::new();
        item.insert("rf".into(), n(1));
        assert_eq!(decode(&item).unwrap().shard_count, 1, "absent: one shard");
        for ok in [1, 2, 32] {
            item.insert("shard_count".into(), n(ok));
            assert_eq!(decode(&item).unwrap().shard_count, ok as u32);
        }
        for (bad, why) in [
            (33, "'shard_count' is 33, not within 1..=32"),
            (0, "'shard_count' is 0, not within 1..=32"),
            (-1, "'shard_count' is -1, not within 1..=32"),
            (1 << 40, "'shard_count' is 1099511627776, not within 1..=32"),
        ] {
            item.insert("shard_count".into(), n(bad));
            assert_eq!(decode(&item).unwrap_err(), why);
        }
    }
}

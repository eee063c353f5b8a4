//! What a store can hold: the bounds of a stored key and item, which every store enforces
//! alike, and the stored form of an entity too long to be part of a key.
//!
//! DynamoDB refuses a partition key over 2,048 bytes and an item over 400 KB. The
//! contract states both limits for a key under the longest namespace a store accepts
//! ([`MAX_NAMESPACE_BYTES`]), and every store checks them before it writes, so the memory
//! store refuses exactly what DynamoDB would and the conformance list sees it. The engine
//! never sends such a key: an entity longer than [`MAX_ENTITY_BYTES`] is stored under its
//! digest ([`stored_entity`]), so a long descriptor value is limited like a short one.
//!
//! This module decides nothing about limits; it only measures and names.

use sha2::{Digest, Sha256};

use super::{BucketItem, BucketKey, LimitWrite, Name, StoreError, Write, MAX_COMMIT_ITEMS};
use crate::support::text::elide;

/// DynamoDB's limit on a partition key.
pub const MAX_PARTITION_KEY_BYTES: usize = 2_048;

/// DynamoDB's limit on an item (attribute names and values together).
pub const MAX_ITEM_BYTES: usize = 400 * 1_024;

/// Longest key prefix (`--namespace`) a store accepts.
pub const MAX_NAMESPACE_BYTES: usize = 256;

/// Longest resource a rule may name (config validation refuses longer ones).
pub const MAX_RESOURCE_BYTES: usize = 256;

/// Longest entity stored as it is; a longer one is stored under its digest. With the
/// longest namespace and resource, the key stays under [`MAX_PARTITION_KEY_BYTES`].
pub const MAX_ENTITY_BYTES: usize = 1_024;

/// Starts every digest form. Request values are percent-encoded for `#` and an `entity:`
/// template may not contain one, so no other entity can begin with it.
pub const DIGEST_PREFIX: &str = "#sha256:";

/// Bytes of the original entity kept after the digest, for people reading the table.
const READABLE_HEAD_BYTES: usize = 64;

/// `/BUCKET#` between the namespace and the entity, then `#` twice.
const KEY_FRAMING_BYTES: usize = "/BUCKET#".len() + 2;

/// The entity as stored: itself when it is at most [`MAX_ENTITY_BYTES`] long, else
/// `#sha256:<64 hex digits>:<its first bytes>` — the SHA-256 of the whole entity, so two
/// long entities share a bucket only if they are equal (or SHA-256 collides).
pub fn stored_entity(entity: Name) -> Name {
    if entity.len() <= MAX_ENTITY_BYTES {
        return entity;
    }
    let digest = Sha256::digest(entity.as_bytes());
    let mut head = READABLE_HEAD_BYTES;
    while !entity.is_char_boundary(head) {
        head -= 1;
    }
    let mut out = Name::with_capacity(DIGEST_PREFIX.len() + 64 + 1 + head);
    out.push_str(DIGEST_PREFIX);
    out.push_str(&hex::encode(digest));
    out.push(':');
    out.push_str(&entity[..head]);
    out
}

/// Length of the partition key DynamoDB would store for `key` under the longest
/// namespace: `{namespace}/BUCKET#{entity}#{resource}#{shard}`.
pub fn partition_key_bytes(key: &BucketKey) -> usize {
    MAX_NAMESPACE_BYTES
        + KEY_FRAMING_BYTES
        + key.entity.len()
        + key.resource.len()
        + decimal_digits(u64::from(key.shard))
}

/// Refuses a key no store can hold (see the module comment).
pub fn check_key(key: &BucketKey) -> Result<(), StoreError> {
    let bytes = partition_key_bytes(key);
    if bytes > MAX_PARTITION_KEY_BYTES {
        return Err(StoreError::Invalid {
            key: key.to_string(),
            reason: format!(
                "the partition key would be {bytes} bytes (at most {MAX_PARTITION_KEY_BYTES})"
            ),
            source: None,
        });
    }
    Ok(())
}

/// What the attributes of `key` itself (`PK`, `SK`, `entity_id`, `resource`) add to the
/// size of its item, [`item_bytes`]: a store that measures an item from its own fields
/// (Redis, in its commit script) adds this.
pub fn key_attribute_bytes(key: &BucketKey) -> usize {
    "PK".len()
        + partition_key_bytes(key)
        + "SK".len()
        + "#STATE".len()
        + "entity_id".len()
        + key.entity.len()
        + "resource".len()
        + key.resource.len()
}

/// The size DynamoDB counts for `item` stored under `key` (the longest namespace): the
/// UTF-8 length of every attribute name plus its value — a string's UTF-8 length, a
/// number's one byte per two significant digits plus one.
pub fn item_bytes(key: &BucketKey, item: &BucketItem) -> usize {
    let mut bytes = key_attribute_bytes(key);
    bytes += "rf".len() + number_bytes(item.refilled_at);
    bytes += "shard_count".len() + number_bytes(i64::from(item.shard_count));
    if item.count_raised_at != 0 {
        bytes += "sa".len() + number_bytes(item.count_raised_at);
    }
    if let Some(ttl) = item.ttl {
        bytes += "ttl".len() + number_bytes(ttl);
    }
    for (name, st) in item.limits.iter() {
        // `b_{name}_{field}`: two underscores, a two-letter field.
        let attribute = name.len() + 6;
        for v in [
            st.balance,
            st.capacity,
            st.refill_amount,
            st.refill_period_ms,
            st.taken,
        ] {
            bytes += attribute + number_bytes(v);
        }
    }
    bytes
}

/// Refuses an item larger than DynamoDB stores.
pub fn check_item(key: &BucketKey, item: &BucketItem) -> Result<(), StoreError> {
    let bytes = item_bytes(key, item);
    if bytes > MAX_ITEM_BYTES {
        return Err(StoreError::Invalid {
            key: key.to_string(),
            reason: format!("the item would be {bytes} bytes (at most {MAX_ITEM_BYTES})"),
            source: None,
        });
    }
    Ok(())
}

/// Refuses a call that names one limit of `key` twice (two debits, credits or writes of
/// the same limit). DynamoDB refuses such an update (its paths overlap), so every store
/// refuses it, with the same error; the engine never makes one.
pub fn check_once<T>(
    key: &BucketKey,
    items: &[T],
    limit: impl Fn(&T) -> &str,
) -> Result<(), StoreError> {
    // Pairwise, without a set: a call names a handful of limits, and this runs on every
    // decision (an allocation here would be one per decision).
    for (i, a) in items.iter().enumerate() {
        let name = limit(a);
        if items[..i].iter().any(|b| limit(b) == name) {
            return Err(StoreError::Invalid {
                key: key.to_string(),
                reason: format!("limit '{}' is named twice in one call", elide(name, 64)),
                source: None,
            });
        }
    }
    Ok(())
}

/// Refuses a commit no store takes: no write or more than [`MAX_COMMIT_ITEMS`], a key too
/// long, an item created too large. `name` is how the store names a key in its errors.
pub fn check_commit(
    writes: &[Write],
    name: impl Fn(&BucketKey) -> String,
) -> Result<(), StoreError> {
    if writes.is_empty() || writes.len() > MAX_COMMIT_ITEMS {
        return Err(StoreError::Invalid {
            key: writes.first().map(|w| name(w.key())).unwrap_or_default(),
            reason: format!(
                "a commit carries 1..={MAX_COMMIT_ITEMS} items, not {}",
                writes.len()
            ),
            source: None,
        });
    }
    for w in writes {
        check_key(w.key())?;
        match w {
            Write::Update { key, limits, .. } => check_once(key, limits, LimitWrite::limit)?,
            Write::Debit { key, debits, .. } => check_once(key, debits, |d| &d.limit)?,
            Write::Create { .. } => {}
        }
        if let Write::Create { key, item } = w {
            check_item(key, item)?;
        }
    }
    Ok(())
}

fn decimal_digits(mut v: u64) -> usize {
    let mut digits = 1;
    while v >= 10 {
        v /= 10;
        digits += 1;
    }
    digits
}

/// DynamoDB's size of a number: leading and trailing zeros are not significant.
fn number_bytes(v: i64) -> usize {
    let mut m = v.unsigned_abs();
    if m == 0 {
        return 1 + 1;
    }
    while m.is_multiple_of(10) {
        m /= 10;
    }
    decimal_digits(m).div_ceil(2) + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_entities_are_stored_as_they_are() {
        let e = Name::new("tenant=acme/api_key=k1");
        assert_eq!(stored_entity(e.clone()), e);
        let at_bound = Name::new("x".repeat(MAX_ENTITY_BYTES));
        assert_eq!(stored_entity(at_bound.clone()), at_bound);
    }

    #[test]
    fn long_entities_are_stored_under_a_digest_that_tells_them_apart() {
        let a = stored_entity(Name::new("a".repeat(MAX_ENTITY_BYTES + 1)));
        let b = stored_entity(Name::new(format!("{}b", "a".repeat(MAX_ENTITY_BYTES))));
        assert!(a.starts_with(DIGEST_PREFIX) && b.starts_with(DIGEST_PREFIX));
        assert_ne!(a, b, "same head, different tails");
        assert_eq!(a.len(), DIGEST_PREFIX.len() + 64 + 1 + READABLE_HEAD_BYTES);
        assert!(a.ends_with(&"a".repeat(READABLE_HEAD_BYTES)));
        // Deterministic: every server maps one entity to one key.
        assert_eq!(
            a,
            stored_entity(Name::new("a".repeat(MAX_ENTITY_BYTES + 1)))
        );
    }

    #[test]
    fn the_readable_head_never_splits_a_character() {
        let long = "é".repeat(MAX_ENTITY_BYTES);
        let stored = stored_entity(Name::new(&long));
        assert!(stored.ends_with(&"é".repeat(READABLE_HEAD_BYTES / 2)));
    }

    #[test]
    fn every_stored_entity_fits_a_key_with_the_longest_namespace_and_resource() {
        let key = BucketKey::new(
            "x".repeat(MAX_ENTITY_BYTES),
            "r".repeat(MAX_RESOURCE_BYTES),
            31,
        );
        assert!(check_key(&key).is_ok(), "{}", partition_key_bytes(&key));
        let too_long = BucketKey::new("x".repeat(1_800), "r", 0);
        let err = check_key(&too_long).unwrap_err();
        assert!(matches!(err, StoreError::Invalid { .. }), "{err}");
    }

    #[test]
    fn number_sizes_follow_dynamodb() {
        assert_eq!(number_bytes(0), 2);
        assert_eq!(number_bytes(7), 2);
        assert_eq!(
            number_bytes(1_000_000),
            2,
            "trailing zeros are not significant"
        );
        assert_eq!(number_bytes(123), 3);
        assert_eq!(number_bytes(-1_234), 3);
        assert_eq!(number_bytes(i64::MIN), 11);
    }
}

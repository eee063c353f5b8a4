//! The Redis item format: keys, hash fields, images decoded from `HGETALL` (or from a
//! script's image, the fields joined by spaces), a new item's fields, and the operation
//! ids that ride along. Pure: nothing here talks to Redis. The scripts' arguments are
//! `args.rs`'s (debits, credits) and `commit_args.rs`'s.
//!
//! An item is one hash: `rf`, `sc` (shard count), `sa` (when the count was last raised,
//! epoch ms; absent: never), `ttl` (epoch seconds; absent: never expires) and five fields per limit, `b:{limit}:tk|cp|ra|rp|tc`, every value a decimal
//! integer — the same integers the other stores hold — plus the records of operations
//! that ran on it (`x:{id}`, `lua/lib.lua`), which are no part of the item. The key is
//! `{}{namespace}/BUCKET#{entity}#{resource}#{shard}`: the leading empty hash tag makes
//! Redis Cluster hash the whole key, so a brace in a request value can never choose the
//! slot, and the shards of one bucket land on slots of their own (spread over the
//! masters, which is what sharding a hot bucket is for).

use crate::store::{BucketItem, BucketKey, LimitState, Limits};

/// The prefix that makes Cluster hash the whole key (see the module comment).
const WHOLE_KEY_TAG: &str = "{}";

/// The Redis key of `key` under `namespace`.
pub(super) fn redis_key(namespace: &str, key: &BucketKey) -> String {
    let mut out = String::with_capacity(
        WHOLE_KEY_TAG.len() + namespace.len() + key.entity.len() + key.resource.len() + 16,
    );
    out.push_str(WHOLE_KEY_TAG);
    out.push_str(namespace);
    out.push_str("/BUCKET#");
    out.push_str(&key.entity);
    out.push('#');
    out.push_str(&key.resource);
    out.push('#');
    out.push_str(&key.shard.to_string());
    out
}

/// The Cluster slot of a Redis key: CRC16 (XMODEM) of the whole key, as Redis computes it
/// for a key whose first `{` is followed at once by `}` — every key of this store.
pub(super) fn slot(redis_key: &str) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(redis_key.as_bytes()) % 16_384
}

/// A new operation id (`lua/lib.lua`, `record`): 96 random bits in hex, so that no two
/// calls of any server sharing the Redis ever carry the same.
pub(super) fn op_id() -> String {
    format!("{:024x}", rand::random::<u128>() >> 32)
}

/// Why an image could not be decoded.
pub(super) type DecodeError = String;

/// The item an `HGETALL` returned as a flat field/value list (`None`: no item).
pub(super) fn decode<S: AsRef<str>>(flat: &[S]) -> Result<Option<BucketItem>, DecodeError> {
    if !flat.len().is_multiple_of(2) {
        return Err(format!("{} values, not field/value pairs", flat.len()));
    }
    decode_strings(flat.iter().map(AsRef::as_ref)).and_then(crate::store::checked_stored)
}

/// The item a script's image names: its field and value strings joined by single spaces
/// (`lua/lib.lua`, `image`; empty: no item).
pub(super) fn decode_joined(joined: &str) -> Result<Option<BucketItem>, DecodeError> {
    if joined.is_empty() {
        return Ok(None);
    }
    decode_strings(joined.split(' ')).and_then(crate::store::checked_stored)
}

/// The item of a field/value sequence (none: no item).
fn decode_strings<'a>(
    mut flat: impl Iterator<Item = &'a str>,
) -> Result<Option<BucketItem>, DecodeError> {
    let mut found = false;
    let (mut rf, mut sc, mut sa, mut ttl) = (None, None, None, None);
    // Each limit's five fields as they are found (any value is valid, i64::MIN too: a
    // consumed counter saturates there).
    let mut fields: Vec<(&str, [Option<i64>; 5])> = Vec::new();
    while let Some(field) = flat.next() {
        found = true;
        let value = flat
            .next()
            .ok_or_else(|| format!("field '{field}' has no value: not field/value pairs"))?;
        let int = |v: &str| -> Result<i64, DecodeError> {
            v.parse()
                .map_err(|_| format!("field '{field}' is not an integer"))
        };
        match field {
            "rf" => rf = Some(int(value)?),
            "sc" => {
                sc = Some(
                    value
                        .parse::<u32>()
                        .map_err(|_| "field 'sc' is not a shard count".to_string())?,
                )
            }
            "ttl" => ttl = Some(int(value)?),
            "sa" => sa = Some(int(value)?),
            // An operation's record (`lua/lib.lua`, `record`): not the item's.
            _ if field.starts_with("x:") => {}
            _ => limit_field(&mut fields, field, int(value)?)?,
        }
    }
    if !found {
        return Ok(None);
    }
    let mut limits = Limits::new();
    for (name, parts) in fields {
        let [Some(tk), Some(cp), Some(ra), Some(rp), Some(tc)] = parts else {
            return Err(format!("limit '{name}' lacks a field"));
        };
        limits.insert(
            name,
            LimitState {
                balance: tk,
                capacity: cp,
                refill_amount: ra,
                refill_period_ms: rp,
                taken: tc,
            },
        );
    }
    Ok(Some(BucketItem {
        refilled_at: rf.ok_or("no field 'rf'")?,
        shard_count: sc.ok_or("no field 'sc'")?,
        count_raised_at: sa.unwrap_or(0),
        ttl,
        limits,
    }))
}

/// A limit's field (`b:{name}:{part}`) and its value, onto the limit's five so far.
fn limit_field<'a>(
    fields: &mut Vec<(&'a str, [Option<i64>; 5])>,
    field: &'a str,
    v: i64,
) -> Result<(), DecodeError> {
    let Some((name, part)) = field
        .strip_prefix("b:")
        .and_then(|rest| rest.rsplit_once(':'))
    else {
        return Err(format!("unknown field '{field}'"));
    };
    let slot = match part {
        "tk" => 0,
        "cp" => 1,
        "ra" => 2,
        "rp" => 3,
        "tc" => 4,
        _ => return Err(format!("unknown field '{field}'")),
    };
    match fields.iter_mut().find(|(n, _)| *n == name) {
        Some((_, parts)) => parts[slot] = Some(v),
        None => {
            let mut parts = [None; 5];
            parts[slot] = Some(v);
            fields.push((name, parts));
        }
    }
    Ok(())
}

/// The hash fields of a new item, flat (`rf`, `sc`, then five per limit).
pub(super) fn fields_of(item: &BucketItem) -> Vec<String> {
    let mut out = Vec::with_capacity(4 + 10 * item.limits.len());
    out.extend(["rf".into(), item.refilled_at.to_string()]);
    out.extend(["sc".into(), item.shard_count.to_string()]);
    if item.count_raised_at != 0 {
        out.extend(["sa".into(), item.count_raised_at.to_string()]);
    }
    for (name, st) in item.limits.iter() {
        push_limit(&mut out, name, st);
    }
    out
}

/// A limit's five fields: each suffix (`b:{name}:{suffix}`) and its value.
pub(super) fn limit_parts(st: &LimitState) -> [(&'static str, i64); 5] {
    [
        ("tk", st.balance),
        ("cp", st.capacity),
        ("ra", st.refill_amount),
        ("rp", st.refill_period_ms),
        ("tc", st.taken),
    ]
}

pub(super) fn push_limit(out: &mut Vec<String>, name: &str, st: &LimitState) {
    for (part, v) in limit_parts(st) {
        out.push(format!("b:{name}:{part}"));
        out.push(v.to_string());
    }
}

/// An item's hash fields as the debit script takes a seed: field and value strings
/// joined by single spaces. `None` when a limit's name holds a space (the rules never
/// make one; the contract does not forbid it): such a seed is not sent, and a missing
/// item is refused as missing, to be created by the caller's commit instead.
pub(super) fn seed_arg(item: &BucketItem) -> Option<String> {
    if item.limits.iter().any(|(name, _)| name.contains(' ')) {
        return None;
    }
    // What `fields_of(item).join(" ")` is, written into one string: a seed goes with
    // every debit that may create, and building it field by field was about 5% of a
    // server's time on distinct buckets.
    let mut digits = itoa::Buffer::new();
    let mut out = String::with_capacity(24 + 80 * item.limits.len());
    out.push_str("rf ");
    out.push_str(digits.format(item.refilled_at));
    out.push_str(" sc ");
    out.push_str(digits.format(item.shard_count));
    if item.count_raised_at != 0 {
        out.push_str(" sa ");
        out.push_str(digits.format(item.count_raised_at));
    }
    for (name, st) in item.limits.iter() {
        for (part, v) in limit_parts(st) {
            for piece in [" b:", name, ":", part, " ", digits.format(v)] {
                out.push_str(piece);
            }
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::LimitParams;

    #[test]
    fn keys_hash_whole_so_a_brace_in_a_value_cannot_pick_the_slot() {
        let a = redis_key("ns", &BucketKey::new("{x}a", "r", 0));
        let b = redis_key("ns", &BucketKey::new("{x}b", "r", 0));
        assert!(a.starts_with("{}ns/BUCKET#"));
        // With `{x}` hashed alone both would share a slot; hashed whole they differ
        // (checked for these two values, which do).
        assert_ne!(slot(&a), slot(&b));
        // Redis's own example: the slot of "123456789" is 0x31C3 % 16384.
        assert_eq!(slot("123456789"), 0x31C3);
    }

    #[test]
    fn an_item_round_trips_through_its_fields() {
        let item = BucketItem {
            refilled_at: 1_700_000_000_123,
            shard_count: 4,
            count_raised_at: 0,
            ttl: None,
            limits: [
                (
                    "rpm",
                    LimitState::new(LimitParams::new(10, 10, 60_000), -(1 << 62), 7),
                ),
                ("a:b", LimitState::new(LimitParams::new(1, 1, 1), 0, 0)),
            ]
            .into_iter()
            .collect(),
        };
        assert_eq!(decode(&fields_of(&item)), Ok(Some(item.clone())));
        // A consumed counter saturated at i64::MIN is a value like any other.
        let mut saturated = item;
        saturated.limits.get_mut("rpm").unwrap().taken = i64::MIN;
        assert_eq!(decode(&fields_of(&saturated)), Ok(Some(saturated.clone())));
        assert_eq!(decode::<String>(&[]), Ok(None));
        // As the debit scripts answer it: one string, joined by spaces.
        let joined = fields_of(&saturated).join(" ");
        assert_eq!(decode_joined(&joined), Ok(Some(saturated)));
        assert_eq!(decode_joined(""), Ok(None));
        // An operation's record rides along and is no part of the item.
        let recorded = format!("{joined} x:{} 1700000000123:0,2", op_id());
        assert_eq!(decode_joined(&recorded), decode_joined(&joined));
        assert!(decode_joined("rf 1 sc").unwrap_err().contains("pairs"));
    }

    #[test]
    fn a_corrupt_image_names_what_is_wrong() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(decode(&s(&["rf", "x", "sc", "1"]))
            .unwrap_err()
            .contains("'rf'"));
        assert!(decode(&s(&["rf", "1"])).unwrap_err().contains("'sc'"));
        assert!(decode(&s(&["rf", "1", "sc", "1", "b:l:tk", "5"]))
            .unwrap_err()
            .contains("lacks"));
        assert!(decode(&s(&["rf", "1", "sc", "1", "zz", "5"]))
            .unwrap_err()
            .contains("'zz'"));
    }
}

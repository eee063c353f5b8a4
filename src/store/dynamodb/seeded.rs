//! A bucket's first request in one write: the fast path's `UpdateItem` that debits the
//! item where it exists and creates it, already debited, where it does not
//! ([`BucketStore::debit_or_create`](crate::store::BucketStore::debit_or_create)). Without
//! it a new key costs a refused debit (DynamoDB bills a failed conditional write) and
//! then the create.
//!
//! One expression serves both: the condition is `attribute_not_exists(PK)` or the
//! debit's own; every attribute the seed holds is `SET` to `if_not_exists(attribute,
//! seed's value)` and each debited counter to `if_not_exists(counter, seed's) ± amount`.
//! On an item that exists every `if_not_exists` reads the item, so the write is exactly
//! the debit; on a missing one it reads the seed, so the item written is the seed with the
//! debit applied. `wcu` is the one difference the contract asks for (a create takes no
//! `wcu` token): its seed values are offset by the token the expression takes.
//!
//! Owns the expression only; must not decide whether the seed fits (the contract's
//! `seed_after_debit` does) nor make the call (`calls.rs`).

use std::fmt::Write as _;

use super::expr::{attr, debit_expression, n, s, Expr};
use crate::store::{BucketItem, BucketKey, Debit, DebitMode, MILLI, WCU_LIMIT};

/// Past this many bytes of expression the one-write debit is not tried (DynamoDB takes
/// 4 KB); the plain debit and a create serve the bucket instead: a bucket of a dozen
/// limits or more, where a second write on its first request is a small share.
const MAX_EXPRESSION_BYTES: usize = 3_000;

/// The update and condition of a fast debit on `key` that creates `seed` (debited) where
/// there is no item, or `None` where one expression cannot: a seed limit that is not
/// debited (the existing item might lack it, and would gain it), a retry-only debit, an
/// expression past [`MAX_EXPRESSION_BYTES`].
pub(super) fn debit_or_create_expression(
    key: &BucketKey,
    debits: &[Debit],
    mode: DebitMode,
    seed: &BucketItem,
) -> Option<(String, String, Expr)> {
    let DebitMode::Fast { .. } = mode else {
        return None;
    };
    let debited = |limit: &str| debits.iter().any(|d| *d.limit == *limit);
    if seed
        .limits
        .iter()
        .any(|(limit, _)| limit != WCU_LIMIT && !debited(limit))
    {
        return None;
    }
    // The debit's condition and its aliases (`#t{i}`, `#c{i}`, `:n{i}`, `:a{i}`, `#wt`,
    // `#wc`, `:wneg`, `:wpos`, `#ttl`); its `ADD` is rewritten as `SET`s below.
    let (_, debit_condition, mut e) = debit_expression(debits, mode, None);
    let mut set = String::with_capacity(1_024);
    for (i, d) in debits.iter().enumerate() {
        let st = seed.limits.get(&d.limit)?;
        let (tk, tc) = (format!("#t{i}"), format!("#c{i}"));
        let seed_tk = e.value(format!(":st{i}"), n(st.balance));
        let seed_tc = e.value(format!(":sc{i}"), n(st.taken));
        let _ = write!(
            set,
            "{tk} = if_not_exists({tk}, {seed_tk}) + :n{i}, \
             {tc} = if_not_exists({tc}, {seed_tc}) + :a{i}, "
        );
    }
    let wcu = seed.limits.get(WCU_LIMIT)?;
    // The token the expression takes comes back on the seed: a new item keeps its `wcu`.
    let seed_wt = e.value(":swt".into(), n(wcu.balance.saturating_add(MILLI)));
    let seed_wc = e.value(":swc".into(), n(wcu.taken.saturating_sub(MILLI)));
    let _ = write!(
        set,
        "#wt = if_not_exists(#wt, {seed_wt}) + :wneg, #wc = if_not_exists(#wc, {seed_wc}) + :wpos"
    );
    let mut k = 0;
    let mut keep = |e: &mut Expr, set: &mut String, name: String, v| {
        let alias = e.name(format!("#k{k}"), name);
        let value = e.value(format!(":k{k}"), v);
        let _ = write!(set, ", {alias} = if_not_exists({alias}, {value})");
        k += 1;
    };
    keep(&mut e, &mut set, "entity_id".into(), s(key.entity.clone()));
    keep(&mut e, &mut set, "resource".into(), s(key.resource.clone()));
    keep(&mut e, &mut set, "rf".into(), n(seed.refilled_at));
    keep(
        &mut e,
        &mut set,
        "shard_count".into(),
        n(i64::from(seed.shard_count)),
    );
    for (limit, st) in seed.limits.iter() {
        for (field, v) in [
            ("cp", st.capacity),
            ("ra", st.refill_amount),
            ("rp", st.refill_period_ms),
        ] {
            keep(&mut e, &mut set, attr(limit, field), n(v));
        }
    }
    let mut condition = debit_condition;
    if let Some(ttl) = seed.ttl {
        // An existing item without an expiry (a limit that never refills) must keep none:
        // only items that have one are debited here; the others go the plain way.
        let seed_ttl = e.value(":sttl".into(), n(ttl));
        let _ = write!(set, ", #ttl = if_not_exists(#ttl, {seed_ttl})");
        condition.push_str(" AND attribute_exists(#ttl)");
    }
    let update = format!("SET {set}");
    let condition = format!("attribute_not_exists(PK) OR ({condition})");
    (update.len() + condition.len() <= MAX_EXPRESSION_BYTES).then_some((update, condition, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{LimitParams, LimitState, Limits};

    const NOW_S: i64 = 1_800_000_000;
    const FAST: DebitMode = DebitMode::Fast {
        now_s: NOW_S,
        shard_count: 1,
    };

    fn seed(names: &[&str]) -> BucketItem {
        let mut limits = Limits::new();
        for name in names {
            limits.insert(
                *name,
                LimitState::new(LimitParams::new(10, 10, 60_000), 10_000, 0),
            );
        }
        limits.insert(
            WCU_LIMIT,
            LimitState::new(LimitParams::new(1_000, 1_000, 1_000), 1_000_000, 0),
        );
        BucketItem {
            refilled_at: NOW_S * 1_000,
            shard_count: 1,
            count_raised_at: 0,
            ttl: Some(NOW_S + 420),
            limits,
        }
    }

    fn debits(names: &[&str]) -> Vec<Debit> {
        names
            .iter()
            .map(|name| Debit {
                limit: (*name).into(),
                amount: 1_000,
                gated: true,
                params: Some(LimitParams::new(10, 10, 60_000)),
            })
            .collect()
    }

    fn key() -> BucketKey {
        BucketKey::new("tenant=acme", "api", 0)
    }

    #[test]
    fn a_missing_item_passes_the_condition_and_every_seed_attribute_is_kept_if_present() {
        let (update, condition, _) =
            debit_or_create_expression(&key(), &debits(&["rpm"]), FAST, &seed(&["rpm"])).unwrap();
        assert!(condition.starts_with("attribute_not_exists(PK) OR (attribute_exists(PK)"));
        // An item that exists must have an expiry for the seed's to be written.
        assert!(
            condition.ends_with(" AND attribute_exists(#ttl))"),
            "{condition}"
        );
        assert!(update.starts_with("SET #t0 = if_not_exists(#t0, :st0) + :n0"));
        // rf, shard count, entity and resource, and cp/ra/rp of both limits.
        assert_eq!(
            update.matches("= if_not_exists(#k").count(),
            4 + 2 * 3,
            "{update}"
        );
        assert!(update.contains("#ttl = if_not_exists(#ttl, :sttl)"));
    }

    #[test]
    fn one_expression_is_not_tried_where_it_could_change_an_existing_item() {
        // A seed limit the debit does not name: an existing item might lack it.
        let two = seed(&["rpm", "rph"]);
        assert!(debit_or_create_expression(&key(), &debits(&["rpm"]), FAST, &two).is_none());
        // The retry-only debit carries none of the fast path's conditions.
        let retry = DebitMode::RetryOnly;
        assert!(
            debit_or_create_expression(&key(), &debits(&["rpm"]), retry, &seed(&["rpm"])).is_none()
        );
        // Past the expression budget.
        let names: Vec<String> = (0..24).map(|i| format!("limit-number-{i:02}")).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        assert!(debit_or_create_expression(&key(), &debits(&names), FAST, &seed(&names)).is_none());
    }
}

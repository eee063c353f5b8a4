//! What a debit that carries a seed creates where its item is missing
//! ([`BucketStore::debit_or_create`](super::BucketStore::debit_or_create)): the fit of the
//! seed to the debit, for the stores that send the seed ahead (Redis's script, DynamoDB's
//! conditional update) and so must decide it before the call. Pure; the memory store,
//! which holds the item, checks it in place.

use super::{BucketItem, Debit, DebitMode, MILLI, MIN_BALANCE, WCU_LIMIT};

/// The least balance that covers `d` (`tk − amount ≥ floor`, as `tk ≥ floor + amount`).
pub(crate) fn debit_need(d: &Debit) -> i128 {
    let floor = if d.gated { 0 } else { i128::from(MIN_BALANCE) };
    floor + i128::from(d.amount)
}

/// The item a debit creates from `seed` where there is none: `seed` with `debits` applied
/// (no `wcu` token taken: a create takes none), when the debit's conditions under `mode`
/// hold on it — the very conditions a debit checks on a stored item (expiry,
/// shard count, a `wcu` token, each limit present with its parameters and covering its
/// amount), as Redis's `lua/debit.lua` and DynamoDB's debit condition check them. `None`:
/// they do not, and nothing is to be created. Checked where the seed is, so that a store
/// that sends the seed ahead (a script, a conditional update) only writes what it is
/// sent.
pub(crate) fn seed_after_debit(
    seed: &BucketItem,
    debits: &[Debit],
    mode: DebitMode,
) -> Option<BucketItem> {
    let fast = match mode {
        DebitMode::Fast { now_s, shard_count } => {
            let wcu = seed.limit(WCU_LIMIT).map_or(0, |w| w.balance);
            if seed.ttl.is_some_and(|t| t <= now_s)
                || seed.shard_count != shard_count
                || wcu < MILLI
            {
                return None;
            }
            true
        }
        DebitMode::RetryOnly => false,
    };
    let mut item = seed.clone();
    for d in debits {
        let st = item.limits.get_mut(&d.limit)?;
        let params_differ = d.params.is_some_and(|p| st.params() != p);
        if i128::from(st.balance) < debit_need(d) || (fast && params_differ) {
            return None;
        }
        st.balance -= d.amount;
        st.taken = st.taken.saturating_add(d.amount);
    }
    Some(item)
}

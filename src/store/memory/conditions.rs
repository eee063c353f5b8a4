//! The contract's conditions, evaluated on the compact form: whether a debit may be
//! applied to an item and how, and what a slow-path update makes of one. Pure: no lock,
//! no clock; `mod.rs` takes the partition's lock around them.

use super::slot::CompactItem;
use crate::store::{
    BucketItem, CountChange, Debit, DebitMode, LimitWrite, MILLI, MIN_BALANCE, WCU_LIMIT,
};

/// Whether `debits` may be applied to `slot` under the mode's conditions.
pub(super) fn debit_allowed(slot: &CompactItem, debits: &[Debit], mode: DebitMode) -> bool {
    let fast = match mode {
        DebitMode::Fast { now_s, shard_count } => {
            if slot.ttl <= now_s || u32::from(slot.shard_count) != shard_count {
                return false;
            }
            if slot
                .balance(WCU_LIMIT)
                .is_none_or(|(_, w)| w.balance < MILLI)
            {
                return false;
            }
            true
        }
        DebitMode::RetryOnly => false,
    };
    debits.iter().all(|d| match slot.balance(&d.limit) {
        None => false,
        Some((params, b)) => {
            let params_match = !fast || d.params.is_none_or(|p| *params == p);
            let floor = if d.gated { 0 } else { MIN_BALANCE };
            let covered = b
                .balance
                .checked_sub(d.amount)
                .is_some_and(|after| after >= floor);
            params_match && covered
        }
    })
}

/// Applies allowed `debits` in place (see [`debit_allowed`]).
pub(super) fn apply_debit(slot: &mut CompactItem, debits: &[Debit], mode: DebitMode) {
    for d in debits {
        if let Some(b) = slot.balance_mut(&d.limit) {
            b.balance -= d.amount;
            b.taken = b.taken.saturating_add(d.amount);
        }
    }
    if matches!(mode, DebitMode::Fast { .. }) {
        if let Some(w) = slot.balance_mut(WCU_LIMIT) {
            w.balance -= MILLI;
            w.taken += MILLI;
        }
    }
}

/// The update a slow-path commit makes to `cur`, or `None` when a condition fails.
pub(super) fn apply_update(
    cur: &BucketItem,
    expected_rf: i64,
    rf: i64,
    ttl: Option<i64>,
    shard_count: Option<CountChange>,
    limits: &[LimitWrite],
) -> Option<BucketItem> {
    if cur.refilled_at != expected_rf {
        return None;
    }
    // The stored expiry is never moved earlier (`None`: never expires, the latest).
    let earlier = match (cur.ttl, ttl) {
        (Some(stored), Some(written)) => written < stored,
        (None, Some(_)) => true,
        (_, None) => false,
    };
    if earlier {
        return None;
    }
    let mut next = cur.clone();
    next.refilled_at = rf;
    next.ttl = ttl;
    if let Some(change) = shard_count {
        if cur.shard_count != change.read {
            return None;
        }
        next.shard_count = change.new;
        next.count_raised_at = rf;
    }
    for lw in limits {
        match lw {
            LimitWrite::Add {
                limit,
                balance_delta: tk_delta,
                taken_delta: tc_delta,
                floor,
                cap,
                ..
            } => {
                let st = next.limits.get_mut(limit)?;
                if floor.is_some_and(|f| st.balance < f) || cap.is_some_and(|c| st.balance > c) {
                    return None;
                }
                st.balance = st.balance.checked_add(*tk_delta)?;
                st.taken = st.taken.saturating_add(*tc_delta);
            }
            LimitWrite::Set {
                limit,
                state,
                read_tc,
                ..
            } => {
                if next.limits.get(limit).map(|st| st.taken) != *read_tc {
                    return None;
                }
                next.limits.insert(limit, *state);
            }
        }
    }
    Some(next)
}

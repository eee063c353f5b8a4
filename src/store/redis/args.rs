//! The debit and credit scripts' arguments, as `lua/debit.lua`, `lua/debits.lua` and
//! `lua/credit.lua` read them, and what a debit creates or leaves, computed here rather
//! than read back. Pure: nothing here talks to Redis.
//!
//! Bounds the scripts check are computed here in `i128`, where no sum overflows, and sent
//! as decimal strings that the scripts compare exactly (Lua's numbers are doubles).

use super::codec::{seed_arg, DecodeError};
pub(super) use crate::store::seed::{debit_need as need, seed_after_debit as created};
use crate::store::{BucketItem, Credit, CreditGuard, Debit, DebitMode, MILLI, WCU_LIMIT};

/// The value past which adding `delta` leaves `i64` (upward for `delta ≥ 0`).
pub(super) fn turn(delta: i64) -> (i128, bool) {
    if delta >= 0 {
        (i128::from(i64::MAX) - i128::from(delta), true)
    } else {
        (i128::from(i64::MIN) - i128::from(delta), false)
    }
}

/// An integer as the scripts read it: canonical decimal text.
fn text(v: impl itoa::Integer) -> String {
    itoa::Buffer::new().format(v).to_owned()
}

/// The debit script's arguments (`lua/debit.lua`): the mode's, the item to create where
/// there is none (`created`: its fields as one string, [`seed_arg`], and its `ttl`, the
/// debit already applied), then eight per debit.
pub(super) fn debit_args(
    debits: &[Debit],
    mode: DebitMode,
    created: Option<&BucketItem>,
) -> Vec<String> {
    let mut args = Vec::with_capacity(4 + 8 * debits.len());
    match mode {
        DebitMode::Fast { now_s, shard_count } => {
            args.push(text(now_s));
            args.push(text(shard_count));
        }
        DebitMode::RetryOnly => {
            args.push(String::new());
            args.push(String::new());
        }
    }
    args.push(created.and_then(seed_arg).unwrap_or_default());
    args.push(created.and_then(|s| s.ttl).map_or_else(String::new, text));
    for d in debits {
        args.push(d.limit.to_string());
        args.push(text(need(d)));
        args.push(text(d.amount));
        args.push(text(-i128::from(d.amount)));
        args.push(text(turn(d.amount).0));
        match d.params {
            Some(p) => args.extend([
                text(p.capacity),
                text(p.refill_amount),
                text(p.refill_period_ms),
            ]),
            None => args.extend([String::new(), String::new(), String::new()]),
        }
    }
    args
}

/// The item a debit the script applied left: `before` (the image the script answered,
/// as it found it) with the script's own writes — each debit's amount off its balance
/// and onto its `tc` (saturating), and on the fast path one `wcu` token the same way.
/// Computed here rather than read back in the script, which costs Redis a second
/// `HGETALL`; the script checked every bound, so a limit missing or a balance leaving
/// `i64` means the image is not what the script saw.
pub(super) fn debited(
    before: BucketItem,
    debits: &[Debit],
    mode: DebitMode,
) -> Result<BucketItem, DecodeError> {
    let mut item = before;
    let wcu = matches!(mode, DebitMode::Fast { .. }).then(|| Debit {
        limit: WCU_LIMIT.into(),
        amount: MILLI,
        gated: true,
        params: None,
    });
    for d in debits.iter().chain(wcu.as_ref()) {
        let st = item
            .limits
            .get_mut(&d.limit)
            .ok_or_else(|| format!("the debited limit '{}' is missing", d.limit))?;
        st.balance = st
            .balance
            .checked_sub(d.amount)
            .ok_or_else(|| format!("limit '{}' balance leaves i64", d.limit))?;
        st.taken = st.taken.saturating_add(d.amount);
    }
    Ok(item)
}

/// The credit script's arguments (`lua/credit.lua`), `op` its operation id.
pub(super) fn credit_args(guard: CreditGuard, credits: &[Credit], op: &str) -> Vec<String> {
    let mut args = Vec::with_capacity(3 + 8 * credits.len());
    match guard {
        CreditGuard::Unrefilled(stamp) => {
            args.push(stamp.refilled_at.to_string());
            args.push(stamp.shard_count.to_string());
        }
        CreditGuard::SameCount(count) => {
            args.push(String::new());
            args.push(count.to_string());
        }
    }
    args.push(op.to_string());
    for c in credits {
        args.push(c.limit.to_string());
        // tk + amount ≤ ceiling.
        args.push((i128::from(c.ceiling) - i128::from(c.amount)).to_string());
        args.push(c.amount.to_string());
        args.push((-i128::from(c.amount)).to_string());
        args.push(turn(c.amount.saturating_neg()).0.to_string());
        args.extend([
            c.params.capacity.to_string(),
            c.params.refill_amount.to_string(),
            c.params.refill_period_ms.to_string(),
        ]);
    }
    args
}

#[cfg(test)]
mod tests {
    use super::super::codec::fields_of;
    use super::*;
    use crate::store::{LimitParams, LimitState, Limits, MIN_BALANCE};

    #[test]
    fn the_scripts_name_the_reserved_limit_and_its_unit_as_the_contract_does() {
        // lua/lib.lua's `debit` spells both out.
        assert_eq!(WCU_LIMIT, "wcu");
        assert_eq!(MILLI, 1_000);
        let lib = include_str!("lua/lib.lua");
        let debit = &lib[lib.find("local function debit(").unwrap()..];
        assert!(debit.contains("'b:wcu:tk'") && debit.contains("'1000'"));
    }

    #[test]
    fn a_created_item_is_the_seed_debited_when_the_debit_fits_it() {
        let params = crate::store::LimitParams::new(10, 10, 60_000);
        let wcu = crate::store::LimitParams::new(1_000, 1_000, 1_000);
        let mut limits = Limits::new();
        limits.insert("rpm", LimitState::new(params, 10_000, 0));
        limits.insert(WCU_LIMIT, LimitState::new(wcu, 1_000_000, 0));
        let seed = BucketItem {
            refilled_at: 5_000,
            shard_count: 1,
            count_raised_at: 0,
            ttl: Some(100),
            limits,
        };
        let debit = |amount| Debit {
            limit: "rpm".into(),
            amount,
            gated: true,
            params: Some(params),
        };
        let fast = |now_s, shard_count| DebitMode::Fast { now_s, shard_count };
        let made = created(&seed, &[debit(3_000)], fast(5, 1)).unwrap();
        assert_eq!(made.limits["rpm"], LimitState::new(params, 7_000, 3_000));
        assert_eq!(
            made.limits[WCU_LIMIT], seed.limits[WCU_LIMIT],
            "no wcu token"
        );
        assert_eq!(created(&seed, &[debit(11_000)], fast(5, 1)), None, "short");
        assert_eq!(
            created(&seed, &[debit(1_000)], fast(100, 1)),
            None,
            "expired"
        );
        assert_eq!(
            created(&seed, &[debit(1_000)], fast(5, 2)),
            None,
            "another count"
        );
    }

    #[test]
    fn an_applied_debit_is_the_image_found_with_the_scripts_writes() {
        let params = LimitParams::new(10, 10, 60_000);
        let mut limits = Limits::new();
        limits.insert("rpm", LimitState::new(params, 10_000, i64::MAX - 500));
        limits.insert(
            WCU_LIMIT,
            LimitState::new(LimitParams::new(5, 5, 1_000), 5_000, 0),
        );
        let before = BucketItem {
            refilled_at: 5_000,
            shard_count: 1,
            count_raised_at: 0,
            ttl: Some(100),
            limits,
        };
        let debit = |limit: &str, amount| Debit {
            limit: limit.into(),
            amount,
            gated: true,
            params: None,
        };
        let fast = DebitMode::Fast {
            now_s: 5,
            shard_count: 1,
        };
        // Twice the same limit adds up, as the script's writes do; `tc` saturates.
        let after = debited(
            before.clone(),
            &[debit("rpm", 3_000), debit("rpm", 1_000)],
            fast,
        )
        .unwrap();
        assert_eq!(after.limits["rpm"].balance, 6_000);
        assert_eq!(after.limits["rpm"].taken, i64::MAX);
        assert_eq!(after.limits[WCU_LIMIT].balance, 4_000, "one wcu token");
        assert_eq!(after.limits[WCU_LIMIT].taken, MILLI);
        let retry = debited(before.clone(), &[debit("rpm", 1)], DebitMode::RetryOnly).unwrap();
        assert_eq!(
            retry.limits[WCU_LIMIT], before.limits[WCU_LIMIT],
            "no token"
        );
        assert!(debited(before.clone(), &[debit("other", 1)], fast)
            .unwrap_err()
            .contains("'other'"));
        assert!(debited(before, &[debit("rpm", i64::MIN)], fast)
            .unwrap_err()
            .contains("leaves i64"));
    }

    #[test]
    fn a_seed_travels_as_one_string_unless_a_name_holds_a_space() {
        let params = LimitParams::new(1, 1, 1);
        let item = |name: &str| {
            let mut limits = Limits::new();
            limits.insert(name, LimitState::new(params, 1_000, 0));
            BucketItem {
                refilled_at: 7,
                shard_count: 2,
                count_raised_at: 0,
                ttl: None,
                limits,
            }
        };
        assert_eq!(
            seed_arg(&item("rpm")).unwrap(),
            "rf 7 sc 2 b:rpm:tk 1000 b:rpm:cp 1000 b:rpm:ra 1000 b:rpm:rp 1 b:rpm:tc 0"
        );
        assert_eq!(seed_arg(&item("a b")), None);
        let mut wide = item("rpm");
        wide.limits
            .insert("x.y-z", LimitState::new(params, i64::MIN, i64::MAX));
        assert_eq!(seed_arg(&wide), Some(fields_of(&wide).join(" ")));
        let created = item("a b");
        let args = debit_args(&[], DebitMode::RetryOnly, Some(&created));
        assert_eq!(
            args[2], "",
            "not sent: a missing item is refused as missing"
        );
    }

    #[test]
    fn bounds_are_exact_past_i64() {
        let d = Debit {
            limit: "l".into(),
            amount: i64::MAX,
            gated: false,
            params: None,
        };
        let args = debit_args(&[d], DebitMode::RetryOnly, None);
        assert_eq!(
            args[5],
            (i128::from(MIN_BALANCE) + i128::from(i64::MAX)).to_string()
        );
        assert_eq!(args[8], "0", "adding i64::MAX saturates past tc = 0");
    }
}

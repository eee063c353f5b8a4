//! Token-bucket arithmetic: integer millitokens, lazy refill, clamping, retry-after.
//!
//! Pure functions only: no clock, no store, no allocation. Every product that can exceed
//! `i64` (elapsed × rate, deficit × period) is computed in `i128`. Balances may be negative
//! (debt); division of a possibly negative balance floors (`div_euclid`).

pub use crate::store::{LimitParams, ShardShare, MILLI};

impl LimitParams {
    /// A limit of `capacity` tokens refilled by `refill` tokens every `period_ms`.
    pub fn new(capacity: u64, refill: u64, period_ms: u64) -> LimitParams {
        LimitParams {
            capacity: to_milli(capacity),
            refill_amount: to_milli(refill),
            refill_period_ms: period_ms.max(1).min(i64::MAX as u64) as i64,
        }
    }

    /// Milliseconds until a shard holding `balance` (refilled to now; negative in debt)
    /// is surely full again, whatever shard count the bucket grows to: `None` if it never
    /// will (no refill, and something to refill). Debt repays at the shard's share of the
    /// rate, which a later doubling divides again, so the debt term assumes the most
    /// shards; the full-from-empty term does not depend on the count. The basis of the
    /// item TTL: an item expired after this long would be re-created exactly as it is.
    pub fn full_again_ms(&self, balance: i64) -> Option<i64> {
        let balance = balance.min(0);
        if self.refill_amount <= 0 {
            return (self.capacity <= 0 && balance == 0).then_some(0);
        }
        // Shares floor their ceiling and rate, so each count is measured as it divides.
        let mut longest = 0i128;
        let mut count = 1;
        while count <= crate::store::MAX_SHARD_COUNT {
            let share = self.share(count);
            if share.refill_amount <= 0 {
                return None;
            }
            let missing = i128::from(share.ceiling) - i128::from(balance);
            let ms = div_ceil_i128(
                missing * i128::from(share.refill_period_ms),
                i128::from(share.refill_amount),
            );
            longest = longest.max(ms);
            count *= 2;
        }
        Some(saturate(longest))
    }

    /// Seconds until an empty bucket is full again (the basis of the item TTL); `None`
    /// for a limit that never refills.
    pub fn seconds_to_full(&self) -> Option<i64> {
        if self.refill_amount <= 0 {
            return None;
        }
        let ms = div_ceil_i128(
            i128::from(self.capacity) * i128::from(self.refill_period_ms),
            i128::from(self.refill_amount),
        );
        Some(saturate(div_ceil_i128(ms, 1000)))
    }
}

/// Epoch seconds of a time in epoch milliseconds (floored, also before 1970), as item
/// expiry (`ttl`) is kept.
pub fn now_s(now_ms: i64) -> i64 {
    now_ms.div_euclid(1_000)
}

fn to_milli(tokens: u64) -> i64 {
    (i128::from(tokens) * i128::from(MILLI)).min(i128::from(i64::MAX)) as i64
}

fn saturate(v: i128) -> i64 {
    v.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
}

fn div_ceil_i128(a: i128, b: i128) -> i128 {
    // Both operands are non-negative wherever this is used.
    (a + b - 1) / b
}

/// Lazy refill of a balance `tk` last materialised at `rf` (epoch ms), up to `now`.
///
/// Returns the refilled balance, clamped to the share's ceiling (the clamp applies even
/// with no elapsed time, and never raises debt), and the refill baseline advanced by the
/// time that produced the added tokens (drift compensation: the fraction is kept, and the
/// same interval is never counted twice).
pub fn refill(balance: i64, refilled_at: i64, now: i64, share: ShardShare) -> (i64, i64) {
    let elapsed = now.saturating_sub(refilled_at);
    if elapsed <= 0 || share.refill_amount <= 0 || share.refill_period_ms <= 0 {
        return (balance.min(share.ceiling), refilled_at);
    }
    let amount = i128::from(share.refill_amount);
    let period = i128::from(share.refill_period_ms);
    let add = i128::from(elapsed) * amount / period;
    if add == 0 {
        return (balance.min(share.ceiling), refilled_at);
    }
    // Rounded up: when the rate exceeds one millitoken per ms, flooring could report
    // zero time used and let the same interval be counted twice.
    let used = (add * period + amount - 1) / amount;
    let refilled = (i128::from(balance) + add).min(i128::from(share.ceiling));
    (saturate(refilled), saturate(i128::from(refilled_at) + used))
}

/// How long after a shard's last refill (`rf`) a refused request may not count the
/// refill accrued since, when deciding whether the store could admit it (see
/// [`held_refill`]).
pub const REFILL_HOLD_MS: i64 = 5;

/// The balance a refused request may count on at `now` without a store write: `tk`
/// refilled to `now`, except within [`REFILL_HOLD_MS`] of `rf` (the shard's last refill),
/// when the refill since is held back and `None` says until when (`rf + hold`).
///
/// Why: a hot key at its limit refills a token every fraction of a millisecond. Counting
/// that refill sends nearly every refused request to the store's slow path (a refused
/// debit, a read, a commit lost to the next request), so each refusal costs more store
/// calls than an admission. Held back a few milliseconds, the refill stays in the store
/// for the first request after the hold: refusals come at most that much early and no
/// token is lost — the hold never applies when the share would reach its ceiling within
/// it (a small bucket with a fast rate refills every millisecond, as before).
pub fn held_refill(
    balance: i64,
    refilled_at: i64,
    now: i64,
    share: ShardShare,
) -> (i64, Option<i64>) {
    let refilled = refill(balance, refilled_at, now, share).0;
    let since = now.saturating_sub(refilled_at);
    if !(0..REFILL_HOLD_MS).contains(&since) || refilled <= balance {
        return (refilled, None);
    }
    let (at_hold_end, _) = refill(
        balance,
        refilled_at,
        refilled_at.saturating_add(REFILL_HOLD_MS),
        share,
    );
    if at_hold_end >= share.ceiling {
        return (refilled, None);
    }
    (
        balance.min(share.ceiling),
        Some(refilled_at + REFILL_HOLD_MS),
    )
}

/// Whole tokens in a balance, floored (a debt of 1.5 tokens is -2).
pub fn whole_tokens(balance: i64) -> i64 {
    balance.div_euclid(MILLI)
}

/// Milliseconds until a balance `tk` (already refilled to now) covers `amount`
/// millitokens at the share's rate, plus one millisecond of rounding guard; `Some(0)` if
/// it already does, `None` if it never will (no refill, or above the ceiling).
pub fn wait_for(balance: i64, amount: i64, share: ShardShare, undivided_ra: i64) -> Option<i64> {
    if balance >= amount {
        return Some(0);
    }
    if amount > share.ceiling {
        return None;
    }
    // A share whose rate floors to zero refills at the undivided rate (as the reference).
    let rate = if share.refill_amount > 0 {
        share.refill_amount
    } else {
        undivided_ra
    };
    if rate <= 0 {
        return None;
    }
    let deficit = i128::from(amount) - i128::from(balance);
    Some(saturate(
        deficit * i128::from(share.refill_period_ms) / i128::from(rate) + 1,
    ))
}

/// Milliseconds until a balance `tk` is back at the ceiling (0 if it is already there).
pub fn time_to_full(balance: i64, share: ShardShare) -> i64 {
    if balance >= share.ceiling || share.refill_amount <= 0 || share.refill_period_ms <= 0 {
        return 0;
    }
    let missing = i128::from(share.ceiling) - i128::from(balance);
    saturate(div_ceil_i128(
        missing * i128::from(share.refill_period_ms),
        i128::from(share.refill_amount),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn share(ceiling: i64, amount: i64, period: i64) -> ShardShare {
        ShardShare {
            ceiling,
            refill_amount: amount,
            refill_period_ms: period,
        }
    }

    #[test]
    fn refill_is_held_for_a_few_ms_after_the_last_one_unless_the_share_would_fill() {
        // 2000 tokens/s, burst 2000: 2 tokens a millisecond.
        let s = share(2_000_000, 2_000_000, 1_000);
        assert_eq!(held_refill(0, 100, 103, s), (0, Some(105)), "held");
        assert_eq!(
            held_refill(0, 100, 105, s),
            (10_000, None),
            "the hold is over"
        );
        assert_eq!(held_refill(0, 100, 99, s), (0, None), "no time, no refill");
        // A bucket of one token refilled every millisecond: held, it would cap and lose.
        let small = share(1_000, 1_000, 1);
        assert_eq!(held_refill(0, 100, 101, small), (1_000, None));
    }

    // S01
    #[test]
    fn partial_refill() {
        let s = share(100_000_000, 100_000_000, 60_000);
        assert_eq!(refill(0, 0, 30_000, s).0, 50_000_000);
    }

    // S02
    #[test]
    fn drift_compensation_keeps_the_fraction() {
        let s = share(10_000, 1_000, 60_000);
        assert_eq!(refill(0, 0, 59, s), (0, 0));
        assert_eq!(refill(0, 0, 61, s), (1, 60));
    }

    // S03
    #[test]
    fn clamp_without_elapsed_time_and_debt_untouched() {
        let s = share(100_000, 100_000, 60_000);
        assert_eq!(refill(150_000, 1_000, 1_000, s), (100_000, 1_000));
        assert_eq!(refill(150_000, 1_000, 900, s), (100_000, 1_000));
        assert_eq!(refill(-5_000, 1_000, 1_000, s), (-5_000, 1_000));
    }

    // S04
    #[test]
    fn debt_repays_at_the_refill_rate() {
        let s = share(100_000_000, 100_000_000, 60_000);
        assert_eq!(refill(-50_000_000, 0, 30_000, s).0, 0);
    }

    // S05
    #[test]
    fn retry_after_formula() {
        let p = LimitParams {
            capacity: 10_000,
            refill_amount: 10_000,
            refill_period_ms: 60_000,
        };
        assert_eq!(wait_for(0, 1_000, p.share(1), p.refill_amount), Some(6_001));
    }

    #[test]
    fn floored_tokens_for_debt() {
        assert_eq!(whole_tokens(-1_500_500), -1_501);
        assert_eq!(whole_tokens(1_999), 1);
    }

    #[test]
    fn per_shard_ceiling_never_fits() {
        let p = LimitParams {
            capacity: 10_000,
            refill_amount: 10_000,
            refill_period_ms: 60_000,
        };
        assert_eq!(wait_for(2_500, 3_000, p.share(4), p.refill_amount), None);
    }

    #[test]
    fn huge_elapsed_does_not_overflow() {
        let s = share(i64::MAX / 2, i64::MAX / 4, 1);
        let (balance, _) = refill(0, 0, i64::MAX / 2, s);
        assert_eq!(balance, i64::MAX / 2);
    }

    #[test]
    fn seconds_to_full_matches_reference_ttl_basis() {
        // rpm 10/min: 60 s; tpm 10000/min burst 15000: 90 s.
        assert_eq!(LimitParams::new(10, 10, 60_000).seconds_to_full(), Some(60));
        assert_eq!(
            LimitParams::new(15_000, 10_000, 60_000).seconds_to_full(),
            Some(90)
        );
        assert_eq!(LimitParams::new(5, 0, 60_000).seconds_to_full(), None);
    }

    #[test]
    fn full_again_counts_debt_at_the_slowest_share_and_never_for_no_refill() {
        let p = LimitParams::new(10, 10, 1_000); // 10/s, burst 10
        assert_eq!(
            p.full_again_ms(10_000),
            Some(1_000),
            "full: the from-empty time"
        );
        assert_eq!(
            p.full_again_ms(3_000),
            Some(1_000),
            "never less than from empty"
        );
        // 5,000 tokens of debt at 10/s take 500 s on one shard; at 32 shards a shard's
        // share (312 millitokens per second, the ceiling as much) takes 32 times longer.
        let at_32 = ((312 + 5_000_000_i64) * 1_000 + 311) / 312;
        assert_eq!(p.full_again_ms(-5_000_000), Some(at_32));
        assert!(at_32 > 500_000 * 32);
        let never = LimitParams::new(3, 0, 1_000);
        assert_eq!(never.full_again_ms(3_000), None);
        assert_eq!(never.full_again_ms(0), None);
        let empty = LimitParams::new(0, 0, 1_000);
        assert_eq!(
            empty.full_again_ms(0),
            Some(0),
            "nothing to refill: always full"
        );
        assert_eq!(empty.full_again_ms(-1), None, "its debt never repays");
    }

    proptest! {
        #[test]
        fn a_held_refill_is_never_more_than_the_refill_nor_loses_to_the_ceiling(
            balance in -1_000_000i64..2_000_000,
            refilled_at in 0i64..1_000,
            dt in 0i64..20,
            ceiling in 1i64..2_000_000,
            amount in 1i64..10_000_000,
            period in 1i64..100_000,
        ) {
            let s = share(ceiling, amount, period);
            let (full, _) = refill(balance, refilled_at, refilled_at + dt, s);
            let (held, until) = held_refill(balance, refilled_at, refilled_at + dt, s);
            prop_assert!(held <= full);
            match until {
                None => prop_assert_eq!(held, full),
                Some(t) => {
                    prop_assert_eq!(t, refilled_at + REFILL_HOLD_MS);
                    prop_assert!(dt < REFILL_HOLD_MS);
                    // Nothing refilled by the hold's end would have been capped away.
                    prop_assert!(refill(balance, refilled_at, t, s).0 < ceiling);
                }
            }
        }

        /// A shard of any count, refilled from `balance` at its share's rate, is full by
        /// `full_again_ms` (refill is lazy and exact, so one step suffices).
        #[test]
        fn full_again_is_enough_at_every_shard_count(
            cap in 1u64..1_000_000,
            rate in 1u64..1_000_000,
            period in 1u64..100_000,
            balance in -1_000_000_000i64..1_000_000_000,
            shards in 0u32..6,
        ) {
            let p = LimitParams::new(cap, rate, period);
            let share = p.share(1 << shards);
            let start = balance.min(share.ceiling);
            let ms = p.full_again_ms(start).expect("refills");
            let (balance, _) = refill(start, 0, ms, share);
            prop_assert_eq!(balance, share.ceiling);
        }

        /// The store's own statement of "full again" (`LimitParams::refilled_full`, which
        /// the memory store's bound evicts by) is exactly what this refill computes: an
        /// item it calls full is one a slow pass would find at its ceiling.
        #[test]
        fn the_stores_full_again_is_the_refills(
            cp in 0i64..1_000_000_000,
            amount in -1i64..1_000_000_000,
            period in 1i64..100_000_000,
            balance in -1_000_000_000i64..1_100_000_000,
            refilled_at in 0i64..1_000_000,
            dt in -1_000i64..10_000_000_000,
            shards in 0u32..6,
        ) {
            let p = LimitParams { capacity: cp, refill_amount: amount, refill_period_ms: period };
            let count = 1 << shards;
            let share = p.share(count);
            let (refilled, _) = refill(balance, refilled_at, refilled_at + dt, share);
            prop_assert_eq!(
                p.refilled_full(balance, refilled_at, refilled_at + dt, count),
                refilled >= share.ceiling
            );
        }

        #[test]
        fn refill_never_exceeds_the_ceiling(
            balance in -1_000_000_000i64..1_000_000_000,
            refilled_at in 0i64..1_000_000,
            dt in 0i64..10_000_000_000,
            ceiling in 0i64..1_000_000_000,
            amount in 0i64..1_000_000_000,
            period in 1i64..100_000_000,
        ) {
            let (out, _) = refill(balance, refilled_at, refilled_at + dt, share(ceiling, amount, period));
            prop_assert!(out <= ceiling.max(balance.min(ceiling)));
            prop_assert!(out <= ceiling);
        }

        #[test]
        fn refill_is_never_faster_than_the_rate(
            balance in -1_000_000_000i64..0,
            dt in 0i64..10_000_000,
            amount in 1i64..1_000_000,
            period in 1i64..100_000,
        ) {
            // Debt repays at exactly the refill rate, never faster.
            let (out, rf2) = refill(balance, 0, dt, share(i64::MAX / 4, amount, period));
            let added = i128::from(out) - i128::from(balance);
            prop_assert!(added * i128::from(period) <= i128::from(dt) * i128::from(amount));
            prop_assert!(rf2 <= dt && rf2 >= 0);
        }

        #[test]
        fn splitting_time_never_adds_tokens(
            dt1 in 0i64..1_000_000,
            dt2 in 0i64..1_000_000,
            amount in 1i64..1_000_000,
            period in 1i64..100_000,
        ) {
            let s = share(i64::MAX / 4, amount, period);
            let (a, rf_a) = refill(0, 0, dt1, s);
            let (b, _) = refill(a, rf_a, dt1 + dt2, s);
            let (c, _) = refill(0, 0, dt1 + dt2, s);
            prop_assert!(b <= c, "refilling in two steps gave {} > {} in one", b, c);
        }

        /// Admitted tokens over any interval <= capacity + rate x interval, for an
        /// arbitrary sequence of requests against one bucket.
        #[test]
        fn admitted_never_exceeds_capacity_plus_rate(
            cap in 1u64..1_000,
            rate in 1u64..1_000,
            period in 1u64..100_000,
            steps in proptest::collection::vec((0i64..5_000, 0u64..50), 1..200),
        ) {
            let p = LimitParams::new(cap, rate, period);
            let s = p.share(1);
            let (mut balance, mut refilled_at, mut now) = (p.capacity, 0i64, 0i64);
            let mut admitted: i128 = 0;
            for (dt, want) in steps {
                now += dt;
                let (t, r) = refill(balance, refilled_at, now, s);
                balance = t;
                refilled_at = r;
                let amount = (want as i64) * MILLI;
                if balance >= amount {
                    balance -= amount;
                    admitted += i128::from(amount);
                }
            }
            let bound = i128::from(p.capacity) + i128::from(now) * i128::from(p.refill_amount) / i128::from(p.refill_period_ms);
            prop_assert!(admitted <= bound, "admitted {} > bound {}", admitted, bound);
        }
    }
}

//! The share math of the Rate Limit Quota Service: what fraction of a rule's limit one
//! Envoy's stream is assigned from the demand every stream reports for the bucket, and
//! that fraction as the token bucket Envoy enforces. Pure functions of numbers: no clock,
//! no config, no state, so every property is a unit or property test.
//!
//! Must not overcommit: the fractions of all streams of a bucket sum to at most 1 when
//! each is computed from the same totals, and the token bucket derived from a fraction
//! never refills faster than that fraction of the limit.

use std::time::Duration;

/// The part of a limit every stream holding the bucket gets whatever its demand, split
/// evenly among them: an Envoy that has just subscribed (its first report says little
/// about its load) or whose load is small is never starved by a busy one. The rest,
/// 1 − `FLOOR_FRACTION`, is split in proportion to the reported demand.
pub const FLOOR_FRACTION: f64 = 0.1;

/// How much larger a new fraction must be than the one a stream holds before it is sent:
/// below it the stream keeps the smaller one it holds. A fraction that moves with noise in
/// the reports would otherwise give Envoy a different token bucket at every report, and a
/// new bucket starts full. Decreases are sent at once (they never overcommit).
pub const RAISE_HYSTERESIS: f64 = 0.05;

/// The fraction of a bucket's limit a stream is assigned: `own` demand (requests per
/// second it allowed and denied) among `total` reported by the `streams` streams that
/// hold the bucket on this server (`own` included). With no demand at all, an even split.
pub fn fraction(own: f64, total: f64, streams: usize) -> f64 {
    let n = streams.max(1) as f64;
    if !(total.is_finite() && total > 0.0) {
        return 1.0 / n;
    }
    let own = if own.is_finite() {
        own.clamp(0.0, total)
    } else {
        0.0
    };
    FLOOR_FRACTION / n + (1.0 - FLOOR_FRACTION) * own / total
}

/// The fraction a stream that holds `held` is sent when its demand gives `computed`: the
/// held one when the computed one is larger by less than [`RAISE_HYSTERESIS`] (never more
/// than computed, so never an overcommit), the computed one otherwise.
pub fn settled(held: Option<f64>, computed: f64) -> f64 {
    match held {
        Some(h) if h <= computed && computed <= h * (1.0 + RAISE_HYSTERESIS) => h,
        _ => computed,
    }
}

/// `share` cut to what the other streams of the bucket leave (1 − `others_held`), but
/// never below the floor: a stream that joins a bucket, or whose demand grew, waits for
/// the others to give up their part at their next report rather than overcommit the
/// limit. The fractions held then sum to at most 1 plus one floor (the newest stream's).
pub fn capped(share: f64, others_held: f64, streams: usize) -> f64 {
    let floor = FLOOR_FRACTION / streams.max(1) as f64;
    share.min((1.0 - others_held).max(floor))
}

/// A token bucket as Envoy's `envoy.type.v3.TokenBucket` says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    pub max_tokens: u32,
    pub tokens_per_fill: u32,
    pub fill_interval: Duration,
}

/// Longest fill interval searched for the closest rate in whole seconds; a share slower
/// than a token in it is one token per as many seconds as it takes.
const MAX_FILL_SECONDS: u64 = 60;

/// The token bucket for `fraction` of a limit of `tokens` per `period` with `burst`
/// tokens. Its refill rate is at most the fraction of the limit: a whole number of tokens
/// per a whole number of seconds, the closest below the share within a minute's interval,
/// because Envoy 1.40 reads the interval in whole seconds (a 990 ms interval is 0 s to it,
/// a rate without bound). The interval carries as many nanoseconds as it has seconds:
/// Envoy tells a new bucket from the one it holds by `max_tokens`, `tokens_per_fill` and
/// the interval's nanoseconds only, so two buckets that differ in whole seconds alone
/// would otherwise leave it on the old one. Its size is the fraction of the burst, at most
/// one fill and at least one token: a new bucket starts full, a larger one would be a
/// burst at every new assignment.
pub fn bucket(fraction: f64, tokens: u64, period: Duration, burst: u64) -> Option<Bucket> {
    let fraction = if fraction.is_finite() {
        fraction.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let per_second = fraction * tokens as f64 / period.as_secs_f64();
    bucket_at(per_second, fraction * burst as f64)
}

/// The token bucket of `per_second` tokens with a burst of `burst` (at most one fill, at
/// least one token), as [`bucket`] makes it; `None` for no rate at all.
pub fn bucket_at(per_second: f64, burst: f64) -> Option<Bucket> {
    if !(per_second.is_finite() && per_second > 0.0) {
        return None;
    }
    let (tokens_per_fill, seconds) = whole_rate(per_second);
    let burst = if burst.is_finite() {
        burst.floor()
    } else {
        1.0
    };
    let max_tokens = burst.clamp(1.0, f64::from(tokens_per_fill)) as u32;
    Some(Bucket {
        max_tokens,
        tokens_per_fill,
        fill_interval: Duration::new(seconds, seconds.min(999_999_999) as u32),
    })
}

/// The largest rate of `n` tokens per `s` whole seconds at most `per_second` (the
/// shortest interval among equals), `s` within [`MAX_FILL_SECONDS`]; below a token in
/// that, one token per the seconds a token takes.
fn whole_rate(per_second: f64) -> (u32, u64) {
    if per_second * (MAX_FILL_SECONDS as f64) < 1.0 {
        return (1, (1.0 / per_second).ceil().min(u64::MAX as f64) as u64);
    }
    let mut best = (0u32, 1u64);
    for s in 1..=MAX_FILL_SECONDS {
        // A hair over, so that a rate a float's rounding puts just under a whole number
        // of tokens (a third of 100 a minute, times 9 s) still makes it.
        let n = (per_second * s as f64 * (1.0 + 1e-12)).floor();
        let n = n.min(f64::from(u32::MAX)) as u32;
        if u64::from(n) * best.1 > u64::from(best.0) * s {
            best = (n, s);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn equal_demand_splits_evenly_and_alone_takes_all() {
        assert!((fraction(100.0, 200.0, 2) - 0.5).abs() < 1e-9);
        assert!((fraction(5.0, 5.0, 1) - 1.0).abs() < 1e-9);
        assert!((fraction(0.0, 0.0, 4) - 0.25).abs() < 1e-9);
    }

    #[test]
    fn a_new_stream_gets_its_floor() {
        let f = fraction(0.0, 1000.0, 2);
        assert!((f - FLOOR_FRACTION / 2.0).abs() < 1e-9);
    }

    #[test]
    fn half_of_fifty_per_second_is_twenty_five_a_second() {
        let b = bucket(0.5, 50, Duration::from_secs(1), 50).unwrap();
        assert_eq!(b.tokens_per_fill, 25);
        assert_eq!(b.fill_interval.as_secs(), 1);
        assert_eq!(b.max_tokens, 25);
    }

    #[test]
    fn a_slow_share_is_one_token_per_longer_interval() {
        // 100 per minute, a third: 33.3 a minute, 5 tokens every 9 s (33.3 a minute).
        let b = bucket(1.0 / 3.0, 100, Duration::from_secs(60), 100).unwrap();
        assert_eq!((b.tokens_per_fill, b.fill_interval.as_secs()), (5, 9));
        assert_eq!(b.max_tokens, 5);
        // A few a day: one token per the whole seconds it takes.
        let b = bucket(0.5, 10, Duration::from_secs(86_400), 10).unwrap();
        assert_eq!((b.tokens_per_fill, b.fill_interval.as_secs()), (1, 17_280));
    }

    #[test]
    fn nothing_to_share_is_no_bucket() {
        assert_eq!(bucket(0.0, 50, Duration::from_secs(1), 50), None);
        assert_eq!(bucket(0.5, 0, Duration::from_secs(1), 0), None);
    }

    #[test]
    fn a_small_raise_keeps_the_held_fraction_a_cut_does_not() {
        assert_eq!(settled(Some(0.5), 0.51), 0.5);
        assert_eq!(settled(Some(0.5), 0.6), 0.6);
        assert_eq!(settled(Some(0.5), 0.49), 0.49);
        assert_eq!(settled(None, 0.3), 0.3);
    }

    #[test]
    fn a_newcomer_waits_for_the_holders_to_give_way() {
        // One stream holds the whole limit; a second one with equal demand joins.
        let joined = capped(fraction(10.0, 20.0, 2), 1.0, 2);
        assert!((joined - FLOOR_FRACTION / 2.0).abs() < 1e-12);
        // The holder's next report brings it down to half; the newcomer's then takes half.
        let holder = capped(fraction(10.0, 20.0, 2), joined, 2);
        assert!((holder - 0.5).abs() < 1e-12);
        assert!((capped(fraction(10.0, 20.0, 2), holder, 2) - 0.5).abs() < 1e-12);
    }

    proptest! {
        #[test]
        fn shares_sum_to_the_limit_and_keep_their_floor(
            demands in proptest::collection::vec(0.0f64..1e6, 1..40)
        ) {
            let total: f64 = demands.iter().sum();
            let n = demands.len();
            let sum: f64 = demands.iter().map(|d| fraction(*d, total, n)).sum();
            prop_assert!(sum <= 1.0 + 1e-9, "sum {sum}");
            prop_assert!(sum >= 1.0 - 1e-9, "sum {sum}");
            for d in &demands {
                prop_assert!(fraction(*d, total, n) >= FLOOR_FRACTION / n as f64 - 1e-12);
            }
        }

        #[test]
        fn a_bucket_never_refills_faster_than_its_share(
            fraction in 0.0001f64..=1.0,
            tokens in 1u64..1_000_000,
            period_s in prop::sample::select(vec![1u64, 60, 3600, 86_400]),
            burst_extra in 0u64..1000,
        ) {
            let period = Duration::from_secs(period_s);
            let share_per_s = fraction * tokens as f64 / period_s as f64;
            if let Some(b) = bucket(fraction, tokens, period, tokens + burst_extra) {
                let rate = f64::from(b.tokens_per_fill) / b.fill_interval.as_secs() as f64;
                prop_assert!(rate <= share_per_s * (1.0 + 1e-9), "rate {rate} share {share_per_s}");
                prop_assert!(b.max_tokens >= 1 && b.max_tokens <= b.tokens_per_fill);
                // Whole seconds to Envoy, the seconds again in the nanoseconds.
                prop_assert!(b.fill_interval.as_secs() >= 1);
                let nanos = b.fill_interval.as_secs().min(999_999_999) as u32;
                prop_assert_eq!(b.fill_interval.subsec_nanos(), nanos);
            }
        }
    }
}

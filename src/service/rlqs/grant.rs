//! A server's grant of one RLQS bucket when several servers share its limit through the
//! store (`fleet.rs`): the tokens this server has drawn from the shared bucket and not
//! yet promised (its bank), and the rate it promises its Envoys in total.
//!
//! Pure arithmetic on numbers: no clock, no store. Its promise: after every draw the rate
//! promised is covered by the bank for [`SAFE_S`] — past the next draw even when that draw
//! is late — so the Envoys of all servers together admit no more than the servers drew,
//! and the shared bucket bounds what they drew. Every token the promise may spend (the
//! rate for the time that passed, a new Envoy bucket's first
//! `max_tokens`) leaves the bank when it may be spent, whether Envoy spent it or not; what
//! goes beyond the bank between two draws (new buckets, lateness) is a debt the next draws
//! repay before the rate may rise, or the rate is cut.

/// The time between two draws of a bucket (seconds; each draw jittered by up to
/// [`JITTER`] of it, so that servers that started together drift apart and take turns at
/// a contended bucket).
pub const TICK_S: f64 = 0.5;

/// The jitter of a tick, as a fraction of [`TICK_S`] either way.
pub const JITTER: f64 = 0.2;

/// The bank a draw tops up to: this many seconds of the target rate. Longer than a tick,
/// so that one short draw at a contended bucket does not cut the rate at once.
pub const RUNWAY_S: f64 = 1.0;

/// What the bank must always cover of the promised rate: a tick, its jitter and as much
/// again of lateness (a runtime busy for a quarter of a second).
pub const SAFE_S: f64 = TICK_S * (1.0 + JITTER) + 0.15;

/// The most an Envoy token bucket of a fleet holds: this many seconds of its rate (at
/// least one token). A new bucket starts full and is paid from the bank.
pub const ENVOY_BURST_S: f64 = 0.1;

/// How far the rate the bank affords may move before the promise follows: a new rate is a
/// new token bucket for every Envoy, each starting full.
pub const HYSTERESIS: f64 = 0.1;

/// One bucket's grant on this server.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Grant {
    /// Tokens drawn and not yet promised; below zero, a debt: tokens promised beyond what
    /// was drawn (a new Envoy bucket's first tokens, a draw later than [`SAFE_S`]), which
    /// the next draws repay first.
    pub bank: f64,
    /// Tokens per second promised to this server's Envoys, in total. It moves only at a
    /// draw ([`Self::drawn`]), so one rate holds between two draws.
    pub rate: f64,
}

impl Grant {
    /// The rate for `elapsed_s` (the time since the last draw) leaves the bank; what goes
    /// beyond it (a draw later than [`SAFE_S`]) stays a debt.
    pub fn spend(&mut self, elapsed_s: f64) {
        self.bank -= self.rate * elapsed_s.max(0.0);
    }

    /// `tokens` promised at once (a new Envoy token bucket starts full) leave the bank,
    /// as a debt if they are more than it holds. The rate is not cut here: a cut sends
    /// every Envoy a new bucket whose first tokens would be charged in turn (a cascade
    /// down to nothing); the next draw repays the debt, or cuts the rate.
    pub fn charge(&mut self, tokens: f64) {
        self.bank -= tokens.max(0.0);
    }

    /// The tokens to draw for a `target` rate: what tops the bank up to [`RUNWAY_S`] of it
    /// (a debt first), at most `ceiling` (what one claim on the bucket may take).
    pub fn want(&self, target: f64, ceiling: f64) -> f64 {
        (target * RUNWAY_S - self.bank).clamp(0.0, ceiling.max(0.0))
    }

    /// After a draw of `drawn` tokens toward `target`: the rate follows what the bank
    /// affords over the runway, capped at the target, once it has moved by more than
    /// [`HYSTERESIS`] — and at once whenever the bank no longer covers it for [`SAFE_S`].
    /// Returns whether the rate changed.
    pub fn drawn(&mut self, drawn: f64, target: f64) -> bool {
        self.bank += drawn.max(0.0);
        let held = self.bank.max(0.0);
        let afforded = (held / RUNWAY_S).min(target.max(0.0));
        let low = self.rate * (1.0 - HYSTERESIS);
        let high = self.rate * (1.0 + HYSTERESIS);
        let moved = afforded < low || afforded > high || (self.rate == 0.0 && afforded > 0.0);
        let before = self.rate;
        if moved {
            self.rate = afforded;
        }
        if held < self.rate * SAFE_S {
            self.rate = held / RUNWAY_S;
        }
        self.rate != before
    }

    /// Whole tokens the bank holds beyond what it keeps once demand fell (at most `least`
    /// of them: none): the [`RUNWAY_S`] of the `target` and [`SAFE_S`] of the rate
    /// promised before this draw (`before`: Envoys keep it until their new assignment
    /// arrives). Given back to the store, they serve the fleet's other servers.
    pub fn surplus(&self, target: f64, before: f64, least: f64) -> u64 {
        let keep = (target.max(0.0) * RUNWAY_S).max(before.max(self.rate) * SAFE_S);
        let surplus = (self.bank - keep).floor();
        if surplus >= least.max(1.0) {
            surplus as u64
        } else {
            0
        }
    }

    /// `tokens` leave the bank, given back to the store.
    pub fn give_back(&mut self, tokens: u64) {
        self.bank -= tokens as f64;
    }

    /// Whether the promise is covered for [`SAFE_S`] (the invariant each draw restores).
    #[cfg(test)]
    pub fn covered(&self) -> bool {
        self.bank + 1e-9 >= self.rate * SAFE_S
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(bank: f64, rate: f64) -> Grant {
        Grant { bank, rate }
    }

    #[test]
    fn alone_on_a_bucket_the_rate_reaches_the_limit_and_stays() {
        // A limit of 100/s with a burst of 100: the first draw takes the burst.
        let mut g = Grant::default();
        assert_eq!(g.want(100.0, 100.0), 100.0);
        assert!(g.drawn(100.0, 100.0));
        assert_eq!(g.rate, 100.0);
        for _ in 0..10 {
            g.spend(TICK_S);
            let want = g.want(100.0, 100.0);
            assert!((want - 50.0).abs() < 1e-9, "{want}");
            // The bucket refilled 50 in the tick: all of it is drawn.
            assert!(!g.drawn(want, 100.0));
            assert_eq!(g.rate, 100.0);
        }
    }

    #[test]
    fn a_short_draw_cuts_the_rate_only_when_the_bank_no_longer_covers_it() {
        let mut g = at(100.0, 100.0);
        g.spend(TICK_S);
        // Nothing drawn: 50 left, which covers 100/s for half a second only.
        assert!(g.drawn(0.0, 100.0));
        assert!(g.covered());
        assert!(g.rate < 100.0 * 0.9, "{g:?}");
    }

    #[test]
    fn new_envoy_buckets_are_a_debt_the_next_draw_repays() {
        let mut g = at(5.0, 5.0);
        // Eight Envoys' one-token buckets: no cut now (it would send eight more).
        g.charge(8.0);
        assert_eq!((g.bank, g.rate), (-3.0, 5.0));
        // The next draw wants the debt back and the runway.
        g.spend(TICK_S);
        assert!(
            (g.want(5.0, 100.0) - (3.0 + 2.5 + 5.0)).abs() < 1e-9,
            "{g:?}"
        );
        assert!(!g.drawn(10.5, 5.0));
        assert!(g.covered(), "{g:?}");
        // Not repaid (the store had nothing): the rate is cut to what is left, nothing.
        let mut g = at(5.0, 5.0);
        g.charge(8.0);
        g.spend(TICK_S);
        assert!(g.drawn(0.0, 5.0));
        assert_eq!(g.rate, 0.0);
    }

    #[test]
    fn demand_below_the_rate_lowers_it_past_the_hysteresis_only() {
        let mut g = at(100.0, 100.0);
        assert!(!g.drawn(0.0, 95.0));
        assert!(g.drawn(0.0, 50.0));
        assert_eq!(g.rate, 50.0);
    }

    #[test]
    fn when_demand_falls_the_bank_beyond_the_runway_goes_back() {
        // A second of 100/s banked; demand falls to a target of 20/s.
        let mut g = at(100.0, 100.0);
        assert!(g.drawn(0.0, 20.0));
        assert_eq!(g.rate, 20.0);
        // Kept: the larger of 1 s of the new target (20) and SAFE_S of the old rate (85).
        let back = g.surplus(20.0, 100.0, 5.0);
        assert_eq!(back, (100.0 - 100.0 * SAFE_S).floor() as u64);
        g.give_back(back);
        assert!(g.covered(), "{g:?}");
        // Once the old rate is gone, the next draw keeps the runway of the target only.
        let mut g = at(100.0, 20.0);
        assert_eq!(g.surplus(20.0, 20.0, 5.0), 80);
        // Below `least`, nothing: a store call is not worth it.
        assert_eq!(at(24.0, 20.0).surplus(20.0, 20.0, 5.0), 0);
        assert_eq!(at(25.0, 20.0).surplus(20.0, 20.0, 5.0), 5);
        g.give_back(80);
        assert_eq!(g.bank, 20.0);
    }

    proptest! {
        /// Whatever the draws, targets and charges, with each draw at most [`SAFE_S`]
        /// after the last: the promise is covered after every draw (or, in debt, is
        /// nothing); the time that passed adds no debt beyond the charges since the last
        /// draw; a give-back leaves the rate before the draw covered; and the tokens
        /// promised (the rate for the time, every charge) are always exactly those drawn
        /// less those given back and the bank, a debt included.
        #[test]
        fn the_promise_is_always_covered(
            steps in proptest::collection::vec(
                (0.0f64..200.0, 0.0f64..300.0, 0.0f64..SAFE_S, 0.0f64..20.0), 1..60),
        ) {
            let mut g = Grant::default();
            let (mut drawn_total, mut promised, mut floor) = (0.0, 0.0, 0.0);
            for (drawn, target, elapsed, charge) in steps {
                promised += g.rate * elapsed;
                g.spend(elapsed);
                prop_assert!(g.bank >= floor - 1e-6, "{:?}: a debt past the charges", g);
                let want = g.want(target, 150.0);
                let got = drawn.min(want);
                drawn_total += got;
                let before = g.rate;
                g.drawn(got, target);
                let back = g.surplus(target, before, 1.0);
                g.give_back(back);
                drawn_total -= back as f64;
                prop_assert!(g.bank >= before * SAFE_S - 1e-6 || back == 0, "{:?}", g);
                prop_assert!(g.covered() || g.bank < 0.0 && g.rate == 0.0, "{:?}", g);
                promised += charge;
                g.charge(charge);
                floor = (g.bank + charge).min(0.0) - charge;
                prop_assert!((promised + g.bank - drawn_total).abs() <= 1e-6,
                    "promised {} + bank {} != drawn {}", promised, g.bank, drawn_total);
            }
        }
    }
}

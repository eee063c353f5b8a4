//! A server's grant of one RLQS bucket when several servers share its limit through the
//! store (`fleet.rs`): the tokens this server has drawn from the shared bucket and not
//! yet promised (its bank), and the rate it promises its Envoys in total.
//!
//! Pure arithmetic on numbers: no clock, no store. Its one promise: whatever happens, the
//! rate promised is covered by the bank for [`SAFE_S`] — past the next draw even when that
//! draw is late — so the Envoys of all servers together admit no more than the servers
//! drew, and the shared bucket bounds what they drew. Every token the promise may spend
//! (the rate for the time that passed, a new Envoy bucket's first `max_tokens`) leaves the
//! bank when it may be spent, whether Envoy spent it or not: the bank never holds a token
//! an Envoy may already have used.

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

/// The most an Envoy token bucket of a fleet holds: this many seconds of its rate. A new
/// bucket starts full and is paid from the bank; kept well under the runway's margin over
/// [`SAFE_S`], a round of new buckets does not cut the rate it was sent for.
pub const ENVOY_BURST_S: f64 = 0.1;

/// How far the rate the bank affords may move before the promise follows: a new rate is a
/// new token bucket for every Envoy, each starting full.
pub const HYSTERESIS: f64 = 0.1;

/// One bucket's grant on this server.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Grant {
    /// Tokens drawn and not yet promised.
    pub bank: f64,
    /// Tokens per second promised to this server's Envoys, in total.
    pub rate: f64,
}

impl Grant {
    /// `elapsed_s` of the promised rate leave the bank: the time since the last draw,
    /// which left the bank covering [`SAFE_S`] of it. A draw later than that finds the
    /// bank empty (the Envoys may have spent more than it held: the lateness the bound
    /// names), and its [`Self::drawn`] cuts the rate to what the bank affords again.
    pub fn spend(&mut self, elapsed_s: f64) {
        let spent = self.rate * elapsed_s.max(0.0);
        self.bank = (self.bank - spent).max(0.0);
    }

    /// `tokens` promised at once (a new Envoy token bucket starts full) leave the bank;
    /// the rate is cut if the rest no longer covers it — to what the bank affords over
    /// the runway, not just [`SAFE_S`]: the new buckets the cut itself sends are paid
    /// from that margin, so a cut never sets off another. Returns whether it was cut.
    pub fn charge(&mut self, tokens: f64) -> bool {
        self.bank = (self.bank - tokens.max(0.0)).max(0.0);
        if self.bank < self.rate * SAFE_S {
            self.rate = self.bank / RUNWAY_S;
            return true;
        }
        false
    }

    /// The tokens to draw for a `target` rate: what tops the bank up to [`RUNWAY_S`] of it,
    /// at most `ceiling` (what one claim on the bucket may take).
    pub fn want(&self, target: f64, ceiling: f64) -> f64 {
        (target * RUNWAY_S - self.bank).clamp(0.0, ceiling.max(0.0))
    }

    /// After a draw of `drawn` tokens toward `target`: the rate follows what the bank
    /// affords over the runway, capped at the target, once it has moved by more than
    /// [`HYSTERESIS`] — and at once whenever the bank no longer covers it for [`SAFE_S`].
    /// Returns whether the rate changed.
    pub fn drawn(&mut self, drawn: f64, target: f64) -> bool {
        self.bank += drawn.max(0.0);
        let afforded = (self.bank / RUNWAY_S).min(target.max(0.0));
        let low = self.rate * (1.0 - HYSTERESIS);
        let high = self.rate * (1.0 + HYSTERESIS);
        let moved = afforded < low || afforded > high || (self.rate == 0.0 && afforded > 0.0);
        let before = self.rate;
        if moved {
            self.rate = afforded;
        }
        if self.bank < self.rate * SAFE_S {
            self.rate = self.bank / RUNWAY_S;
        }
        self.rate != before
    }

    /// Whether the promise is covered for [`SAFE_S`] (the invariant each draw and charge
    /// restores).
    pub fn covered(&self) -> bool {
        self.bank + 1e-9 >= self.rate * SAFE_S
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_envoy_burst_fits_in_the_margin_of_the_runway() {
        const { assert!(ENVOY_BURST_S * (1.0 + 0.1) < RUNWAY_S - SAFE_S) };
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
        let mut g = Grant {
            bank: 100.0,
            rate: 100.0,
        };
        g.spend(TICK_S);
        // Nothing drawn: 50 left, which covers 100/s for half a second only.
        assert!(g.drawn(0.0, 100.0));
        assert!(g.covered());
        assert!(g.rate < 100.0 * 0.9, "{g:?}");
    }

    #[test]
    fn a_new_envoy_bucket_is_paid_from_the_bank() {
        let mut g = Grant {
            bank: 100.0,
            rate: 100.0,
        };
        assert!(g.charge(50.0));
        assert!(g.covered() && g.bank == 50.0, "{g:?}");
    }

    #[test]
    fn a_cut_leaves_room_for_the_buckets_it_sends() {
        // A bank just covering its rate; each cut sends every Envoy a new bucket (a tenth
        // of a second of the rate, charged): the second charge must not cut again.
        let mut g = Grant {
            bank: 75.0,
            rate: 100.0,
        };
        assert!(g.charge(10.0));
        let cut = g.rate;
        assert!(!g.charge(cut * ENVOY_BURST_S), "{g:?}");
        assert_eq!(g.rate, cut);
    }

    #[test]
    fn demand_below_the_rate_lowers_it_past_the_hysteresis_only() {
        let mut g = Grant {
            bank: 100.0,
            rate: 100.0,
        };
        assert!(!g.drawn(0.0, 95.0));
        assert!(g.drawn(0.0, 50.0));
        assert_eq!(g.rate, 50.0);
    }

    proptest! {
        /// Whatever the draws, targets and charges, with each draw at most [`SAFE_S`]
        /// after the last: the bank pays for all the time that passed, the promise is
        /// covered after every step, and the tokens promised never exceed those drawn.
        #[test]
        fn the_promise_is_always_covered(
            steps in proptest::collection::vec(
                (0.0f64..200.0, 0.0f64..300.0, 0.0f64..SAFE_S, 0.0f64..20.0), 1..60),
        ) {
            let mut g = Grant::default();
            let (mut drawn_total, mut promised) = (0.0, 0.0);
            for (drawn, target, elapsed, charge) in steps {
                prop_assert!(g.rate * elapsed <= g.bank + 1e-6, "{:?} for {}", g, elapsed);
                promised += g.rate * elapsed;
                g.spend(elapsed);
                let want = g.want(target, 150.0);
                let got = drawn.min(want);
                drawn_total += got;
                g.drawn(got, target);
                prop_assert!(g.covered(), "{:?}", g);
                let paid = charge.min(g.bank);
                promised += paid;
                g.charge(charge);
                prop_assert!(g.covered(), "{:?}", g);
                prop_assert!(promised + g.bank <= drawn_total + 1e-6,
                    "promised {} + bank {} > drawn {}", promised, g.bank, drawn_total);
            }
        }
    }
}

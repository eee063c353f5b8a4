//! Several servers sharing one RLQS limit through the shared store (DynamoDB, Redis): each
//! draws, for every bucket its Envoys report, the tokens it promises them from the rule's
//! own token bucket in the store — the bucket the rate-limit service debits — and divides
//! what it drew among its streams (`stream.rs`, `share.rs`). So the limit holds for the
//! fleet, however the Envoys spread over the servers; the bound is in docs/rlqs.md.
//!
//! Every [`TICK_S`] (jittered) a server draws, per bucket with demand, what tops its bank
//! up ([`Grant`]); a bucket's first report draws at once, before it is answered. A draw is
//! one engine acquire of that many tokens, all or nothing; refused, it is tried once more
//! with what the shard answered was left. When the rate a bucket's bank affords moves, the
//! streams are told ([`Fleet::changes`]) and send their Envoys new assignments at once,
//! without waiting for a report. A new Envoy token bucket starts full: its `max_tokens`
//! are paid from the bank too ([`Fleet::charge`]). When demand falls, what the bank
//! holds beyond its runway is given back to the shards it was drawn from, for the other
//! servers (`Grant::surplus`).
//!
//! Owns the grants; reads the demand table (`demand.rs`) and the rules in force; decides
//! no assignment (the streams do) and touches the store only through the engine.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::assign::{kind, Kind};
use super::demand::{BucketKey, Demands};
use super::grant::{Grant, JITTER, TICK_S};
use crate::config::{FailureMode, Rule, RuleLimit};
use crate::engine::plan::Plan;
use crate::engine::Decision;
use crate::service::metrics::Metrics;
use crate::service::RateLimiter;
use crate::store::{BucketStore, MILLI};

/// A bucket younger than this is drawn for at its whole limit: the first reports of an
/// Envoy (Envoy 1.40 reports every 5 s, the first one at once) say little of its load.
const NEW_BUCKET: Duration = Duration::from_secs(6);

/// A stream's demand older than this is left out (three of Envoy 1.40's report intervals,
/// the assignments' lifetime).
const STALE: Duration = Duration::from_secs(15);

/// How much more than its Envoys' reported demand a server draws for (demand grows
/// between reports, and a report lags by up to an interval).
const HEADROOM: f64 = 1.25;

/// The least a server draws for, as a fraction of the limit: Envoys that report little
/// can still grow.
const FLOOR: f64 = 0.1;

/// Draws in flight at once on one tick.
const DRAWS_AT_ONCE: usize = 16;

/// A draw that leaves the bucket less than this fraction of a second of its rate (or
/// gets less than it asked) finds it contended: other servers draw from it too.
const CONTENDED: f64 = 0.1;

/// Servers share a contended bucket as TCP flows share a link (AIMD): on a contended draw
/// a server's cap on its target falls by this factor, on any other it rises by
/// [`CAP_RISE`] of the limit. The larger cap loses more at each fall, so the caps of the
/// servers that contend converge to equal parts; alone, a server's cap hovers just under
/// the limit, the bucket's burst absorbing the difference.
const CAP_FALL: f64 = 0.8;

/// See [`CAP_FALL`]: a tick's rise, as a fraction of the limit (from nothing to the whole
/// limit in 10 s of uncontended draws).
const CAP_RISE: f64 = 0.05;

/// One bucket's grant, and when it was drawn for.
#[derive(Debug, Clone)]
struct Held {
    grant: Grant,
    /// The most this server draws for (tokens per second): its part of a contended bucket.
    cap: f64,
    drawn_at: Instant,
    since: Instant,
    /// The last draw that took tokens: the shards a surplus goes back to.
    taken: Option<Decision>,
    /// The last draw failed (the store erred or did not answer in time): a rule whose
    /// `failure_mode` is `allow` is divided locally until a draw lands again.
    failing: bool,
}

/// A bucket's grant on this server, as `/rlconfig` and `explain` show it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GrantView {
    /// Tokens per second promised to this server's Envoys.
    pub rate: f64,
    /// Tokens drawn and not yet promised.
    pub bank: f64,
    /// The most this server draws for (its part of a contended bucket).
    pub cap: f64,
}

/// What one draw came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Drawn {
    tokens: u64,
    /// Whole tokens the shard held after it.
    left: i64,
}

/// A draw's outcome, and the decision that took its tokens (`None`: it took none).
#[derive(Debug)]
struct Draw {
    drawn: Drawn,
    taken: Option<Decision>,
}

/// What a bucket's draw round came to.
enum Round {
    /// The bank held enough: nothing was asked.
    NoDraw,
    /// The store erred or did not answer within the store timeout.
    Failed,
    Drew(Box<Draw>),
}

/// A grant after its draw round: how far its rate moved, whether its store started or
/// stopped failing, and what goes back to the store.
struct Settled {
    moved: f64,
    flipped: bool,
    surplus: Option<Surplus>,
}

/// Tokens a draw round gives back: how many, of which bucket, to the shards `taken` took
/// them from.
struct Surplus {
    tokens: u64,
    taken: Decision,
}

/// What a rule lets a fleet draw: its first limit's rate and burst (tokens per second,
/// tokens); `None` for a rule that is not a plain limit (allow or deny all, overdraft).
#[derive(Debug, Clone)]
struct Drawable {
    rule: Arc<Rule>,
    per_second: f64,
    burst: f64,
}

/// A rule's first limit as a fleet draws it.
#[derive(Debug, Clone, Copy)]
struct DrawnLimit {
    per_second: f64,
    /// Tokens: what one draw may take at most.
    burst: f64,
}

/// The grants of one server.
#[derive(Debug)]
pub struct Fleet {
    grants: Mutex<HashMap<BucketKey, Held>>,
    changes: watch::Sender<u64>,
    metrics: Arc<Metrics>,
}

impl Fleet {
    pub fn new(metrics: Arc<Metrics>) -> Fleet {
        Fleet {
            grants: Mutex::default(),
            changes: watch::Sender::new(0),
            metrics,
        }
    }

    /// A rate moved by `moved` tokens per second: counted, and the streams told.
    fn moved(&self, moved: f64) {
        if moved != 0.0 {
            self.metrics.rlqs().promised_moved(moved);
            self.changes.send_modify(|g| *g += 1);
        }
    }

    /// Tokens per second promised for `key` in all (`None`: never drawn for).
    pub fn rate(&self, key: &BucketKey) -> Option<f64> {
        self.grants.lock().get(key).map(|h| h.grant.rate)
    }

    /// Whether `key`'s last draw failed and its `rule` fails open (`failure_mode: allow`):
    /// its Envoys are then given their part of the limit divided among this server's
    /// streams, as on the memory store, until a draw lands again.
    pub fn fails_open(&self, key: &BucketKey, rule: &Rule) -> bool {
        rule.failure_mode == FailureMode::Allow
            && self.grants.lock().get(key).is_some_and(|h| h.failing)
    }

    /// `key`'s grant as it stands (`None`: never drawn for).
    pub fn held(&self, key: &BucketKey) -> Option<GrantView> {
        let grants = self.grants.lock();
        let h = grants.get(key)?;
        Some(GrantView {
            rate: h.grant.rate,
            bank: h.grant.bank,
            cap: h.cap,
        })
    }

    /// Told whenever a bucket's promised rate moved: the streams reassign.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// `tokens` promised at once for `key` (a new Envoy bucket, full) leave its bank.
    pub fn charge(&self, key: &BucketKey, tokens: f64) {
        if let Some(held) = self.grants.lock().get_mut(key) {
            held.grant.charge(tokens);
        }
    }

    /// Draws for each of `keys` never drawn for yet (a bucket's first report), at once.
    pub async fn draw_new<S: BucketStore>(&self, limiter: &RateLimiter<S>, keys: Vec<BucketKey>) {
        let new: Vec<BucketKey> = {
            let grants = self.grants.lock();
            keys.into_iter()
                .filter(|k| !grants.contains_key(k))
                .collect()
        };
        futures::stream::iter(new)
            .for_each_concurrent(DRAWS_AT_ONCE, |key| self.draw_for(limiter, key, None))
            .await;
    }

    /// Draws, every tick, for every bucket this server's streams report; forgets the
    /// grants of buckets no stream reports any more (their banked tokens are lost: the
    /// fleet admits less, never more).
    pub async fn run<S: BucketStore>(
        self: Arc<Self>,
        limiter: Arc<RateLimiter<S>>,
        demands: Arc<Demands>,
    ) {
        loop {
            tokio::time::sleep(jittered(TICK_S)).await;
            let wanted = demands.totals(Instant::now(), STALE);
            let gone = {
                let mut grants = self.grants.lock();
                let before: f64 = grants.values().map(|h| h.grant.rate).sum();
                // A grant younger than its bucket's first reports is kept: its stream
                // records its demand only after the first draw.
                let now = Instant::now();
                grants.retain(|k, h| {
                    now.saturating_duration_since(h.since) < NEW_BUCKET
                        || wanted.iter().any(|(w, _)| w == k)
                });
                before - grants.values().map(|h| h.grant.rate).sum::<f64>()
            };
            self.metrics.rlqs().promised_moved(-gone);
            futures::stream::iter(wanted)
                .for_each_concurrent(DRAWS_AT_ONCE, |(key, demand)| {
                    self.draw_for(&limiter, key, Some(demand))
                })
                .await;
        }
    }

    /// One draw for `key` toward its target (`demand` in requests per second; `None`: a
    /// new bucket, drawn for at its limit), at most its cap.
    async fn draw_for<S: BucketStore>(
        &self,
        limiter: &RateLimiter<S>,
        key: BucketKey,
        demand: Option<f64>,
    ) {
        let Some(drawable) = drawable(limiter, &key) else {
            let gone = self
                .grants
                .lock()
                .remove(&key)
                .map_or(0.0, |h| h.grant.rate);
            self.metrics.rlqs().promised_moved(-gone);
            return;
        };
        let (want, target) = self.aim(&key, &drawable, demand);
        let round = if want == 0 {
            Round::NoDraw
        } else {
            let got = draw(limiter, &drawable.rule, &key.1, want).await;
            let tokens = got.as_ref().map(|d| d.drawn.tokens);
            self.metrics.rlqs().drew(want, tokens);
            got.map_or(Round::Failed, |d| Round::Drew(Box::new(d)))
        };
        let Some(settled) = self.settle(&key, &drawable, want, target, round) else {
            return;
        };
        self.moved(settled.moved);
        if settled.flipped {
            // Into or out of a store failure: the streams reassign (a rule that fails
            // open is divided locally meanwhile).
            self.changes.send_modify(|g| *g += 1);
        }
        if let Some(surplus) = settled.surplus {
            self.metrics.rlqs().gave_back(surplus.tokens);
            give_back(limiter, &drawable.rule, &key.1, surplus).await;
        }
    }

    /// A draw round's aim for `key` (its grant made if new, the time since the last
    /// round spent): the tokens to draw and the target rate they are for.
    fn aim(&self, key: &BucketKey, drawable: &Drawable, demand: Option<f64>) -> (u64, f64) {
        let now = Instant::now();
        let mut grants = self.grants.lock();
        let held = grants.entry(key.clone()).or_insert(Held {
            grant: Grant::default(),
            cap: drawable.per_second,
            drawn_at: now,
            since: now,
            taken: None,
            failing: false,
        });
        let elapsed = now.saturating_duration_since(held.drawn_at);
        held.grant.spend(elapsed.as_secs_f64());
        held.drawn_at = now;
        let young = now.saturating_duration_since(held.since) < NEW_BUCKET;
        let target = match demand {
            Some(d) if !young => target_rate(d, drawable.per_second),
            _ => drawable.per_second,
        };
        let target = target.min(held.cap);
        // Rounded up: a slow limit (6 a minute) wants a tenth of a token a draw, and
        // would never draw a whole one rounded down. What is drawn beyond the runway
        // stays banked.
        let want = held.grant.want(target, drawable.burst).ceil() as u64;
        (want, target)
    }

    /// `key`'s grant after a draw round of `want` tokens toward `target` came to `round`:
    /// its cap, whether its store fails, its bank and rate, and the surplus to give back
    /// (`None`: the grant went away meanwhile).
    fn settle(
        &self,
        key: &BucketKey,
        drawable: &Drawable,
        want: u64,
        target: f64,
        round: Round,
    ) -> Option<Settled> {
        let mut grants = self.grants.lock();
        let held = grants.get_mut(key)?;
        let mut flipped = false;
        if !matches!(round, Round::NoDraw) {
            let failed = matches!(round, Round::Failed);
            let drawn = match &round {
                Round::Drew(d) => Some(d.drawn),
                _ => None,
            };
            held.cap = next_cap(held.cap, want, drawn, drawable.per_second);
            flipped = held.failing != failed;
            held.failing = failed;
        }
        let mut tokens = 0;
        if let Round::Drew(d) = round {
            tokens = d.drawn.tokens;
            if let Some(taken) = d.taken {
                held.taken = Some(taken);
            }
        }
        let before = held.grant.rate;
        held.grant.drawn(tokens as f64, target);
        let moved = held.grant.rate - before;
        // Demand fell: what the bank holds beyond its runway goes back to the store, for
        // the other servers (at least a tenth of a second of the limit).
        let back = held
            .grant
            .surplus(target, before, FLOOR * drawable.per_second);
        let surplus = match (&held.taken, back) {
            (Some(taken), 1..) => {
                held.grant.give_back(back);
                Some(Surplus {
                    tokens: back,
                    taken: taken.clone(),
                })
            }
            _ => None,
        };
        Some(Settled {
            moved,
            flipped,
            surplus,
        })
    }
}

/// The rate a server draws for: its Envoys' demand with headroom, between the floor and
/// the limit.
fn target_rate(demand: f64, limit: f64) -> f64 {
    let demand = if demand.is_finite() { demand } else { limit };
    (demand * HEADROOM).clamp(limit * FLOOR, limit)
}

/// A server's cap after a draw of `asked` tokens that came to `got` (`None`: the store
/// failed, which says nothing of the others), on a limit of `limit` per second.
fn next_cap(cap: f64, asked: u64, got: Option<Drawn>, limit: f64) -> f64 {
    let Some(got) = got else {
        return cap;
    };
    let contended = got.tokens < asked || (got.left as f64) < CONTENDED * limit;
    let next = if contended {
        cap * CAP_FALL
    } else {
        cap + CAP_RISE * limit
    };
    next.clamp(FLOOR * limit, limit)
}

/// Whether a fleet draws `rule`'s tokens from the store: a plain limit (not allow or
/// deny all; not overdraft, whose draw would always succeed). Any other is divided among
/// this server's Envoys as on the memory store.
pub fn draws_for(rule: &Rule) -> bool {
    drawn_limit(rule).is_some()
}

/// The rate and burst a fleet draws `rule`'s tokens at; `None` when it draws none
/// ([`draws_for`]).
fn drawn_limit(rule: &Rule) -> Option<DrawnLimit> {
    match &rule.limit {
        RuleLimit::Limited(limit) if !limit.overdraft => {}
        _ => return None,
    }
    match kind(Some(rule)) {
        Kind::Limited {
            tokens,
            period,
            burst,
        } => Some(DrawnLimit {
            per_second: tokens as f64 / period.as_secs_f64().max(1e-3),
            burst: burst as f64,
        }),
        Kind::AllowAll | Kind::DenyAll => None,
    }
}

/// What the rules in force let a fleet draw for `key`.
fn drawable<S: BucketStore>(limiter: &RateLimiter<S>, key: &BucketKey) -> Option<Drawable> {
    let config = limiter.config();
    let rule = config.domain(&key.0)?.match_descriptor(&key.1)?.clone();
    let limit = drawn_limit(&rule)?;
    Some(Drawable {
        per_second: limit.per_second,
        burst: limit.burst,
        rule,
    })
}

/// Takes `tokens` of `rule`'s bucket for `entries` from the store, all or nothing; when
/// refused, once more what the shard answered was left. What it took, and what the shard
/// held after (`None`: the store failed or did not answer within the store timeout:
/// nothing is banked, and a debit that landed all the same is lost, never spent).
async fn draw<S: BucketStore>(
    limiter: &RateLimiter<S>,
    rule: &Rule,
    entries: &[(String, String)],
    tokens: u64,
) -> Option<Draw> {
    let mut asked = tokens;
    for _ in 0..2 {
        let mut plan = Plan::new();
        plan.add(rule, entries, asked).ok()?;
        let acquire = limiter.engine().acquire(&plan.acquire);
        let decision = tokio::time::timeout(limiter.store_timeout(), acquire)
            .await
            .ok()?
            .ok()?;
        let left = decision
            .buckets
            .iter()
            .flat_map(|b| b.limits.iter())
            .map(|l| l.remaining.div_euclid(MILLI))
            .min()
            .unwrap_or(0);
        if decision.admitted {
            let drawn = Drawn {
                tokens: asked,
                left,
            };
            return Some(Draw {
                drawn,
                taken: Some(decision),
            });
        }
        if left <= 0 || left as u64 >= asked {
            return Some(none_taken(left));
        }
        asked = left as u64;
    }
    Some(none_taken(0))
}

/// A draw that took nothing; the shard held `left`.
fn none_taken(left: i64) -> Draw {
    Draw {
        drawn: Drawn { tokens: 0, left },
        taken: None,
    }
}

/// Gives a bucket's `surplus` back to the shards its last draw took from (best effort,
/// bounded by the store timeout: a return that does not land leaves them taken).
async fn give_back<S: BucketStore>(
    limiter: &RateLimiter<S>,
    rule: &Rule,
    entries: &[(String, String)],
    surplus: Surplus,
) {
    let mut plan = Plan::new();
    if plan.add(rule, entries, surplus.tokens).is_err() {
        return;
    }
    let give = limiter.engine().give_back(&plan.acquire, &surplus.taken);
    let _ = tokio::time::timeout(limiter.store_timeout(), give).await;
}

/// `base_s` seconds, moved at random by up to [`JITTER`] of it either way.
fn jittered(base_s: f64) -> Duration {
    use rand::RngExt;
    let spread = base_s * JITTER * (2.0 * rand::rng().random::<f64>() - 1.0);
    Duration::from_secs_f64((base_s + spread).max(0.01))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_follows_demand_between_the_floor_and_the_limit() {
        assert_eq!(target_rate(40.0, 100.0), 50.0);
        assert_eq!(target_rate(0.0, 100.0), 10.0);
        assert_eq!(target_rate(500.0, 100.0), 100.0);
        assert_eq!(target_rate(f64::NAN, 100.0), 100.0);
    }

    #[test]
    fn contended_caps_fall_by_a_factor_and_rise_by_a_step() {
        let got = |tokens, left| Some(Drawn { tokens, left });
        // Got all it asked and the bucket keeps plenty: up a step, at most the limit.
        assert_eq!(next_cap(50.0, 10, got(10, 40), 100.0), 55.0);
        assert_eq!(next_cap(99.0, 10, got(10, 40), 100.0), 100.0);
        // Got less, or left the bucket nearly dry: down by the factor, not below the floor.
        assert_eq!(next_cap(50.0, 10, got(4, 0), 100.0), 40.0);
        assert_eq!(next_cap(50.0, 10, got(10, 5), 100.0), 40.0);
        assert_eq!(next_cap(11.0, 10, got(0, 0), 100.0), 10.0);
        // A failed store call says nothing of the others.
        assert_eq!(next_cap(50.0, 10, None, 100.0), 50.0);
    }

    #[test]
    fn two_servers_drawing_from_one_bucket_converge_to_equal_caps() {
        // A bucket of 100/s drawn by two servers every half second in turn, each asking
        // its cap's half second; the first starts with the whole limit.
        let (limit, mut bucket) = (100.0f64, 100.0f64);
        let mut caps = [100.0f64, 10.0];
        for _ in 0..400 {
            for cap in caps.iter_mut() {
                bucket = (bucket + limit * 0.25).min(limit);
                let asked = (*cap * 0.5).floor() as u64;
                let tokens = asked.min(bucket.floor() as u64);
                bucket -= tokens as f64;
                let left = bucket.floor() as i64;
                *cap = next_cap(*cap, asked, Some(Drawn { tokens, left }), limit);
            }
        }
        let ratio = caps[0] / caps[1];
        assert!((0.6..=1.6).contains(&ratio), "{caps:?}");
        assert!(caps[0] + caps[1] >= 0.7 * limit, "{caps:?}");
    }

    #[test]
    fn a_tick_is_jittered_within_its_bounds() {
        for _ in 0..100 {
            let d = jittered(TICK_S).as_secs_f64();
            assert!((TICK_S * (1.0 - JITTER) - 1e-9..=TICK_S * (1.0 + JITTER) + 1e-9).contains(&d));
        }
    }
}

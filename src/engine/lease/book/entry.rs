//! One tracked bucket of the lease book: its demand over the last window, the leases it
//! holds (per shard), the moves of its tokens under way, and what the store last said its
//! shards hold. Owns the arithmetic of serving from a lease and of wanting one; knows
//! nothing of partitions, admission or locks (`part.rs`, `mod.rs`).

use smallvec::SmallVec;
use tokio::sync::watch;

use super::super::super::bucket::ShardShare;
use super::super::super::{BucketClaim, BucketOutcome, LimitClaim, LimitOutcome};
use super::super::size::{self, Demand};
use super::super::LeaseOptions;
use super::{Return, Want, WantedLimit, WINDOW_MS};
use crate::store::{BucketKey, LimitParams, Name, Stamp};

/// Most leases one bucket holds at once (on different shards, or across a doubling).
const MAX_LEASES_PER_BUCKET: usize = 2;

/// One limit of a lease.
#[derive(Debug, Clone)]
pub(super) struct HeldLimit {
    pub(super) limit: Name,
    pub(super) params: LimitParams,
    pub(super) share: ShardShare,
    /// Millitokens of the last grant (the top-up mark is half of it).
    pub(super) granted: i64,
    /// Millitokens taken from the shard and not used yet.
    pub(super) rest: i64,
    /// What the shard held after the last grant (refilled to then): with `rest`, what a
    /// request served from the lease reports as remaining.
    pub(super) shard_left: i64,
}

/// Tokens taken from one shard in advance.
#[derive(Debug, Clone)]
pub(super) struct ShardLease {
    pub(super) shard: u32,
    /// The count the grant was sized for; its return requires the same.
    pub(super) shard_count: u32,
    pub(super) stamp: Stamp,
    /// After this the rest goes back (nothing is served from it).
    pub(super) expires_ms: i64,
    pub(super) limits: SmallVec<[HeldLimit; 2]>,
}

impl ShardLease {
    /// Whether this lease can answer all of `b`'s claims at `now`.
    pub(super) fn covers(&self, b: &BucketClaim, now: i64) -> bool {
        now < self.expires_ms
            && b.limits.iter().all(|c| {
                self.limits
                    .iter()
                    .any(|h| h.limit == c.limit && h.params == c.params && h.rest >= c.amount)
            })
    }

    pub(super) fn outstanding(&self) -> i64 {
        self.limits.iter().map(|h| h.rest.max(0)).sum()
    }
}

/// A demand window being counted.
#[derive(Debug, Default)]
struct Window {
    start: i64,
    decisions: u32,
    /// Per limit: millitokens taken, largest single request.
    taken: SmallVec<[(Name, i64, i64); 2]>,
}

#[derive(Debug)]
pub(super) struct Entry {
    /// The bucket (its names, looked up by reference) and the hash it is filed under.
    pub(super) entity: Name,
    pub(super) resource: Name,
    pub(super) hash: u64,
    /// When the book admitted it: its first window is measured from then.
    pub(super) admitted: i64,
    window: Window,
    /// Decisions per second over the last full window.
    pub(super) rate: u32,
    /// Per limit, over the last full window.
    pub(super) demand: SmallVec<[(Name, Demand); 2]>,
    /// The limits of the last request, for a fetch.
    pub(super) limits: SmallVec<[LimitClaim; 2]>,
    pub(super) leases: SmallVec<[ShardLease; 1]>,
    /// Per limit, what the store last said the shard holds (refilled to then): a lease
    /// takes at most half of it, so a request that goes to the store while the lease is
    /// being fetched still finds the other half.
    pub(super) available: SmallVec<[(Name, i64); 2]>,
    /// One fetch wanted or in flight per bucket per process.
    pub(super) fetching: bool,
    /// Moves of tokens between this bucket's leases and its shards under way: a fetch
    /// wanted or in flight, or an expired lease being given back. A request that finds
    /// the bucket uncovered meanwhile waits for them to land instead of racing them to
    /// the store, whose answer would miss the tokens in flight (and could even refuse).
    pub(super) in_flight: u32,
    /// Bumped whenever a move lands.
    pub(super) landed: watch::Sender<u64>,
    /// No fetch before this (the shard could not grant one lately).
    pub(super) quiet_until: i64,
    pub(super) last_seen: i64,
}

impl Entry {
    /// Whether the store might refuse `b` only because this bucket's tokens are on the
    /// move: a fetch takes at most half of what the shard last held, so a request for no
    /// more than that half finds it in the store whatever the fetch takes; a larger one,
    /// or one on a shard never seen, might not.
    pub(super) fn tight_for(&self, b: &BucketClaim) -> bool {
        b.limits.iter().any(|c| {
            self.available
                .iter()
                .find(|(l, _)| *l == c.limit)
                .is_none_or(|(_, held)| c.amount > held / 2)
        })
    }

    pub(super) fn new(entity: Name, resource: Name, hash: u64, now: i64) -> Entry {
        Entry {
            entity,
            resource,
            hash,
            admitted: now,
            window: Window {
                start: now,
                ..Window::default()
            },
            rate: 0,
            demand: SmallVec::new(),
            limits: SmallVec::new(),
            leases: SmallVec::new(),
            available: SmallVec::new(),
            fetching: false,
            in_flight: 0,
            landed: watch::Sender::new(0),
            quiet_until: 0,
            last_seen: now,
        }
    }

    /// Counts one request on this bucket.
    pub(super) fn observe(&mut self, b: &BucketClaim, now: i64) {
        let elapsed = now - self.window.start;
        if elapsed >= WINDOW_MS {
            let per_s = |x: i64| (i128::from(x) * 1_000 / i128::from(elapsed)) as i64;
            self.rate = u32::try_from(per_s(i64::from(self.window.decisions))).unwrap_or(u32::MAX);
            self.demand = self
                .window
                .taken
                .drain(..)
                .map(|(limit, sum, largest)| {
                    (
                        limit,
                        Demand {
                            per_s: per_s(sum),
                            largest,
                        },
                    )
                })
                .collect();
            self.window = Window {
                start: now,
                ..Window::default()
            };
        }
        self.window.decisions = self.window.decisions.saturating_add(1);
        for c in &b.limits {
            match self.window.taken.iter_mut().find(|(l, _, _)| *l == c.limit) {
                Some((_, sum, largest)) => {
                    *sum = sum.saturating_add(c.amount);
                    *largest = (*largest).max(c.amount);
                }
                None => self
                    .window
                    .taken
                    .push((c.limit.clone(), c.amount, c.amount)),
            }
        }
        let same = self.limits.len() == b.limits.len()
            && self
                .limits
                .iter()
                .zip(&b.limits)
                .all(|(a, c)| a.limit == c.limit && a.params == c.params);
        if !same {
            self.limits = b.limits.clone();
        }
        self.last_seen = now;
    }

    /// One move of tokens has landed: wake whoever waits for it.
    pub(super) fn land(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.landed.send_modify(|n| *n += 1);
    }

    pub(super) fn hot(&self, options: &LeaseOptions) -> bool {
        self.rate >= options.hot_rate
    }

    /// Whether this bucket should fetch a lease now, and if so marks the fetch begun.
    pub(super) fn wants(&mut self, options: &LeaseOptions, now: i64) -> bool {
        let live = self.leases.iter().filter(|l| now < l.expires_ms).count();
        let low = match self.leases.iter().find(|l| now < l.expires_ms) {
            None => true,
            Some(l) => l
                .limits
                .iter()
                .any(|h| size::needs_top_up(h.rest, h.granted)),
        };
        let want = !self.fetching
            && now >= self.quiet_until
            && self.hot(options)
            && low
            && live < MAX_LEASES_PER_BUCKET
            && !self.demand.is_empty()
            // Not before the store has said what the shard holds: a lease takes at most
            // half of that, and a request racing the fetch counts on the other half.
            && !self.available.is_empty();
        if want {
            self.fetching = true;
            self.in_flight += 1;
        }
        want
    }
}

impl Entry {
    /// What a fetch for this bucket sizes and asks for: the limits of its last request,
    /// with their demand and what the store last said each shard holds.
    pub(super) fn want(&self) -> Want {
        let limits = self
            .limits
            .iter()
            .map(|c| {
                let demand = self.demand.iter().find(|(l, _)| *l == c.limit).map_or(
                    Demand {
                        per_s: 0,
                        largest: c.amount,
                    },
                    |(_, d)| *d,
                );
                WantedLimit {
                    claim: c.clone(),
                    demand,
                    available: self
                        .available
                        .iter()
                        .find(|(l, _)| *l == c.limit)
                        .map(|(_, a)| *a),
                }
            })
            .collect();
        Want {
            bucket: BucketKey {
                entity: self.entity.clone(),
                resource: self.resource.clone(),
                shard: 0,
            },
            limits,
        }
    }

    /// Whether the book may forget this bucket to admit one in demand: it holds no
    /// tokens and none are on the move, and it is cold — measured below the hot rate
    /// (once it has had two windows to be measured in), or unseen for two windows.
    pub(super) fn cold(&self, options: &LeaseOptions, now: i64) -> bool {
        let measured = now - self.admitted >= 2 * WINDOW_MS;
        let quiet = now - self.last_seen >= 2 * WINDOW_MS;
        self.leases.is_empty()
            && !self.fetching
            && self.in_flight == 0
            && (quiet || (measured && !self.hot(options)))
    }
}

pub(super) fn return_of(entity: &Name, resource: &Name, l: ShardLease) -> Option<Return> {
    let rest: SmallVec<[(Name, LimitParams, i64); 2]> = l
        .limits
        .into_iter()
        .filter(|h| h.rest > 0)
        .map(|h| (h.limit, h.params, h.rest))
        .collect();
    (!rest.is_empty()).then(|| Return {
        key: BucketKey {
            entity: entity.clone(),
            resource: resource.clone(),
            shard: l.shard,
        },
        shard_count: l.shard_count,
        rest,
    })
}

pub(super) fn note_available<'a>(
    available: &mut SmallVec<[(Name, i64); 2]>,
    limits: impl Iterator<Item = (&'a LimitClaim, &'a LimitOutcome)>,
) {
    for (c, o) in limits {
        match available.iter_mut().find(|(l, _)| *l == c.limit) {
            Some((_, a)) => *a = o.remaining,
            None => available.push((c.limit.clone(), o.remaining)),
        }
    }
}

/// Takes `b`'s claims from `lease` (which covers them) and reports the bucket as a debit
/// on its shard would: the shard's balance at the last grant plus the lease's rest.
#[expect(
    clippy::expect_used,
    reason = "a covering lease holds every claimed limit"
)]
pub(super) fn take(lease: &mut ShardLease, b: &BucketClaim) -> BucketOutcome {
    let limits = b
        .limits
        .iter()
        .map(|c| {
            let h = lease
                .limits
                .iter_mut()
                .find(|h| h.limit == c.limit)
                .expect("a covering lease holds every claimed limit");
            h.rest -= c.amount;
            // The shard may have refilled to its ceiling while the lease was held, so the
            // sum can pass it; a debit of `amount` leaves at most the ceiling less it.
            LimitOutcome {
                fits: true,
                remaining: h
                    .shard_left
                    .saturating_add(h.rest)
                    .min(h.share.ceiling.saturating_sub(c.amount))
                    .max(0),
                share: h.share,
                refill_amount: c.params.refill_amount,
                wait_ms: Some(0),
            }
        })
        .collect();
    BucketOutcome {
        shard: lease.shard,
        shard_count: lease.shard_count,
        stamp: lease.stamp,
        limits,
        from_lease: true,
    }
}

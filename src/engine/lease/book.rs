//! The lease book: what this process holds and sees of each bucket it serves — the
//! demand of the last window, the leases held (per shard), whether a fetch is in flight.
//! It answers a request from the leases when every bucket of it is covered, all or
//! nothing, under one lock; otherwise it says which leases to give back first and which
//! buckets want one. No store and no clock: the caller brings `now` and does the I/O.

use std::time::Duration;

use hashbrown::HashMap;
use parking_lot::Mutex;
use smallvec::SmallVec;
use tokio::sync::{watch, Notify};

use super::super::bucket::ShardShare;
use super::super::{Acquire, BucketClaim, BucketOutcome, Decision, LimitClaim, LimitOutcome};
use super::size::{self, Demand};
use super::LeaseOptions;
use crate::store::{BucketKey, LimitParams, Name, Stamp};

type Hasher = foldhash::quality::RandomState;

/// The demand window: rates are measured over at least this long.
pub(super) const WINDOW_MS: i64 = 250;

/// Most buckets tracked at once: beyond it a new bucket is simply not leased (a flood of
/// distinct descriptors cannot grow the book), until idle ones are dropped.
pub(super) const MAX_TRACKED: usize = 10_000;

/// Most leases one bucket holds at once (on different shards, or across a doubling).
const MAX_LEASES_PER_BUCKET: usize = 2;

/// One limit of a lease.
#[derive(Debug, Clone)]
struct HeldLimit {
    limit: Name,
    params: LimitParams,
    share: ShardShare,
    /// Millitokens of the last grant (the top-up mark is half of it).
    granted: i64,
    /// Millitokens taken from the shard and not used yet.
    rest: i64,
    /// What the shard held after the last grant (refilled to then): with `rest`, what a
    /// request served from the lease reports as remaining.
    shard_left: i64,
}

/// Tokens taken from one shard in advance.
#[derive(Debug, Clone)]
struct ShardLease {
    shard: u32,
    /// The count the grant was sized for; its return requires the same.
    shard_count: u32,
    stamp: Stamp,
    /// After this the rest goes back (nothing is served from it).
    expires_ms: i64,
    limits: SmallVec<[HeldLimit; 2]>,
}

impl ShardLease {
    /// Whether this lease can answer all of `b`'s claims at `now`.
    fn covers(&self, b: &BucketClaim, now: i64) -> bool {
        now < self.expires_ms
            && b.limits.iter().all(|c| {
                self.limits
                    .iter()
                    .any(|h| h.limit == c.limit && h.params == c.params && h.rest >= c.amount)
            })
    }

    fn outstanding(&self) -> i64 {
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
struct Entry {
    window: Window,
    /// Decisions per second over the last full window.
    rate: u32,
    /// Per limit, over the last full window.
    demand: SmallVec<[(Name, Demand); 2]>,
    /// The limits of the last request, for a fetch.
    limits: SmallVec<[LimitClaim; 2]>,
    leases: SmallVec<[ShardLease; 1]>,
    /// Per limit, what the store last said the shard holds (refilled to then): a lease
    /// takes at most half of it, so a request that goes to the store while the lease is
    /// being fetched still finds the other half.
    available: SmallVec<[(Name, i64); 2]>,
    /// One fetch wanted or in flight per bucket per process.
    fetching: bool,
    /// Moves of tokens between this bucket's leases and its shards under way: a fetch
    /// wanted or in flight, or an expired lease being given back. A request that finds
    /// the bucket uncovered meanwhile waits for them to land instead of racing them to
    /// the store, whose answer would miss the tokens in flight (and could even refuse).
    in_flight: u32,
    /// Bumped whenever a move lands.
    landed: watch::Sender<u64>,
    /// No fetch before this (the shard could not grant one lately).
    quiet_until: i64,
    last_seen: i64,
}

impl Entry {
    /// Whether the store might refuse `b` only because this bucket's tokens are on the
    /// move: a fetch takes at most half of what the shard last held, so a request for no
    /// more than that half finds it in the store whatever the fetch takes; a larger one,
    /// or one on a shard never seen, might not.
    fn tight_for(&self, b: &BucketClaim) -> bool {
        b.limits.iter().any(|c| {
            self.available
                .iter()
                .find(|(l, _)| *l == c.limit)
                .is_none_or(|(_, held)| c.amount > held / 2)
        })
    }

    fn new(now: i64) -> Entry {
        Entry {
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
    fn observe(&mut self, b: &BucketClaim, now: i64) {
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
    fn land(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
        self.landed.send_modify(|n| *n += 1);
    }

    fn hot(&self, options: &LeaseOptions) -> bool {
        self.rate >= options.hot_rate
    }

    /// Whether this bucket should fetch a lease now, and if so marks the fetch begun.
    fn wants(&mut self, options: &LeaseOptions, now: i64) -> bool {
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

/// One limit a lease is wanted for.
#[derive(Debug, Clone)]
pub(super) struct WantedLimit {
    /// The limit, its parameters and the amount of the last request.
    pub claim: LimitClaim,
    pub demand: Demand,
    /// What the store last said the shard holds (`None`: not known yet).
    pub available: Option<i64>,
}

/// A bucket that wants a lease: what a fetch sizes and asks for.
#[derive(Debug, Clone)]
pub(super) struct Want {
    /// The bucket (shard 0 stands for all of them).
    pub bucket: BucketKey,
    pub limits: SmallVec<[WantedLimit; 2]>,
}

/// The unused rest of a lease, to be credited back to its shard.
#[derive(Debug, Clone)]
pub(super) struct Return {
    pub key: BucketKey,
    pub shard_count: u32,
    /// Per limit: name, parameters, millitokens.
    pub rest: SmallVec<[(Name, LimitParams, i64); 2]>,
}

/// What the book answers a request.
// The decision is returned by value, as the engine returns it: boxing it would allocate
// on every request served from a lease.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(super) enum Served {
    /// Every bucket was covered: answered, nothing to do on the store.
    Answered(Decision),
    /// Not covered: these leases were short for the request and must go back to their
    /// shards before the store decides it (their tokens would otherwise be refused).
    Missed(Vec<Return>),
    /// Not covered while a lease of one of its buckets is in flight: ask again once it
    /// has landed.
    Wait(Landing),
}

/// A move of a bucket's tokens under way, which a request may wait for.
#[derive(Debug)]
pub(super) struct Landing {
    /// Changes when the move lands.
    pub landed: watch::Receiver<u64>,
    /// The store might refuse the request only because of the tokens on the move (see
    /// [`Entry::tight_for`]); otherwise waiting only makes the `remaining` it reports
    /// exact.
    pub tight: bool,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<BucketKey, Entry, Hasher>,
    wants: Vec<Want>,
    /// Set at shutdown: no fetch is wanted any more.
    closed: bool,
}

#[derive(Debug)]
pub(crate) struct LeaseBook {
    options: LeaseOptions,
    state: Mutex<State>,
    /// Wakes the lease task when a bucket wants a lease (a permit is kept when it is busy).
    wanted: Notify,
}

fn return_of(entity: &Name, resource: &Name, l: ShardLease) -> Option<Return> {
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

impl LeaseBook {
    pub(crate) fn new(options: LeaseOptions) -> LeaseBook {
        LeaseBook {
            options,
            state: Mutex::default(),
            wanted: Notify::new(),
        }
    }

    pub(super) fn options(&self) -> &LeaseOptions {
        &self.options
    }

    pub(super) fn wanted(&self) -> &Notify {
        &self.wanted
    }

    /// Counts `req` (when `count`: not when asked again after a wait) and answers it from
    /// the leases if they cover every bucket of it.
    pub(super) fn serve(&self, req: &Acquire, now: i64, count: bool) -> Served {
        let mut wanted = false;
        let mut waiting = None;
        let served = {
            let mut st = self.state.lock();
            let st = &mut *st;
            for b in req.buckets.iter().filter(|b| !b.strict && count) {
                let id = BucketKey::new(&b.entity, &b.resource, 0);
                if let Some(e) = st.entries.get_mut(&id) {
                    e.observe(b, now);
                } else if st.entries.len() < MAX_TRACKED {
                    let mut e = Entry::new(now);
                    e.observe(b, now);
                    st.entries.insert(id, e);
                }
            }
            let covering: Option<SmallVec<[usize; 2]>> = req
                .buckets
                .iter()
                .map(|b| {
                    if b.strict {
                        return None;
                    }
                    let e = st.entries.get(&BucketKey::new(&b.entity, &b.resource, 0))?;
                    e.leases.iter().position(|l| l.covers(b, now))
                })
                .collect();
            let served = match covering {
                Some(at) if !req.buckets.is_empty() => {
                    let buckets = req
                        .buckets
                        .iter()
                        .zip(at)
                        .map(|(b, i)| {
                            let id = BucketKey::new(&b.entity, &b.resource, 0);
                            let e = st.entries.get_mut(&id).expect("covered above");
                            take(&mut e.leases[i], b)
                        })
                        .collect();
                    Served::Answered(Decision {
                        admitted: true,
                        buckets,
                    })
                }
                _ => {
                    let in_flight = req.buckets.iter().filter(|b| !b.strict).find_map(|b| {
                        st.entries
                            .get(&BucketKey::new(&b.entity, &b.resource, 0))
                            .filter(|e| e.in_flight > 0)
                            .map(|e| (e, b))
                    });
                    if let Some((e, b)) = in_flight.filter(|_| count) {
                        return Served::Wait(Landing {
                            landed: e.landed.subscribe(),
                            tight: e.tight_for(b),
                        });
                    }
                    let mut returns = Vec::new();
                    for b in req.buckets.iter().filter(|b| !b.strict) {
                        let id = BucketKey::new(&b.entity, &b.resource, 0);
                        let Some(e) = st.entries.get_mut(&id) else {
                            continue;
                        };
                        if e.leases.iter().any(|l| l.covers(b, now)) {
                            continue;
                        }
                        // Short or expired for this request: the store decides it, with
                        // these tokens back where every server can see them.
                        for l in std::mem::take(&mut e.leases) {
                            returns.extend(return_of(&b.entity, &b.resource, l));
                        }
                    }
                    Served::Missed(returns)
                }
            };
            if !st.closed {
                for b in req.buckets.iter().filter(|b| !b.strict) {
                    let id = BucketKey::new(&b.entity, &b.resource, 0);
                    let Some(e) = st.entries.get_mut(&id) else {
                        continue;
                    };
                    if e.wants(&self.options, now) {
                        let limits = e
                            .limits
                            .iter()
                            .map(|c| {
                                let d = e.demand.iter().find(|(l, _)| *l == c.limit).map_or(
                                    Demand {
                                        per_s: 0,
                                        largest: c.amount,
                                    },
                                    |(_, d)| *d,
                                );
                                WantedLimit {
                                    claim: c.clone(),
                                    demand: d,
                                    available: e
                                        .available
                                        .iter()
                                        .find(|(l, _)| *l == c.limit)
                                        .map(|(_, a)| *a),
                                }
                            })
                            .collect();
                        // This request waits for the fetch it asked for rather than race
                        // it to the store (unless it has leases to give back first).
                        let wait =
                            matches!(&served, Served::Missed(r) if r.is_empty()).then(|| Landing {
                                landed: e.landed.subscribe(),
                                tight: e.tight_for(b),
                            });
                        st.wants.push(Want { bucket: id, limits });
                        wanted = true;
                        if let Some(rx) = wait.filter(|_| count) {
                            waiting = Some(rx);
                        }
                    }
                }
            }
            match waiting {
                Some(landing) => Served::Wait(landing),
                None => served,
            }
        };
        if wanted {
            self.wanted.notify_one();
        }
        served
    }

    /// Notes what the store said of each bucket of a decision it made (not one answered
    /// from a lease): the balance each shard was left with. Then adds to what the
    /// decision reports the tokens this process still holds in leases of the bucket, so
    /// a request decided by the store reports what a request answered from a lease does.
    pub(super) fn saw(&self, req: &Acquire, decision: &mut Decision, now: i64) {
        let mut st = self.state.lock();
        for (b, o) in req.buckets.iter().zip(decision.buckets.iter_mut()) {
            if b.strict || o.from_lease {
                continue;
            }
            let Some(e) = st
                .entries
                .get_mut(&BucketKey::new(&b.entity, &b.resource, 0))
            else {
                continue;
            };
            note_available(&mut e.available, b.limits.iter().zip(&o.limits));
            for (c, l) in b.limits.iter().zip(o.limits.iter_mut()) {
                let held: i64 = e
                    .leases
                    .iter()
                    .filter(|lease| now < lease.expires_ms)
                    .flat_map(|lease| lease.limits.iter())
                    .filter(|h| h.limit == c.limit && h.params == c.params)
                    .map(|h| h.rest.max(0))
                    .sum();
                if held > 0 {
                    let most = if decision.admitted {
                        l.share.ceiling.saturating_sub(c.amount)
                    } else {
                        l.share.ceiling
                    };
                    l.remaining = l.remaining.saturating_add(held).min(most.max(l.remaining));
                }
            }
        }
    }

    /// The buckets that want a lease now (each is marked as fetching until
    /// [`LeaseBook::granted`] or [`LeaseBook::declined`]).
    pub(super) fn take_wants(&self) -> Vec<Want> {
        let mut st = self.state.lock();
        std::mem::take(&mut st.wants)
    }

    /// Records a grant: `outcome` is the shard's answer to the lease's debit of `sizes`
    /// (per limit, in the order of `limits`).
    pub(super) fn granted(
        &self,
        bucket: &BucketKey,
        limits: &[LimitClaim],
        outcome: &BucketOutcome,
        now: i64,
    ) {
        let mut st = self.state.lock();
        let e = st
            .entries
            .entry(bucket.clone())
            .or_insert_with(|| Entry::new(now));
        e.fetching = false;
        e.land();
        note_available(&mut e.available, limits.iter().zip(&outcome.limits));
        let expires_ms = now + self.options.lifetime_ms;
        let held = |c: &LimitClaim, o: &LimitOutcome| HeldLimit {
            limit: c.limit.clone(),
            params: c.params,
            share: o.share,
            granted: c.amount,
            rest: c.amount,
            shard_left: o.remaining,
        };
        match e
            .leases
            .iter_mut()
            .find(|l| l.shard == outcome.shard && l.shard_count == outcome.shard_count)
        {
            Some(l) => {
                for (c, o) in limits.iter().zip(&outcome.limits) {
                    match l.limits.iter_mut().find(|h| h.limit == c.limit) {
                        Some(h) if h.params == c.params => {
                            h.rest = h.rest.saturating_add(c.amount);
                            h.granted = c.amount;
                            h.shard_left = o.remaining;
                            h.share = o.share;
                        }
                        Some(h) => *h = held(c, o),
                        None => l.limits.push(held(c, o)),
                    }
                }
                l.expires_ms = expires_ms;
                l.stamp = outcome.stamp;
            }
            None => e.leases.push(ShardLease {
                shard: outcome.shard,
                shard_count: outcome.shard_count,
                stamp: outcome.stamp,
                expires_ms,
                limits: limits
                    .iter()
                    .zip(&outcome.limits)
                    .map(|(c, o)| held(c, o))
                    .collect(),
            }),
        }
    }

    /// Puts `b`'s claims back into the lease of `shard` (sized for `shard_count`) that
    /// answered them (a refund of a decision served from it); `false` when that lease is
    /// gone (returned since), and the tokens must go to the shard itself.
    pub(super) fn restore(&self, b: &BucketClaim, shard: u32, shard_count: u32) -> bool {
        let mut st = self.state.lock();
        let Some(e) = st
            .entries
            .get_mut(&BucketKey::new(&b.entity, &b.resource, 0))
        else {
            return false;
        };
        let Some(l) = e
            .leases
            .iter_mut()
            .find(|l| l.shard == shard && l.shard_count == shard_count)
        else {
            return false;
        };
        let held: Option<SmallVec<[usize; 2]>> = b
            .limits
            .iter()
            .map(|c| l.limits.iter().position(|h| h.limit == c.limit))
            .collect();
        let Some(held) = held else { return false };
        for (c, i) in b.limits.iter().zip(held) {
            l.limits[i].rest = l.limits[i].rest.saturating_add(c.amount);
        }
        true
    }

    /// Records a fetch that got no lease: no other fetch for a while.
    pub(super) fn declined(&self, bucket: &BucketKey, now: i64) {
        let mut st = self.state.lock();
        if let Some(e) = st.entries.get_mut(bucket) {
            e.fetching = false;
            e.land();
            e.quiet_until = now + self.options.lifetime_ms / 4;
        }
    }

    /// Takes out every lease expired at `now`, and forgets buckets idle for a while.
    pub(super) fn expire(&self, now: i64) -> Vec<Return> {
        let idle_ms = 4 * self.options.lifetime_ms.max(WINDOW_MS);
        let mut st = self.state.lock();
        let mut returns = Vec::new();
        st.entries.retain(|id, e| {
            let (expired, live): (SmallVec<[ShardLease; 1]>, _) = std::mem::take(&mut e.leases)
                .into_iter()
                .partition(|l| now >= l.expires_ms);
            e.leases = live;
            for l in expired {
                if let Some(r) = return_of(&id.entity, &id.resource, l) {
                    e.in_flight += 1;
                    returns.push(r);
                }
            }
            e.fetching || e.in_flight > 0 || !e.leases.is_empty() || now - e.last_seen < idle_ms
        });
        returns
    }

    /// Records that the returns [`LeaseBook::expire`] handed out have landed.
    pub(super) fn returned(&self, returns: &[Return]) {
        let mut st = self.state.lock();
        for r in returns {
            if let Some(e) = st
                .entries
                .get_mut(&BucketKey::new(&r.key.entity, &r.key.resource, 0))
            {
                e.land();
            }
        }
    }

    /// Takes out every lease and wants no more (shutdown).
    pub(super) fn close(&self) -> Vec<Return> {
        let mut st = self.state.lock();
        st.closed = true;
        st.wants.clear();
        let mut returns = Vec::new();
        for (id, e) in st.entries.iter_mut() {
            for l in std::mem::take(&mut e.leases) {
                returns.extend(return_of(&id.entity, &id.resource, l));
            }
        }
        returns
    }

    /// Millitokens held in leases now, over all buckets and limits.
    pub(crate) fn outstanding(&self) -> i64 {
        let st = self.state.lock();
        st.entries
            .values()
            .flat_map(|e| e.leases.iter())
            .map(ShardLease::outstanding)
            .sum()
    }

    /// How often the lease task looks for expired leases.
    pub(super) fn tick(&self) -> Duration {
        Duration::from_millis((self.options.lifetime_ms / 10).clamp(10, 250) as u64)
    }
}

fn note_available<'a>(
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
fn take(lease: &mut ShardLease, b: &BucketClaim) -> BucketOutcome {
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
                ra: c.params.ra,
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

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_800_000_000_000;

    fn claim(amount: i64) -> BucketClaim {
        BucketClaim {
            entity: "e".into(),
            resource: "r".into(),
            limits: smallvec::smallvec![LimitClaim {
                limit: "l".into(),
                params: LimitParams::new(1_000_000, 1_000_000, 1_000),
                amount,
                forced: false,
            }],
            cascades: false,
            strict: false,
        }
    }

    fn one(b: BucketClaim) -> Acquire {
        Acquire {
            buckets: smallvec::smallvec![b],
        }
    }

    fn book() -> LeaseBook {
        LeaseBook::new(LeaseOptions::default())
    }

    /// `n` requests of one token spread evenly over `ms` from `start`; those not
    /// answered from a lease are decided by the store (admitted, the shard left at
    /// 900,000 tokens) and the book sees it.
    fn drive(book: &LeaseBook, b: &BucketClaim, start: i64, ms: i64, n: i64) -> Vec<Served> {
        (0..n)
            .map(|i| {
                let now = start + i * ms / n;
                let req = one(b.clone());
                let served = book.serve(&req, now, true);
                if !matches!(served, Served::Answered(_)) {
                    book.saw(&req, &mut stored(b, 900_000_000), now);
                }
                served
            })
            .collect()
    }

    /// The store's decision of `b`, admitted, the shard left with `remaining`.
    fn stored(b: &BucketClaim, remaining: i64) -> Decision {
        let share = b.limits[0].params.share(1);
        Decision {
            admitted: true,
            buckets: smallvec::smallvec![BucketOutcome {
                shard: 0,
                shard_count: 1,
                stamp: Stamp::default(),
                limits: b
                    .limits
                    .iter()
                    .map(|_| LimitOutcome {
                        fits: true,
                        remaining,
                        share,
                        ra: share.ra,
                        wait_ms: Some(0),
                    })
                    .collect(),
                from_lease: false,
            }],
        }
    }

    fn grant(book: &LeaseBook, want: &Want, now: i64) {
        let limits: Vec<LimitClaim> = want
            .limits
            .iter()
            .map(|w| LimitClaim {
                amount: 100_000,
                ..w.claim.clone()
            })
            .collect();
        let share = limits[0].params.share(1);
        let outcome = BucketOutcome {
            shard: 0,
            shard_count: 1,
            stamp: Stamp::default(),
            limits: limits
                .iter()
                .map(|_| LimitOutcome {
                    fits: true,
                    remaining: 500_000,
                    share,
                    ra: share.ra,
                    wait_ms: Some(0),
                })
                .collect(),
            from_lease: false,
        };
        book.granted(&want.bucket, &limits, &outcome, now);
    }

    #[test]
    fn a_bucket_the_store_has_not_decided_wants_no_lease() {
        let book = book();
        let req = one(claim(1_000));
        // Hot, but every store call failed (or missed its deadline): nothing was seen.
        for i in 0..60 {
            book.serve(&req, T0 + i * 10, true);
        }
        assert!(book.take_wants().is_empty());
        book.saw(&req, &mut stored(&claim(1_000), 900_000_000), T0 + 600);
        book.serve(&req, T0 + 610, true);
        assert_eq!(
            book.take_wants().len(),
            1,
            "wanted once the shard's balance is known"
        );
    }

    #[test]
    fn a_cold_bucket_wants_no_lease() {
        let book = book();
        // 4 requests in a second: below the threshold.
        drive(&book, &claim(1_000), T0, 1_000, 4);
        assert!(book.take_wants().is_empty());
    }

    #[test]
    fn a_hot_bucket_wants_one_lease_at_a_time_and_is_served_from_it() {
        let book = book();
        let b = claim(1_000);
        drive(&book, &b, T0, 300, 30); // 100/s over the first window
        let wants = book.take_wants();
        assert_eq!(wants.len(), 1, "{wants:?}");
        assert_eq!(wants[0].limits[0].demand.per_s, 100_000, "{wants:?}");
        drive(&book, &b, T0 + 300, 100, 10);
        assert!(
            book.take_wants().is_empty(),
            "one fetch in flight per bucket"
        );

        grant(&book, &wants[0], T0 + 400);
        let Served::Answered(d) = book.serve(&one(b.clone()), T0 + 401, true) else {
            panic!("covered");
        };
        assert!(d.admitted);
        // The shard's 500 after the grant, and 99 of the lease's 100 left.
        assert_eq!(d.buckets[0].limits[0].remaining, 599_000);
        assert_eq!(book.outstanding(), 99_000);
    }

    #[test]
    fn a_request_larger_than_the_rest_sends_the_lease_back_first() {
        let book = book();
        let b = claim(1_000);
        drive(&book, &b, T0, 300, 30);
        let wants = book.take_wants();
        grant(&book, &wants[0], T0 + 300);
        let Served::Missed(returns) = book.serve(&one(claim(150_000)), T0 + 301, true) else {
            panic!("150 tokens do not fit in a lease of 100");
        };
        assert_eq!(returns.len(), 1);
        assert_eq!(returns[0].rest[0].2, 100_000);
        assert_eq!(book.outstanding(), 0);
    }

    #[test]
    fn a_strict_bucket_is_never_served_from_a_lease() {
        let book = book();
        let mut b = claim(1_000);
        b.strict = true;
        drive(&book, &b, T0, 600, 60);
        assert!(book.take_wants().is_empty());
        assert!(matches!(book.serve(&one(b), T0 + 700, true), Served::Missed(r) if r.is_empty()));
    }

    #[test]
    fn leases_expire_and_everything_goes_back_at_close() {
        let book = book();
        let b = claim(1_000);
        drive(&book, &b, T0, 300, 30);
        let wants = book.take_wants();
        grant(&book, &wants[0], T0 + 300);
        assert!(book.expire(T0 + 1_299).is_empty(), "still live");
        let returned = book.expire(T0 + 1_300);
        assert_eq!(returned.len(), 1);
        assert_eq!(book.outstanding(), 0);
        // The shard held 500 tokens after the grant.
        assert!(
            matches!(
                book.serve(&one(claim(300_000)), T0 + 1_300, true),
                Served::Wait(Landing { tight: true, .. })
            ),
            "a request for more than half of it waits for the return in flight"
        );
        assert!(
            matches!(
                book.serve(&one(claim(250_000)), T0 + 1_300, true),
                Served::Wait(Landing { tight: false, .. })
            ),
            "one the store holds enough for need not"
        );
        book.returned(&returned);

        drive(&book, &b, T0 + 1_300, 300, 30);
        let wants = book.take_wants();
        assert_eq!(wants.len(), 1);
        grant(&book, &wants[0], T0 + 1_600);
        assert_eq!(book.close().len(), 1);
        drive(&book, &b, T0 + 1_600, 600, 60);
        assert!(book.take_wants().is_empty(), "closed");
    }

    #[test]
    fn the_book_is_bounded() {
        let book = book();
        for i in 0..(MAX_TRACKED + 10) {
            let mut b = claim(1_000);
            b.entity = format!("e{i}").into();
            book.serve(&one(b), T0, true);
        }
        assert_eq!(book.state.lock().entries.len(), MAX_TRACKED);
        assert_eq!(book.expire(T0 + 10_000).len(), 0);
        assert_eq!(
            book.state.lock().entries.len(),
            0,
            "idle buckets are forgotten"
        );
    }
}

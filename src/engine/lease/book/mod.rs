//! The lease book: what this process holds and sees of the buckets it serves in demand —
//! the demand of the last window, the leases held (per shard), whether a fetch is in
//! flight. It answers a request from the leases when every bucket of it is covered, all
//! or nothing; otherwise it says which leases to give back first and which buckets want
//! one. No store and no clock: the caller brings `now` and does the I/O.
//!
//! It scales with the requests and the buckets: it is split into [`PARTS`] partitions by
//! the bucket's hash, each under its own lock (a request locks only its buckets'
//! partitions, in order), and looks a bucket up by reference to the request's names. A
//! bucket enters the book only when its demand, counted in its partition's sketch
//! (`demand.rs`), could make it hot; until then it costs a count and no allocation, so a
//! churn of cold buckets cannot crowd a hot one out (`part.rs` makes room by forgetting
//! the coldest). Strict buckets never touch it.

mod demand;
mod entry;
mod moves;
mod part;
mod seen;

use crate::engine::partitioned::Hasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;
use tokio::sync::Notify;

use super::super::{Acquire, Decision, LimitClaim};
use super::LeaseOptions;
use crate::engine::{BucketClaim, BucketOutcome};
use crate::store::BucketKey;
#[cfg(test)]
use entry::Entry;
use entry::{note_available, return_of, take, HeldLimit, ShardLease};
use part::Part;

pub(super) use moves::{Landing, Return, Served, Want, WantedLimit};
pub use seen::{BucketLeases, HeldTokens, TrackedBucket};

/// The demand window: rates are measured over at least this long.
pub(super) const WINDOW_MS: i64 = 250;

/// Most buckets tracked at once (a [`PARTS`]th of it per partition): beyond it a bucket
/// in demand enters only in place of a cold one.
pub(super) const MAX_TRACKED: usize = 10_000;

/// Independently locked partitions (a power of two).
const PARTS: usize = 32;

/// Buckets tracked per partition, at most.
const PER_PART: usize = MAX_TRACKED.div_ceil(PARTS);

/// Where a bucket is filed: its hash (computed once a request) and its partition.
#[derive(Debug, Clone, Copy)]
struct Spot {
    hash: u64,
    part: usize,
}

/// The fetches wanted and not yet taken by the lease task.
#[derive(Debug, Default)]
struct Wants {
    list: Vec<Want>,
    /// Set at shutdown: no fetch is wanted any more.
    closed: bool,
}

#[derive(Debug)]
pub(crate) struct LeaseBook {
    options: LeaseOptions,
    parts: Box<[CachePadded<Mutex<Part>>]>,
    /// Hashes a bucket's names to its [`Spot`].
    hasher: Hasher,
    /// Taken only when a bucket wants a lease, and by the lease task.
    wants: Mutex<Wants>,
    /// [`Wants::closed`], read without its lock on the request path.
    closed: AtomicBool,
    /// Wakes the lease task when a bucket wants a lease (a permit is kept when it is busy).
    wanted: Notify,
}

/// The partitions a request's buckets are filed in, locked in ascending order (so two
/// requests on the same partitions never wait for each other crosswise).
struct Locked<'a> {
    guards: SmallVec<[(usize, MutexGuard<'a, Part>); 2]>,
}

impl<'a> Locked<'a> {
    fn new(parts: &'a [CachePadded<Mutex<Part>>], spots: &[Option<Spot>]) -> Locked<'a> {
        let mut at: SmallVec<[usize; 4]> = spots.iter().flatten().map(|s| s.part).collect();
        at.sort_unstable();
        at.dedup();
        Locked {
            // A spot's part is below `PARTS`, the parts' number: `get` finds each one.
            guards: at
                .into_iter()
                .filter_map(|i| Some((i, parts.get(i)?.lock())))
                .collect(),
        }
    }

    #[expect(clippy::expect_used, reason = "every spot's partition is locked")]
    fn part(&mut self, i: usize) -> &mut Part {
        let (_, guard) = self
            .guards
            .iter_mut()
            .find(|(j, _)| *j == i)
            .expect("every spot's partition is locked");
        guard
    }

    /// The entry of `b` filed at `spot`, when tracked.
    fn entry(&mut self, b: &BucketClaim, spot: Spot) -> Option<&mut entry::Entry> {
        self.part(spot.part)
            .get_mut(&b.entity, &b.resource, spot.hash)
    }
}

impl LeaseBook {
    pub(crate) fn new(options: LeaseOptions) -> LeaseBook {
        LeaseBook {
            options,
            parts: (0..PARTS)
                .map(|_| CachePadded::new(Mutex::default()))
                .collect(),
            hasher: Hasher::default(),
            wants: Mutex::default(),
            closed: AtomicBool::new(false),
            wanted: Notify::new(),
        }
    }

    pub(super) fn options(&self) -> &LeaseOptions {
        &self.options
    }

    pub(super) fn wanted(&self) -> &Notify {
        &self.wanted
    }

    fn spot(&self, entity: &str, resource: &str) -> Spot {
        let hash = std::hash::BuildHasher::hash_one(&self.hasher, (entity, resource));
        // Bits neither the partition's table (the lowest, the top seven) nor its sketch
        // index by, so each partition's buckets spread over both.
        Spot {
            hash,
            part: (hash >> 32) as usize % PARTS,
        }
    }

    /// The partition of `spot`, locked alone.
    #[expect(
        clippy::indexing_slicing,
        reason = "a spot's part is reduced modulo PARTS, the parts' number"
    )]
    fn part(&self, spot: Spot) -> MutexGuard<'_, Part> {
        self.parts[spot.part].lock()
    }

    /// Counts `req` (when `count`: not when asked again after a wait) and answers it from
    /// the leases if they cover every bucket of it.
    pub(super) fn serve(&self, req: &Acquire, now: i64, count: bool) -> Served {
        let spots: SmallVec<[Option<Spot>; 4]> = req
            .buckets
            .iter()
            .map(|b| (!b.strict).then(|| self.spot(&b.entity, &b.resource)))
            .collect();
        if spots.iter().all(Option::is_none) {
            // Strict or empty: nothing a lease could answer, nothing to count.
            return Served::Missed(Vec::new());
        }
        let mut locked = Locked::new(&self.parts, &spots);
        if count {
            for (b, spot) in req.buckets.iter().zip(spots.iter().copied()) {
                if let Some(s) = spot {
                    locked
                        .part(s.part)
                        .observe(b, s.hash, now, &self.options, PER_PART);
                }
            }
        }
        let served = self.answer(&mut locked, req, &spots, now, count);
        let (wanted, waiting) = self.ask_fetches(&mut locked, req, &spots, now, count, &served);
        drop(locked);
        if wanted {
            self.wanted.notify_one();
        }
        match waiting {
            Some(landing) => Served::Wait(landing),
            None => served,
        }
    }

    /// `req` answered from the leases when they cover every bucket of it; else a wait for
    /// a fetch in flight (when `count`), or a miss with the leases that no longer cover
    /// their bucket taken out to be given back.
    #[expect(
        clippy::expect_used,
        clippy::indexing_slicing,
        reason = "covered: each entry and lease was found above, under the same locks"
    )]
    fn answer(
        &self,
        locked: &mut Locked<'_>,
        req: &Acquire,
        spots: &[Option<Spot>],
        now: i64,
        count: bool,
    ) -> Served {
        let tracked = || req.buckets.iter().zip(spots.iter().copied());
        let covering: Option<SmallVec<[usize; 2]>> = tracked()
            .map(|(b, spot)| {
                let e = locked.entry(b, spot?)?;
                e.leases.iter().position(|l| l.covers(b, now))
            })
            .collect();
        if let Some(at) = covering {
            let buckets = tracked()
                .zip(at)
                .map(|((b, spot), i)| {
                    let e = locked
                        .entry(b, spot.expect("covered"))
                        .expect("covered above");
                    take(&mut e.leases[i], b)
                })
                .collect();
            return Served::Answered(Decision {
                admitted: true,
                buckets,
            });
        }
        if count {
            for (b, spot) in tracked() {
                let Some(e) = spot.and_then(|s| locked.entry(b, s)) else {
                    continue;
                };
                if e.in_flight > 0 {
                    return Served::Wait(Landing {
                        landed: e.landed.subscribe(),
                        tight: e.tight_for(b),
                    });
                }
            }
        }
        let mut returns = Vec::new();
        for (b, spot) in tracked() {
            let Some(e) = spot.and_then(|s| locked.entry(b, s)) else {
                continue;
            };
            if e.leases.iter().any(|l| l.covers(b, now)) {
                continue;
            }
            // Short or expired for this request: the store decides it, with these tokens
            // back where every server can see them.
            for l in std::mem::take(&mut e.leases) {
                returns.extend(return_of(&b.entity, &b.resource, l));
            }
        }
        Served::Missed(returns)
    }

    /// Files a fetch for each bucket of `req` that wants a lease (unless the book is
    /// closed). Returns whether any was filed, and the landing `req` waits for when it
    /// asked for a fetch and has nothing to give back (`served`: how it was answered).
    fn ask_fetches(
        &self,
        locked: &mut Locked<'_>,
        req: &Acquire,
        spots: &[Option<Spot>],
        now: i64,
        count: bool,
        served: &Served,
    ) -> (bool, Option<Landing>) {
        let mut wanted = false;
        let mut waiting = None;
        if self.closed.load(Ordering::Acquire) {
            return (wanted, waiting);
        }
        for (b, spot) in req.buckets.iter().zip(spots.iter().copied()) {
            let Some(e) = spot.and_then(|s| locked.entry(b, s)) else {
                continue;
            };
            if !e.wants(&self.options, now) {
                continue;
            }
            {
                let mut wants = self.wants.lock();
                if wants.closed {
                    // Closed meanwhile: the fetch will never be made.
                    e.fetching = false;
                    e.land();
                    continue;
                }
                wants.list.push(e.want());
            }
            wanted = true;
            // This request waits for the fetch it asked for rather than race it to the
            // store (unless it has leases to give back first).
            if count && matches!(served, Served::Missed(r) if r.is_empty()) {
                waiting = Some(Landing {
                    landed: e.landed.subscribe(),
                    tight: e.tight_for(b),
                });
            }
        }
        (wanted, waiting)
    }

    /// Notes what the store said of each bucket of a decision it made (not one answered
    /// from a lease): the balance each shard was left with. Then adds to what the
    /// decision reports the tokens this process still holds in leases of the bucket, so
    /// a request decided by the store reports what a request answered from a lease does.
    pub(super) fn saw(&self, req: &Acquire, decision: &mut Decision, now: i64) {
        let admitted = decision.admitted;
        for (b, o) in req.buckets.iter().zip(decision.buckets.iter_mut()) {
            if b.strict || o.from_lease {
                continue;
            }
            let spot = self.spot(&b.entity, &b.resource);
            let mut part = self.part(spot);
            let Some(e) = part.get_mut(&b.entity, &b.resource, spot.hash) else {
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
                    let most = if admitted {
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
        std::mem::take(&mut self.wants.lock().list)
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
        let spot = self.spot(&bucket.entity, &bucket.resource);
        let mut part = self.part(spot);
        let e = part.entry_for_grant(&bucket.entity, &bucket.resource, spot.hash, now);
        e.fetching = false;
        e.land();
        note_available(&mut e.available, limits.iter().zip(&outcome.limits));
        let expires_ms = now + self.options.lifetime_ms;
        let held = |c: &LimitClaim, o: &crate::engine::LimitOutcome| HeldLimit {
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
        let spot = self.spot(&b.entity, &b.resource);
        let mut part = self.part(spot);
        let Some(e) = part.get_mut(&b.entity, &b.resource, spot.hash) else {
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
            if let Some(h) = l.limits.get_mut(i) {
                h.rest = h.rest.saturating_add(c.amount);
            }
        }
        true
    }

    /// Records a fetch that got no lease: no other fetch for a while.
    pub(super) fn declined(&self, bucket: &BucketKey, now: i64) {
        let spot = self.spot(&bucket.entity, &bucket.resource);
        let mut part = self.part(spot);
        if let Some(e) = part.get_mut(&bucket.entity, &bucket.resource, spot.hash) {
            e.fetching = false;
            e.land();
            e.quiet_until = now + self.options.lifetime_ms / 4;
        }
    }

    /// Takes out every lease expired at `now`, and forgets buckets idle for a while: one
    /// partition locked at a time, each holding at most a [`PARTS`]th of the book.
    pub(super) fn expire(&self, now: i64) -> Vec<Return> {
        let idle_ms = 4 * self.options.lifetime_ms.max(WINDOW_MS);
        let mut returns = Vec::new();
        for part in self.parts.iter() {
            part.lock().retain(|e| {
                let (expired, live): (SmallVec<[ShardLease; 1]>, _) = std::mem::take(&mut e.leases)
                    .into_iter()
                    .partition(|l| now >= l.expires_ms);
                e.leases = live;
                for l in expired {
                    if let Some(r) = return_of(&e.entity, &e.resource, l) {
                        e.in_flight += 1;
                        returns.push(r);
                    }
                }
                e.fetching || e.in_flight > 0 || !e.leases.is_empty() || now - e.last_seen < idle_ms
            });
        }
        returns
    }

    /// Records that the returns [`LeaseBook::expire`] handed out have landed.
    pub(super) fn returned(&self, returns: &[Return]) {
        for r in returns {
            let spot = self.spot(&r.key.entity, &r.key.resource);
            if let Some(e) = self
                .part(spot)
                .get_mut(&r.key.entity, &r.key.resource, spot.hash)
            {
                e.land();
            }
        }
    }

    /// Takes out every lease and wants no more (shutdown).
    pub(super) fn close(&self) -> Vec<Return> {
        {
            let mut wants = self.wants.lock();
            wants.closed = true;
            wants.list.clear();
        }
        self.closed.store(true, Ordering::Release);
        let mut returns = Vec::new();
        for part in self.parts.iter() {
            for e in part.lock().entries_mut() {
                for l in std::mem::take(&mut e.leases) {
                    returns.extend(return_of(&e.entity, &e.resource, l));
                }
            }
        }
        returns
    }

    /// What the book holds of `(entity, resource)` at `now` (read only, for `explain`).
    pub(crate) fn seen(&self, entity: &str, resource: &str, now: i64) -> BucketLeases {
        let spot = self.spot(entity, resource);
        BucketLeases {
            hot_rate: self.options.hot_rate,
            tracked: self
                .part(spot)
                .get(entity, resource, spot.hash)
                .map(|e| seen::tracked(e, now)),
        }
    }

    /// Millitokens held in leases now, over all buckets and limits.
    pub(crate) fn outstanding(&self) -> i64 {
        self.parts
            .iter()
            .map(|part| {
                part.lock()
                    .entries()
                    .flat_map(|e| e.leases.iter())
                    .map(ShardLease::outstanding)
                    .sum::<i64>()
            })
            .sum()
    }

    /// How often the lease task looks for expired leases.
    pub(super) fn tick(&self) -> Duration {
        Duration::from_millis((self.options.lifetime_ms / 10).clamp(10, 250) as u64)
    }

    /// Buckets tracked now (tests).
    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.parts.iter().map(|p| p.lock().len()).sum()
    }

    /// Runs `f` on the entry of `(entity, resource)`, if tracked (tests).
    #[cfg(test)]
    fn with_entry<R>(
        &self,
        entity: &str,
        resource: &str,
        f: impl FnOnce(&Entry) -> R,
    ) -> Option<R> {
        let spot = self.spot(entity, resource);
        self.part(spot).get(entity, resource, spot.hash).map(f)
    }
}

#[cfg(test)]
mod tests;

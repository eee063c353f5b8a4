//! The lease work of one engine ([`Leasing`]): a request answered from leases, or the
//! leases too short for it given back before the store decides it; what the store decided
//! told to the book; the lease task (fetches and returns, supervised); a refund into a
//! lease. The book (`book/`) keeps the leases and the demand; `size.rs` is the arithmetic.

use crate::support::text::with_causes;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;

use futures::stream::{FuturesUnordered, StreamExt};
use smallvec::SmallVec;

use super::book::{Landing, LeaseBook, Return, Served, Want};
use super::options::LeaseOptions;
use super::size;

use crate::engine::acquire::Deciding;
use crate::engine::{Acquire, BucketClaim, Decision, Engine, EngineStats, LimitClaim};
use crate::store::{BucketStore, Credit, CreditGuard};

/// A request waits for a lease move at most this fraction of what is left of its
/// deadline (a quarter: 3.3 ms of the 13.3 ms Envoy's default 20 ms timeout leaves the
/// store), so the store still has three quarters to decide it.
pub const WAIT_SHARE_OF_DEADLINE: u32 = 4;

/// A caller with at least this long left waits (its share) for a move even when the store
/// holds enough for it: the store's answer then counts the tokens on the move, so the
/// `remaining` it reports is exact. One with less (Envoy's 20 ms leaves the store
/// 13.3 ms) goes to the store at once, whose answer may report up to a lease's tokens
/// too few remaining; what is admitted is the same.
pub const UNHURRIED: std::time::Duration = std::time::Duration::from_millis(100);

type Work<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// The lease work of one engine: its parts and its book. The engine hands one out only
/// when leases are on, and for answering requests only while the lease task lives
/// (`instance.rs`), so no step here asks again.
pub(crate) struct Leasing<'a, S: BucketStore> {
    engine: &'a Engine<S>,
    book: &'a LeaseBook,
}

impl<'a, S: BucketStore> Leasing<'a, S> {
    pub(crate) fn new(engine: &'a Engine<S>, book: &'a LeaseBook) -> Self {
        Leasing { engine, book }
    }

    /// Answers `req` from leases when they cover it; otherwise gives back first the
    /// leases too short for it, and returns `None` (the store decides). Waits for a lease
    /// move under way on its bucket at most [`Self::lease_patience`].
    pub(crate) async fn answer(
        &self,
        req: &Acquire,
        deadline: Option<tokio::time::Instant>,
    ) -> Option<Decision> {
        let book = self.book;
        let mut first = true;
        loop {
            match book.serve(req, self.engine.clock.now_ms(), first) {
                Served::Answered(decision) => {
                    EngineStats::bump(&self.engine.stats.lease_decisions);
                    return Some(decision);
                }
                Served::Missed(returns) => {
                    if !returns.is_empty() {
                        self.give_back_before_the_store(returns, deadline).await;
                    }
                    return None;
                }
                Served::Wait(Landing { mut landed, tight }) => {
                    // Once at most (the second look never waits): then the store decides,
                    // finding at least the half of the shard a lease leaves.
                    let patience = Self::lease_patience(book.options(), deadline, tight);
                    if !patience.is_zero() {
                        let waited = tokio::time::timeout(patience, landed.changed()).await;
                        if waited.is_err() {
                            EngineStats::bump(&self.engine.stats.lease_waits_cut);
                        }
                    }
                    first = false;
                }
            }
        }
    }

    /// How long a request may wait for a lease move: [`LeaseOptions::wait_ms`], and no
    /// more than a [`WAIT_SHARE_OF_DEADLINE`]th of what is left before `deadline`; not at
    /// all, when the store holds enough for it whatever the move (not `tight`) and the
    /// caller is in a hurry (less than [`UNHURRIED`] left).
    fn lease_patience(
        options: &LeaseOptions,
        deadline: Option<tokio::time::Instant>,
        tight: bool,
    ) -> std::time::Duration {
        let most = std::time::Duration::from_millis(options.wait_ms);
        let Some(deadline) = deadline else {
            return most;
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if !tight && left < UNHURRIED {
            return std::time::Duration::ZERO;
        }
        most.min(left / WAIT_SHARE_OF_DEADLINE)
    }

    /// Tells the lease book what the store decided (the balances it left).
    pub(crate) fn saw_decision(&self, req: &Acquire, decision: &mut Decision) {
        self.book.saw(req, decision, self.engine.clock.now_ms());
    }

    /// Fetches the leases wanted now, concurrently.
    pub(crate) async fn fetch_wanted(&self) {
        let wants = self.book.take_wants();
        futures::future::join_all(wants.into_iter().map(|w| self.fetch(w))).await;
    }

    /// Gives back every lease expired by now.
    pub(crate) async fn return_expired(&self) {
        let returns = self.book.expire(self.engine.clock.now_ms());
        if !returns.is_empty() {
            self.give_back_expired(returns).await;
        }
    }

    /// The lease task: fetches the leases hot buckets want and gives back expired ones,
    /// until `stop` resolves; then lets the fetches in flight land and gives everything
    /// back.
    ///
    /// Supervised: should it panic (a bug in the book, the store or the arithmetic),
    /// leasing turns off for good — every request goes to the store, none waits for a
    /// fetch that will never land — the leases held are given back, and the death is
    /// logged and counted (`lease_task_failures`). Returns then, without waiting for
    /// `stop`.
    pub(crate) async fn run(&self, stop: impl Future<Output = ()>) {
        let run = std::panic::AssertUnwindSafe(self.lease_loop(stop));
        if let Err(panic) = futures::FutureExt::catch_unwind(run).await {
            self.engine.leasing_failed.store(true, Ordering::Release);
            EngineStats::bump(&self.engine.stats.lease_task_failures);
            let returns = self.book.close();
            tracing::error!(
                panic = crate::support::text::panic_text(panic.as_ref(), 256),
                leases = returns.len(),
                "the lease task died: leasing is off until restart, the leases held are given back",
            );
            self.give_back(returns).await;
        }
    }

    /// [`Self::run`]'s loop.
    async fn lease_loop(&self, stop: impl Future<Output = ()>) {
        let book = self.book;
        let mut work: FuturesUnordered<Work<'_>> = FuturesUnordered::new();
        let mut tick = tokio::time::interval(book.tick());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => break,
                _ = book.wanted().notified() => {
                    for want in book.take_wants() {
                        work.push(Box::pin(self.fetch(want)));
                    }
                }
                Some(()) = work.next(), if !work.is_empty() => {}
                _ = tick.tick() => {
                    let returns = book.expire(self.engine.clock.now_ms());
                    if !returns.is_empty() {
                        work.push(Box::pin(self.give_back_expired(returns)));
                    }
                }
            }
        }
        // Grants in flight land in the book, and go back with the rest.
        while work.next().await.is_some() {}
        let returns = book.close();
        let n = returns.len();
        self.give_back(returns).await;
        tracing::info!(leases = n, "leases given back");
    }

    /// The claims a lease for `want` takes: for each limit, the size its demand calls for
    /// (`size.rs`), or what the shard can still give when that is still useful. `None`
    /// when some limit's lease would be too small to be worth a write.
    fn lease_claims(&self, want: &Want) -> Option<SmallVec<[LimitClaim; 2]>> {
        let options = self.book.options();
        let count = self
            .engine
            .shards
            .get(&want.bucket.entity, &want.bucket.resource);
        want.limits
            .iter()
            .map(|w| {
                let share = w.claim.params.share(count);
                let size =
                    size::lease_size(w.demand, options.lifetime_ms, share, options.share_divisor)?;
                let amount = match w.available {
                    Some(a) => size::what_fits(size, a, w.demand.largest)?,
                    None => size,
                };
                Some(LimitClaim {
                    amount,
                    forced: false,
                    ..w.claim.clone()
                })
            })
            .collect()
    }

    /// Takes one lease for `want`: a debit of the size its demand calls for, or of what
    /// the shard can still give when that is still useful; else none for a while.
    async fn fetch(&self, want: Want) {
        let book = self.book;
        let options = book.options();
        assert!(
            !options.panic_at_fetch,
            "SHARDGATE_DEBUG_LEASE_TASK_PANIC: the lease task panics at its first fetch"
        );
        let Some(mut limits) = self.lease_claims(&want) else {
            book.declined(&want.bucket, self.engine.clock.now_ms());
            return;
        };
        for attempt in 0..2 {
            let req = Acquire {
                buckets: smallvec::smallvec![BucketClaim {
                    entity: want.bucket.entity.clone(),
                    resource: want.bucket.resource.clone(),
                    limits: limits.clone(),
                    cascades: false,
                    strict: false,
                }],
            };
            match Deciding::new(self.engine, &req).decide().await {
                Ok(d) if d.admitted => {
                    EngineStats::bump(&self.engine.stats.leases_taken);
                    // The request carried one bucket: the decision answers that one.
                    if let Some(granted) = d.buckets.first() {
                        book.granted(&want.bucket, &limits, granted, self.engine.clock.now_ms());
                    }
                    return;
                }
                Ok(d) if attempt == 0 => {
                    // Take what fits, if that is still worth a lease.
                    let Some(o) = d.buckets.first() else {
                        break;
                    };
                    let fitted: Option<SmallVec<[LimitClaim; 2]>> = limits
                        .iter()
                        .zip(&o.limits)
                        .zip(&want.limits)
                        .map(|((c, l), w)| {
                            size::what_fits(c.amount, l.remaining, w.demand.largest).map(|amount| {
                                LimitClaim {
                                    amount,
                                    ..c.clone()
                                }
                            })
                        })
                        .collect();
                    match fitted {
                        Some(f) => limits = f,
                        None => break,
                    }
                }
                Ok(_) => break,
                Err(e) => {
                    tracing::debug!(resource = %want.bucket.resource, error = %with_causes(&e), "lease fetch failed");
                    break;
                }
            }
        }
        EngineStats::bump(&self.engine.stats.leases_refused);
        book.declined(&want.bucket, self.engine.clock.now_ms());
    }

    /// Gives back what a decision answered from a lease took: into that lease, or to its
    /// shard when the lease has gone back since (as a lease's rest: the tokens were taken).
    pub(crate) async fn refund_to_lease(&self, b: &BucketClaim, shard: u32, shard_count: u32) {
        let book = self.book;
        EngineStats::bump(&self.engine.stats.refunds);
        if book.restore(b, shard, shard_count) {
            return;
        }
        let rest = b
            .limits
            .iter()
            .filter(|c| c.amount > 0)
            .map(|c| (c.limit.clone(), c.params, c.amount))
            .collect();
        let key = crate::store::BucketKey::new(&b.entity, &b.resource, shard);
        self.give_back(vec![Return {
            key,
            shard_count,
            rest,
        }])
        .await;
    }

    /// Gives back leases too short for a request before the store decides it (so that it
    /// sees their tokens), waiting at most a [`WAIT_SHARE_OF_DEADLINE`]th of what is left
    /// of the caller's deadline; then the store decides without them. A give-back cut
    /// short lands later or not at all (its tokens stay taken): the bucket admits less,
    /// never more. Without a deadline, the store's own timeout bounds it.
    async fn give_back_before_the_store(
        &self,
        returns: Vec<Return>,
        deadline: Option<tokio::time::Instant>,
    ) {
        let Some(deadline) = deadline else {
            return self.give_back(returns).await;
        };
        let patience = deadline.saturating_duration_since(tokio::time::Instant::now())
            / WAIT_SHARE_OF_DEADLINE;
        if tokio::time::timeout(patience, self.give_back(returns))
            .await
            .is_err()
        {
            EngineStats::bump(&self.engine.stats.lease_waits_cut);
        }
    }

    /// Gives back leases [`LeaseBook::expire`] took out, then tells the book they landed.
    async fn give_back_expired(&self, returns: Vec<Return>) {
        let book = self.book;
        self.give_back(returns.clone()).await;
        book.returned(&returns);
    }

    /// Credits the rest of each lease back to its shard, under its ceiling and on
    /// condition that the shard count is still the one the lease was sized for.
    async fn give_back(&self, returns: Vec<Return>) {
        futures::future::join_all(returns.into_iter().map(|r| async move {
            let credits: Vec<Credit> = r
                .rest
                .iter()
                .map(|(limit, params, amount)| Credit {
                    limit: limit.clone(),
                    amount: *amount,
                    ceiling: params.share(r.shard_count).ceiling,
                    params: *params,
                })
                .collect();
            self.engine.rejections.credit(&r.key, &credits);
            EngineStats::bump(&self.engine.stats.leases_returned);
            match self
                .engine
                .store
                .credit(&r.key, CreditGuard::SameCount(r.shard_count), &credits)
                .await
            {
                Ok(applied) if applied.len() == credits.len() => {}
                // The shard doubled or refilled near its ceiling meanwhile: those tokens
                // stay taken until it refills (never an over-admission).
                Ok(_) => EngineStats::bump(&self.engine.stats.lease_returns_dropped),
                Err(e) => {
                    EngineStats::bump(&self.engine.stats.lease_returns_dropped);
                    if let Some(suppressed) = self.engine.lease_return_log.admit() {
                        tracing::warn!(resource = %r.key.resource, error = %with_causes(&e), similar_not_logged = suppressed, "lease return failed");
                    }
                }
            }
        }))
        .await;
    }
}

//! The [`Engine`] itself: its parts (store, clock, shard draw, caches, leases, counters),
//! its construction, the accessors the server and the tests use, and every call it
//! answers — each a few lines handing the work to the room that does it: a decision to
//! the lease book first and then to the acquire algorithm (`acquire/`, whose steps are
//! methods of one request's [`Deciding`]), the lease task to `lease/` ([`Leasing`]).
//! This is the only `impl Engine`: what the engine can be asked is all here.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures::future::join_all;

use super::acquire::Deciding;
use super::lease::Leasing;
use super::{
    inflight, lease, rejection, shard, Acquire, BucketLeases, Clock, Decision, EngineError,
    EngineOptions, EngineStats, EngineView, LimitParams, RandomDraw, ShardDraw, SystemClock,
};
use crate::store::BucketStore;

/// The engine: one per process, shared by every request.
pub struct Engine<S: BucketStore> {
    pub(super) store: Arc<S>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) draw: Arc<dyn ShardDraw>,
    pub(super) options: EngineOptions,
    pub(super) wcu: LimitParams,
    pub(super) shards: Arc<shard::ShardCounts>,
    pub(super) rejections: Arc<rejection::RejectionCache>,
    pub(super) slow_passes: inflight::SlowPasses,
    pub(super) leases: Option<Arc<lease::LeaseBook>>,
    /// Set when the lease task died: no request is answered from (or waits for) a lease
    /// any more, every one goes to the store (see `lease/mod.rs`).
    pub(super) leasing_failed: std::sync::atomic::AtomicBool,
    pub(super) stats: Arc<EngineStats>,
    pub(super) ceiling_log: crate::support::throttle::LogThrottle,
    /// A failed refund and a failed lease return, each at most one line per interval: a
    /// store outage fails every one of them, and each would be a line.
    pub(super) refund_log: crate::support::throttle::LogThrottle,
    pub(super) lease_return_log: crate::support::throttle::LogThrottle,
}

impl<S: BucketStore> std::fmt::Debug for Engine<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl<S: BucketStore> Engine<S> {
    pub fn new(store: Arc<S>, options: EngineOptions) -> Engine<S> {
        Self::with_parts(store, options, Arc::new(SystemClock), Arc::new(RandomDraw))
    }

    /// An engine with an explicit clock and shard draw (tests freeze both).
    pub fn with_parts(
        store: Arc<S>,
        options: EngineOptions,
        clock: Arc<dyn Clock>,
        draw: Arc<dyn ShardDraw>,
    ) -> Engine<S> {
        let budget = options.partition_write_budget.max(1);
        Engine {
            store,
            clock,
            draw,
            wcu: LimitParams::new(budget, budget, 1_000),
            shards: Arc::default(),
            rejections: Arc::new(rejection::RejectionCache::new(
                options.rejection_cache_ms,
                options.rejection_cache_entries,
            )),
            slow_passes: inflight::SlowPasses::default(),
            leases: options
                .leases
                .clone()
                .map(|o| Arc::new(lease::LeaseBook::new(o))),
            leasing_failed: std::sync::atomic::AtomicBool::new(false),
            options,
            stats: Arc::default(),
            ceiling_log: crate::support::throttle::LogThrottle::new(
                std::time::Duration::from_secs(10),
            ),
            refund_log: crate::support::throttle::LogThrottle::new(std::time::Duration::from_secs(
                10,
            )),
            lease_return_log: crate::support::throttle::LogThrottle::new(
                std::time::Duration::from_secs(10),
            ),
        }
    }

    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    pub fn stats(&self) -> &Arc<EngineStats> {
        &self.stats
    }

    /// A handle on the engine's counters, shard counts and rejection cache, for metrics.
    pub fn view(&self) -> EngineView {
        EngineView {
            stats: self.stats.clone(),
            shards: self.shards.clone(),
            rejections: self.rejections.clone(),
            leases: self.leases.clone(),
        }
    }

    /// Drops the rejection-cache entries no request can use any more (the server calls
    /// this on a timer; see `rejection.rs`). Returns how many were dropped.
    pub fn prune_rejections(&self) -> usize {
        self.rejections.prune(self.clock.now_ms())
    }

    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// The shard count this process knows for (entity, resource).
    pub fn known_shard_count(&self, entity: &str, resource: &str) -> u32 {
        self.shards.get(entity, resource)
    }

    /// Teaches the shard count cache (tests set up scenarios with it).
    pub fn learn_shard_count(&self, entity: &str, resource: &str, count: u32) {
        self.shards.learn(entity, resource, count);
    }

    /// Decides `req`: debits every gated claim (and every forced one), or nothing.
    pub async fn acquire(&self, req: &Acquire) -> Result<Decision, EngineError> {
        self.acquire_by(req, None).await
    }

    /// [`Self::acquire`] for a caller that gives up at `deadline`: a wait for a lease
    /// move takes at most a small part of what is left, so the store still decides in
    /// time (see `lease/mod.rs`). The deadline bounds nothing else: the caller holds the
    /// whole call to it.
    pub async fn acquire_by(
        &self,
        req: &Acquire,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Decision, EngineError> {
        if let Some(leasing) = self.leasing() {
            if let Some(decision) = Box::pin(leasing.answer(req, deadline)).await {
                return Ok(decision);
            }
        }
        let deciding = Deciding::new(self, req);
        let mut decision = match deciding.decide().await {
            Ok(d) => d,
            Err(e) => return deciding.busy_refusal(e),
        };
        if let Some(leasing) = self.leasing() {
            leasing.saw_decision(req, &mut decision);
        }
        if !decision.admitted {
            deciding.note_per_shard_ceiling(&decision);
        }
        Ok(decision)
    }

    /// Answers `req` from the store without writing: what each bucket would say now.
    pub async fn peek(&self, req: &Acquire) -> Result<Decision, EngineError> {
        Deciding::new(self, req).peek().await
    }

    /// Gives back what an admitted decision took (best effort; used when a request turns
    /// out refused after its debits, e.g. every quota-mode descriptor over): to the
    /// lease it was answered from, or to the shard it was debited on.
    pub async fn refund(&self, req: &Acquire, decision: &Decision) {
        if !decision.admitted {
            return;
        }
        let deciding = Deciding::new(self, req);
        let leases = self.leases();
        join_all(
            req.buckets
                .iter()
                .zip(&decision.buckets)
                .map(|(b, o)| async {
                    if !o.from_lease {
                        deciding
                            .credit_bucket(b, o.shard, o.shard_count, o.stamp)
                            .await;
                    } else if let Some(leases) = &leases {
                        leases.refund_to_lease(b, o.shard, o.shard_count).await;
                    }
                }),
        )
        .await;
    }

    /// Gives back tokens an admitted `taken` decision took and that were never spent (an
    /// RLQS fleet's unused draw): `req` claims how many, per bucket, and each goes to the
    /// shard `taken` took it from — into this process's lease when it came from one, else
    /// to the shard as a lease's rest is returned (under the shard's ceiling, only while
    /// its shard count is the same). Best effort: a return that does not land leaves the
    /// tokens taken (the bucket admits less, never more).
    pub async fn give_back(&self, req: &Acquire, taken: &Decision) {
        if !taken.admitted {
            return;
        }
        let deciding = Deciding::new(self, req);
        let leases = self.leases();
        join_all(req.buckets.iter().zip(&taken.buckets).map(|(b, o)| async {
            match (&leases, o.from_lease) {
                (Some(leases), true) => leases.refund_to_lease(b, o.shard, o.shard_count).await,
                _ => deciding.return_taken(b, o.shard, o.shard_count).await,
            }
        }))
        .await;
    }

    /// The lease task (see [`Leasing::run`]): runs until `stop` resolves, then gives every
    /// lease back. Returns at once (after `stop`) when leases are off.
    pub async fn run_leases(&self, stop: impl Future<Output = ()>) {
        match self.leases() {
            Some(leases) => leases.run(stop).await,
            None => stop.await,
        }
    }

    /// Fetches the leases wanted now, concurrently (tests call it to step the lease
    /// task by hand).
    pub async fn fetch_wanted_leases(&self) {
        if let Some(leases) = self.leases() {
            leases.fetch_wanted().await;
        }
    }

    /// Gives back every lease expired by now (tests call it to step the lease task).
    pub async fn return_expired_leases(&self) {
        if let Some(leases) = self.leases() {
            leases.return_expired().await;
        }
    }

    /// Millitokens this process holds in leases.
    pub fn leased_outstanding(&self) -> i64 {
        self.leases.as_ref().map_or(0, |b| b.outstanding())
    }

    /// What this process's lease book holds of `(entity, resource)` (for `explain`):
    /// `None` when leases are off, or off since the lease task died.
    pub fn leases_of(&self, entity: &str, resource: &str) -> Option<BucketLeases> {
        self.leasing()?;
        let book = self.leases.as_deref()?;
        Some(book.seen(entity, resource, self.clock.now_ms()))
    }

    /// The lease work, when leases are on (even after the lease task died: what it
    /// held still goes back).
    fn leases(&self) -> Option<Leasing<'_, S>> {
        Some(Leasing::new(self, self.leases.as_deref()?))
    }

    /// The lease work when requests are answered from leases: they are on, and the lease
    /// task lives.
    fn leasing(&self) -> Option<Leasing<'_, S>> {
        if self.leasing_failed.load(Ordering::Acquire) {
            return None;
        }
        self.leases()
    }
}

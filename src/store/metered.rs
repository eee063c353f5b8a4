//! A store wrapper that reports every contract call (operation, outcome, latency) to an
//! observer — the metrics — and to the count of the calling decision (`calls.rs`),
//! whatever store is underneath. It changes nothing else.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::calls;
use super::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Credit, CreditGuard, Debit, DebitMode,
    DebitOutcome, Seed, StoreError, Write,
};

/// One call's operation and outcome, as a store names them (DynamoDB: its API's
/// operation, `ok`, `condition_failed`, `conflict`, `throttled`, `error`, …).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallKind {
    pub operation: &'static str,
    pub outcome: &'static str,
}

/// Totals of one kind of call, as the store accounts them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CallTotals {
    pub calls: u64,
    /// Capacity units DynamoDB reported (`ReturnConsumedCapacity = TOTAL`).
    pub capacity: f64,
}

/// Receives one record per store call.
pub trait CallObserver: Send + Sync + 'static {
    fn observe(&self, operation: &'static str, outcome: &'static str, elapsed: Duration);
}

/// `S`, observed.
pub struct Metered<S: BucketStore> {
    inner: Arc<S>,
    observer: Arc<dyn CallObserver>,
}

impl<S: BucketStore> Metered<S> {
    pub fn new(inner: Arc<S>, observer: Arc<dyn CallObserver>) -> Metered<S> {
        Metered { inner, observer }
    }

    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    fn record<T>(
        &self,
        operation: &'static str,
        started: Instant,
        result: &Result<T, StoreError>,
        outcome: impl FnOnce(&T) -> &'static str,
    ) {
        let outcome = match result {
            Ok(v) => outcome(v),
            // Failed fast by the circuit breaker, or shed: the store was not called.
            Err(e @ (StoreError::CircuitOpen { .. } | StoreError::Shed { .. })) => {
                calls::add(-1);
                e.class()
            }
            // By class: only `error` is the store failing; throttling, contention, a
            // corrupt item or a refused key are one bucket's (or one request's).
            Err(e) => e.class(),
        };
        self.observer.observe(operation, outcome, started.elapsed());
    }
}

impl<S: BucketStore> BucketStore for Metered<S> {
    fn circuit(&self) -> Option<&'static str> {
        self.inner.circuit()
    }

    async fn debit(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
    ) -> Result<DebitOutcome, StoreError> {
        calls::add(1);
        let started = Instant::now();
        let r = self.inner.debit(key, debits, mode).await;
        self.record("debit", started, &r, |o| match o {
            DebitOutcome::Applied(_) => "applied",
            DebitOutcome::Refused(Some(_)) => "refused",
            DebitOutcome::Refused(None) => "missing",
        });
        r
    }

    async fn debit_or_create(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
        seed: &Seed<'_>,
    ) -> Result<DebitOutcome, StoreError> {
        calls::add(1);
        let started = Instant::now();
        let r = self.inner.debit_or_create(key, debits, mode, seed).await;
        self.record("debit", started, &r, |o| match o {
            DebitOutcome::Applied(_) => "applied",
            DebitOutcome::Refused(Some(_)) => "refused",
            DebitOutcome::Refused(None) => "missing",
        });
        r
    }

    async fn read(&self, keys: &[BucketKey]) -> Result<Vec<Option<BucketItem>>, StoreError> {
        calls::add(1);
        let started = Instant::now();
        let r = self.inner.read(keys).await;
        self.record("read", started, &r, |_| "ok");
        r
    }

    async fn commit(&self, writes: &[Write]) -> Result<CommitOutcome, StoreError> {
        calls::add(1);
        let started = Instant::now();
        let r = self.inner.commit(writes).await;
        self.record("commit", started, &r, |o| match o {
            CommitOutcome::Committed => "committed",
            CommitOutcome::Conflict(_) => "conflict",
        });
        r
    }

    async fn credit(
        &self,
        key: &BucketKey,
        guard: CreditGuard,
        credits: &[Credit],
    ) -> Result<Vec<Credit>, StoreError> {
        calls::add(1);
        let started = Instant::now();
        let r = self.inner.credit(key, guard, credits).await;
        self.record("credit", started, &r, |applied| {
            if applied.len() == credits.len() {
                "applied"
            } else {
                "trimmed"
            }
        });
        r
    }

    fn fault_domain(&self, key: &BucketKey) -> usize {
        self.inner.fault_domain(key)
    }
}

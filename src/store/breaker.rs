//! A circuit breaker in front of a store: after a run of consecutive unavailability
//! failures it stops calling the store for a cool-off period (calls fail at once), then
//! lets one probe through; the probe's success closes the circuit again. An outage then
//! costs microseconds per request instead of a timeout each, and recovery needs no
//! restart. Only `Unavailable` errors count: a corrupt item is not an outage.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{
    BucketItem, BucketKey, BucketStore, BumpOutcome, CommitOutcome, Credit, Debit, DebitMode,
    DebitOutcome, StoreError, Write,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Circuit {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
    },
    /// One probe is in flight; everyone else fails fast until it returns.
    Probing,
}

/// Where the circuit stands, for metrics and health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    Closed,
    Open,
    Probing,
}

/// `S` behind a circuit breaker.
#[derive(Debug)]
pub struct Breaker<S: BucketStore> {
    inner: S,
    circuit: Mutex<Circuit>,
    threshold: u32,
    cool_off: Duration,
}

impl<S: BucketStore> Breaker<S> {
    /// Opens after `threshold` consecutive failures, for `cool_off`.
    pub fn new(inner: S, threshold: u32, cool_off: Duration) -> Breaker<S> {
        Breaker {
            inner,
            circuit: Mutex::new(Circuit::Closed { failures: 0 }),
            threshold: threshold.max(1),
            cool_off,
        }
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    pub fn state(&self) -> CircuitState {
        match *self.circuit.lock().unwrap_or_else(|e| e.into_inner()) {
            Circuit::Closed { .. } => CircuitState::Closed,
            Circuit::Open { .. } => CircuitState::Open,
            Circuit::Probing => CircuitState::Probing,
        }
    }

    /// Whether a call may go to the store now; `Err` fails it at once.
    fn admit(&self, key: &str) -> Result<(), StoreError> {
        let mut c = self.circuit.lock().unwrap_or_else(|e| e.into_inner());
        match *c {
            Circuit::Closed { .. } => Ok(()),
            Circuit::Open { until } if Instant::now() >= until => {
                *c = Circuit::Probing;
                Ok(())
            }
            Circuit::Open { .. } | Circuit::Probing => Err(StoreError::Unavailable {
                key: key.to_string(),
                reason: "circuit open: the store failed repeatedly; probing it again shortly"
                    .to_string(),
            }),
        }
    }

    fn settle<T>(&self, result: &Result<T, StoreError>) {
        let mut c = self.circuit.lock().unwrap_or_else(|e| e.into_inner());
        let failed = matches!(result, Err(StoreError::Unavailable { .. }));
        *c = match (*c, failed) {
            (_, false) => Circuit::Closed { failures: 0 },
            (Circuit::Closed { failures }, true) if failures + 1 < self.threshold => {
                Circuit::Closed {
                    failures: failures + 1,
                }
            }
            (Circuit::Closed { .. }, true) | (Circuit::Probing, true) => {
                tracing::warn!(cool_off = ?self.cool_off, "store circuit opened");
                Circuit::Open {
                    until: Instant::now() + self.cool_off,
                }
            }
            // A call admitted before the circuit opened came back: keep it open.
            (open @ Circuit::Open { .. }, true) => open,
        };
    }

    async fn guarded<T>(
        &self,
        key: &str,
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.admit(key)?;
        let result = call.await;
        self.settle(&result);
        result
    }
}

fn key_text(key: &BucketKey) -> String {
    key.to_string()
}

impl<S: BucketStore> BucketStore for Breaker<S> {
    async fn debit(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
    ) -> Result<DebitOutcome, StoreError> {
        self.guarded(&key_text(key), self.inner.debit(key, debits, mode))
            .await
    }

    async fn read(&self, keys: &[BucketKey]) -> Result<Vec<Option<BucketItem>>, StoreError> {
        let first = keys.first().map(key_text).unwrap_or_default();
        self.guarded(&first, self.inner.read(keys)).await
    }

    async fn commit(&self, writes: &[Write]) -> Result<CommitOutcome, StoreError> {
        let first = writes
            .first()
            .map(|w| key_text(w.key()))
            .unwrap_or_default();
        self.guarded(&first, self.inner.commit(writes)).await
    }

    async fn bump_shard_count(
        &self,
        entity: &str,
        resource: &str,
        old: u32,
        new: u32,
    ) -> Result<BumpOutcome, StoreError> {
        let key = key_text(&BucketKey::new(entity, resource, 0));
        self.guarded(
            &key,
            self.inner.bump_shard_count(entity, resource, old, new),
        )
        .await
    }

    async fn raise_shard_count(&self, key: &BucketKey, new: u32) -> Result<bool, StoreError> {
        self.guarded(&key_text(key), self.inner.raise_shard_count(key, new))
            .await
    }

    async fn credit(&self, key: &BucketKey, credits: &[Credit]) -> Result<Vec<Credit>, StoreError> {
        self.guarded(&key_text(key), self.inner.credit(key, credits))
            .await
    }
}

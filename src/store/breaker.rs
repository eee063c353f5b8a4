//! A circuit breaker in front of a store: after a run of consecutive unavailability
//! failures it stops calling the store for a cool-off period (calls fail at once), then
//! lets one probe through; the probe's success closes the circuit again. An outage then
//! costs microseconds per request instead of a timeout each, and recovery needs no
//! restart. Only the store's own faults count ([`StoreError::is_fault`]): one request's
//! invalid key, a corrupt item or contention on one bucket proves the store answered.
//!
//! Every store call passes through here, so the usual state — closed, no failure since
//! the last success — is one atomic load on the way in and one on the way out: the mutex
//! is taken only when a failure is being counted or the circuit is not closed.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Credit, CreditGuard, Debit, DebitMode,
    DebitOutcome, Seed, StoreError, Write,
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
    /// Whether `circuit` is `Closed { failures: 0 }`: written under its lock at every
    /// change, read without it. While it holds, a call is admitted and a success changes
    /// nothing, so neither takes the lock.
    clean: AtomicBool,
    threshold: u32,
    cool_off: Duration,
}

impl<S: BucketStore> Breaker<S> {
    /// Opens after `threshold` consecutive failures, for `cool_off`.
    pub fn new(inner: S, threshold: u32, cool_off: Duration) -> Breaker<S> {
        Breaker {
            inner,
            circuit: Mutex::new(Circuit::Closed { failures: 0 }),
            clean: AtomicBool::new(true),
            threshold: threshold.max(1),
            cool_off,
        }
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    pub fn state(&self) -> CircuitState {
        match *self.circuit.lock() {
            Circuit::Closed { .. } => CircuitState::Closed,
            Circuit::Open { .. } => CircuitState::Open,
            Circuit::Probing => CircuitState::Probing,
        }
    }

    /// Closes the circuit: the store was seen answering by other means (the server's
    /// warm-up), so calls need not wait for the next probe.
    pub fn close(&self) {
        self.set(&mut self.circuit.lock(), Circuit::Closed { failures: 0 });
    }

    /// Moves the circuit (its lock held) and keeps [`Self::clean`] in step.
    fn set(&self, c: &mut Circuit, next: Circuit) {
        *c = next;
        self.clean
            .store(next == Circuit::Closed { failures: 0 }, Ordering::Release);
    }

    /// Whether a call may go to the store now (and whether it is the probe); `Err` fails
    /// it at once.
    fn admit(&self, key: &(dyn std::fmt::Display + Sync)) -> Result<Admitted, StoreError> {
        if self.clean.load(Ordering::Acquire) {
            return Ok(Admitted::Call);
        }
        let mut c = self.circuit.lock();
        match *c {
            Circuit::Closed { .. } => Ok(Admitted::Call),
            Circuit::Open { until } if Instant::now() >= until => {
                self.set(&mut c, Circuit::Probing);
                Ok(Admitted::Probe)
            }
            Circuit::Open { .. } | Circuit::Probing => Err(StoreError::CircuitOpen {
                key: key.to_string(),
            }),
        }
    }

    /// Moves the circuit after a call that returned; `failed` when the store was
    /// unavailable.
    fn record_outcome(&self, failed: bool) {
        // A success on a clean circuit leaves it as it is.
        if !failed && self.clean.load(Ordering::Acquire) {
            return;
        }
        let mut c = self.circuit.lock();
        let next = match (*c, failed) {
            (Circuit::Probing, false) => {
                tracing::info!("store answered the probe: circuit closed");
                Circuit::Closed { failures: 0 }
            }
            (_, false) => Circuit::Closed { failures: 0 },
            (Circuit::Closed { failures }, true) if failures + 1 < self.threshold => {
                Circuit::Closed {
                    failures: failures + 1,
                }
            }
            (Circuit::Closed { failures }, true) => {
                tracing::warn!(
                    consecutive_failures = failures + 1,
                    cool_off = ?self.cool_off,
                    "store circuit opened: calls fail at once until a probe succeeds"
                );
                self.open()
            }
            // A failed probe: stay open (logged once, when it opened).
            (Circuit::Probing, true) => self.open(),
            // A call admitted before the circuit opened came back: keep it open.
            (open @ Circuit::Open { .. }, true) => open,
        };
        self.set(&mut c, next);
    }

    fn open(&self) -> Circuit {
        Circuit::Open {
            until: Instant::now() + self.cool_off,
        }
    }

    async fn guarded<T>(
        &self,
        key: &(dyn std::fmt::Display + Sync),
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let admitted = self.admit(key)?;
        // A call is cancelled when its caller goes away (a client deadline ends the gRPC
        // call). A cancelled probe must still settle the circuit, or it would stay
        // `Probing` — failing every call — for ever.
        let mut pending = PendingProbe {
            breaker: self,
            armed: admitted == Admitted::Probe,
        };
        let result = call.await;
        pending.armed = false;
        self.record_outcome(result.as_ref().err().is_some_and(StoreError::is_fault));
        result
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admitted {
    Call,
    Probe,
}

/// Settles a probe that was dropped before the store answered: as a failure (it did not
/// answer within the caller's deadline), so the circuit opens for another cool-off and
/// the next call after it probes again.
struct PendingProbe<'a, S: BucketStore> {
    breaker: &'a Breaker<S>,
    armed: bool,
}

impl<S: BucketStore> Drop for PendingProbe<'_, S> {
    fn drop(&mut self) {
        if self.armed {
            self.breaker.record_outcome(true);
        }
    }
}

/// The first key of a call on several, formatted only when the circuit fails the call.
struct FirstKey<'a>(Option<&'a BucketKey>);

impl std::fmt::Display for FirstKey<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(k) => k.fmt(f),
            None => Ok(()),
        }
    }
}

impl<S: BucketStore> BucketStore for Breaker<S> {
    fn circuit(&self) -> Option<&'static str> {
        Some(match self.state() {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::Probing => "probing",
        })
    }

    async fn debit(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
    ) -> Result<DebitOutcome, StoreError> {
        self.guarded(key, self.inner.debit(key, debits, mode)).await
    }

    async fn debit_or_create(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
        seed: &Seed<'_>,
    ) -> Result<DebitOutcome, StoreError> {
        self.guarded(key, self.inner.debit_or_create(key, debits, mode, seed))
            .await
    }

    async fn read(&self, keys: &[BucketKey]) -> Result<Vec<Option<BucketItem>>, StoreError> {
        self.guarded(&FirstKey(keys.first()), self.inner.read(keys))
            .await
    }

    async fn commit(&self, writes: &[Write]) -> Result<CommitOutcome, StoreError> {
        let first = FirstKey(writes.first().map(Write::key));
        self.guarded(&first, self.inner.commit(writes)).await
    }

    async fn credit(
        &self,
        key: &BucketKey,
        guard: CreditGuard,
        credits: &[Credit],
    ) -> Result<Vec<Credit>, StoreError> {
        self.guarded(key, self.inner.credit(key, guard, credits))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    /// The lock-free flag follows the circuit through every move: clean only while closed
    /// with no failure counted, so a failure is never skipped by the fast path.
    #[test]
    fn the_fast_path_flag_is_set_exactly_while_closed_without_failures() {
        let b = Breaker::new(MemoryStore::new(), 2, Duration::ZERO);
        let clean = |b: &Breaker<MemoryStore>| b.clean.load(Ordering::Acquire);
        assert!(clean(&b));
        b.record_outcome(false);
        assert!(clean(&b), "a success on a clean circuit changes nothing");
        b.record_outcome(true);
        assert_eq!(b.state(), CircuitState::Closed);
        assert!(!clean(&b), "one failure counted");
        b.record_outcome(false);
        assert!(clean(&b), "a success resets the count");
        b.record_outcome(true);
        b.record_outcome(true);
        assert_eq!(b.state(), CircuitState::Open);
        assert!(!clean(&b));
        assert!(
            b.admit(&"k").unwrap() == Admitted::Probe,
            "cool-off of zero: a probe"
        );
        assert_eq!(b.state(), CircuitState::Probing);
        assert!(b.admit(&"k").is_err(), "one probe at a time");
        b.record_outcome(false);
        assert_eq!(b.state(), CircuitState::Closed);
        assert!(clean(&b));
        b.record_outcome(true);
        b.close();
        assert!(clean(&b));
    }
}

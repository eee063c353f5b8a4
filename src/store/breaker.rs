//! A circuit breaker in front of a store: after a run of consecutive unavailability
//! failures it stops calling the store for a cool-off period (calls fail at once), then
//! lets one probe through; the probe's success closes the circuit again. An outage then
//! costs microseconds per request instead of a timeout each, and recovery needs no
//! restart. Only the store's own faults count ([`StoreError::is_fault`]): one request's
//! invalid key, a corrupt item or contention on one bucket proves the store answered.
//!
//! One circuit per fault domain of the store ([`BucketStore::fault_domain`]): on a Redis
//! Cluster each master's slots have their own, so a dead master fails its own keys' calls
//! fast and the healthy masters' calls go on (one client's node must not fail another's).
//! A call on several keys goes by its first key's domain.
//!
//! Every store call passes through here, so the usual state — closed, no failure since
//! the last success — is one atomic load on the way in and one on the way out: the mutex
//! is taken only when a failure is being counted or the circuit is not closed.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Credit, CreditGuard, Debit, DebitMode,
    DebitOutcome, Seed, StoreError, Write, FAULT_DOMAINS,
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

/// One fault domain's circuit.
#[derive(Debug)]
struct Domain {
    circuit: Mutex<Circuit>,
    /// Whether `circuit` is `Closed { failures: 0 }`: written under its lock at every
    /// change, read without it. While it holds, a call is admitted and a success changes
    /// nothing, so neither takes the lock.
    clean: AtomicBool,
}

impl Domain {
    fn new() -> Domain {
        Domain {
            circuit: Mutex::new(Circuit::Closed { failures: 0 }),
            clean: AtomicBool::new(true),
        }
    }

    fn state(&self) -> CircuitState {
        match *self.circuit.lock() {
            Circuit::Closed { .. } => CircuitState::Closed,
            Circuit::Open { .. } => CircuitState::Open,
            Circuit::Probing => CircuitState::Probing,
        }
    }

    /// Moves the circuit (its lock held) and keeps [`Self::clean`] in step.
    fn set(&self, c: &mut Circuit, next: Circuit) {
        *c = next;
        self.clean
            .store(next == Circuit::Closed { failures: 0 }, Ordering::Release);
    }
}

impl CircuitState {
    /// As the operator's page and logs name it.
    pub fn name(self) -> &'static str {
        match self {
            CircuitState::Closed => "closed",
            CircuitState::Open => "open",
            CircuitState::Probing => "probing",
        }
    }
}

/// `S` behind a circuit breaker.
#[derive(Debug)]
pub struct Breaker<S: BucketStore> {
    inner: S,
    /// One per fault domain (see the module comment).
    domains: Box<[Domain]>,
    threshold: u32,
    cool_off: Duration,
}

impl<S: BucketStore> Breaker<S> {
    /// Opens a domain's circuit after `threshold` consecutive failures there, for
    /// `cool_off`.
    pub fn new(inner: S, threshold: u32, cool_off: Duration) -> Breaker<S> {
        Breaker {
            inner,
            domains: (0..FAULT_DOMAINS).map(|_| Domain::new()).collect(),
            threshold: threshold.max(1),
            cool_off,
        }
    }

    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// The worst circuit of any domain: open if one is.
    pub fn state(&self) -> CircuitState {
        let mut worst = CircuitState::Closed;
        for d in self.domains.iter() {
            match d.state() {
                CircuitState::Closed => {}
                CircuitState::Open => return CircuitState::Open,
                CircuitState::Probing => worst = CircuitState::Probing,
            }
        }
        worst
    }

    /// The circuit of `key`'s fault domain.
    pub fn state_of(&self, key: &BucketKey) -> CircuitState {
        self.domain(Some(key)).state()
    }

    /// Closes every circuit: the store was seen answering by other means (the server's
    /// warm-up), so calls need not wait for the next probe.
    pub fn close(&self) {
        for d in self.domains.iter() {
            d.set(&mut d.circuit.lock(), Circuit::Closed { failures: 0 });
        }
    }

    /// The circuit of `key`'s fault domain (none: the first).
    #[expect(
        clippy::indexing_slicing,
        reason = "an index modulo FAULT_DOMAINS, the length `new` gives `domains`"
    )]
    fn domain(&self, key: Option<&BucketKey>) -> &Domain {
        let at = key.map_or(0, |k| self.inner.fault_domain(k));
        &self.domains[at % FAULT_DOMAINS]
    }

    /// Whether a call may go to the store now (and whether it is the probe); `Err` fails
    /// it at once.
    fn admit(
        &self,
        d: &Domain,
        key: &(dyn std::fmt::Display + Sync),
    ) -> Result<Admitted, StoreError> {
        if d.clean.load(Ordering::Acquire) {
            return Ok(Admitted::Call);
        }
        let mut c = d.circuit.lock();
        match *c {
            Circuit::Closed { .. } => Ok(Admitted::Call),
            Circuit::Open { until } if Instant::now() >= until => {
                d.set(&mut c, Circuit::Probing);
                Ok(Admitted::Probe)
            }
            Circuit::Open { .. } | Circuit::Probing => Err(StoreError::CircuitOpen {
                key: key.to_string(),
            }),
        }
    }

    /// Moves the circuit after a call that returned; `failed` when the store was
    /// unavailable.
    fn record_outcome(&self, d: &Domain, failed: bool) {
        // A success on a clean circuit leaves it as it is.
        if !failed && d.clean.load(Ordering::Acquire) {
            return;
        }
        let mut c = d.circuit.lock();
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
        d.set(&mut c, next);
    }

    fn open(&self) -> Circuit {
        Circuit::Open {
            until: Instant::now() + self.cool_off,
        }
    }

    async fn guarded<T>(
        &self,
        domain: Option<&BucketKey>,
        key: &(dyn std::fmt::Display + Sync),
        call: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let d = self.domain(domain);
        let admitted = self.admit(d, key)?;
        // A call is cancelled when its caller goes away (a client deadline ends the gRPC
        // call). A cancelled probe must still settle the circuit, or it would stay
        // `Probing` — failing every call — for ever.
        let mut pending = PendingProbe {
            breaker: self,
            domain: d,
            armed: admitted == Admitted::Probe,
        };
        let result = call.await;
        pending.armed = false;
        self.record_outcome(d, result.as_ref().err().is_some_and(StoreError::is_fault));
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
    domain: &'a Domain,
    armed: bool,
}

impl<S: BucketStore> Drop for PendingProbe<'_, S> {
    fn drop(&mut self) {
        if self.armed {
            self.breaker.record_outcome(self.domain, true);
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
        Some(self.state().name())
    }

    async fn debit(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
    ) -> Result<DebitOutcome, StoreError> {
        self.guarded(Some(key), key, self.inner.debit(key, debits, mode))
            .await
    }

    async fn debit_or_create(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
        seed: &Seed<'_>,
    ) -> Result<DebitOutcome, StoreError> {
        let call = self.inner.debit_or_create(key, debits, mode, seed);
        self.guarded(Some(key), key, call).await
    }

    async fn read(&self, keys: &[BucketKey]) -> Result<Vec<Option<BucketItem>>, StoreError> {
        let first = keys.first();
        self.guarded(first, &FirstKey(first), self.inner.read(keys))
            .await
    }

    async fn commit(&self, writes: &[Write]) -> Result<CommitOutcome, StoreError> {
        let first = writes.first().map(Write::key);
        self.guarded(first, &FirstKey(first), self.inner.commit(writes))
            .await
    }

    async fn credit(
        &self,
        key: &BucketKey,
        guard: CreditGuard,
        credits: &[Credit],
    ) -> Result<Vec<Credit>, StoreError> {
        self.guarded(Some(key), key, self.inner.credit(key, guard, credits))
            .await
    }

    fn fault_domain(&self, key: &BucketKey) -> usize {
        self.inner.fault_domain(key)
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
        let d = &b.domains[0];
        let clean = || d.clean.load(Ordering::Acquire);
        assert!(clean());
        b.record_outcome(d, false);
        assert!(clean(), "a success on a clean circuit changes nothing");
        b.record_outcome(d, true);
        assert_eq!(b.state(), CircuitState::Closed);
        assert!(!clean(), "one failure counted");
        b.record_outcome(d, false);
        assert!(clean(), "a success resets the count");
        b.record_outcome(d, true);
        b.record_outcome(d, true);
        assert_eq!(b.state(), CircuitState::Open);
        assert!(!clean());
        assert!(
            b.admit(d, &"k").unwrap() == Admitted::Probe,
            "cool-off of zero: a probe"
        );
        assert_eq!(b.state(), CircuitState::Probing);
        assert!(b.admit(d, &"k").is_err(), "one probe at a time");
        b.record_outcome(d, false);
        assert_eq!(b.state(), CircuitState::Closed);
        assert!(clean());
        b.record_outcome(d, true);
        b.close();
        assert!(clean());
    }

    /// A store whose shard 1 is another node's.
    struct TwoNodes(MemoryStore);

    impl BucketStore for TwoNodes {
        async fn debit(
            &self,
            key: &BucketKey,
            debits: &[Debit],
            mode: DebitMode,
        ) -> Result<DebitOutcome, StoreError> {
            self.0.debit(key, debits, mode).await
        }
        async fn read(&self, keys: &[BucketKey]) -> Result<Vec<Option<BucketItem>>, StoreError> {
            self.0.read(keys).await
        }
        async fn commit(&self, writes: &[Write]) -> Result<CommitOutcome, StoreError> {
            self.0.commit(writes).await
        }
        async fn credit(
            &self,
            key: &BucketKey,
            guard: CreditGuard,
            credits: &[Credit],
        ) -> Result<Vec<Credit>, StoreError> {
            self.0.credit(key, guard, credits).await
        }
        fn fault_domain(&self, key: &BucketKey) -> usize {
            key.shard as usize
        }
    }

    /// One domain's failures open its circuit only: the other's calls go on.
    #[test]
    fn a_dead_domain_fails_fast_alone() {
        let b = Breaker::new(TwoNodes(MemoryStore::new()), 2, Duration::from_secs(60));
        let (dead, alive) = (BucketKey::new("e", "r", 1), BucketKey::new("e", "r", 0));
        for _ in 0..2 {
            b.record_outcome(b.domain(Some(&dead)), true);
        }
        assert_eq!(b.state_of(&dead), CircuitState::Open);
        assert_eq!(b.state_of(&alive), CircuitState::Closed);
        assert_eq!(b.state(), CircuitState::Open, "the worst of them");
        assert!(b.admit(b.domain(Some(&dead)), &"k").is_err());
        assert!(b.admit(b.domain(Some(&alive)), &"k").unwrap() == Admitted::Call);
        b.close();
        assert_eq!(b.state(), CircuitState::Closed);
    }
}

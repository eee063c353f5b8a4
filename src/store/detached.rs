//! A store wrapper that runs every call in a task of its own, so that a caller giving up
//! (a request past its deadline, its future dropped) never cancels the call itself, and
//! that bounds the calls left running that way.
//!
//! Why detached: a store call may be doing work every later call depends on — resolving
//! credentials, opening and handshaking a connection (the first call of a cold process
//! does both) — and the AWS SDK drops that work with the calling future. Cancelled at each
//! request's deadline, a slow first connection would never complete, and a cold server
//! would fail every call. Detached, the call runs to its own deadline (the store's,
//! `--store-timeout`), leaves the connection in the pool and the credentials in the
//! cache, and its outcome still reaches whatever the wrapped store does with one (the
//! circuit breaker counts it, the ledger records it). The caller only stops waiting.
//!
//! Why bounded: a call whose caller gave up still loads the store until it ends. In a
//! brownout (the store answering later than callers wait) such calls pile up, about the
//! call rate times the store timeout of them, each holding a connection to a store that is
//! already behind. So a call whose caller has gone starts no new attempt ([`caller_gone`],
//! which the store's retry loops and the SDK's retry classifier ask), and once
//! [`DEFAULT_ABANDONED_BUDGET`] of them are still running a new call is not sent at all:
//! it fails at once with [`StoreError::Shed`] and the request is answered by its rules'
//! `failure_mode`, as it would have been at its deadline. Running it attached instead
//! (cancelled with its caller) would still send it to the store that is behind, and cut
//! connection set-ups off midway, the very thing detaching avoids.
//!
//! The cost is a task, a small shared state and a copy of the call's arguments per call:
//! nothing beside a network round trip. The memory store needs none of this and is not
//! wrapped.

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;

use super::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Credit, CreditGuard, Debit, DebitMode,
    DebitOutcome, Seed, StoreError, Write,
};

/// Calls whose callers gave up that may still be running before new calls are shed. Far
/// above what a healthy store leaves behind (a caller gives up only when the store missed
/// its deadline), low enough that a brownout cannot hold thousands of connections open.
pub const DEFAULT_ABANDONED_BUDGET: usize = 256;

/// Where one call stands: its caller waiting, its caller gone, or the call ended.
const WAITED_FOR: u8 = 0;
const ABANDONED: u8 = 1;
const ENDED: u8 = 2;

/// One call's state, shared by its caller and its task.
#[derive(Debug, Default)]
struct CallState(AtomicU8);

tokio::task_local! {
    /// The state of the call the current task runs (set only inside a detached call).
    static CALL: Arc<CallState>;
}

/// Whether the caller of the store call running in this task has given up on it: a
/// retry then only loads the store for an answer nobody reads. False outside a detached
/// call (the server's warm-up, tests calling a store directly).
pub fn caller_gone() -> bool {
    CALL.try_with(|c| c.0.load(Ordering::Acquire) == ABANDONED)
        .unwrap_or(false)
}

/// What the metrics read: calls still running after their caller gave up, and calls shed
/// because too many were.
#[derive(Debug, Default)]
pub struct Pressure {
    abandoned: AtomicUsize,
    shed: AtomicU64,
}

impl Pressure {
    /// Calls still running whose callers gave up.
    pub fn abandoned(&self) -> usize {
        self.abandoned.load(Ordering::Relaxed)
    }

    /// Calls not sent since start-up because the budget of abandoned calls was spent.
    pub fn shed(&self) -> u64 {
        self.shed.load(Ordering::Relaxed)
    }
}

/// Marks its call ended when dropped (finished, panicked or cancelled with the runtime),
/// and releases its place in the budget if its caller had given up.
struct Ends {
    state: Arc<CallState>,
    pressure: Arc<Pressure>,
}

impl Drop for Ends {
    fn drop(&mut self) {
        if self.state.0.swap(ENDED, Ordering::AcqRel) == ABANDONED {
            self.pressure.abandoned.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Held by the caller while it waits: dropped armed (the caller gave up), it marks the
/// call abandoned and counts it, unless the call ended first.
struct Waiting<'a> {
    state: &'a CallState,
    pressure: &'a Pressure,
    armed: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Counted before the mark, so that the task's release (which follows the mark)
        // never finds the count lower than its own place.
        self.pressure.abandoned.fetch_add(1, Ordering::Relaxed);
        let marked = self.state.0.compare_exchange(
            WAITED_FOR,
            ABANDONED,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if marked.is_err() {
            self.pressure.abandoned.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// `S`, each call in a task of its own.
#[derive(Debug)]
pub struct Detached<S: BucketStore> {
    inner: Arc<S>,
    budget: usize,
    pressure: Arc<Pressure>,
}

impl<S: BucketStore> Detached<S> {
    /// Sheds new calls once [`DEFAULT_ABANDONED_BUDGET`] abandoned ones are running.
    pub fn new(inner: Arc<S>) -> Detached<S> {
        Detached {
            inner,
            budget: DEFAULT_ABANDONED_BUDGET,
            pressure: Arc::default(),
        }
    }

    /// Sheds new calls once `budget` abandoned ones are running.
    pub fn with_budget(mut self, budget: usize) -> Detached<S> {
        self.budget = budget;
        self
    }

    pub fn inner(&self) -> &Arc<S> {
        &self.inner
    }

    /// The counts the metrics read.
    pub fn pressure(&self) -> &Arc<Pressure> {
        &self.pressure
    }

    /// Runs `call` on the wrapped store in a task; a task that panicked or was cancelled
    /// (the runtime shutting down) reads as the store failing.
    async fn run<T, F>(
        &self,
        key: &BucketKey,
        call: impl FnOnce(Arc<S>) -> F,
    ) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: std::future::Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let abandoned = self.pressure.abandoned();
        if abandoned >= self.budget {
            self.pressure.shed.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::Shed {
                key: key.to_string(),
                abandoned,
            });
        }
        let state = Arc::new(CallState::default());
        let ends = Ends {
            state: state.clone(),
            pressure: self.pressure.clone(),
        };
        let work = call(self.inner.clone());
        let task = tokio::spawn(CALL.scope(state.clone(), async move {
            let _ends = ends;
            work.await
        }));
        let mut waiting = Waiting {
            state: &state,
            pressure: &self.pressure,
            armed: true,
        };
        let result = task.await;
        waiting.armed = false;
        result.unwrap_or_else(|e| {
            Err(StoreError::Unavailable {
                key: key.to_string(),
                reason: format!("store call ended without an answer: {e}"),
                source: None,
            })
        })
    }
}

impl<S: BucketStore> BucketStore for Detached<S> {
    fn circuit(&self) -> Option<&'static str> {
        self.inner.circuit()
    }

    async fn debit(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
    ) -> Result<DebitOutcome, StoreError> {
        let (k, debits) = (key.clone(), debits.to_vec());
        self.run(
            key,
            move |s| async move { s.debit(&k, &debits, mode).await },
        )
        .await
    }

    /// The seed is built here, before the call leaves for its task: the task outlives
    /// the caller's borrow.
    async fn debit_or_create(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
        seed: &Seed<'_>,
    ) -> Result<DebitOutcome, StoreError> {
        let (k, debits, item) = (key.clone(), debits.to_vec(), seed());
        self.run(key, move |s| async move {
            s.debit_or_create(&k, &debits, mode, &|| item.clone()).await
        })
        .await
    }

    async fn read(&self, keys: &[BucketKey]) -> Result<Vec<Option<BucketItem>>, StoreError> {
        let first = keys
            .first()
            .cloned()
            .unwrap_or_else(|| BucketKey::new("", "", 0));
        let keys = keys.to_vec();
        self.run(&first, move |s| async move { s.read(&keys).await })
            .await
    }

    async fn commit(&self, writes: &[Write]) -> Result<CommitOutcome, StoreError> {
        let first = writes
            .first()
            .map_or_else(|| BucketKey::new("", "", 0), |w| w.key().clone());
        let writes = writes.to_vec();
        self.run(&first, move |s| async move { s.commit(&writes).await })
            .await
    }

    async fn credit(
        &self,
        key: &BucketKey,
        guard: CreditGuard,
        credits: &[Credit],
    ) -> Result<Vec<Credit>, StoreError> {
        let (k, credits) = (key.clone(), credits.to_vec());
        self.run(
            key,
            move |s| async move { s.credit(&k, guard, &credits).await },
        )
        .await
    }

    fn fault_domain(&self, key: &BucketKey) -> usize {
        self.inner.fault_domain(key)
    }
}

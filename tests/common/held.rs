//! A memory store whose calls wait while it is held, counting the calls that reach it:
//! calls in flight at once, as behind a slow store. Included by path by the suites that
//! use it (`abandoned_calls.rs`; `engine_scenarios.rs` through `common`).

use std::sync::atomic::{AtomicU64, Ordering};

use shardgate::store::memory::MemoryStore;
use shardgate::store::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Credit, CreditGuard, Debit, DebitMode,
    DebitOutcome, StoreError, Write,
};
use tokio::sync::watch;

/// A memory store whose calls wait until released, counting the calls that reach it.
pub struct Held {
    pub inner: MemoryStore,
    released: watch::Receiver<bool>,
    /// Calls that reached it, released or not.
    pub calls: AtomicU64,
}

impl Held {
    /// The store, holding its calls (send `true` to release them, `false` to hold
    /// the next ones again).
    pub fn new() -> (Held, watch::Sender<bool>) {
        let (tx, rx) = watch::channel(false);
        let held = Held {
            inner: MemoryStore::new(),
            released: rx,
            calls: AtomicU64::new(0),
        };
        (held, tx)
    }

    async fn hold(&self) {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let mut released = self.released.clone();
        let _ = released.wait_for(|r| *r).await;
    }
}

impl BucketStore for Held {
    async fn debit(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
    ) -> Result<DebitOutcome, StoreError> {
        self.hold().await;
        self.inner.debit(key, debits, mode).await
    }
    async fn read(&self, keys: &[BucketKey]) -> Result<Vec<Option<BucketItem>>, StoreError> {
        self.hold().await;
        self.inner.read(keys).await
    }
    async fn commit(&self, writes: &[Write]) -> Result<CommitOutcome, StoreError> {
        self.hold().await;
        self.inner.commit(writes).await
    }
    async fn credit(
        &self,
        key: &BucketKey,
        guard: CreditGuard,
        credits: &[Credit],
    ) -> Result<Vec<Credit>, StoreError> {
        self.hold().await;
        self.inner.credit(key, guard, credits).await
    }
}

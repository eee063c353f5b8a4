//! A store wrapper that runs every call in a task of its own, so that a caller giving up
//! (a request past its deadline, its future dropped) never cancels the call itself.
//!
//! Why: a store call may be doing work every later call depends on — resolving
//! credentials, opening and handshaking a connection (the first call of a cold process
//! does both) — and the AWS SDK drops that work with the calling future. Cancelled at each
//! request's deadline, a slow first connection would never complete, and a cold server
//! would fail every call. Detached, the call runs to its own deadline (the store's,
//! `--store-timeout`), leaves the connection in the pool and the credentials in the
//! cache, and its outcome still reaches whatever the wrapped store does with one (the
//! circuit breaker counts it, the ledger records it). The caller only stops waiting.
//!
//! The cost is a task and a copy of the call's arguments per call: nothing beside a
//! network round trip. The memory store needs none of this and is not wrapped.

use std::sync::Arc;

use super::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Credit, CreditGuard, Debit, DebitMode,
    DebitOutcome, StoreError, Write,
};

/// `S`, each call in a task of its own.
#[derive(Debug)]
pub struct Detached<S: BucketStore> {
    inner: Arc<S>,
}

impl<S: BucketStore> Detached<S> {
    pub fn new(inner: Arc<S>) -> Detached<S> {
        Detached { inner }
    }

    pub fn inner(&self) -> &Arc<S> {
        &self.inner
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
        let task = tokio::spawn(call(self.inner.clone()));
        task.await.unwrap_or_else(|e| {
            Err(StoreError::Unavailable {
                key: key.to_string(),
                reason: format!("store call ended without an answer: {e}"),
            })
        })
    }
}

impl<S: BucketStore> BucketStore for Detached<S> {
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
}

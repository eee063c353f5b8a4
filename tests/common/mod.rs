//! The integration tests' one helper folder.
//!
//! - here: `cross_store!` (one case, one test per store) and a store wrapper that records
//!   every call (operation, shard and outcome) and can inject a concurrent writer's action
//!   at a chosen moment, for any store;
//! - [`dynamo`]: the DynamoDB Local connection; [`redis`]: the test Redis and Cluster;
//!   [`tcp_proxy`]: a forwarder in front of a Redis (a failover behind one address, an
//!   answer cut after its call ran);
//! - [`server`]: in-process shardgate servers on loopback and request builders;
//!   [`serve_process`]: a `shardgate serve` process, read from outside (health,
//!   `/metrics`, its log, its memory);
//! - [`tls_sentinel`]: `scripts/redis-local sentinel-tls`, a master, a replica and a
//!   Sentinel on TLS ports;
//! - [`control_plane`]: a test xDS control plane that pushes rules;
//! - [`h2_call`]: one gRPC call over the `h2` crate, its bytes and stream under the test's
//!   control;
//! - [`held`]: a memory store whose calls wait until released (calls in flight at once);
//! - [`raw_h2`]: a raw HTTP/2 client that may flood, stall and lie;
//! - [`tls`]: a TLS server and the certificates for it;
//! - `stub_dynamo.rs`: a stand-in for DynamoDB's JSON API that answers by the test's rule
//!   (throttling, slow conflicts, 500s), included by path by the two suites that use it
//!   (`abandoned_calls.rs`, `throttling.rs`) so that no other test binary builds it.

#![allow(dead_code)]

pub mod control_plane;
#[cfg(feature = "dynamodb")]
pub mod dynamo;
pub mod h2_call;
pub mod held;
pub mod raw_h2;
#[cfg(feature = "redis")]
pub mod redis;
pub mod serve_process;
pub mod server;
#[cfg(feature = "redis")]
pub mod tcp_proxy;
pub mod tls;
#[cfg(feature = "redis")]
pub mod tls_sentinel;

/// Defines a case written once against any store, and one test of it per store:
/// `<case>::memory`; built with the `dynamodb` feature, `<case>::dynamodb` (ignored
/// with a reason when no DynamoDB Local is configured: `scripts/test` starts one and sets
/// `SHARDGATE_TEST_DYNAMODB_ENDPOINT`); built with the `redis` feature, `<case>::redis`
/// and `<case>::redis_cluster` (ignored unless `scripts/test` started Redis and set
/// `SHARDGATE_TEST_REDIS_URL` and `SHARDGATE_TEST_REDIS_CLUSTER`). A case is a test of
/// every store by construction: no list to leave one off.
///
/// `async fn case<S: Bound>(store: S)` gets a fresh store; `async fn case<S: Bound>(a: S,
/// b: S)` two stores of the same kind (a server and its twin).
#[allow(unused_macros)]
macro_rules! cross_store {
    ($(#[$meta:meta])* async fn $name:ident<S: $bound:path>($store:ident: S) $body:block) => {
        $(#[$meta])*
        async fn $name<S: $bound>($store: S) $body

        mod $name {
            cross_store!(@stores $name, |store| super::$name(store().await).await);
        }
    };
    ($(#[$meta:meta])* async fn $name:ident<S: $bound:path>($a:ident: S, $b:ident: S) $body:block) => {
        $(#[$meta])*
        async fn $name<S: $bound>($a: S, $b: S) $body

        mod $name {
            cross_store!(@stores $name, |store| super::$name(store().await, store().await).await);
        }
    };
    // One test per store; `store` is an async constructor of a fresh store of that kind.
    (@stores $name:ident, |$store:ident| $call:expr) => {
        #[tokio::test]
        async fn memory() {
            let $store = || async { shardgate::store::memory::MemoryStore::new() };
            $call
        }

        #[cfg(feature = "dynamodb")]
        #[tokio::test]
        #[cfg_attr(
            not(dynamodb_local),
            ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
        )]
        async fn dynamodb() {
            let $store = crate::common::dynamo::store;
            $call
        }

        #[cfg(feature = "redis")]
        #[tokio::test]
        #[cfg_attr(
            not(redis_local),
            ignore = "needs Redis: run scripts/test, or set SHARDGATE_TEST_REDIS_URL and SHARDGATE_TEST_REDIS_CLUSTER and build again"
        )]
        async fn redis() {
            let $store = crate::common::redis::store;
            $call
        }

        #[cfg(feature = "redis")]
        #[tokio::test]
        #[cfg_attr(
            not(redis_local),
            ignore = "needs a Redis Cluster: run scripts/test, or set SHARDGATE_TEST_REDIS_URL and SHARDGATE_TEST_REDIS_CLUSTER and build again"
        )]
        async fn redis_cluster() {
            let $store = crate::common::redis::cluster_store;
            $call
        }
    };
}

/// A key prefix no other test uses (a shared store's tests never see each other's items).
pub fn unique_namespace() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "t{}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use shardgate::store::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Credit, CreditGuard, Debit, DebitMode,
    DebitOutcome, Seed, StoreError, Write,
};

/// One store call as the engine made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Debit {
        shard: u32,
        retry_only: bool,
        applied: bool,
        missing: bool,
    },
    Read {
        shards: Vec<u32>,
    },
    Commit {
        kinds: Vec<&'static str>,
        committed: bool,
    },
    Credit {
        shard: u32,
    },
}

pub type Hook<S> = Box<dyn FnOnce(Arc<S>) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// Any store, recording calls, with one-shot hooks run before a commit (standing in for
/// another server acting in between) or after a debit, before its answer reaches the
/// engine (holding a request at that point). A commit's kinds are `create`, `update`,
/// `raise` (an update that raises the shard count: a doubling, or a shard learning it) and
/// `debit` (a consumption-only retry).
pub struct Recorder<S: BucketStore> {
    pub inner: Arc<S>,
    calls: Mutex<Vec<Call>>,
    before_commit: Mutex<Option<Hook<S>>>,
    after_debit: Mutex<Option<Hook<S>>>,
    before_credit: Mutex<Option<Hook<S>>>,
}

impl<S: BucketStore> Recorder<S> {
    pub fn new(inner: S) -> Arc<Recorder<S>> {
        Arc::new(Recorder {
            inner: Arc::new(inner),
            calls: Mutex::new(Vec::new()),
            before_commit: Mutex::new(None),
            after_debit: Mutex::new(None),
            before_credit: Mutex::new(None),
        })
    }

    pub fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    pub fn clear(&self) {
        self.calls.lock().unwrap().clear();
    }

    pub fn before_commit(&self, hook: Hook<S>) {
        *self.before_commit.lock().unwrap() = Some(hook);
    }

    /// Runs `hook` once, after the next debit is made and recorded, before its answer
    /// is returned.
    pub fn after_debit(&self, hook: Hook<S>) {
        *self.after_debit.lock().unwrap() = Some(hook);
    }

    /// Runs `hook` once, before the next credit reaches the store (a slow give-back).
    pub fn before_credit(&self, hook: Hook<S>) {
        *self.before_credit.lock().unwrap() = Some(hook);
    }

    /// Creates an item through the contract (not recorded).
    pub async fn put(&self, key: BucketKey, item: BucketItem) {
        put(&*self.inner, key, item).await;
    }

    /// Reads an item through the contract (not recorded).
    pub async fn get(&self, key: &BucketKey) -> Option<BucketItem> {
        self.inner
            .read(std::slice::from_ref(key))
            .await
            .unwrap()
            .pop()
            .unwrap()
    }

    fn log(&self, c: Call) {
        self.calls.lock().unwrap().push(c);
    }

    /// What every debit does after the store answered: logged, then the `after_debit`
    /// hook run once, before the engine sees the outcome.
    async fn debited(
        &self,
        key: &BucketKey,
        mode: DebitMode,
        out: DebitOutcome,
    ) -> Result<DebitOutcome, StoreError> {
        self.log(Call::Debit {
            shard: key.shard,
            retry_only: mode == DebitMode::RetryOnly,
            applied: matches!(out, DebitOutcome::Applied(_)),
            missing: matches!(out, DebitOutcome::Refused(None)),
        });
        let hook = self.after_debit.lock().unwrap().take();
        if let Some(hook) = hook {
            hook(self.inner.clone()).await;
        }
        Ok(out)
    }
}

/// Creates an item through the contract; panics if it exists.
pub async fn put<S: BucketStore>(store: &S, key: BucketKey, item: BucketItem) {
    let out = store.commit(&[Write::Create { key, item }]).await.unwrap();
    assert_eq!(
        out,
        CommitOutcome::Committed,
        "test set-up puts fresh items only"
    );
}

impl<S: BucketStore> BucketStore for Recorder<S> {
    async fn debit(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
    ) -> Result<DebitOutcome, StoreError> {
        let out = self.inner.debit(key, debits, mode).await?;
        self.debited(key, mode, out).await
    }

    async fn debit_or_create(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
        seed: &Seed<'_>,
    ) -> Result<DebitOutcome, StoreError> {
        let out = self.inner.debit_or_create(key, debits, mode, seed).await?;
        self.debited(key, mode, out).await
    }

    async fn read(&self, keys: &[BucketKey]) -> Result<Vec<Option<BucketItem>>, StoreError> {
        self.log(Call::Read {
            shards: keys.iter().map(|k| k.shard).collect(),
        });
        self.inner.read(keys).await
    }

    async fn commit(&self, writes: &[Write]) -> Result<CommitOutcome, StoreError> {
        let hook = self.before_commit.lock().unwrap().take();
        if let Some(hook) = hook {
            hook(self.inner.clone()).await;
        }
        let out = self.inner.commit(writes).await?;
        self.log(Call::Commit {
            kinds: writes
                .iter()
                .map(|w| match w {
                    Write::Create { .. } => "create",
                    Write::Update {
                        shard_count: Some(_),
                        ..
                    } => "raise",
                    Write::Update { .. } => "update",
                    Write::Debit { .. } => "debit",
                })
                .collect(),
            committed: matches!(out, CommitOutcome::Committed),
        });
        Ok(out)
    }

    async fn credit(
        &self,
        key: &BucketKey,
        guard: CreditGuard,
        credits: &[Credit],
    ) -> Result<Vec<Credit>, StoreError> {
        self.log(Call::Credit { shard: key.shard });
        let hook = self.before_credit.lock().unwrap().take();
        if let Some(hook) = hook {
            hook(self.inner.clone()).await;
        }
        self.inner.credit(key, guard, credits).await
    }
}

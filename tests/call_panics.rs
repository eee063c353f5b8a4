//! A call that panics ends alone. The store here panics inline in the call, as the
//! memory store runs (defined in this test crate only: nothing a release serves can
//! panic on purpose): one call of 500 in flight on one HTTP/2 connection reaches it and
//! is answered INTERNAL; the 499 others get their normal answers, the connection stays
//! open and the panic is counted once.

mod common;

use std::sync::Arc;

use common::server::{one, serve_defaults, StoreServer};
use shardgate::store::memory::MemoryStore;
use shardgate::store::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Credit, CreditGuard, Debit, DebitMode,
    DebitOutcome, StoreError, Write,
};

const RULES: &str = "
domain: panics
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000}
";

/// A memory store that panics on any bucket of the user `boom`.
struct Panicking(MemoryStore);

fn check(key: &BucketKey) {
    if key.entity.contains("boom") || key.resource.contains("boom") {
        panic!("the test store's panic on {key:?}");
    }
}

impl BucketStore for Panicking {
    async fn debit(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
    ) -> Result<DebitOutcome, StoreError> {
        check(key);
        self.0.debit(key, debits, mode).await
    }
    async fn read(&self, keys: &[BucketKey]) -> Result<Vec<Option<BucketItem>>, StoreError> {
        keys.iter().for_each(check);
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
        check(key);
        self.0.credit(key, guard, credits).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_panicking_call_among_500_fails_alone() {
    let store = Arc::new(Panicking(MemoryStore::new()));
    let server = StoreServer::start(RULES, store, serve_defaults()).await;
    // One client: one HTTP/2 connection carries every call.
    let client = server.client().await;
    let mut calls = Vec::new();
    for i in 0..500 {
        let user = if i == 250 {
            "boom".to_string()
        } else {
            format!("u{i}")
        };
        let mut client = client.clone();
        calls.push(tokio::spawn(async move {
            client
                .0
                .should_rate_limit(one("panics", &[("user", &user)]))
                .await
        }));
    }
    let mut failed = Vec::new();
    let mut answered = 0;
    for call in calls {
        match call.await.unwrap() {
            Ok(_) => answered += 1,
            Err(status) => failed.push(status),
        }
    }
    assert_eq!(answered, 499, "{failed:?}");
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].code(), tonic::Code::Internal);
    assert!(
        failed[0].message().contains("request id"),
        "{}",
        failed[0].message()
    );
    // The connection is still open, and serves.
    let mut again = client.clone();
    again.ok(one("panics", &[("user", "after")])).await;
    let metrics = server.limiter.metrics();
    assert_eq!(metrics.port().connections(), 1);
    assert_eq!(metrics.port().panics(), 1);
    let page = metrics.render();
    assert!(
        page.contains("shardgate_call_panics_total{end=\"internal\"} 1"),
        "{page}"
    );
}

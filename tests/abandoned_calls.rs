//! Calls whose callers gave up are bounded (issue 27, point 13): each store call runs in
//! a task of its own (`store/detached.rs`), and a brownout must not pile them up.
//!
//! - Past a budget of abandoned calls still running, a new call is not sent: it fails at
//!   once, shed, and the count falls back as the abandoned calls end.
//! - A call whose caller has gone starts no new SDK attempt; while its caller waits, the
//!   SDK still retries within the call's deadline.
//! - The retries of a write a transaction holds end at the call's deadline, and stop once
//!   the caller has gone.
//!
//! Request counts are judged, never wall-clock times: a slow machine only makes fewer
//! attempts fit.

#[path = "common/held.rs"]
mod held;
#[cfg(feature = "dynamodb")]
#[path = "common/stub_dynamo.rs"]
mod stub_dynamo;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use held::Held;
use shardgate::store::detached::{Detached, DEFAULT_ABANDONED_BUDGET};
use shardgate::store::memory::MemoryStore;
use shardgate::store::{BucketKey, BucketStore, StoreError};
#[cfg(feature = "dynamodb")]
use shardgate::store::{Debit, DebitMode};
#[cfg(feature = "dynamodb")]
use stub_dynamo::{Answer, Stub};
use tokio::sync::watch;

/// A read whose caller gives up after 1 ms.
async fn abandon<S: BucketStore>(store: &Detached<S>) {
    let key = [BucketKey::new("e", "r", 0)];
    let r = tokio::time::timeout(Duration::from_millis(1), store.read(&key)).await;
    assert!(r.is_err(), "the held call cannot answer");
}

/// Polls `done` every 10 ms for up to 10 s.
async fn eventually(done: impl Fn() -> bool) -> bool {
    for _ in 0..1_000 {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done()
}

/// `budget` abandoned calls may run; the next is shed at once, without reaching the
/// store, and counted; once they end, calls are sent again.
async fn sheds_past(budget: usize, store: Detached<Held>, release: watch::Sender<bool>) {
    for _ in 0..budget {
        abandon(&store).await;
    }
    assert_eq!(store.pressure().abandoned(), budget);
    let key = [BucketKey::new("e", "r", 0)];
    let shed = tokio::time::timeout(Duration::from_secs(5), store.read(&key))
        .await
        .expect("shed at once, not held with the others");
    assert!(
        matches!(&shed, Err(StoreError::Shed { abandoned, .. }) if *abandoned == budget),
        "{shed:?}"
    );
    assert!(
        !shed.unwrap_err().is_fault(),
        "never sent: not the store's fault"
    );
    assert_eq!(store.inner().calls.load(Ordering::SeqCst), budget as u64);
    assert_eq!(store.pressure().shed(), 1);

    release.send_replace(true);
    assert!(eventually(|| store.pressure().abandoned() == 0).await);
    assert!(store.read(&key).await.is_ok(), "sent again");
    assert_eq!(store.pressure().shed(), 1);
}

#[tokio::test]
async fn a_call_past_the_budget_of_abandoned_calls_is_shed() {
    let (held, release) = Held::new();
    sheds_past(4, Detached::new(Arc::new(held)).with_budget(4), release).await;
}

#[tokio::test]
async fn the_default_budget_sheds_past_256_abandoned_calls() {
    assert_eq!(DEFAULT_ABANDONED_BUDGET, 256);
    let (held, release) = Held::new();
    sheds_past(
        DEFAULT_ABANDONED_BUDGET,
        Detached::new(Arc::new(held)),
        release,
    )
    .await;
}

/// A caller still waiting when its call ends leaves nothing counted.
#[tokio::test]
async fn a_call_answered_in_time_is_never_counted_abandoned() {
    let store = Detached::new(Arc::new(MemoryStore::new())).with_budget(1);
    for _ in 0..100 {
        assert!(store.read(&[BucketKey::new("e", "r", 0)]).await.is_ok());
    }
    assert_eq!(store.pressure().abandoned(), 0);
    assert_eq!(store.pressure().shed(), 0);
}

#[cfg(feature = "dynamodb")]
fn one_token() -> Vec<Debit> {
    vec![Debit {
        limit: "rpm".into(),
        amount: 1_000,
        gated: true,
        params: None,
    }]
}

#[cfg(feature = "dynamodb")]
const FAST: DebitMode = DebitMode::Fast {
    now_s: 1,
    shard_count: 1,
};

/// Polls until the stand-in's count of requests has not moved for 300 ms, and returns it.
#[cfg(feature = "dynamodb")]
async fn settled(stub: &Stub) -> usize {
    let mut last = stub.count(|_| true);
    loop {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = stub.count(|_| true);
        if now == last {
            return now;
        }
        last = now;
    }
}

/// A store answering 500 after 50 ms: while the caller waits, the SDK makes its three
/// attempts within the call's deadline; a caller gone after 10 ms leaves the attempt in
/// flight to end, and no other is made. Before, the call made all three whatever its
/// caller did.
#[cfg(feature = "dynamodb")]
#[tokio::test]
async fn no_sdk_retry_once_the_caller_is_gone() {
    let stub = Stub::start(|_| Answer::server_error().after(Duration::from_millis(50))).await;
    let store = Detached::new(Arc::new(stub.store(Duration::from_secs(1)).await));
    let key = BucketKey::new("e", "r", 0);

    let waited = store.debit(&key, &one_token(), FAST).await;
    assert!(
        matches!(waited, Err(StoreError::Unavailable { .. })),
        "{waited:?}"
    );
    assert_eq!(
        settled(&stub).await,
        3,
        "three attempts for a waiting caller"
    );

    let gone = tokio::time::timeout(
        Duration::from_millis(10),
        store.debit(&key, &one_token(), FAST),
    )
    .await;
    assert!(gone.is_err(), "the caller gave up");
    assert_eq!(settled(&stub).await, 4, "one attempt more, no retry");
    assert!(eventually(|| store.pressure().abandoned() == 0).await);
}

#[cfg(feature = "dynamodb")]
fn conflict() -> Answer {
    Answer::error("TransactionConflictException", serde_json::json!({}))
}

/// A write a transaction keeps holding, each refusal taking 40 ms, with a store deadline
/// of 100 ms: the retries stop at the deadline (three attempts at most), and the write is
/// the bucket's contention. Before, four attempts ran whatever the deadline.
#[cfg(feature = "dynamodb")]
#[tokio::test]
async fn the_conflict_retries_end_at_the_deadline() {
    let stub = Stub::start(|_| conflict().after(Duration::from_millis(40))).await;
    let store = stub.store(Duration::from_millis(100)).await;
    let key = BucketKey::new("e", "r", 0);
    let r = store.debit(&key, &one_token(), FAST).await;
    assert!(matches!(r, Err(StoreError::Contention { .. })), "{r:?}");
    let attempts = settled(&stub).await;
    assert!((1..=3).contains(&attempts), "{attempts} attempts");

    // With time enough, all four attempts are made.
    let stub = Stub::start(|_| conflict()).await;
    let store = stub.store(Duration::from_secs(1)).await;
    let r = store.debit(&key, &one_token(), FAST).await;
    assert!(matches!(r, Err(StoreError::Contention { .. })), "{r:?}");
    assert_eq!(settled(&stub).await, 4);
}

/// The same write, its caller gone after 10 ms while the first refusal takes 30 ms: no
/// retry follows. Before, four attempts ran.
#[cfg(feature = "dynamodb")]
#[tokio::test]
async fn the_conflict_retries_stop_once_the_caller_is_gone() {
    let stub = Stub::start(|_| conflict().after(Duration::from_millis(30))).await;
    let store = Detached::new(Arc::new(stub.store(Duration::from_secs(1)).await));
    let key = BucketKey::new("e", "r", 0);
    let gone = tokio::time::timeout(
        Duration::from_millis(10),
        store.debit(&key, &one_token(), FAST),
    )
    .await;
    assert!(gone.is_err(), "the caller gave up");
    assert_eq!(settled(&stub).await, 1);
    assert!(eventually(|| store.pressure().abandoned() == 0).await);
}

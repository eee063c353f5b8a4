//! Store failures: every call has a deadline, the circuit breaker stops calling a failing
//! store and probes it again, `failure_mode` decides the answer, and recovery needs no
//! restart.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use shardgate::config::Config;
use shardgate::engine::{Engine, EngineOptions};
use shardgate::service::{CallError, RateLimiter};
use shardgate::store::breaker::{Breaker, CircuitState};
use shardgate::store::dynamodb::{DynamoOptions, DynamoStore};
use shardgate::store::memory::MemoryStore;
use shardgate::store::{
    BucketItem, BucketKey, BucketStore, BumpOutcome, CommitOutcome, Credit, Debit, DebitMode,
    DebitOutcome, StoreError, Write,
};

/// A memory store that can be switched off, counting the calls that reach it.
#[derive(Default)]
struct Switchable {
    inner: MemoryStore,
    down: AtomicBool,
    /// Calls never answer (a store that accepts and hangs).
    hang: AtomicBool,
    calls: AtomicU64,
}

impl Switchable {
    async fn check(&self) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if self.down.load(Ordering::SeqCst) {
            Err(StoreError::Unavailable {
                key: "test".into(),
                reason: "switched off".into(),
            })
        } else {
            Ok(())
        }
    }
}

impl BucketStore for Switchable {
    async fn debit(
        &self,
        key: &BucketKey,
        d: &[Debit],
        m: DebitMode,
    ) -> Result<DebitOutcome, StoreError> {
        self.check().await?;
        self.inner.debit(key, d, m).await
    }
    async fn read(&self, keys: &[BucketKey]) -> Result<Vec<Option<BucketItem>>, StoreError> {
        self.check().await?;
        self.inner.read(keys).await
    }
    async fn commit(&self, writes: &[Write]) -> Result<CommitOutcome, StoreError> {
        self.check().await?;
        self.inner.commit(writes).await
    }
    async fn bump_shard_count(
        &self,
        e: &str,
        r: &str,
        o: u32,
        n: u32,
    ) -> Result<BumpOutcome, StoreError> {
        self.check().await?;
        self.inner.bump_shard_count(e, r, o, n).await
    }
    async fn raise_shard_count(&self, key: &BucketKey, n: u32) -> Result<bool, StoreError> {
        self.check().await?;
        self.inner.raise_shard_count(key, n).await
    }
    async fn credit(&self, key: &BucketKey, c: &[Credit]) -> Result<Vec<Credit>, StoreError> {
        self.check().await?;
        self.inner.credit(key, c).await
    }
}

const RULES: &str = "
domain: faults
descriptors:
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: open
    failure_mode: allow
    rate_limit: {unit: minute, requests_per_unit: 100}
";

fn limiter<S: BucketStore>(store: Arc<S>) -> RateLimiter<S> {
    let config = Config::from_yaml("faults.yaml", RULES).unwrap();
    let engine = Arc::new(Engine::new(
        store,
        EngineOptions {
            rejection_cache_ms: 0,
            ..EngineOptions::default()
        },
    ));
    RateLimiter::new(Arc::new(config), engine)
}

fn request(key: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "faults".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: key.into(),
                value: "x".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

#[tokio::test]
async fn failure_mode_decides_the_answer_and_recovery_needs_no_restart() {
    let store = Arc::new(Breaker::new(
        Switchable::default(),
        3,
        Duration::from_millis(200),
    ));
    let rl = limiter(store.clone());
    assert_eq!(
        rl.should_rate_limit(&request("closed"))
            .await
            .unwrap()
            .overall_code,
        Code::Ok as i32
    );

    store.inner().down.store(true, Ordering::SeqCst);
    let denied = rl.should_rate_limit(&request("closed")).await;
    assert!(
        matches!(denied, Err(CallError::Unavailable(_))),
        "deny → UNAVAILABLE"
    );
    let allowed = rl.should_rate_limit(&request("open")).await.unwrap();
    assert_eq!(allowed.overall_code, Code::Ok as i32, "allow → OK");

    // The circuit opens after three failures: further requests do not reach the store.
    for _ in 0..3 {
        let _ = rl.should_rate_limit(&request("closed")).await;
    }
    assert_eq!(store.state(), CircuitState::Open);
    let before = store.inner().calls.load(Ordering::SeqCst);
    for _ in 0..100 {
        assert!(rl.should_rate_limit(&request("closed")).await.is_err());
    }
    assert_eq!(
        store.inner().calls.load(Ordering::SeqCst),
        before,
        "an open circuit calls nothing"
    );

    // The store comes back: after the cool-off one probe closes the circuit.
    store.inner().down.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Ok(r) = rl.should_rate_limit(&request("closed")).await {
            assert_eq!(r.overall_code, Code::Ok as i32);
            break;
        }
        assert!(Instant::now() < deadline, "no recovery");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(store.state(), CircuitState::Closed);
}

#[tokio::test]
async fn a_failed_probe_reopens_the_circuit() {
    let store = Breaker::new(Switchable::default(), 1, Duration::from_millis(50));
    store.inner().down.store(true, Ordering::SeqCst);
    let key = [BucketKey::new("e", "r", 0)];
    assert!(store.read(&key).await.is_err());
    assert_eq!(store.state(), CircuitState::Open);
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(
        store.read(&key).await.is_err(),
        "the probe reaches the store and fails"
    );
    assert_eq!(store.state(), CircuitState::Open);
    assert_eq!(store.inner().calls.load(Ordering::SeqCst), 2);
}

/// A probe whose caller gives up (a client deadline drops the gRPC call) must still settle
/// the circuit: it reopens, and the next probe after the cool-off closes it.
#[tokio::test]
async fn a_probe_cancelled_by_its_caller_does_not_wedge_the_circuit() {
    let store = Breaker::new(Switchable::default(), 1, Duration::from_millis(50));
    let key = [BucketKey::new("e", "r", 0)];
    store.inner().down.store(true, Ordering::SeqCst);
    assert!(store.read(&key).await.is_err());
    assert_eq!(store.state(), CircuitState::Open);

    store.inner().down.store(false, Ordering::SeqCst);
    store.inner().hang.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(60)).await;
    let dropped = tokio::time::timeout(Duration::from_millis(20), store.read(&key)).await;
    assert!(dropped.is_err(), "the probe hangs and its caller gives up");
    assert_eq!(
        store.state(),
        CircuitState::Open,
        "a dropped probe counts as a failed one"
    );
    assert!(
        matches!(store.read(&key).await, Err(StoreError::CircuitOpen { .. })),
        "within the new cool-off calls fail at once"
    );

    store.inner().hang.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(store.read(&key).await.is_ok(), "the next probe succeeds");
    assert_eq!(store.state(), CircuitState::Closed);
}

/// A DynamoDB endpoint that accepts connections and never answers: every call ends at
/// its deadline instead of hanging.
#[tokio::test]
async fn every_dynamodb_call_has_a_deadline() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let held = Arc::new(std::sync::Mutex::new(Vec::new()));
    {
        let held = held.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                held.lock().unwrap().push(conn); // keep it open, say nothing
            }
        });
    }
    let options = DynamoOptions {
        table: "black_hole".into(),
        namespace: "t".into(),
        endpoint: Some(format!("http://{addr}")),
        region: Some("us-east-1".into()),
        timeout: Duration::from_millis(50),
    };
    std::env::set_var("AWS_ACCESS_KEY_ID", "local");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "local");
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    let store = Arc::new(DynamoStore::connect(&options).await);
    let rl = limiter(store);
    let started = Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        rl.should_rate_limit(&request("closed")),
    )
    .await
    .expect("a store call without a deadline would hang here");
    assert!(
        matches!(answer, Err(CallError::Unavailable(_))),
        "{answer:?}"
    );
    let allowed = tokio::time::timeout(
        Duration::from_secs(10),
        rl.should_rate_limit(&request("open")),
    )
    .await
    .expect("bounded")
    .unwrap();
    assert_eq!(allowed.overall_code, Code::Ok as i32);
    eprintln!(
        "two answers against a silent store took {:?}",
        started.elapsed()
    );
}

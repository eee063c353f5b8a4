//! Store failures: every call has a deadline, the circuit breaker stops calling a failing
//! store and probes it again, `failure_mode` decides the answer, and recovery needs no
//! restart.

mod common;

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
#[cfg(feature = "dynamodb")]
use shardgate::store::dynamodb::{DynamoOptions, DynamoStore};
use shardgate::store::memory::MemoryStore;
use shardgate::store::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Credit, CreditGuard, Debit, DebitMode,
    DebitOutcome, StoreError, Write,
};

/// A memory store that can be switched off, counting the calls that reach it.
#[derive(Default)]
struct Switchable {
    inner: MemoryStore,
    down: AtomicBool,
    /// Calls never answer (a store that accepts and hangs).
    hang: AtomicBool,
    /// Every call takes this many ms first (a slow store).
    delay_ms: AtomicU64,
    calls: AtomicU64,
}

impl Switchable {
    async fn check(&self) -> Result<(), StoreError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if self.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let delay = self.delay_ms.load(Ordering::SeqCst);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if self.down.load(Ordering::SeqCst) {
            Err(StoreError::Unavailable {
                key: "test".into(),
                reason: "switched off".into(),
                source: None,
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
    async fn credit(
        &self,
        key: &BucketKey,
        guard: CreditGuard,
        c: &[Credit],
    ) -> Result<Vec<Credit>, StoreError> {
        self.check().await?;
        self.inner.credit(key, guard, c).await
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
#[cfg(feature = "dynamodb")]
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

/// A gRPC call on `client` on `key` with the caller's deadline `timeout` (sent as
/// `grpc-timeout`, as Envoy sends its filter's `timeout`).
async fn call_within(
    client: &mut common::server::Rls,
    key: &str,
    timeout: Option<Duration>,
) -> Result<envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse, tonic::Status> {
    let mut req = tonic::Request::new(request(key));
    if let Some(t) = timeout {
        req.set_timeout(t);
    }
    tokio::time::timeout(Duration::from_secs(10), client.0.should_rate_limit(req))
        .await
        .expect("answered")
        .map(tonic::Response::into_inner)
}

/// A client of `server` whose connection is up and has carried a call (as Envoy's
/// long-lived connection has): a request for a domain no rule knows, no store call.
async fn connected<S: BucketStore>(server: &common::server::StoreServer<S>) -> common::server::Rls {
    let mut client = server.client().await;
    let mut warm = request("x");
    warm.domain = "no-such-domain".into();
    client.ok(warm).await;
    client
}

/// A caller that allows 50 ms gets its `failure_mode` answer from the server when the
/// store hangs — UNAVAILABLE for a `deny` rule, OK for `allow` — not its own
/// DEADLINE_EXCEEDED: the store gets the caller's time less a margin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_allowing_50ms_gets_its_failure_mode_answer_when_the_store_hangs() {
    let store = Arc::new(Breaker::new(
        Switchable::default(),
        5,
        Duration::from_millis(500),
    ));
    let server =
        common::server::StoreServer::start(RULES, store.clone(), EngineOptions::default()).await;
    let mut client = connected(&server).await;
    store.inner().hang.store(true, Ordering::SeqCst);
    for _ in 0..3 {
        let denied = call_within(&mut client, "closed", Some(Duration::from_millis(50))).await;
        let status = denied.expect_err("fails closed");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        let allowed = call_within(&mut client, "open", Some(Duration::from_millis(50)))
            .await
            .expect("fails open");
        assert_eq!(allowed.overall_code, Code::Ok as i32);
    }
}

/// A caller that allows 2 s is not failed at some shorter deadline of the server's: a
/// store that takes 300 ms answers (the default store timeout is 1 s), and so does one
/// without a deadline of its own.
#[tokio::test]
async fn a_patient_caller_waits_for_a_slow_store() {
    let store = Arc::new(Breaker::new(
        Switchable::default(),
        5,
        Duration::from_millis(500),
    ));
    store.inner().delay_ms.store(300, Ordering::SeqCst);
    let server =
        common::server::StoreServer::start(RULES, store.clone(), EngineOptions::default()).await;
    let mut client = connected(&server).await;
    for timeout in [Some(Duration::from_secs(2)), None] {
        let r = call_within(&mut client, "closed", timeout)
            .await
            .expect("the store answered");
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert!(
            r.statuses[0].current_limit.is_some(),
            "decided, not failed open"
        );
    }
    assert_eq!(store.state(), CircuitState::Closed);
}

/// A caller whose deadline leaves the store no time at all is answered at once by its
/// `failure_mode`, without a store call: one hasty client costs the store nothing and
/// cannot open the circuit for everyone.
#[tokio::test]
async fn a_caller_with_no_time_left_costs_the_store_nothing() {
    let store = Arc::new(Breaker::new(
        Switchable::default(),
        1,
        Duration::from_secs(60),
    ));
    let server =
        common::server::StoreServer::start(RULES, store.clone(), EngineOptions::default()).await;
    let mut client = connected(&server).await;
    for _ in 0..5 {
        let r = call_within(&mut client, "closed", Some(Duration::from_micros(500))).await;
        match r {
            // The server's UNAVAILABLE, or the client's own deadline passing first.
            Err(s) => assert!(
                matches!(
                    s.code(),
                    tonic::Code::Unavailable
                        | tonic::Code::DeadlineExceeded
                        | tonic::Code::Cancelled
                ),
                "{s:?}"
            ),
            Ok(r) => panic!("no time for a decision: {r:?}"),
        }
    }
    assert_eq!(store.inner().calls.load(Ordering::SeqCst), 0);
    assert_eq!(store.state(), CircuitState::Closed);
    let r = call_within(&mut client, "closed", Some(Duration::from_secs(2)))
        .await
        .unwrap();
    assert_eq!(r.overall_code, Code::Ok as i32);
}

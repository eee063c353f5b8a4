//! Throttling is one bucket's contention, never an outage (issue 27, point 12): DynamoDB
//! throttling one partition is that bucket's answer — a doubling where it can still
//! double, else a short refusal for it alone — while every other bucket is decided as
//! before and the circuit breaker never counts it. Throttling of the whole table (its
//! reasons name the table's or the account's limit) is still the store failing.
//!
//! The store level runs against a stand-in for DynamoDB (`common/stub_dynamo.rs`), the engine and
//! the service against a memory store that throttles chosen buckets.

#[cfg(feature = "dynamodb")]
#[path = "common/stub_dynamo.rs"]
mod stub_dynamo;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use shardgate::config::Config;
use shardgate::engine::{
    Acquire, BucketClaim, Engine, EngineOptions, EngineStats, LimitClaim, LimitParams, ManualClock,
    ScriptedDraw, CONTENTION_RETRY_MS,
};
use shardgate::service::RateLimiter;
use shardgate::store::breaker::{Breaker, CircuitState};
use shardgate::store::memory::MemoryStore;
use shardgate::store::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Credit, CreditGuard, Debit, DebitMode,
    DebitOutcome, LimitState, Limits, StoreError, Write, WCU_LIMIT,
};
#[cfg(feature = "dynamodb")]
use stub_dynamo::{Answer, Stub};

// ------------------------------------------------------------------ the store

#[cfg(feature = "dynamodb")]
fn hot_or_nothing(reasons: serde_json::Value) -> impl Fn(&stub_dynamo::Request) -> Answer {
    move |r| {
        if r.operation == "UpdateItem" && r.concerns("hot") {
            Answer::error("ThrottlingException", reasons.clone())
        } else {
            Answer::nothing(r)
        }
    }
}

#[cfg(feature = "dynamodb")]
fn fast(now_s: i64) -> DebitMode {
    DebitMode::Fast {
        now_s,
        shard_count: 1,
    }
}

#[cfg(feature = "dynamodb")]
fn one_token() -> Vec<Debit> {
    vec![Debit {
        limit: "rpm".into(),
        amount: 1_000,
        gated: true,
        params: Some(LimitParams::new(10, 10, 60_000)),
    }]
}

/// A hot bucket's writes, six in a row between two of another bucket's (the hot one takes
/// most of the traffic), all throttled: each is answered at once as that bucket's
/// throttle (one attempt each: the SDK does not retry it), the other bucket's writes keep
/// being answered, and the breaker (five consecutive faults open it) stays closed.
/// Before, each throttle was the store's fault after three attempts, and the fifth in a
/// row opened the circuit for every bucket.
#[cfg(feature = "dynamodb")]
#[tokio::test]
async fn a_throttled_partition_leaves_the_circuit_closed_for_every_other_bucket() {
    let stub = Stub::start(hot_or_nothing(serde_json::json!({}))).await;
    let store = Breaker::new(
        stub.store(Duration::from_secs(1)).await,
        5,
        Duration::from_secs(60),
    );
    let hot = BucketKey::new("hot", "api", 0);
    let cold = BucketKey::new("cold", "api", 0);
    for round in 0..4 {
        for i in 0..6 {
            let throttled = store.debit(&hot, &one_token(), fast(1)).await;
            assert_eq!(
                throttled,
                Err(StoreError::Throttled { key: hot.clone() }),
                "round {round}, call {i}"
            );
        }
        let answered = store.debit(&cold, &one_token(), fast(1)).await;
        assert_eq!(answered, Ok(DebitOutcome::Refused(None)), "round {round}");
    }
    assert_eq!(store.state(), CircuitState::Closed);
    assert_eq!(
        stub.count(|r| r.concerns("hot")),
        24,
        "one attempt per throttled call"
    );
    let ledger = store.inner().ledger().totals();
    let throttled = ledger
        .iter()
        .find(|(k, _)| k.operation == "UpdateItem" && k.outcome == "throttled");
    assert_eq!(throttled.map(|(_, t)| t.calls), Some(24), "{ledger:?}");
}

/// DynamoDB names why it throttled: a key range's limit is the bucket's, the same as no
/// reason at all; the table's capacity or the account's quota throttles every bucket
/// alike, and that is the store failing: the breaker counts it.
#[cfg(feature = "dynamodb")]
#[tokio::test]
async fn throttling_of_the_whole_table_is_the_stores_fault() {
    let key_range = serde_json::json!({"throttlingReasons": [
        {"reason": "TableWriteKeyRangeThroughputExceeded", "resource": "arn:aws:dynamodb:us-east-1:1:table/stub"}
    ]});
    let stub = Stub::start(hot_or_nothing(key_range)).await;
    let store = stub.store(Duration::from_secs(1)).await;
    let hot = BucketKey::new("hot", "api", 0);
    let err = store.debit(&hot, &one_token(), fast(1)).await.unwrap_err();
    assert_eq!(err, StoreError::Throttled { key: hot.clone() });
    assert!(!err.is_fault());

    let table_wide = serde_json::json!({"throttlingReasons": [
        {"reason": "TableWriteAccountLimitExceeded", "resource": "arn:aws:dynamodb:us-east-1:1:table/stub"}
    ]});
    let stub = Stub::start(hot_or_nothing(table_wide)).await;
    let store = Breaker::new(
        stub.store(Duration::from_secs(1)).await,
        5,
        Duration::from_secs(60),
    );
    for _ in 0..5 {
        let err = store.debit(&hot, &one_token(), fast(1)).await.unwrap_err();
        assert!(err.is_fault(), "{err}");
        assert!(err.to_string().contains("ThrottlingException"), "{err}");
    }
    assert_eq!(store.state(), CircuitState::Open);
}

// ------------------------------------------------------------------ the engine

/// A memory store whose fast debits on the chosen buckets DynamoDB would throttle:
/// `times` of them (then it lets them through), on the entities `hot` names.
struct Throttling {
    inner: MemoryStore,
    hot: &'static [&'static str],
    times: AtomicU32,
}

impl Throttling {
    fn new(hot: &'static [&'static str], times: u32) -> Throttling {
        Throttling {
            inner: MemoryStore::new(),
            hot,
            times: AtomicU32::new(times),
        }
    }
}

impl BucketStore for Throttling {
    async fn debit(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
    ) -> Result<DebitOutcome, StoreError> {
        let hot = self.hot.contains(&key.entity.as_str());
        let take = || {
            self.times
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| t.checked_sub(1))
                .is_ok()
        };
        if hot && matches!(mode, DebitMode::Fast { .. }) && take() {
            return Err(StoreError::Throttled { key: key.clone() });
        }
        self.inner.debit(key, debits, mode).await
    }
    async fn read(&self, keys: &[BucketKey]) -> Result<Vec<Option<BucketItem>>, StoreError> {
        self.inner.read(keys).await
    }
    async fn commit(&self, writes: &[Write]) -> Result<CommitOutcome, StoreError> {
        self.inner.commit(writes).await
    }
    async fn credit(
        &self,
        key: &BucketKey,
        guard: CreditGuard,
        credits: &[Credit],
    ) -> Result<Vec<Credit>, StoreError> {
        self.inner.credit(key, guard, credits).await
    }
}

const T0: i64 = 1_800_000_000_000;

fn rpm(entity: &str, rate: u64) -> BucketClaim {
    BucketClaim {
        entity: entity.into(),
        resource: "api".into(),
        limits: smallvec::smallvec![LimitClaim {
            limit: "rpm".into(),
            params: LimitParams::new(rate, rate, 60_000),
            amount: 1_000,
            forced: false,
        }],
        cascades: false,
        strict: false,
    }
}

/// A shard of `entity/api` at `count` shards, its `rpm` share full and `wcu` untouched: a
/// bucket nothing but the throttle says is hot.
async fn put_shard(store: &Throttling, entity: &str, shard: u32, count: u32, rate: u64) {
    let p = LimitParams::new(rate, rate, 60_000);
    let wcu = LimitParams::new(1_000, 1_000, 1_000);
    let mut limits = Limits::new();
    limits.insert("rpm", LimitState::new(p, p.share(count).ceiling, 0));
    limits.insert(WCU_LIMIT, LimitState::new(wcu, wcu.capacity, 0));
    let item = BucketItem {
        refilled_at: T0,
        shard_count: count,
        count_raised_at: 0,
        ttl: Some(T0 / 1_000 + 3_600),
        limits,
    };
    let create = Write::Create {
        key: BucketKey::new(entity, "api", shard),
        item,
    };
    assert_eq!(
        store.inner.commit(&[create]).await.unwrap(),
        CommitOutcome::Committed
    );
}

fn engine(store: Arc<Throttling>, draws: impl IntoIterator<Item = u32>) -> Engine<Throttling> {
    Engine::with_parts(
        store,
        EngineOptions {
            rejection_cache_ms: 0,
            ..EngineOptions::default()
        },
        Arc::new(ManualClock::new(T0)),
        Arc::new(ScriptedDraw::new(draws)),
    )
}

async fn shard(store: &Throttling, entity: &str, shard: u32) -> Option<BucketItem> {
    store
        .inner
        .read(&[BucketKey::new(entity, "api", shard)])
        .await
        .unwrap()
        .pop()
        .unwrap()
}

/// A throttled fast debit drives its bucket's doubling, as a `wcu` run dry does (the
/// same doubling: shard 0's count raised and clamped), and the request is then decided
/// on a brand-new shard: admitted, with no error for `failure_mode` to answer.
#[tokio::test]
async fn a_throttled_debit_doubles_its_bucket_and_is_decided_on_a_new_shard() {
    let store = Arc::new(Throttling::new(&["hot"], 1));
    put_shard(&store, "hot", 0, 1, 100_000).await;
    let engine = engine(store.clone(), [0]);
    let req = Acquire {
        buckets: smallvec::smallvec![rpm("hot", 100_000)],
    };
    let d = engine.acquire(&req).await.expect("a throttle is no error");
    assert!(d.admitted, "{d:?}");
    assert_eq!(d.buckets[0].shard, 1, "decided on the new shard");
    let stats = engine.stats();
    assert_eq!(EngineStats::get(&stats.shard_doublings), 1);
    assert_eq!(EngineStats::get(&stats.throttled_refusals), 0);
    let zero = shard(&store, "hot", 0).await.unwrap();
    assert_eq!(zero.shard_count, 2);
    assert_eq!(
        zero.limits["rpm"].balance, 50_000_000,
        "clamped to its new share"
    );
    let one = shard(&store, "hot", 1)
        .await
        .expect("created by the slow pass");
    assert_eq!(
        (one.shard_count, one.limits["rpm"].balance),
        (2, 50_000_000 - 1_000)
    );
    assert_eq!(engine.known_shard_count("hot", "api"), 2);
}

/// A throttled bucket that cannot double (32 shards already) is refused with a short
/// wait, itself alone: the other bucket of the request is answered as fitting and had its
/// debit refunded, and nothing is an error.
#[tokio::test]
async fn a_throttled_bucket_that_cannot_double_is_refused_for_itself_alone() {
    let store = Arc::new(Throttling::new(&["hot"], u32::MAX));
    put_shard(&store, "hot", 0, 32, 100_000).await;
    put_shard(&store, "cold", 0, 1, 100).await;
    let engine = engine(store.clone(), [0, 0]);
    engine.learn_shard_count("hot", "api", 32);
    let req = Acquire {
        buckets: smallvec::smallvec![rpm("cold", 100), rpm("hot", 100_000)],
    };
    let d = engine.acquire(&req).await.expect("a throttle is no error");
    assert!(!d.admitted);
    let hot = &d.buckets[1].limits[0];
    assert_eq!(
        (hot.fits, hot.wait_ms),
        (false, Some(CONTENTION_RETRY_MS)),
        "{d:?}"
    );
    assert!(d.buckets[0].limits[0].fits, "{d:?}");
    let cold = shard(&store, "cold", 0).await.unwrap();
    assert_eq!(
        cold.limits["rpm"].balance, 100_000,
        "the cold debit was refunded"
    );
    let stats = engine.stats();
    assert_eq!(EngineStats::get(&stats.throttled_refusals), 1);
    assert_eq!(EngineStats::get(&stats.shard_doublings_declined_at_max), 1);
    assert_eq!(EngineStats::get(&stats.shard_doublings), 0);
}

/// A throttled bucket whose doubled shards could not hold its requests (2 per minute,
/// 2 tokens a request) is not doubled but refused; the next request after the throttle
/// passes is decided as before.
#[tokio::test]
async fn a_throttled_bucket_too_small_to_double_is_refused_not_spread() {
    let store = Arc::new(Throttling::new(&["hot"], 1));
    put_shard(&store, "hot", 0, 1, 2).await;
    let engine = engine(store.clone(), [0, 0]);
    let mut claim = rpm("hot", 2);
    claim.limits[0].amount = 2_000;
    let req = Acquire {
        buckets: smallvec::smallvec![claim],
    };
    let d = engine.acquire(&req).await.expect("a throttle is no error");
    assert!(!d.admitted);
    assert_eq!(d.buckets[0].limits[0].wait_ms, Some(CONTENTION_RETRY_MS));
    let stats = engine.stats();
    assert_eq!(
        EngineStats::get(&stats.shard_doublings_declined_small_share),
        1
    );
    assert_eq!(shard(&store, "hot", 0).await.unwrap().shard_count, 1);
    assert!(engine.acquire(&req).await.unwrap().admitted);
}

// ------------------------------------------------------------------ the service

const RULES: &str = "
domain: pressure
descriptors:
  - key: user
    failure_mode: deny
    rate_limit: {unit: minute, requests_per_unit: 100}
";

fn request(user: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "pressure".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: user.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// Through the service, behind the circuit breaker as the server runs it: a bucket whose
/// partition stays throttled is answered OVER_LIMIT with a 100 ms reset — never
/// UNAVAILABLE, though its rule says `failure_mode: deny` — and another user's bucket is
/// decided normally all along; the circuit never opens.
#[tokio::test]
async fn a_throttled_bucket_is_over_limit_for_a_moment_not_unavailable() {
    // An entity is the descriptor's canonical path.
    let store = Arc::new(Breaker::new(
        Throttling::new(&["user=hot"], u32::MAX),
        5,
        Duration::from_secs(60),
    ));
    let config = Config::from_yaml("pressure.yaml", RULES).unwrap();
    let options = EngineOptions {
        rejection_cache_ms: 0,
        ..EngineOptions::default()
    };
    let engine = Arc::new(Engine::new(store.clone(), options));
    let rl = RateLimiter::new(Arc::new(config), engine.clone());
    for i in 0..10 {
        let r = rl
            .should_rate_limit(&request("hot"))
            .await
            .unwrap_or_else(|e| panic!("request {i}: {e}"));
        assert_eq!(r.overall_code, Code::OverLimit as i32, "request {i}");
        let reset = r.statuses[0].duration_until_reset.unwrap();
        assert_eq!(
            (reset.seconds, reset.nanos),
            (0, 100_000_000),
            "request {i}"
        );
        let other = rl.should_rate_limit(&request("cold")).await.unwrap();
        assert_eq!(other.overall_code, Code::Ok as i32);
        assert!(other.statuses[0].current_limit.is_some(), "decided");
    }
    assert_eq!(store.state(), CircuitState::Closed);
    assert!(EngineStats::get(&engine.stats().throttled_refusals) >= 10);
}

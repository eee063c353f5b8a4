//! DynamoDB-specific behaviour against DynamoDB Local: the calls each path costs, TTL,
//! a hot entity sharding itself, a config change reaching every shard, and three server
//! processes sharing one bucket.

#![cfg(feature = "dynamodb")]

mod common;

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use shardgate::engine::{
    Acquire, BucketClaim, Engine, EngineOptions, LimitClaim, LimitParams, ManualClock, ScriptedDraw,
};
use shardgate::store::dynamodb::DynamoStore;
use shardgate::store::{
    inspect, BucketItem, BucketKey, BucketStore, InspectedShard, LimitState, Limits, WCU_LIMIT,
};

const T0: i64 = 1_800_000_000_000;

fn rpm(entity: &str, rate: u64, amount: i64) -> BucketClaim {
    BucketClaim {
        entity: entity.into(),
        resource: "api".into(),
        limits: smallvec::smallvec![LimitClaim {
            limit: "rpm".into(),
            params: LimitParams::new(rate, rate, 60_000),
            amount: amount * 1_000,
            forced: false,
        }],
        cascades: false,
        strict: false,
    }
}

fn one(b: BucketClaim) -> Acquire {
    Acquire {
        buckets: smallvec::smallvec![b],
    }
}

struct Frozen {
    engine: Engine<DynamoStore>,
    store: Arc<DynamoStore>,
    clock: Arc<ManualClock>,
    draw: Arc<ScriptedDraw>,
}

async fn frozen(rejection_cache_ms: i64) -> Frozen {
    let store = Arc::new(common::dynamo::store().await);
    let clock = Arc::new(ManualClock::new(T0));
    let draw = Arc::new(ScriptedDraw::default());
    let engine = Engine::with_parts(
        store.clone(),
        EngineOptions {
            rejection_cache_ms,
            ..EngineOptions::default()
        },
        clock.clone(),
        draw.clone(),
    );
    Frozen {
        engine,
        store,
        clock,
        draw,
    }
}

fn sequence(store: &DynamoStore) -> Vec<String> {
    let s = store.ledger().sequence();
    store.ledger().reset();
    s
}

#[tokio::test]
#[cfg_attr(
    not(dynamodb_local),
    ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
)]
async fn first_request_is_one_update_item_that_creates_and_steady_state_one_update_item() {
    let f = frozen(0).await;
    let req = one(rpm("u1", 10, 1));
    assert!(f.engine.acquire(&req).await.unwrap().admitted);
    // The debit found no item and created it, debited: one write, no refused one.
    assert_eq!(sequence(&f.store), ["UpdateItem"]);
    for _ in 0..9 {
        assert!(f.engine.acquire(&req).await.unwrap().admitted);
    }
    assert_eq!(
        sequence(&f.store),
        vec!["UpdateItem"; 9],
        "one write, no read"
    );
    // One write unit per admitted request, as DynamoDB reports it.
    assert!(!f.engine.acquire(&req).await.unwrap().admitted);
    assert_eq!(
        sequence(&f.store),
        ["UpdateItem✗"],
        "fast rejection: no read"
    );
}

#[tokio::test]
#[cfg_attr(
    not(dynamodb_local),
    ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
)]
async fn steady_state_consumes_one_write_unit_per_admitted_request() {
    let f = frozen(0).await;
    let req = one(rpm("u1", 1_000, 1));
    assert!(f.engine.acquire(&req).await.unwrap().admitted);
    f.store.ledger().reset();
    for _ in 0..20 {
        assert!(f.engine.acquire(&req).await.unwrap().admitted);
    }
    let totals = f.store.ledger().totals();
    assert_eq!(totals.len(), 1, "{totals:?}");
    let (kind, t) = totals.iter().next().unwrap();
    assert_eq!((kind.operation, kind.outcome), ("UpdateItem", "ok"));
    assert_eq!(t.calls, 20);
    assert!((t.capacity - 20.0).abs() < 1e-9, "capacity {}", t.capacity);
}

#[tokio::test]
#[cfg_attr(
    not(dynamodb_local),
    ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
)]
async fn slow_path_is_one_read_and_one_write() {
    let f = frozen(0).await;
    let req = one(rpm("u1", 10, 1));
    for _ in 0..11 {
        f.engine.acquire(&req).await.unwrap();
    }
    f.clock.advance(6_001);
    f.store.ledger().reset();
    assert!(f.engine.acquire(&req).await.unwrap().admitted);
    assert_eq!(
        sequence(&f.store),
        ["UpdateItem✗", "BatchGetItem", "UpdateItem"]
    );
}

#[tokio::test]
#[cfg_attr(
    not(dynamodb_local),
    ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
)]
async fn a_new_cascade_is_two_updates_that_create_and_hot_path_two_updates() {
    let f = frozen(0).await;
    let mut child = rpm("key1", 10, 1);
    child.cascades = true;
    let req = Acquire {
        buckets: smallvec::smallvec![child, rpm("org", 100, 1)],
    };
    assert!(f.engine.acquire(&req).await.unwrap().admitted);
    let seq = sequence(&f.store);
    // Both debits found no item and created theirs: no refused write, no transaction.
    assert_eq!(seq, ["UpdateItem", "UpdateItem"]);
    assert!(f.engine.acquire(&req).await.unwrap().admitted);
    assert_eq!(sequence(&f.store), ["UpdateItem", "UpdateItem"]);
}

#[tokio::test]
#[cfg_attr(
    not(dynamodb_local),
    ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
)]
async fn repeat_rejection_within_the_cache_second_costs_no_call() {
    let f = frozen(1_000).await;
    let req = one(rpm("u1", 3, 1));
    for _ in 0..3 {
        assert!(f.engine.acquire(&req).await.unwrap().admitted);
    }
    f.store.ledger().reset();
    for _ in 0..5 {
        assert!(!f.engine.acquire(&req).await.unwrap().admitted);
    }
    assert_eq!(f.store.ledger().total_calls(), 0);
    f.clock.advance(1_000);
    assert!(!f.engine.acquire(&req).await.unwrap().admitted);
    assert_eq!(
        sequence(&f.store),
        ["UpdateItem✗"],
        "a stale image is not trusted"
    );
}

/// S44 an expired but not yet swept item: the slow path refreshes its TTL and keeps its
/// stored parameters and balance (no reset to full).
#[tokio::test]
#[cfg_attr(
    not(dynamodb_local),
    ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
)]
async fn s44_expired_item_is_refreshed_not_reset() {
    let f = frozen(0).await;
    let p = LimitParams::new(10, 10, 60_000);
    let wcu = LimitParams::new(1_000, 1_000, 1_000);
    let mut limits = Limits::new();
    limits.insert("rpm", LimitState::new(p, 4_000, 6_000));
    limits.insert(WCU_LIMIT, LimitState::new(wcu, wcu.capacity, 0));
    common::put(
        &*f.store,
        BucketKey::new("u1", "api", 0),
        BucketItem {
            refilled_at: T0,
            shard_count: 1,
            count_raised_at: 0,
            ttl: Some(T0 / 1_000 - 1),
            limits,
        },
    )
    .await;
    f.store.ledger().reset();
    assert!(
        f.engine
            .acquire(&one(rpm("u1", 10, 1)))
            .await
            .unwrap()
            .admitted
    );
    assert_eq!(
        sequence(&f.store),
        ["UpdateItem✗", "BatchGetItem", "UpdateItem"]
    );
    let it = f
        .store
        .read(&[BucketKey::new("u1", "api", 0)])
        .await
        .unwrap()[0]
        .clone()
        .unwrap();
    assert_eq!(it.ttl, Some(T0 / 1_000 + 420));
    assert_eq!(
        (it.limits["rpm"].balance, it.limits["rpm"].capacity),
        (3_000, 10_000)
    );
}

/// A config change reaches every existing shard on its next request: the stored
/// parameters are rewritten and each balance clamped to the new share.
#[tokio::test]
#[cfg_attr(
    not(dynamodb_local),
    ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
)]
async fn changed_limit_reaches_every_existing_shard() {
    let f = frozen(0).await;
    let old = LimitParams::new(100, 100, 60_000);
    let wcu = LimitParams::new(1_000, 1_000, 1_000);
    for s in 0..4 {
        let mut limits = Limits::new();
        limits.insert("rpm", LimitState::new(old, 25_000, 0));
        limits.insert(WCU_LIMIT, LimitState::new(wcu, wcu.capacity, 0));
        common::put(
            &*f.store,
            BucketKey::new("u1", "api", s),
            BucketItem {
                refilled_at: T0,
                shard_count: 4,
                count_raised_at: 0,
                ttl: None,
                limits,
            },
        )
        .await;
    }
    f.engine.learn_shard_count("u1", "api", 4);
    let lowered = one(rpm("u1", 40, 1));
    for s in 0..4 {
        f.draw.push(s);
        assert!(f.engine.acquire(&lowered).await.unwrap().admitted);
    }
    for InspectedShard { shard: s, image } in inspect(&*f.store, "u1", "api").await.unwrap() {
        let rpm = image.unwrap().limits["rpm"];
        assert_eq!(
            (rpm.capacity, rpm.refill_amount, rpm.refill_period_ms),
            (40_000, 40_000, 60_000),
            "shard {s}"
        );
        assert_eq!(
            rpm.balance,
            10_000 - 1_000,
            "shard {s}: clamped to the new share, then debited"
        );
    }
}

/// A hot entity with a partition write budget of 5 writes/s, offered up to ~200 requests/s
/// for 5 s, spreads over as many shards as the rate DynamoDB Local actually answered
/// calls for (at least 8 at ≥ 40/s), creates every shard it draws at its share, and admits
/// at most 1.5 × (capacity + rate × elapsed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(dynamodb_local),
    ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
)]
async fn hot_entity_shards_itself() {
    // Low enough that even the ~35 answers/s of a slow machine's DynamoDB Local are a
    // hot partition several times over; at the ~200/s of a quiet one the bucket reaches
    // 32 shards, whose slow passes then refill `wcu` (admitting as before).
    const BUDGET: u64 = 5;
    let store = Arc::new(common::dynamo::store().await);
    let _turn = common::dynamo::load_turn().await;
    // The offered ~200/s must be answered for the partition budget to be passed.
    common::dynamo::warm_up(50, Duration::from_millis(100)).await;
    let engine = Arc::new(Engine::new(
        store.clone(),
        EngineOptions {
            partition_write_budget: BUDGET,
            ..EngineOptions::default()
        },
    ));
    // The limit is above the offered load: every request is a write the partition must
    // absorb (refusals are mostly answered by the rejection cache and cost no write).
    let (cap, rate) = (300u64, 300u64);
    let claim = BucketClaim {
        entity: "hot".into(),
        resource: "api".into(),
        limits: smallvec::smallvec![LimitClaim {
            limit: "rps".into(),
            params: LimitParams::new(cap, rate, 1_000),
            amount: 1_000,
            forced: false,
        }],
        cascades: false,
        strict: false,
    };
    let admitted = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    // 50 clients × 4 requests/s: the offered ~200/s holds even when one call takes a
    // few hundred ms on a busy machine (missed ticks are caught up).
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (engine, admitted, req) = (engine.clone(), admitted.clone(), one(claim.clone()));
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(250));
                for _ in 0..20 {
                    tick.tick().await;
                    if engine.acquire(&req).await.unwrap().admitted {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    // Every request is answered (1,000 in all): the rate the partition had to absorb is
    // what the store answered, however slow this machine is.
    let answered = 50.0 * 20.0 / elapsed;
    let admitted = admitted.load(Ordering::Relaxed) as f64;
    let shards = inspect(&*store, "hot", "api").await.unwrap();
    let count = shards[0].image.as_ref().unwrap().shard_count;
    let expected = expected_shards(answered, BUDGET).min(8);
    assert!(
        expected >= 4,
        "DynamoDB Local answered only {answered:.0} calls/s: too slow to show doubling"
    );
    assert!(
        count >= expected,
        "shard 0 counts {count} shards after {elapsed:.1} s at {answered:.0} answers/s \
         (a budget of {BUDGET} writes/s per shard calls for {expected})"
    );
    for InspectedShard { shard: s, image } in &shards {
        let Some(image) = image else { continue };
        let l = image.limits["rps"];
        assert_eq!(
            l.capacity,
            cap as i64 * 1_000,
            "stored undivided on shard {s}"
        );
        if *s > 0 {
            // Shard s was created by a doubling to at least the next power of two above
            // s, at that count's share; a later doubling only lowers its ceiling at its
            // next slow pass (the documented transient), never raises its balance.
            let created_with = i64::from((*s + 1).next_power_of_two());
            assert!(
                l.balance <= l.capacity / created_with,
                "shard {s} holds {} over the share it was created with",
                l.balance
            );
        }
    }
    let bound = 1.5 * (cap as f64 + rate as f64 * elapsed);
    assert!(admitted <= bound, "admitted {admitted} > {bound}");
    assert!(
        admitted >= 800.0,
        "the limit is above the load: admitted only {admitted}"
    );
    let consumed: i64 = shards
        .iter()
        .filter_map(|s| s.image.as_ref())
        .map(|i| i.limits["rps"].taken)
        .sum();
    assert_eq!(consumed, admitted as i64 * 1_000, "no debit lost");
}

/// The shard count a bucket answering `rate` writes per second must reach with a write
/// budget of `budget` per shard: the largest power of two at most `rate / budget`. One
/// count below it every shard is offered at least twice its budget, so its `wcu` runs
/// dry within a second and the bucket doubles again.
fn expected_shards(rate: f64, budget: u64) -> u32 {
    let fit = (rate / budget as f64).floor().max(1.0) as u32;
    1 << fit.ilog2()
}

#[test]
fn expected_shards_is_the_power_of_two_the_rate_fills() {
    assert_eq!(expected_shards(4.0, 5), 1);
    assert_eq!(expected_shards(10.0, 5), 2);
    assert_eq!(expected_shards(35.0, 5), 4);
    assert_eq!(expected_shards(48.0, 5), 8);
    assert_eq!(expected_shards(200.0, 5), 32);
}

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Three server processes sharing one table and one bucket admit no more than
/// capacity + rate × elapsed in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(dynamodb_local),
    ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
)]
async fn three_servers_share_one_bucket() {
    let store = common::dynamo::store().await; // creates the table, picks a namespace
    let _turn = common::dynamo::load_turn().await;
    common::dynamo::warm_up(24, Duration::from_millis(100)).await;
    let namespace = store.pk(&BucketKey::new("x", "y", 0));
    let namespace = namespace.split("/BUCKET#").next().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("limits.yaml");
    std::fs::write(
        &config,
        "domain: fleet\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 20, burst: 40}\n",
    )
    .unwrap();
    // Hold all three sockets while choosing, so the ports are distinct.
    let held: Vec<std::net::TcpListener> = (0..3)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let ports: Vec<u16> = held
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect();
    drop(held);
    let _servers: Vec<Server> = ports
        .iter()
        .map(|port| {
            Server(
                Command::new(env!("CARGO_BIN_EXE_shardgate"))
                    .args([
                        "serve",
                        "--store",
                        "dynamodb",
                        "--table",
                        common::dynamo::TABLE,
                    ])
                    .args(["--namespace", &namespace])
                    .args(["--dynamodb-endpoint", &common::dynamo::endpoint()])
                    .args(["--grpc-addr", &format!("127.0.0.1:{port}")])
                    .args(["--http-addr", "127.0.0.1:0"])
                    // DynamoDB Local on a busy CI machine is slower than real DynamoDB.
                    .args(["--store-timeout", "2s"])
                    .arg("--config")
                    .arg(&config)
                    .env("AWS_ACCESS_KEY_ID", "local")
                    .env("AWS_SECRET_ACCESS_KEY", "local")
                    .env("AWS_REGION", "us-east-1")
                    .env("AWS_EC2_METADATA_DISABLED", "true")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("start shardgate"),
            )
        })
        .collect();
    let mut clients = Vec::new();
    for port in &ports {
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match RateLimitServiceClient::connect(url.clone()).await {
                Ok(c) => {
                    clients.push(c);
                    break;
                }
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => panic!("server on {port} did not come up: {e}"),
            }
        }
    }
    let request = RateLimitRequest {
        domain: "fleet".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "tenant".into(),
                value: "acme".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    };
    let admitted = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + Duration::from_secs(3);
    let tasks: Vec<_> = (0..24)
        .map(|i| {
            let mut client = clients[i % 3].clone();
            let (request, admitted) = (request.clone(), admitted.clone());
            tokio::spawn(async move {
                for _ in 0..400 {
                    if Instant::now() >= deadline {
                        break;
                    }
                    let r = client
                        .should_rate_limit(request.clone())
                        .await
                        .expect("rpc");
                    if r.get_ref().overall_code == Code::Ok as i32 {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = start.elapsed().as_secs_f64();
    let admitted = admitted.load(Ordering::Relaxed) as f64;
    let bound = 40.0 + 20.0 * elapsed;
    assert!(admitted <= bound, "admitted {admitted} > C + R·t = {bound}");
    assert!(admitted >= 40.0, "admitted only {admitted}");
}

/// An item this server cannot read (here a limit whose refill period is 0, as a hand edit
/// or another tool could leave it) is refused with an error naming the item's key and
/// what is wrong, and the item is left as it was.
#[tokio::test]
#[cfg_attr(
    not(dynamodb_local),
    ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
)]
async fn a_corrupt_item_is_an_error_naming_its_key_and_reason() {
    use aws_sdk_dynamodb::types::AttributeValue;
    use shardgate::store::{Debit, DebitMode, StoreError};
    let store = common::dynamo::store().await;
    let key = BucketKey::new("corrupt", "api", 0);
    let pk = store.pk(&key);
    let n = |v: i64| AttributeValue::N(v.to_string());
    store
        .client()
        .put_item()
        .table_name(common::dynamo::TABLE)
        .item("PK", AttributeValue::S(pk.clone()))
        .item("SK", AttributeValue::S("#STATE".into()))
        .item("rf", n(1))
        .item("b_rpm_tk", n(5_000))
        .item("b_rpm_cp", n(10_000))
        .item("b_rpm_ra", n(10_000))
        .item("b_rpm_rp", n(0))
        .send()
        .await
        .unwrap();
    let debit = [Debit {
        limit: "rpm".into(),
        amount: 1_000,
        gated: true,
        params: Some(LimitParams::new(10, 10, 60_000)),
    }];
    let err = store
        .debit(
            &key,
            &debit,
            DebitMode::Fast {
                now_s: T0 / 1_000,
                shard_count: 1,
            },
        )
        .await
        .unwrap_err();
    match &err {
        StoreError::Corrupt { key, reason, .. } => {
            assert_eq!(key, &pk);
            assert_eq!(reason, "limit 'rpm' has refill period 0");
        }
        other => panic!("expected a corrupt-item error, got {other:?}"),
    }
    assert!(err.to_string().contains(&pk), "{err}");
    let left = store
        .client()
        .get_item()
        .table_name(common::dynamo::TABLE)
        .key("PK", AttributeValue::S(pk))
        .key("SK", AttributeValue::S("#STATE".into()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        left.item().unwrap()["b_rpm_tk"],
        n(5_000),
        "nothing written"
    );
}

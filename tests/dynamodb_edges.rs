//! The DynamoDB store at its edges, against DynamoDB Local: the key bounds of the store
//! contract are DynamoDB's own; a key DynamoDB refuses is that request's error and never
//! an outage; a foreign item whose numbers the engine cannot work with is that bucket's
//! error; the IAM policy shipped names exactly what the calls need; and what the AWS SDK
//! does when a caller gives up mid-call — credentials being fetched, a connection being
//! made — and how the store keeps that work from being lost.

#![cfg(feature = "dynamodb")]

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_credential_types::provider::{future, ProvideCredentials, SharedCredentialsProvider};
use aws_credential_types::Credentials;
use aws_sdk_dynamodb::config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use shardgate::engine::{Acquire, BucketClaim, Engine, EngineOptions, LimitClaim, LimitParams};
use shardgate::store::breaker::{Breaker, CircuitState};
use shardgate::store::detached::Detached;
use shardgate::store::dynamodb::{DetachedCredentials, DynamoStore};
use shardgate::store::key::{MAX_NAMESPACE_BYTES, MAX_PARTITION_KEY_BYTES};
use shardgate::store::{BucketKey, BucketStore, StoreError};

fn claim(entity: &str, cascades: bool) -> BucketClaim {
    BucketClaim {
        entity: entity.into(),
        resource: "api".into(),
        limits: smallvec::smallvec![LimitClaim {
            limit: "rpm".into(),
            params: LimitParams::new(100, 100, 60_000),
            amount: 1_000,
            forced: false,
        }],
        cascades,
        strict: false,
    }
}

/// DynamoDB Local refuses a partition key one byte past 2,048 and takes one at it: the
/// limit the contract's bound (`store::key`) is computed from.
#[tokio::test]
#[cfg_attr(
    not(dynamodb_local),
    ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
)]
async fn dynamodb_refuses_a_partition_key_past_2048_bytes() {
    let store = common::dynamo::store().await; // creates the table
    let client = common::dynamo::client();
    let put = |pk: String| {
        client
            .put_item()
            .table_name(common::dynamo::TABLE)
            .item("PK", AttributeValue::S(pk))
            .item("SK", AttributeValue::S("#STATE".into()))
            .send()
    };
    let prefix = format!("{}/", store.namespace());
    let at = format!(
        "{prefix}{}",
        "x".repeat(MAX_PARTITION_KEY_BYTES - prefix.len())
    );
    put(at).await.expect("2,048 bytes are accepted");
    let past = format!(
        "{prefix}{}",
        "x".repeat(MAX_PARTITION_KEY_BYTES + 1 - prefix.len())
    );
    let err = put(past).await.expect_err("2,049 bytes are refused");
    assert_eq!(
        aws_sdk_dynamodb::error::ProvideErrorMetadata::code(&err),
        Some("ValidationException")
    );
}

/// A key DynamoDB itself refuses (here: under a namespace longer than any `serve`
/// accepts, so the contract's own bound lets it through) is the request's error: an
/// invalid request, in a short message, and the circuit breaker never counts it.
#[tokio::test]
#[cfg_attr(
    not(dynamodb_local),
    ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
)]
async fn a_key_dynamodb_refuses_is_the_requests_error_not_an_outage() {
    let _table = common::dynamo::store().await;
    let namespace = "n".repeat(MAX_NAMESPACE_BYTES * 4 + 76);
    let inner = DynamoStore::new(common::dynamo::client(), common::dynamo::TABLE, &namespace);
    let store = Arc::new(Breaker::new(inner, 1, Duration::from_secs(60)));
    let engine = Engine::new(store.clone(), EngineOptions::default());
    let long = "e".repeat(1_000);
    for _ in 0..5 {
        let req = Acquire {
            buckets: smallvec::smallvec![claim(&long, false)],
        };
        let err = engine
            .acquire(&req)
            .await
            .expect_err("DynamoDB refuses the key");
        assert!(err.is_request_error(), "{err}");
        assert!(
            err.to_string().len() <= 1_024,
            "{} bytes",
            err.to_string().len()
        );
    }
    assert_eq!(
        store.state(),
        CircuitState::Closed,
        "a threshold of one, never opened"
    );
    // The store still serves everyone else.
    let req = Acquire {
        buckets: smallvec::smallvec![claim("short", false)],
    };
    assert!(engine.acquire(&req).await.unwrap().admitted);
}

/// Items written straight into the table by something else, with a shard count no bucket
/// can have (a million, and none at all: 0): each is that bucket's corrupt item — an
/// error naming its key and the count, which the breaker never counts — and never work
/// that grows with the count. Every other bucket is decided as before. Before, a million
/// was taken as the count: draws and a doubling's reads over a million shards.
#[tokio::test]
#[cfg_attr(
    not(dynamodb_local),
    ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
)]
async fn a_foreign_items_shard_count_past_32_is_that_buckets_corrupt_item() {
    let inner = common::dynamo::store().await;
    let client = common::dynamo::client();
    for (entity, count) in [("foreign-million", 1_000_000), ("foreign-zero", 0)] {
        let n = |v: i64| AttributeValue::N(v.to_string());
        client
            .put_item()
            .table_name(common::dynamo::TABLE)
            .item(
                "PK",
                AttributeValue::S(inner.pk(&BucketKey::new(entity, "api", 0))),
            )
            .item("SK", AttributeValue::S("#STATE".into()))
            .item("rf", n(1_800_000_000_000))
            .item("shard_count", n(count))
            .item("b_rpm_tk", n(100_000))
            .item("b_rpm_cp", n(100_000))
            .item("b_rpm_ra", n(100_000))
            .item("b_rpm_rp", n(60_000))
            .send()
            .await
            .expect("written past shardgate");
    }
    let store = Arc::new(Breaker::new(inner, 1, Duration::from_secs(60)));
    let engine = Engine::new(store.clone(), EngineOptions::default());
    for (entity, count) in [("foreign-million", 1_000_000), ("foreign-zero", 0)] {
        let req = Acquire {
            buckets: smallvec::smallvec![claim(entity, false)],
        };
        let err = tokio::time::timeout(Duration::from_secs(30), engine.acquire(&req))
            .await
            .expect("no work that grows with the count")
            .expect_err("a corrupt item");
        let shardgate::engine::EngineError::Store { source, .. } = &err else {
            panic!("{err}");
        };
        let StoreError::Corrupt { key, reason, .. } = source else {
            panic!("{err}");
        };
        assert!(key.ends_with(&format!("/BUCKET#{entity}#api#0")), "{key}");
        assert_eq!(
            reason,
            &format!("'shard_count' is {count}, not within 1..=32")
        );
        assert!(!err.is_request_error() && !source.is_fault(), "{err}");
    }
    assert_eq!(store.state(), CircuitState::Closed, "a threshold of one");
    let req = Acquire {
        buckets: smallvec::smallvec![claim("native", false)],
    };
    assert!(engine.acquire(&req).await.unwrap().admitted);
}

/// The policy in `envoy-examples/kubernetes/iam-policy.json` (and the README's list)
/// grants exactly the actions the calls of every path need: creates, fast and slow
/// debits, a cascade's transaction, refunds, a doubling. A transaction needs the actions
/// of the writes it carries, and shardgate sends no `ConditionCheck`.
#[tokio::test]
#[cfg_attr(
    not(dynamodb_local),
    ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
)]
async fn the_iam_policy_grants_exactly_what_the_calls_need() {
    let store = Arc::new(common::dynamo::store().await);
    let engine = Engine::new(
        store.clone(),
        EngineOptions {
            partition_write_budget: 2,
            ..EngineOptions::default()
        },
    );
    let mut child = claim("key", true);
    child.limits[0].params = LimitParams::new(3, 3, 60_000);
    let cascade = Acquire {
        buckets: smallvec::smallvec![child, claim("org", false)],
    };
    for _ in 0..6 {
        engine.acquire(&cascade).await.unwrap(); // creates, debits, refunds, a refusal
    }
    let hot = Acquire {
        buckets: smallvec::smallvec![claim("hot", false)],
    };
    for _ in 0..6 {
        engine.acquire(&hot).await.unwrap(); // the write budget of 2 doubles it
    }
    assert!(
        engine.known_shard_count("hot", "api") > 1,
        "a doubling happened"
    );
    let mut needed: Vec<&str> = Vec::new();
    for (kind, _) in store.ledger().totals() {
        let actions: &[&str] = match kind.operation {
            "TransactWriteItems" => &["dynamodb:PutItem", "dynamodb:UpdateItem"],
            "UpdateItem" => &["dynamodb:UpdateItem"],
            "PutItem" => &["dynamodb:PutItem"],
            "BatchGetItem" => &["dynamodb:BatchGetItem"],
            other => panic!("a call the policy knows nothing of: {other}"),
        };
        needed.extend(actions);
    }
    needed.sort_unstable();
    needed.dedup();
    let policy: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string("envoy-examples/kubernetes/iam-policy.json").unwrap(),
    )
    .unwrap();
    let mut granted: Vec<&str> = policy["Statement"][0]["Action"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    granted.sort_unstable();
    assert_eq!(granted, needed);
    let readme = std::fs::read_to_string("README.md").unwrap();
    for action in &needed {
        let bare = action.trim_start_matches("dynamodb:");
        assert!(readme.contains(bare), "the README names {action}");
    }
}

/// A credentials provider that takes `delay` per fetch and counts its fetches.
#[derive(Debug)]
struct SlowCredentials {
    delay: Duration,
    fetches: Arc<AtomicU64>,
}

impl ProvideCredentials for SlowCredentials {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        let (delay, fetches) = (self.delay, self.fetches.clone());
        future::ProvideCredentials::new(async move {
            fetches.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            Ok(Credentials::new("local", "local", None, None, "slow"))
        })
    }
}

/// A client of `endpoint` with credentials from `provider` and, if given, a deadline for
/// each of its calls.
fn local_client(
    endpoint: &str,
    provider: SharedCredentialsProvider,
    each: Option<Duration>,
) -> Client {
    let mut conf = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(provider)
        .endpoint_url(endpoint);
    if let Some(t) = each {
        let timeouts = aws_sdk_dynamodb::config::timeout::TimeoutConfig::builder()
            .operation_timeout(t)
            .operation_attempt_timeout(t)
            .build();
        conf = conf.timeout_config(timeouts);
    }
    Client::from_conf(conf.build())
}

fn static_credentials() -> SharedCredentialsProvider {
    SharedCredentialsProvider::new(Credentials::new("local", "local", None, None, "t"))
}

/// A client of DynamoDB Local whose every call must end within 200 ms.
fn hasty_client(provider: SharedCredentialsProvider) -> Client {
    local_client(
        &common::dynamo::endpoint(),
        provider,
        Some(Duration::from_millis(200)),
    )
}

/// Twelve reads, 100 ms apart; how many succeeded.
async fn reads_every_100ms(store: &DynamoStore) -> usize {
    let key = [BucketKey::new("e", "r", 0)];
    let mut ok = 0;
    for _ in 0..12 {
        if store.read(&key).await.is_ok() {
            ok += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ok
}

/// What the SDK does with a credentials fetch slower than the call's deadline: its cache
/// loads credentials inside the call, so each call that times out cancels the fetch and
/// the next starts it over — no call ever succeeds. Behind `DetachedCredentials` the
/// fetch runs to its end in a task of its own, once, and the calls after it succeed.
#[tokio::test]
#[cfg_attr(
    not(dynamodb_local),
    ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
)]
async fn credentials_slower_than_every_call_still_arrive() {
    let _table = common::dynamo::store().await;
    let slow = |fetches: &Arc<AtomicU64>| SlowCredentials {
        delay: Duration::from_millis(600),
        fetches: fetches.clone(),
    };

    let raw_fetches = Arc::new(AtomicU64::new(0));
    let raw = SharedCredentialsProvider::new(slow(&raw_fetches));
    let raw_store = DynamoStore::new(hasty_client(raw), common::dynamo::TABLE, "creds-raw");
    assert_eq!(
        reads_every_100ms(&raw_store).await,
        0,
        "never any credentials"
    );
    assert!(
        raw_fetches.load(Ordering::SeqCst) >= 4,
        "each call started the fetch over: {raw_fetches:?}"
    );

    let fetches = Arc::new(AtomicU64::new(0));
    let inner = SharedCredentialsProvider::new(slow(&fetches));
    let detached = SharedCredentialsProvider::new(DetachedCredentials::new(inner));
    let store = DynamoStore::new(
        hasty_client(detached),
        common::dynamo::TABLE,
        "creds-detached",
    );
    let ok = reads_every_100ms(&store).await;
    assert!(ok >= 6, "the calls after the fetch succeed: {ok} of 12");
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "one fetch, shared");
}

/// A TCP relay to DynamoDB Local that holds each new connection's first bytes for
/// `delay` (a slow connection set-up, as a cold TLS handshake is).
async fn slow_relay(delay: Duration) -> String {
    let upstream = common::dynamo::endpoint()
        .trim_start_matches("http://")
        .to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if let Ok(mut server) = tokio::net::TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
    format!("http://{addr}")
}

/// A call whose caller gives up while its connection is still being set up: dropped with
/// the caller, the SDK's call goes nowhere (the connection attempt is cancelled with it);
/// detached (`Detached`), it completes, answers the store's ledger and the breaker, and
/// leaves its connection for the next call.
#[tokio::test]
#[cfg_attr(
    not(dynamodb_local),
    ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
)]
async fn a_call_its_caller_gave_up_on_still_completes_when_detached() {
    let _table = common::dynamo::store().await;
    let endpoint = slow_relay(Duration::from_millis(1_000)).await;
    let conf = |ns: &str| {
        let client = local_client(&endpoint, static_credentials(), None);
        DynamoStore::new(client, common::dynamo::TABLE, ns)
    };
    let key = [BucketKey::new("e", "r", 0)];

    let plain = conf("plain");
    let gave_up = tokio::time::timeout(Duration::from_millis(50), plain.read(&key)).await;
    assert!(gave_up.is_err());
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        plain.ledger().total_calls(),
        0,
        "the dropped call never ended"
    );

    let detached = Detached::new(Arc::new(Breaker::new(
        conf("detached"),
        1,
        Duration::from_secs(60),
    )));
    let gave_up = tokio::time::timeout(Duration::from_millis(50), detached.read(&key)).await;
    assert!(gave_up.is_err(), "the caller gave up");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let ledger = detached.inner().inner().ledger();
    assert_eq!(ledger.calls_of("BatchGetItem"), 1, "{:?}", ledger.totals());
    assert_eq!(ledger.total_calls(), 1);
    assert_eq!(detached.inner().state(), CircuitState::Closed);
    // The connection it made is there for the next call: no set-up delay this time.
    let started = std::time::Instant::now();
    let r = tokio::time::timeout(Duration::from_millis(900), detached.read(&key)).await;
    assert!(
        matches!(r, Ok(Ok(_))),
        "answered on the kept connection: {r:?} after {:?}",
        started.elapsed()
    );
}

/// A stand-in for DynamoDB that answers every `BatchGetItem` with all its keys left
/// unprocessed (what DynamoDB does to a throttled read), counting the requests.
async fn always_unprocessed() -> (String, Arc<AtomicU64>) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let requests = Arc::new(AtomicU64::new(0));
    let counted = requests.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            let counted = counted.clone();
            tokio::spawn(async move {
                let mut conn = BufReader::new(conn);
                loop {
                    let mut length = 0usize;
                    loop {
                        let mut line = String::new();
                        if conn.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let lower = line.to_ascii_lowercase();
                        if let Some(v) = lower.strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap_or(0);
                        }
                        if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0; length];
                    if conn.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    counted.fetch_add(1, Ordering::SeqCst);
                    let asked: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    let unprocessed = asked["RequestItems"].clone();
                    let answer = serde_json::json!({
                        "Responses": {},
                        "UnprocessedKeys": unprocessed,
                    })
                    .to_string();
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/x-amz-json-1.0\r\n\
                         Content-Length: {}\r\nx-amzn-RequestId: stand-in\r\n\r\n",
                        answer.len()
                    );
                    let out = conn.get_mut();
                    if out.write_all(head.as_bytes()).await.is_err()
                        || out.write_all(answer.as_bytes()).await.is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    (format!("http://{addr}"), requests)
}

/// A read whose keys DynamoDB keeps leaving unprocessed is asked again with backoff
/// (10, 20, 40 ms), but never past the call's deadline: with 25 ms, two requests at most
/// (a third would start after the deadline). Then the partition of the key left is
/// throttled: that bucket's contention, not the store failing.
#[tokio::test]
#[cfg_attr(
    not(dynamodb_local),
    ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
)]
async fn unprocessed_keys_are_asked_again_only_within_the_deadline() {
    let (endpoint, requests) = always_unprocessed().await;
    let client = local_client(&endpoint, static_credentials(), None);
    let store = DynamoStore::new(client, "t", "ns").with_timeout(Duration::from_millis(25));
    let err = store
        .read(&[BucketKey::new("e", "r", 0)])
        .await
        .expect_err("never processed");
    assert_eq!(
        err,
        StoreError::Throttled {
            key: BucketKey::new("e", "r", 0)
        }
    );
    assert!(!err.is_fault(), "{err}");
    let sent = requests.load(Ordering::SeqCst);
    assert!((1..=2).contains(&sent), "{sent} requests within 25 ms");
    // A patient store asks four times (the retries all fit in one second).
    let patient =
        DynamoStore::new(store.client().clone(), "t", "ns").with_timeout(Duration::from_secs(1));
    requests.store(0, Ordering::SeqCst);
    assert!(patient.read(&[BucketKey::new("e", "r", 0)]).await.is_err());
    assert_eq!(requests.load(Ordering::SeqCst), 4);
}

/// A bucket's first request is one `UpdateItem` that creates the item (`seeded.rs`), but an
/// item that exists without a `ttl` (one that never refills, or a debt past any expiry)
/// must keep none: with a seed that has one, the one-write debit refuses it with its
/// image, untouched, and the plain debit still applies to it.
#[tokio::test]
#[cfg_attr(
    not(dynamodb_local),
    ignore = "needs DynamoDB Local: run scripts/test, or set SHARDGATE_TEST_DYNAMODB_ENDPOINT and build again"
)]
async fn an_item_without_an_expiry_keeps_none_when_a_seeded_debit_meets_it() {
    use shardgate::store::{
        BucketItem, Debit, DebitMode, DebitOutcome, LimitState, Limits, Write, WCU_LIMIT,
    };
    let store = common::dynamo::store().await;
    let now_s = 1_800_000_000;
    let rpm = LimitParams::new(10, 10, 60_000);
    let item = |ttl: Option<i64>| {
        let mut limits = Limits::new();
        limits.insert("rpm", LimitState::new(rpm, 10_000, 0));
        limits.insert(
            WCU_LIMIT,
            LimitState::new(LimitParams::new(1_000, 1_000, 1_000), 1_000_000, 0),
        );
        BucketItem {
            refilled_at: now_s * 1_000,
            shard_count: 1,
            count_raised_at: 0,
            ttl,
            limits,
        }
    };
    let key = BucketKey::new("no-expiry", "api", 0);
    store
        .commit(&[Write::Create {
            key: key.clone(),
            item: item(None),
        }])
        .await
        .unwrap();
    let debit = [Debit {
        limit: "rpm".into(),
        amount: 1_000,
        gated: true,
        params: Some(rpm),
    }];
    let fast = DebitMode::Fast {
        now_s,
        shard_count: 1,
    };
    let seeded = store
        .debit_or_create(&key, &debit, fast, &|| item(Some(now_s + 60)))
        .await
        .unwrap();
    assert_eq!(seeded, DebitOutcome::Refused(Some(item(None))));
    let DebitOutcome::Applied(after) = store.debit(&key, &debit, fast).await.unwrap() else {
        panic!("the plain debit applies");
    };
    assert_eq!((after.ttl, after.limits["rpm"].balance), (None, 9_000));
}

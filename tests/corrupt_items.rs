//! A stored item no bucket can have, on every store: a shard count outside 1..=32 (the
//! issue's `HSET … sc 4294967295`, and 0), a refill period of 0, a negative capacity, and
//! on the stores another writer can reach field by field (DynamoDB, Redis) a limit missing
//! its refill period. Each is that bucket's corrupt item: the call is answered within its
//! deadline with the `corrupt` class, the store-call counter's `corrupt` outcome reads
//! one per call, the breaker never counts it, and every other bucket is decided as
//! before. Before, a Redis item's `sc 4294967295` was taken as the count, and each call on
//! the bucket walked four billion shards per draw, a core at 100 % until its deadline.

#[macro_use]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shardgate::engine::{
    Acquire, BucketClaim, Engine, EngineError, EngineOptions, LimitClaim, LimitParams,
};
use shardgate::store::breaker::{Breaker, CircuitState};
use shardgate::store::metered::{CallObserver, Metered};
use shardgate::store::{BucketItem, BucketKey, BucketStore, LimitState, StoreError, Write};

/// The caller's deadline: Envoy's default for a rate-limit call is 20 ms, a server's
/// store timeout 1 s; a corrupt item must be answered well within either's order.
const DEADLINE: Duration = Duration::from_secs(2);

/// Counts store calls whose outcome was `corrupt` (what `shardgate_store_calls_total`
/// counts in production, through the same wrapper).
#[derive(Default)]
struct CorruptCalls(AtomicU64);

impl CallObserver for CorruptCalls {
    fn observe(&self, _operation: &'static str, outcome: &'static str, _elapsed: Duration) {
        if outcome == "corrupt" {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn params() -> LimitParams {
    LimitParams::new(100, 100, 60_000)
}

fn claim(entity: &str) -> Acquire {
    Acquire {
        buckets: smallvec::smallvec![BucketClaim {
            entity: entity.into(),
            resource: "api".into(),
            limits: smallvec::smallvec![LimitClaim {
                limit: "rpm".into(),
                params: params(),
                amount: 1_000,
                forced: false,
            }],
            cascades: false,
            strict: false,
        }],
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// A full item of the rule's limit, then `spoil` applied to it.
fn item(spoil: impl FnOnce(&mut BucketItem)) -> BucketItem {
    let p = params();
    let mut item = BucketItem {
        refilled_at: now_ms(),
        shard_count: 1,
        count_raised_at: 0,
        ttl: None,
        limits: [("rpm", LimitState::new(p, p.capacity, 0))]
            .into_iter()
            .collect(),
    };
    spoil(&mut item);
    item
}

/// A store another writer can reach field by field: removes the refill period of the
/// limit `rpm` from `key`'s item, and says what the corrupt item's reason then holds.
/// `None`: this store cannot hold such an item (the memory store keeps every limit's
/// parameters together).
trait Foreign: BucketStore {
    fn remove_refill_period(
        &self,
        key: &BucketKey,
    ) -> impl std::future::Future<Output = Option<&'static str>>;
}

impl Foreign for shardgate::store::memory::MemoryStore {
    async fn remove_refill_period(&self, _key: &BucketKey) -> Option<&'static str> {
        None
    }
}

#[cfg(feature = "dynamodb")]
impl Foreign for shardgate::store::dynamodb::DynamoStore {
    async fn remove_refill_period(&self, key: &BucketKey) -> Option<&'static str> {
        use aws_sdk_dynamodb::types::AttributeValue;
        common::dynamo::client()
            .update_item()
            .table_name(common::dynamo::TABLE)
            .key("PK", AttributeValue::S(self.pk(key)))
            .key("SK", AttributeValue::S("#STATE".into()))
            .update_expression("REMOVE b_rpm_rp")
            .send()
            .await
            .expect("written past shardgate");
        // An absent period reads as 0, which the shared check refuses.
        Some("limit 'rpm' has refill period 0")
    }
}

#[cfg(feature = "redis")]
impl Foreign for shardgate::store::redis::RedisStore {
    async fn remove_refill_period(&self, key: &BucketKey) -> Option<&'static str> {
        let urls = match self.options().mode() {
            shardgate::store::redis::RedisMode::Cluster => common::redis::cluster_urls(),
            _ => vec![common::redis::url()],
        };
        let redis_key = format!("{{}}{}/BUCKET#{key}", self.namespace());
        let mut removed = 0;
        // On a Cluster only the key's master holds it; the others answer MOVED.
        for url in urls {
            let client = redis::Client::open(url.as_str()).unwrap();
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            let n: redis::RedisResult<i64> = redis::cmd("HDEL")
                .arg(&redis_key)
                .arg("b:rpm:rp")
                .query_async(&mut conn)
                .await;
            removed += n.unwrap_or(0);
        }
        assert_eq!(removed, 1, "{redis_key} held b:rpm:rp");
        Some("limit 'rpm' lacks a field")
    }
}

cross_store! {
    async fn a_corrupt_item_is_its_buckets_error_within_the_deadline<S: Foreign>(store: S) {
        let store = Arc::new(store);
        let corrupt = Arc::new(CorruptCalls::default());
        // The production stack's order: metrics outside, the breaker (threshold one:
        // a single counted fault would open it) inside.
        let breaker = Arc::new(Breaker::new(
            ForeignArc(store.clone()),
            1,
            Duration::from_secs(60),
        ));
        let metered = Arc::new(Metered::new(breaker.clone(), corrupt.clone()));
        let engine = Engine::new(metered, EngineOptions::default());
        for entity in ["healthy", "field-gone"] {
            assert!(engine.acquire(&claim(entity)).await.unwrap().admitted, "{entity}");
        }

        let cases: Vec<(&str, BucketItem, &str)> = vec![
            // (The memory store keeps a count in 16 bits: past that it reads 65535.)
            ("sc-max", item(|i| i.shard_count = u32::MAX), "5, not within 1..=32"),
            ("sc-zero", item(|i| i.shard_count = 0), "0, not within 1..=32"),
            (
                "rp-zero",
                item(|i| i.limits.get_mut("rpm").unwrap().refill_period_ms = 0),
                "limit 'rpm' has refill period 0",
            ),
            (
                "cp-negative",
                item(|i| i.limits.get_mut("rpm").unwrap().capacity = -1),
                "limit 'rpm' has capacity -1",
            ),
        ];
        let mut planted = Vec::new();
        for (entity, bad, why) in cases {
            let key = BucketKey::new(entity, "api", 0);
            // Another writer's item, through the contract: shardgate never makes one.
            store
                .commit(&[Write::Create { key, item: bad }])
                .await
                .expect("planted");
            planted.push((entity, why));
        }
        if let Some(why) = store.remove_refill_period(&BucketKey::new("field-gone", "api", 0)).await {
            planted.push(("field-gone", why));
        }
        for (n, (entity, why)) in planted.iter().enumerate() {
            let started = Instant::now();
            let answer = tokio::time::timeout(DEADLINE, engine.acquire(&claim(entity))).await;
            let elapsed = started.elapsed();
            let err = answer
                .expect("answered within the deadline")
                .expect_err("a corrupt item");
            assert!(elapsed < DEADLINE, "{entity}: answered after {elapsed:?}");
            let EngineError::Store { source, .. } = &err else {
                panic!("{entity}: {err}");
            };
            let StoreError::Corrupt { key, reason, .. } = source else {
                panic!("{entity}: {err}");
            };
            assert!(key.contains(&format!("{entity}#api#0")), "{key}");
            assert!(reason.contains(why), "{entity}: {reason}");
            assert_eq!(source.class(), "corrupt");
            assert!(!err.is_request_error() && !source.is_fault(), "{err}");
            assert_eq!(
                corrupt.0.load(Ordering::Relaxed),
                n as u64 + 1,
                "{entity}: one corrupt call counted"
            );
        }
        assert_eq!(breaker.state(), CircuitState::Closed, "a threshold of one, never opened");
        for other in ["healthy", "other-a", "other-b"] {
            assert!(engine.acquire(&claim(other)).await.unwrap().admitted, "{other}");
        }
    }
}

/// An `Arc` of a store as a store (the breaker takes its store by value; the test keeps
/// a handle to write past it).
struct ForeignArc<S>(Arc<S>);

impl<S: BucketStore> BucketStore for ForeignArc<S> {
    fn debit(
        &self,
        key: &BucketKey,
        debits: &[shardgate::store::Debit],
        mode: shardgate::store::DebitMode,
    ) -> impl std::future::Future<Output = Result<shardgate::store::DebitOutcome, StoreError>> + Send
    {
        self.0.debit(key, debits, mode)
    }

    fn debit_or_create(
        &self,
        key: &BucketKey,
        debits: &[shardgate::store::Debit],
        mode: shardgate::store::DebitMode,
        seed: &shardgate::store::Seed<'_>,
    ) -> impl std::future::Future<Output = Result<shardgate::store::DebitOutcome, StoreError>> + Send
    {
        self.0.debit_or_create(key, debits, mode, seed)
    }

    fn read(
        &self,
        keys: &[BucketKey],
    ) -> impl std::future::Future<Output = Result<Vec<Option<BucketItem>>, StoreError>> + Send {
        self.0.read(keys)
    }

    fn commit(
        &self,
        writes: &[Write],
    ) -> impl std::future::Future<Output = Result<shardgate::store::CommitOutcome, StoreError>> + Send
    {
        self.0.commit(writes)
    }

    fn credit(
        &self,
        key: &BucketKey,
        guard: shardgate::store::CreditGuard,
        credits: &[shardgate::store::Credit],
    ) -> impl std::future::Future<Output = Result<Vec<shardgate::store::Credit>, StoreError>> + Send
    {
        self.0.credit(key, guard, credits)
    }
}

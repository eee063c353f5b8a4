//! Expiry never changes a decision: an item the store's TTL sweeper deletes would be
//! re-created exactly as it was. Each case asks the same question just before and just
//! after a sweep at the same instant (a frozen clock), on every store: the memory store's
//! own eviction, and on DynamoDB Local (which sweeps nothing itself) a sweep of every item
//! whose `ttl` has passed, as DynamoDB's would.

#[macro_use]
mod common;

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use shardgate::config::Config;
use shardgate::engine::{Engine, EngineOptions, ManualClock, RandomDraw};
use shardgate::service::RateLimiter;
#[cfg(feature = "dynamodb")]
use shardgate::store::dynamodb::DynamoStore;
use shardgate::store::memory::MemoryStore;
use shardgate::store::BucketStore;

const T0: i64 = 1_800_000_000_000;

const RULES: &str = "
domain: ttl
descriptors:
  # 10/s, burst 10; usage recorded after the fact, even into debt.
  - key: debt
    rate_limit: {unit: second, requests_per_unit: 10, overdraft: true}
  # Three tokens for ever: a limit that never refills.
  - key: lifetime
    rate_limit: {unit: second, requests_per_unit: 0, burst: 3}
  # One item, two limits: requests (full) and tokens (in debt).
  - key: llm
    descriptors:
      - key: kind
        value: requests
        entity: '{llm}'
        rate_limit: {unit: second, requests_per_unit: 10, name: rpm}
      - key: kind
        value: tokens
        entity: '{llm}'
        rate_limit: {unit: second, requests_per_unit: 100, overdraft: true, name: tpm}
";

/// A store the test can sweep as its TTL sweeper would.
trait Sweep: BucketStore {
    /// Deletes what has expired at `now_s`; returns how many items.
    async fn sweep(&self, now_s: i64) -> usize;
}

impl Sweep for MemoryStore {
    async fn sweep(&self, now_s: i64) -> usize {
        self.evict_expired(now_s)
    }
}

#[cfg(feature = "dynamodb")]
impl Sweep for DynamoStore {
    async fn sweep(&self, now_s: i64) -> usize {
        common::dynamo::sweep(self, now_s).await
    }
}

#[cfg(feature = "redis")]
impl Sweep for shardgate::store::redis::RedisStore {
    async fn sweep(&self, now_s: i64) -> usize {
        common::redis::sweep(self, now_s).await
    }
}

struct Rig<S: Sweep> {
    store: Arc<S>,
    clock: Arc<ManualClock>,
    limiter: RateLimiter<S>,
}

fn rig<S: Sweep>(store: S) -> Rig<S> {
    let store = Arc::new(store);
    let clock = Arc::new(ManualClock::new(T0));
    let engine = Engine::with_parts(
        store.clone(),
        EngineOptions {
            // Every answer from the store: a cached image would hide a swept item.
            rejection_cache_ms: 0,
            ..EngineOptions::default()
        },
        clock.clone(),
        Arc::new(RandomDraw),
    );
    let config = Config::from_yaml("ttl.yaml", RULES).unwrap();
    let limiter = RateLimiter::new(Arc::new(config), Arc::new(engine));
    Rig {
        store,
        clock,
        limiter,
    }
}

fn request(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitRequest {
    let d = match hits {
        Some(h) => common::server::desc_hits(entries, h),
        None => common::server::desc(entries),
    };
    common::server::request("ttl", vec![d])
}

impl<S: Sweep> Rig<S> {
    async fn ask(&self, req: &RateLimitRequest) -> RateLimitResponse {
        self.limiter.should_rate_limit(req).await.expect("answered")
    }
}

/// Two servers on stores of their own with the same history (`history` run on each); one
/// store is swept at the end, then both are asked `req`: the answers must be equal.
/// Returns the answer and how many items the sweep deleted.
async fn same_with_and_without_a_sweep<S: Sweep>(
    swept: S,
    kept: S,
    history: impl AsyncFn(&Rig<S>),
    req: &RateLimitRequest,
) -> (RateLimitResponse, usize) {
    let (swept, kept) = (rig(swept), rig(kept));
    history(&swept).await;
    history(&kept).await;
    let deleted = swept.store.sweep(swept.clock.now_s()).await;
    let (after, unswept) = (swept.ask(req).await, kept.ask(req).await);
    assert_eq!(
        after, unswept,
        "the sweep of {deleted} items changed the answer"
    );
    (after, deleted)
}

trait NowS {
    fn now_s(&self) -> i64;
}

impl NowS for ManualClock {
    fn now_s(&self) -> i64 {
        shardgate::engine::Clock::now_ms(self) / 1_000
    }
}

fn over(r: &RateLimitResponse) -> bool {
    r.overall_code == Code::OverLimit as i32
}

cross_store! {
    /// A 10/s rule debited 5,000 after the fact (a debt of about 500 s): 20 s later it is
    /// still in debt, swept or not (expiry from the parameters alone had forgiven it at 7 s).
    async fn debt_outlives_the_time_to_refill_from_empty<S: Sweep>(a: S, b: S) {
        let history = async |rig: &Rig<S>| {
            rig.ask(&request(&[("debt", "x")], Some(5_000))).await;
            rig.clock.advance(20_000);
        };
        let check = request(&[("debt", "x")], Some(0));
        let (answer, deleted) = same_with_and_without_a_sweep(a, b, history, &check).await;
        assert!(over(&answer), "still in debt: {answer:?}");
        assert_eq!(deleted, 0);
    }
}

cross_store! {
    /// Three tokens that never refill stay spent, swept or not (expiry from the `wcu` limit's
    /// one second gave them back every few seconds).
    async fn a_limit_that_never_refills_never_expires<S: Sweep>(a: S, b: S) {
        let req = request(&[("lifetime", "x")], None);
        let history = async |rig: &Rig<S>| {
            for _ in 0..3 {
                assert!(!over(&rig.ask(&req).await));
            }
            rig.clock.advance(3_600_000);
        };
        let (answer, deleted) = same_with_and_without_a_sweep(a, b, history, &req).await;
        assert!(over(&answer), "spent for good: {answer:?}");
        assert_eq!(deleted, 0);
    }
}

cross_store! {
    /// One item, requests full and tokens in debt: the item lives as long as its slowest
    /// limit needs, not its fastest.
    async fn an_item_lives_as_long_as_its_deepest_debt<S: Sweep>(a: S, b: S) {
        let history = async |rig: &Rig<S>| {
            rig.ask(&request(&[("llm", "acme"), ("kind", "requests")], None))
                .await;
            rig.ask(&request(
                &[("llm", "acme"), ("kind", "tokens")],
                Some(5_000),
            ))
            .await;
            rig.clock.advance(20_000);
        };
        let check = request(&[("llm", "acme"), ("kind", "tokens")], Some(0));
        let (answer, deleted) = same_with_and_without_a_sweep(a, b, history, &check).await;
        assert!(over(&answer), "tokens still in debt: {answer:?}");
        assert_eq!(deleted, 0);
    }
}

cross_store! {
    /// What is full again does expire (the sweep is real), and the item created again
    /// answers as the refilled one does.
    async fn a_full_bucket_expires_and_answers_the_same<S: Sweep>(a: S, b: S) {
        let history = async |rig: &Rig<S>| {
            rig.ask(&request(&[("debt", "y")], None)).await;
            rig.clock.advance(10_000); // full after 0.1 s, expired after 7 s
        };
        let check = request(&[("debt", "y")], Some(0));
        let (answer, deleted) = same_with_and_without_a_sweep(a, b, history, &check).await;
        assert!(!over(&answer));
        assert_eq!(deleted, 1, "the full item was swept");
    }
}

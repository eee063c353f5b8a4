//! Every answer within its deadline, whatever the store does after the decision: a
//! quota-mode refund on a store that does not answer never holds an OVER_LIMIT already
//! decided; and `--store-timeout` is refused at start where it would mean no time at all
//! (0) or a deadline past what the clock holds (before, `100000000000s` panicked on every
//! request).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::server::{desc, request};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use shardgate::config::Config;
use shardgate::engine::{Engine, EngineOptions};
use shardgate::service::RateLimiter;
use shardgate::store::memory::MemoryStore;
use shardgate::store::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Credit, CreditGuard, Debit, DebitMode,
    DebitOutcome, Seed, StoreError, Write,
};
use tokio::sync::watch;

/// A memory store whose credits (refunds, lease returns) wait until released; every
/// other call answers at once.
struct SlowCredits {
    inner: MemoryStore,
    released: watch::Receiver<bool>,
    /// Credits applied, once released.
    applied: AtomicUsize,
}

impl BucketStore for SlowCredits {
    async fn debit(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
    ) -> Result<DebitOutcome, StoreError> {
        self.inner.debit(key, debits, mode).await
    }
    async fn debit_or_create(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
        seed: &Seed<'_>,
    ) -> Result<DebitOutcome, StoreError> {
        self.inner.debit_or_create(key, debits, mode, seed).await
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
        let _ = self.released.clone().wait_for(|r| *r).await;
        let applied = self.inner.credit(key, guard, credits).await?;
        self.applied.fetch_add(applied.len(), Ordering::SeqCst);
        Ok(applied)
    }
}

const RULES: &str = "
domain: d
descriptors:
  - key: regular
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: quota
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
";

/// The caller's deadline (the store timeout of a caller that sends none).
const DEADLINE: Duration = Duration::from_secs(1);

/// The second request's quota descriptor is over, so the request is refused and what its
/// regular descriptor took is refunded — on a store whose credit does not answer. The
/// OVER_LIMIT is answered within the caller's deadline; the refund lands once the store
/// answers (the regular bucket has its token back).
#[tokio::test]
async fn a_quota_refund_on_a_slow_store_never_holds_the_answer() {
    let (release, released) = watch::channel(false);
    let store = Arc::new(SlowCredits {
        inner: MemoryStore::new(),
        released,
        applied: AtomicUsize::new(0),
    });
    let config = Config::from_yaml("rules.yaml", RULES).unwrap_or_else(|e| panic!("{e}"));
    let options = EngineOptions {
        leases: None,
        rejection_cache_ms: 0,
        ..EngineOptions::default()
    };
    let engine = Arc::new(Engine::new(store.clone(), options));
    let limiter = RateLimiter::new(Arc::new(config), engine).with_store_timeout(DEADLINE);
    let req = request(
        "d",
        vec![desc(&[("regular", "r")]), desc(&[("quota", "q")])],
    );
    let first = limiter.should_rate_limit(&req).await.unwrap();
    assert_eq!(first.overall_code, Code::Ok as i32);

    let started = Instant::now();
    let second = tokio::time::timeout(5 * DEADLINE, limiter.should_rate_limit(&req))
        .await
        .expect("answered, not held by the refund")
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(second.overall_code, Code::OverLimit as i32, "{second:?}");
    assert!(elapsed < DEADLINE, "answered after {elapsed:?}");

    // The refund was not dropped: it lands once the store answers.
    assert_eq!(store.applied.load(Ordering::SeqCst), 0);
    release.send(true).unwrap();
    for _ in 0..500 {
        if store.applied.load(Ordering::SeqCst) > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        store.applied.load(Ordering::SeqCst),
        1,
        "the regular descriptor's refund"
    );
}

/// `--store-timeout` of no time at all, and one whose deadlines would overflow the clock:
/// each refused at start with a message naming the value, before any port is bound.
#[test]
fn a_store_timeout_of_zero_or_past_the_clock_is_refused_at_start() {
    for (value, says) in [
        ("0", "must be more than zero"),
        ("0s", "must be more than zero"),
        ("100000000000s", "longer than the most taken, 1h"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_shardgate"))
            .args([
                "serve",
                "--store-timeout",
                value,
                "--config",
                "/nonexistent.yaml",
            ])
            .output()
            .expect("ran shardgate");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{value}: {stderr}");
        assert!(
            stderr.contains("--store-timeout")
                && stderr.contains(&format!("'{value}'"))
                && stderr.contains(says),
            "{value}: {stderr}"
        );
    }
}

//! Criterion benchmarks of the hot path, each a function measured alone:
//! - matcher lookup at depth 1–4 in a domain of 10 and of 10,000 rules (must not grow
//!   with the rule count);
//! - token-bucket refill;
//! - memory-store fast-path debit on one hot item and across 100,000 items;
//! - memory-store create of a new item in a store at its default bound (each create
//!   pays its share of the eviction passes that make room), and below it;
//! - one full decision through the service layer (no network), assembled as the server
//!   assembles it (store-call and request metrics), for one descriptor, a cascade pair and
//!   three descriptors, and for one descriptor without metrics;
//! - the lease book (leases on, the lease task running, through the engine): one
//!   descriptor on a different key each time out of 100,000 (cold buckets: what the book
//!   costs a request it does not lease), on one hot key (answered from its lease), and a
//!   churn of cold keys with one hot key among them (one request in 20);
//! - what one answered request records in metrics (its latency, requests in flight up
//!   and down, two rule counters, one engine counter) on 1 and 2 threads at once, as
//!   prometheus-client's shared types record it and as the striped ones do: with two
//!   threads, the shared lines bounce between the cores;
//! - decisions on 2 threads at once, through the store wrappers a server has (the call
//!   metrics over the circuit breaker): on one hot key, and on many keys of a rule with
//!   per-value metrics (`detailed_metric`, past the 10,000-key cap), with and without a
//!   scrape of `/metrics` running beside them — what the breaker's and the rule
//!   counters' locks cost, or no longer cost.
//!
//! Run: `cargo bench --bench hot_path`.

use std::hint::black_box;
use std::sync::Arc;

#[path = "../tests/common/server.rs"]
mod support;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use shardgate::config::Config;
use shardgate::engine::bucket::{refill, LimitParams};
use shardgate::engine::{
    Acquire, BucketClaim, Engine, EngineOptions, LeaseOptions, LimitClaim,
    UNLIMITED_PARTITION_WRITE_BUDGET,
};
use shardgate::service::metrics::Metrics;
use shardgate::service::wire::RequestView;
use shardgate::service::RateLimiter;
use shardgate::store::memory::{MemoryStore, DEFAULT_MAX_BYTES, MIN_MAX_BYTES};
use shardgate::store::metered::Metered;
use shardgate::store::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Debit, DebitMode, LimitState, Write,
    DEFAULT_STORE_TIMEOUT, WCU_LIMIT,
};
use support::{desc, request, HOT_PATH_YAML};

/// A domain with `rules` leaf rules under a four-level path `a/b/c/d<i>`, plus rules at
/// each shallower level, so lookups of every depth hit a rule.
fn domain_yaml(rules: usize) -> String {
    let mut y = String::from(
        "domain: bench\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 10}\n    descriptors:\n      - key: b\n        rate_limit: {unit: second, requests_per_unit: 10}\n        descriptors:\n          - key: c\n            rate_limit: {unit: second, requests_per_unit: 10}\n            descriptors:\n",
    );
    for i in 0..rules {
        y.push_str(&format!(
            "              - key: d\n                value: v{i}\n                rate_limit: {{unit: second, requests_per_unit: 10}}\n"
        ));
    }
    y
}

fn matcher(c: &mut Criterion) {
    let mut g = c.benchmark_group("matcher_lookup");
    for rules in [10usize, 10_000] {
        let config = Config::from_yaml("bench.yaml", &domain_yaml(rules)).unwrap();
        let domain = config.domain("bench").unwrap();
        let path = [("a", "x"), ("b", "y"), ("c", "z"), ("d", "v7")];
        for depth in 1..=4 {
            g.bench_with_input(
                BenchmarkId::new(format!("{rules}_rules"), depth),
                &depth,
                |b, &d| {
                    b.iter(|| black_box(domain.match_descriptor(black_box(&path[..d]))).is_some())
                },
            );
        }
    }
    g.finish();
}

fn bucket_math(c: &mut Criterion) {
    let share = LimitParams::new(1_000, 100, 1_000).share(4);
    c.bench_function("refill", |b| {
        b.iter(|| refill(black_box(12_345), black_box(1_000), black_box(5_678), share))
    });
}

fn item(tokens: i64) -> BucketItem {
    let p = LimitParams::new(1_000_000_000, 1_000_000_000, 1_000);
    let wcu = LimitParams::new(
        UNLIMITED_PARTITION_WRITE_BUDGET,
        UNLIMITED_PARTITION_WRITE_BUDGET,
        1_000,
    );
    let mut limits = shardgate::store::Limits::new();
    limits.insert("rps", LimitState::new(p, tokens, 0));
    limits.insert(WCU_LIMIT, LimitState::new(wcu, wcu.capacity, 0));
    BucketItem {
        refilled_at: 0,
        shard_count: 1,
        count_raised_at: 0,
        ttl: None,
        limits,
    }
}

fn store_debit(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("memory_store_debit");
    let debits = [Debit {
        limit: "rps".into(),
        amount: 1,
        gated: true,
        params: Some(LimitParams::new(1_000_000_000, 1_000_000_000, 1_000)),
    }];
    for items in [1usize, 100_000] {
        let store = MemoryStore::new();
        let keys: Vec<BucketKey> = (0..items)
            .map(|i| BucketKey::new(format!("e{i}"), "r", 0))
            .collect();
        for k in &keys {
            store.put(k.clone(), item(i64::MAX / 4));
        }
        let mut i = 0usize;
        g.bench_function(BenchmarkId::from_parameter(items), |b| {
            b.iter(|| {
                i = (i + 7919) % items;
                rt.block_on(store.debit(
                    &keys[i],
                    &debits,
                    DebitMode::Fast {
                        now_s: 0,
                        shard_count: 1,
                    },
                ))
                .unwrap()
            })
        });
    }
    g.finish();
}

/// Creates of new items (an address-like entity of 30 bytes, one limit and `wcu`) in a
/// store filled to its default bound: every create evicts, in passes that each free a
/// 32nd of a partition. The store is filled on the first run of the bench only, so that
/// other benches run in a process that never held it.
fn store_create(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    // `cargo test` runs each bench once, without `--bench`: a store at the least bound
    // keeps that run short.
    let max_bytes = if std::env::args().any(|a| a == "--bench") {
        DEFAULT_MAX_BYTES
    } else {
        MIN_MAX_BYTES
    };
    let mut full: Option<MemoryStore> = None;
    let mut n = 0u64;
    let mut g = c.benchmark_group("memory_store_create");
    g.bench_function("at_default_bound", |b| {
        let store = full.get_or_insert_with(|| MemoryStore::with_max_bytes(max_bytes).unwrap());
        let mut create = || {
            n += 1;
            let key = BucketKey::new(format!("remote_address=2001:db8::{n:x}"), "r", 0);
            let outcome = rt
                .block_on(store.commit(&[Write::Create {
                    key,
                    item: item(1_000_000),
                }]))
                .unwrap();
            assert_eq!(outcome, CommitOutcome::Committed);
        };
        while store.stats().evicted_active == 0 {
            for _ in 0..10_000 {
                create();
            }
        }
        b.iter(create)
    });
    // The same creates into stores far from their bound (a fresh one every 100,000).
    let mut n = 0u64;
    g.bench_function("below_bound", |b| {
        b.iter_batched_ref(
            || MemoryStore::with_max_bytes(DEFAULT_MAX_BYTES).unwrap(),
            |store| {
                n += 1;
                let key = BucketKey::new(format!("remote_address=2001:db8::{n:x}"), "r", 0);
                rt.block_on(store.commit(&[Write::Create {
                    key,
                    item: item(1_000_000),
                }]))
                .unwrap()
            },
            criterion::BatchSize::NumIterations(100_000),
        )
    });
    g.finish();
}

/// One decision through the service layer, assembled as `shardgate serve` assembles it
/// (the store wrapped by the call metrics, one `Metrics` shared by the limiter and the
/// store), for the request shapes of the load benchmark; and the one-descriptor case
/// without any metrics, to show what recording them costs.
fn decision(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let options = EngineOptions {
        partition_write_budget: UNLIMITED_PARTITION_WRITE_BUDGET,
        ..EngineOptions::default()
    };
    let config = Arc::new(Config::from_yaml("bench.yaml", HOT_PATH_YAML).unwrap());
    let metrics = Arc::new(Metrics::new());
    let store = Arc::new(Metered::new(Arc::new(MemoryStore::new()), metrics.clone()));
    let served = RateLimiter::new(
        config.clone(),
        Arc::new(Engine::new(store, options.clone())),
    )
    .with_metrics(metrics);
    let bare = RateLimiter::new(
        config,
        Arc::new(Engine::new(Arc::new(MemoryStore::new()), options)),
    );
    let one = request("d", vec![desc(&[("tenant", "acme")])]);
    let cascade = request("d", vec![desc(&[("tenant", "acme"), ("api_key", "k1")])]);
    let three = request(
        "d",
        vec![
            desc(&[("tenant", "acme")]),
            desc(&[("path", "/a")]),
            desc(&[("user", "u1")]),
        ],
    );
    let mut g = c.benchmark_group("decision");
    for (name, req) in [("one", &one), ("cascade", &cascade), ("three", &three)] {
        // A rule must match, or the bench would time the unknown-domain shortcut.
        let answer = rt.block_on(served.should_rate_limit(req)).unwrap();
        assert!(
            answer.statuses.iter().all(|s| s.current_limit.is_some()),
            "{name}"
        );
        // Timed as the gRPC service calls it: the answer encoded, not decoded again.
        let view = RequestView::from(req);
        g.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(served.should_rate_limit_by(black_box(&view), deadline()))
                    .unwrap()
            })
        });
    }
    let view = RequestView::from(&one);
    g.bench_function("one_without_metrics", |b| {
        b.iter(|| {
            rt.block_on(bare.should_rate_limit_by(black_box(&view), deadline()))
                .unwrap()
        })
    });
    g.finish();
}

/// A call's deadline, as a caller that sets none gets it.
fn deadline() -> tokio::time::Instant {
    tokio::time::Instant::now() + DEFAULT_STORE_TIMEOUT
}

/// Runs `record` `iters` times on each of `threads` threads started together; returns
/// the wall time, so that time per iteration is the cost of one recording while the other
/// threads record too.
fn on_threads(threads: usize, iters: u64, record: &(dyn Fn() + Sync)) -> std::time::Duration {
    let start = std::sync::Barrier::new(threads + 1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    start.wait();
                    for _ in 0..iters {
                        record();
                    }
                })
            })
            .collect();
        start.wait();
        let began = std::time::Instant::now();
        for w in workers {
            w.join().unwrap();
        }
        began.elapsed()
    })
}

fn metrics_recording(c: &mut Criterion) {
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::gauge::Gauge;
    use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
    use shardgate::support::striped::{
        StripedCells, StripedCounter, StripedGauge, StripedHistogram,
    };
    use std::time::Duration;

    let latency = Duration::from_micros(30);
    let shared = (
        Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
        Gauge::<i64>::default(),
        [Counter::<u64>::default(), Counter::default()],
        Counter::<u64>::default(),
    );
    let record_shared = || {
        let (histogram, in_flight, rule, engine) = &shared;
        in_flight.inc();
        engine.inc();
        rule[0].inc_by(1);
        rule[1].inc_by(1);
        in_flight.dec();
        histogram.observe(black_box(latency).as_secs_f64());
    };
    let striped = (
        StripedHistogram::new(exponential_buckets(0.000_05, 2.0, 16)),
        StripedGauge::default(),
        StripedCells::<5>::default(),
        StripedCounter::default(),
    );
    let record_striped = || {
        let (histogram, in_flight, rule, engine) = &striped;
        in_flight.inc();
        engine.add(1);
        rule.add(0, 1);
        rule.add(3, 1);
        in_flight.dec();
        histogram.observe(black_box(latency));
    };
    let mut g = c.benchmark_group("metrics_recording");
    for threads in [1, 2] {
        g.bench_function(BenchmarkId::new("shared", threads), |b| {
            b.iter_custom(|iters| on_threads(threads, iters, &record_shared))
        });
        g.bench_function(BenchmarkId::new("striped", threads), |b| {
            b.iter_custom(|iters| on_threads(threads, iters, &record_striped))
        });
    }
    g.finish();
}

/// A claim of one token on `entity`'s bucket of 1,000,000 tokens.
fn lease_claim(entity: &str) -> Acquire {
    Acquire {
        buckets: smallvec::smallvec![BucketClaim {
            entity: entity.into(),
            resource: "api".into(),
            limits: smallvec::smallvec![LimitClaim {
                limit: "rps".into(),
                params: LimitParams::new(1_000_000, 1_000_000, 1_000),
                amount: 1_000,
                forced: false,
            }],
            cascades: false,
            strict: false,
        }],
    }
}

/// Decisions through an engine with leases on and its lease task running (on the same
/// current-thread runtime, which runs it while a request waits for a fetch).
fn lease_book(c: &mut Criterion) {
    const KEYS: usize = 100_000;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let engine = Arc::new(Engine::new(
        Arc::new(MemoryStore::new()),
        EngineOptions {
            partition_write_budget: UNLIMITED_PARTITION_WRITE_BUDGET,
            leases: Some(LeaseOptions::default()),
            ..EngineOptions::default()
        },
    ));
    let task = engine.clone();
    rt.spawn(async move { task.run_leases(std::future::pending()).await });
    let cold: Vec<Acquire> = (0..KEYS).map(|i| lease_claim(&format!("k{i}"))).collect();
    let hot = lease_claim("hot");
    let mut g = c.benchmark_group("lease_book");
    let mut at = 0;
    g.bench_function("many_keys", |b| {
        b.iter(|| {
            at = (at + 1) % KEYS;
            rt.block_on(engine.acquire(black_box(&cold[at]))).unwrap()
        })
    });
    g.bench_function("hot_leased", |b| {
        b.iter(|| rt.block_on(engine.acquire(black_box(&hot))).unwrap())
    });
    let mut i = 0usize;
    g.bench_function("churn_and_hot", |b| {
        b.iter(|| {
            i += 1;
            let req = if i.is_multiple_of(20) {
                &hot
            } else {
                at = (at + 1) % KEYS;
                &cold[at]
            };
            rt.block_on(engine.acquire(black_box(req))).unwrap()
        })
    });
    g.finish();
}

/// A domain of one rule with per-value metrics, keyed by its value.
const PER_VALUE_YAML: &str = r#"
domain: d
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: user
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1000000000}
"#;

/// Runs `decide(thread, i)` for `i` in `0..iters` on each of `threads` threads, each on a
/// current-thread runtime of its own built before the clock starts; returns the wall
/// time.
fn decisions_on_threads(
    threads: usize,
    iters: u64,
    decide: &(dyn Fn(&tokio::runtime::Runtime, usize, u64) + Sync),
) -> std::time::Duration {
    let start = std::sync::Barrier::new(threads + 1);
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let start = &start;
                scope.spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_time()
                        .build()
                        .unwrap();
                    start.wait();
                    for i in 0..iters {
                        decide(&rt, t, i);
                    }
                })
            })
            .collect();
        start.wait();
        let began = std::time::Instant::now();
        for w in workers {
            w.join().unwrap();
        }
        began.elapsed()
    })
}

fn hot_path_locks(c: &mut Criterion) {
    use shardgate::store::breaker::Breaker;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    let options = EngineOptions {
        partition_write_budget: UNLIMITED_PARTITION_WRITE_BUDGET,
        rejection_cache_ms: 0,
        ..EngineOptions::default()
    };
    let config = Arc::new(Config::from_yaml("bench.yaml", PER_VALUE_YAML).unwrap());
    let metrics = Arc::new(Metrics::new());
    let breaker = Arc::new(Breaker::new(MemoryStore::new(), 5, Duration::from_secs(1)));
    let store = Arc::new(Metered::new(breaker, metrics.clone()));
    let limiter = RateLimiter::new(config, Arc::new(Engine::new(store, options)))
        .with_metrics(metrics.clone());
    let hot = request("d", vec![desc(&[("tenant", "acme")])]);
    let users: Vec<_> = (0..40_000)
        .map(|i| request("d", vec![desc(&[("user", &format!("u{i}"))])]))
        .collect();
    let hot_view = RequestView::from(&hot);
    let user_views: Vec<RequestView> = users.iter().map(RequestView::from).collect();
    let decide_hot = |rt: &tokio::runtime::Runtime, _: usize, _: u64| {
        rt.block_on(limiter.should_rate_limit_by(black_box(&hot_view), deadline()))
            .unwrap();
    };
    let decide_many = |rt: &tokio::runtime::Runtime, t: usize, i: u64| {
        let view = &user_views[(i as usize * 7_919 + t * 20_000) % user_views.len()];
        rt.block_on(limiter.should_rate_limit_by(black_box(view), deadline()))
            .unwrap();
    };
    // Past the cap before timing: every later unseen value goes to `_overflow_`.
    decisions_on_threads(1, users.len() as u64, &|rt, _, i| {
        rt.block_on(limiter.should_rate_limit(&users[i as usize]))
            .unwrap();
    });
    let mut g = c.benchmark_group("hot_path_locks");
    g.bench_function("hot_key_2_threads", |b| {
        b.iter_custom(|iters| decisions_on_threads(2, iters, &decide_hot))
    });
    g.bench_function("per_value_keys_2_threads", |b| {
        b.iter_custom(|iters| decisions_on_threads(2, iters, &decide_many))
    });
    g.bench_function("per_value_keys_2_threads_scraped", |b| {
        b.iter_custom(|iters| {
            let stop = AtomicBool::new(false);
            std::thread::scope(|scope| {
                scope.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        black_box(metrics.render());
                    }
                });
                let took = decisions_on_threads(2, iters, &decide_many);
                stop.store(true, Ordering::Relaxed);
                took
            })
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    hot_path_locks,
    lease_book,
    matcher,
    bucket_math,
    store_debit,
    store_create,
    decision,
    metrics_recording
);
criterion_main!(benches);

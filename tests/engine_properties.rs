//! Properties of the whole engine on the memory store: admission bounds under random and
//! concurrent load, all-or-nothing across buckets, and no lost debit while sharding.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use shardgate::engine::{
    Acquire, BucketClaim, Clock, Engine, EngineOptions, LimitClaim, LimitParams, ManualClock,
    RandomDraw, MAX_SHARD_COUNT,
};
use shardgate::store::memory::MemoryStore;
use shardgate::store::BucketKey;

const T0: i64 = 1_800_000_000_000;

fn claim(entity: &str, name: &str, params: LimitParams, amount: i64) -> BucketClaim {
    BucketClaim {
        entity: entity.into(),
        resource: "api".into(),
        limits: smallvec::smallvec![LimitClaim {
            limit: name.into(),
            params,
            amount,
            forced: false,
        }],
        cascades: false,
        strict: false,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Sum of `tc` of a limit over every shard of a bucket.
fn consumed(store: &MemoryStore, entity: &str, limit: &str) -> i64 {
    (0..MAX_SHARD_COUNT)
        .filter_map(|s| store.get(&BucketKey::new(entity, "api", s)))
        .map(|it| it.limits.get(limit).map_or(0, |l| l.taken))
        .sum()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Over any random schedule, one bucket admits at most capacity + rate × elapsed.
    #[test]
    fn admitted_never_exceeds_capacity_plus_rate(
        cap in 1u64..50,
        rate in 1u64..50,
        steps in proptest::collection::vec((0i64..3_000, 0i64..5), 1..120),
    ) {
        runtime().block_on(async {
            let store = Arc::new(MemoryStore::new());
            let clock = Arc::new(ManualClock::new(T0));
            let engine = Engine::with_parts(store.clone(), EngineOptions::default(), clock.clone(), Arc::new(RandomDraw));
            let params = LimitParams::new(cap, rate, 1_000);
            let mut admitted = 0i64;
            for (dt, hits) in steps {
                clock.advance(dt);
                let req = Acquire { buckets: smallvec::smallvec![claim("e", "rps", params, hits * 1_000)] };
                if engine.acquire(&req).await.unwrap().admitted {
                    admitted += hits * 1_000;
                }
            }
            let elapsed = clock.now_ms() - T0;
            let bound = params.capacity as i128 + elapsed as i128 * params.refill_amount as i128 / params.refill_period_ms as i128;
            prop_assert!(admitted as i128 <= bound, "admitted {admitted} > bound {bound}");
            prop_assert_eq!(consumed(&store, "e", "rps"), admitted, "tc counts exactly what was admitted");
            Ok(())
        })?;
    }

    /// A refused multi-bucket request takes nothing from any bucket.
    #[test]
    fn refused_requests_take_nothing(
        steps in proptest::collection::vec((0i64..2_000, 0i64..4, 0i64..4), 1..80),
    ) {
        runtime().block_on(async {
            let store = Arc::new(MemoryStore::new());
            let clock = Arc::new(ManualClock::new(T0));
            let engine = Engine::with_parts(store.clone(), EngineOptions::default(), clock.clone(), Arc::new(RandomDraw));
            let a = LimitParams::new(5, 5, 1_000);
            let b = LimitParams::new(3, 1, 1_000);
            let (mut took_a, mut took_b) = (0, 0);
            for (dt, ha, hb) in steps {
                clock.advance(dt);
                let req = Acquire { buckets: smallvec::smallvec![claim("a", "x", a, ha * 1_000), claim("b", "y", b, hb * 1_000)] };
                if engine.acquire(&req).await.unwrap().admitted {
                    took_a += ha * 1_000;
                    took_b += hb * 1_000;
                }
                prop_assert_eq!(consumed(&store, "a", "x"), took_a);
                prop_assert_eq!(consumed(&store, "b", "y"), took_b);
            }
            Ok(())
        })?;
    }
}

/// 64 concurrent tasks on one hot bucket with a partition write budget of 20 writes/s:
/// the bucket shards, no debit is lost, and admissions stay within the doubling
/// transient of capacity + rate × elapsed.
#[test]
fn hot_bucket_shards_under_concurrency_without_losing_debits() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = Arc::new(MemoryStore::new());
        let engine = Arc::new(Engine::new(
            store.clone(),
            EngineOptions {
                partition_write_budget: 20,
                ..EngineOptions::default()
            },
        ));
        let params = LimitParams::new(400, 200, 1_000);
        let admitted = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let deadline = start + Duration::from_millis(2_500);
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let engine = engine.clone();
                let admitted = admitted.clone();
                tokio::spawn(async move {
                    let req = Acquire {
                        buckets: smallvec::smallvec![claim("hot", "rps", params, 1_000)],
                    };
                    for _ in 0..2_000 {
                        if Instant::now() >= deadline {
                            break;
                        }
                        if engine.acquire(&req).await.unwrap().admitted {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        let elapsed = start.elapsed().as_secs_f64() + 0.05;
        let admitted = admitted.load(Ordering::Relaxed) as f64;
        let bound = 1.5 * (400.0 + 200.0 * elapsed);
        assert!(
            admitted <= bound,
            "admitted {admitted} > 1.5 × (C + R·t) = {bound}"
        );
        assert!(
            admitted >= 400.0,
            "the burst alone admits 400, got {admitted}"
        );
        assert_eq!(
            consumed(&store, "hot", "rps"),
            admitted as i64 * 1_000,
            "no debit lost"
        );
        let count = store
            .get(&BucketKey::new("hot", "api", 0))
            .unwrap()
            .shard_count;
        assert!(
            count >= 4,
            "a 20 writes/s budget under this load must shard, got {count}"
        );
        for s in 1..count {
            if let Some(it) = store.get(&BucketKey::new("hot", "api", s)) {
                assert!(
                    it.limits["rps"].capacity == params.capacity,
                    "parameters stored undivided"
                );
            }
        }
    });
}

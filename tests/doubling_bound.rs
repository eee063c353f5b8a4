//! The bound across doublings (issue 50): a bucket never admits more than its capacity
//! plus its refill, whatever its doublings do. A doubling splits each shard's balance
//! between the shard and the shards it creates; it never creates tokens. Each case runs
//! on every store, with two servers (engines) sharing one store, a frozen clock and a
//! scripted shard draw, so every step is deterministic.

#[macro_use]
mod common;

use std::sync::Arc;

use shardgate::engine::{
    Acquire, BucketClaim, Engine, EngineOptions, EngineStats, LimitClaim, LimitParams, ManualClock,
    ScriptedDraw,
};
use shardgate::store::{BucketKey, BucketStore};

const T0: i64 = 1_800_000_000_000;

/// Two servers on one store, each with its own shard-count cache, rejection cache and
/// draw, and one clock (the same machine).
struct Fleet<S: BucketStore> {
    servers: Vec<(Engine<S>, Arc<ScriptedDraw>)>,
    store: Arc<S>,
    clock: Arc<ManualClock>,
}

fn fleet<S: BucketStore>(store: S, write_budget: u64) -> Fleet<S> {
    let store = Arc::new(store);
    let clock = Arc::new(ManualClock::new(T0));
    let servers = (0..2)
        .map(|_| {
            let draw = Arc::new(ScriptedDraw::default());
            let options = EngineOptions {
                partition_write_budget: write_budget,
                rejection_cache_ms: 0,
                ..EngineOptions::default()
            };
            let engine = Engine::with_parts(store.clone(), options, clock.clone(), draw.clone());
            (engine, draw)
        })
        .collect();
    Fleet {
        servers,
        store,
        clock,
    }
}

fn one_token(entity: &str, capacity: u64, per_hour: u64) -> Acquire {
    Acquire {
        buckets: smallvec::smallvec![BucketClaim {
            entity: entity.into(),
            resource: "api".into(),
            limits: smallvec::smallvec![LimitClaim {
                limit: "rps".into(),
                params: LimitParams::new(capacity, per_hour, 3_600_000),
                amount: 1_000,
                forced: false,
            }],
            cascades: false,
            strict: false,
        }],
    }
}

/// Millitokens the bucket's shards hold, summed.
async fn held<S: BucketStore>(store: &S, entity: &str) -> i64 {
    let keys: Vec<BucketKey> = (0..32).map(|s| BucketKey::new(entity, "api", s)).collect();
    let images = store.read(&keys).await.unwrap();
    images
        .iter()
        .flatten()
        .map(|item| item.limits["rps"].balance.max(0))
        .sum()
}

cross_store! {
    /// A bucket of 16 tokens (no refill within the test) doubles after a few writes (a
    /// write budget of one per second): shard 0 holds what was not taken, and the doubling
    /// must split that between shard 0 and its new shard. Both servers then ask, on every
    /// shard in turn, until every shard refuses: exactly 16 are admitted, and the shards
    /// hold, at every step, what was not admitted.
    async fn a_doubling_splits_what_a_shard_holds<S: BucketStore>(store: S) {
        let f = fleet(store, 1);
        let req = one_token("split", 16, 1);
        let mut admitted = 0i64;
        for round in 0..200u32 {
            let (engine, draw) = &f.servers[(round % 2) as usize];
            draw.push(round / 2 % 4);
            if engine.acquire(&req).await.unwrap().admitted {
                admitted += 1;
            }
            let left = held(f.store.as_ref(), "split").await;
            assert!(
                admitted * 1_000 + left <= 16_000,
                "round {round}: {admitted} admitted and {left} millitokens held, of 16 tokens"
            );
        }
        let doublings: u64 = f
            .servers
            .iter()
            .map(|(e, _)| EngineStats::get(&e.stats().shard_doublings))
            .sum();
        assert!(doublings >= 1, "the bucket doubled");
        assert_eq!(admitted, 16, "every token admitted once, none twice");
        f.clock.advance(0);
    }
}

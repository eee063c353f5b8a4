//! The memory store's bound under a flood of distinct keys on a `day` rule (rotating
//! client addresses): what it holds never passes the bound, and buckets in use meanwhile
//! answer exactly as they would on a store without one.
//!
//! Through the store's calls, each flooded key is created as the engine creates it (one
//! token of 100 a day taken, `ttl` a week on); a set of keys in use is debited every
//! round on the bounded store and on a twin that sees only them, and every outcome and
//! image must be equal. A flood slower than the rule refills evicts only buckets that are
//! full again; a faster one evicts the least recently used, never a key in use. Through
//! the whole decision (`RateLimiter`), the answers to keys in use are the same with and
//! without a flood.
//!
//! Sizes: the default runs create 200,000 keys each (seconds in a debug build);
//! `three_million_keys_under_the_default_bound` (ignored) is the case at full
//! size, under the default bound: `cargo test --release --test memory_bound -- --ignored`.

mod common;

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use futures::executor::block_on;
use shardgate::config::Config;
use shardgate::engine::{Engine, EngineOptions, LimitParams, ManualClock, RandomDraw};
use shardgate::service::RateLimiter;
use shardgate::store::memory::{MemoryStats, MemoryStore, DEFAULT_MAX_BYTES, MIN_MAX_BYTES};
use shardgate::store::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Debit, DebitMode, LimitState, Limits, Write,
    WCU_LIMIT,
};

const T0_S: i64 = 1_800_000_000;
const RESOURCE: &str = "day";

/// 100 a day: one token back every 864 s.
fn day() -> LimitParams {
    LimitParams::new(100, 100, 86_400_000)
}

/// The memory store's `wcu` (its write budget is unlimited).
fn wcu() -> LimitParams {
    LimitParams::new(1_000_000_000_000, 1_000_000_000_000, 1_000)
}

/// A bucket as the engine creates it at `now_s` for a request of one hit.
fn created(now_s: i64) -> BucketItem {
    let mut limits = Limits::new();
    limits.insert("day", LimitState::new(day(), day().capacity - 1_000, 1_000));
    limits.insert(WCU_LIMIT, LimitState::new(wcu(), wcu().capacity, 0));
    BucketItem {
        refilled_at: now_s * 1_000,
        shard_count: 1,
        count_raised_at: 0,
        ttl: Some(now_s + 7 * 864),
        limits,
    }
}

/// The `n`th rotating client address, as an entity.
fn flooded(n: usize) -> BucketKey {
    BucketKey::new(format!("remote_address=2001:db8::{n:x}"), RESOURCE, 0)
}

/// A client in use.
fn in_use(n: usize) -> BucketKey {
    BucketKey::new(format!("remote_address=192.0.2.{n}"), RESOURCE, 0)
}

/// A flood: `creates` distinct keys over `rounds` rounds `step_s` apart, into a store
/// bounded at `max_bytes`, while `in_use` keys are debited one token every round.
struct Flood {
    creates: usize,
    rounds: usize,
    step_s: i64,
    max_bytes: u64,
    in_use: usize,
}

fn debit_one(store: &MemoryStore, key: &BucketKey, now_s: i64) -> shardgate::store::DebitOutcome {
    block_on(store.debit(
        key,
        &[Debit {
            limit: "day".into(),
            amount: 1_000,
            gated: true,
            params: Some(day()),
        }],
        DebitMode::Fast {
            now_s,
            shard_count: 1,
        },
    ))
    .expect("debit")
}

fn create(store: &MemoryStore, key: BucketKey, now_s: i64) {
    let outcome = block_on(store.commit(&[Write::Create {
        key,
        item: created(now_s),
    }]))
    .expect("commit");
    assert_eq!(outcome, CommitOutcome::Committed);
}

/// Runs `flood`; every round, the keys in use must fare on the bounded store exactly as
/// on an unbounded twin, and the bound must hold. Returns the bounded store's account.
fn run(flood: &Flood) -> MemoryStats {
    let bounded = MemoryStore::with_max_bytes(flood.max_bytes).unwrap();
    let twin = MemoryStore::with_max_bytes(u64::MAX).unwrap();
    let keys: Vec<BucketKey> = (0..flood.in_use).map(in_use).collect();
    for k in &keys {
        create(&bounded, k.clone(), T0_S);
        create(&twin, k.clone(), T0_S);
    }
    let per_round = flood.creates / flood.rounds;
    let mut next = 0;
    for round in 0..flood.rounds {
        let now_s = T0_S + flood.step_s * round as i64;
        for k in &keys {
            assert_eq!(
                debit_one(&bounded, k, now_s),
                debit_one(&twin, k, now_s),
                "{k} in round {round}"
            );
        }
        for _ in 0..per_round {
            create(&bounded, flooded(next), now_s);
            next += 1;
        }
        let stats = bounded.stats();
        assert!(stats.bytes <= flood.max_bytes, "round {round}: {stats:?}");
    }
    for k in &keys {
        assert_eq!(bounded.get(k), twin.get(k), "{k}");
    }
    let stats = bounded.stats();
    assert_eq!(
        stats.items as usize + (stats.evicted_full + stats.evicted_active) as usize,
        flood.in_use + next,
        "every item held or counted evicted: {stats:?}"
    );
    stats
}

/// Items the bound can hold at most: none is charged less than its slot in a table
/// just doubled.
fn most_items(max_bytes: u64) -> u64 {
    max_bytes / 240
}

#[test]
fn a_flood_faster_than_the_rule_refills_evicts_the_least_recently_used_never_a_key_in_use() {
    // 4 MiB hold about 14,000 of these; each round of 10 s adds 2,000, so an item is
    // evicted about 70 s after its creation, long before its token is back (864 s).
    let stats = run(&Flood {
        creates: 200_000,
        rounds: 100,
        step_s: 10,
        max_bytes: 4 << 20,
        in_use: 200,
    });
    assert!(stats.evicted_active > 150_000, "{stats:?}");
    assert_eq!(stats.evicted_full, 0, "{stats:?}");
    assert!(stats.items <= most_items(4 << 20), "{stats:?}");
}

#[test]
fn a_flood_slower_than_the_rule_refills_evicts_only_buckets_full_again() {
    // Each round of 300 s adds 2,000: an item is full again three rounds after its
    // creation, well before the bound (about seven rounds' worth) is reached.
    let stats = run(&Flood {
        creates: 200_000,
        rounds: 100,
        step_s: 300,
        max_bytes: 4 << 20,
        in_use: 200,
    });
    assert!(stats.evicted_full > 150_000, "{stats:?}");
    assert_eq!(stats.evicted_active, 0, "{stats:?}");
}

#[test]
#[ignore = "three million creates: seconds in a release build, minutes in a debug one; run with --release --ignored"]
fn three_million_keys_under_the_default_bound() {
    // 10,000 new addresses a second for five minutes: the bound holds about 90 seconds'
    // worth, so every eviction takes a bucket still in use, the least recently used.
    let stats = run(&Flood {
        creates: 3_000_000,
        rounds: 300,
        step_s: 1,
        max_bytes: DEFAULT_MAX_BYTES,
        in_use: 1_000,
    });
    assert!(stats.evicted_active > 2_000_000, "{stats:?}");
    assert_eq!(stats.evicted_full, 0, "{stats:?}");
    assert!(stats.items <= most_items(DEFAULT_MAX_BYTES), "{stats:?}");
}

const RULES: &str = "
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 100}
";

struct Rig {
    clock: Arc<ManualClock>,
    limiter: RateLimiter<MemoryStore>,
    store: Arc<MemoryStore>,
}

fn rig(store: MemoryStore) -> Rig {
    let store = Arc::new(store);
    let clock = Arc::new(ManualClock::new(T0_S * 1_000));
    let engine = Engine::with_parts(
        store.clone(),
        EngineOptions {
            // Every answer from the store: a cached image would hide an evicted item.
            rejection_cache_ms: 0,
            ..common::server::serve_defaults()
        },
        clock.clone(),
        Arc::new(RandomDraw),
    );
    let config = Config::from_yaml("edge.yaml", RULES).unwrap();
    Rig {
        clock,
        limiter: RateLimiter::new(Arc::new(config), Arc::new(engine)),
        store,
    }
}

fn request(address: &str, hits: u64) -> RateLimitRequest {
    common::server::request(
        "edge",
        vec![common::server::desc_hits(
            &[("remote_address", address)],
            hits,
        )],
    )
}

fn ask(rig: &Rig, req: &RateLimitRequest) -> RateLimitResponse {
    block_on(rig.limiter.should_rate_limit(req)).expect("answered")
}

/// Through the whole decision: clients in use, some of them refused, get the same
/// answers every second from a server at its bound under a flood of new addresses as
/// from one that never saw the flood.
#[test]
fn clients_in_use_get_the_same_answers_under_a_flood() {
    let flooded = rig(MemoryStore::with_max_bytes(MIN_MAX_BYTES).unwrap());
    let quiet = rig(MemoryStore::new());
    let clients: Vec<String> = (0..50).map(|i| format!("192.0.2.{i}")).collect();
    let mut next = 0;
    for second in 0..40 {
        for (i, client) in clients.iter().enumerate() {
            // Some clients spend their day's 100 within the run, some refuse later.
            let req = request(client, 1 + (i as u64 % 5));
            assert_eq!(
                ask(&flooded, &req),
                ask(&quiet, &req),
                "{client} at {second} s"
            );
        }
        for _ in 0..500 {
            ask(&flooded, &request(&format!("2001:db8::{next:x}"), 1));
            next += 1;
        }
        flooded.clock.advance(1_000);
        quiet.clock.advance(1_000);
    }
    let stats = flooded.store.stats();
    assert!(stats.evicted_active > 10_000, "{stats:?}");
    assert!(stats.bytes <= MIN_MAX_BYTES, "{stats:?}");
}

//! The reference engine's behavioural scenarios (zae-limiter's), ported with the
//! same numbers: S06–S08, S10, S12, S19–S29, S31–S35 (S01–S05 are unit tests of
//! `engine::bucket`). Our profile has no config or META reads, so the call sequences are
//! shorter; the item states and outcomes are the reference's.

#[macro_use]
mod common;

use std::sync::Arc;

use common::{Call, Hook, Recorder};
use shardgate::engine::{
    Acquire, BucketClaim, Decision, Engine, EngineOptions, EngineStats, LimitClaim, LimitParams,
    ManualClock, ScriptedDraw,
};
use shardgate::store::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, CountChange, LimitState, LimitWrite, Write,
    WCU_LIMIT,
};

const T0: i64 = 1_800_000_000_000;

struct Rig<S: BucketStore> {
    engine: Engine<Recorder<S>>,
    store: Arc<Recorder<S>>,
    clock: Arc<ManualClock>,
    draw: Arc<ScriptedDraw>,
}

fn rig_with<S: BucketStore>(inner: S, options: EngineOptions) -> Rig<S> {
    let store = Recorder::new(inner);
    let clock = Arc::new(ManualClock::new(T0));
    let draw = Arc::new(ScriptedDraw::default());
    let engine = Engine::with_parts(store.clone(), options, clock.clone(), draw.clone());
    Rig {
        engine,
        store,
        clock,
        draw,
    }
}

/// DynamoDB's budget (1000 writes/s per shard), rejection cache off (as those scenarios
/// assume), token leases on as on DynamoDB by default: these buckets are cold (the clock
/// is frozen, no demand window ever completes), and a cold bucket is never leased, so
/// every scenario's calls and states are the reference's with leases on.
fn rig<S: BucketStore>(inner: S) -> Rig<S> {
    rig_with(
        inner,
        EngineOptions {
            rejection_cache_ms: 0,
            leases: Some(shardgate::engine::LeaseOptions::default()),
            ..EngineOptions::default()
        },
    )
}

fn per_minute(name: &str, rate: u64, burst: Option<u64>, amount: i64) -> LimitClaim {
    LimitClaim {
        limit: name.into(),
        params: LimitParams::new(burst.unwrap_or(rate), rate, 60_000),
        amount: amount * 1_000,
        forced: false,
    }
}

fn bucket(entity: &str, resource: &str, limits: Vec<LimitClaim>) -> BucketClaim {
    BucketClaim {
        entity: entity.into(),
        resource: resource.into(),
        limits: limits.into(),
        cascades: false,
        strict: false,
    }
}

fn one(b: BucketClaim) -> Acquire {
    Acquire {
        buckets: smallvec::smallvec![b],
    }
}

fn rpm(n: u64, amount: i64) -> Acquire {
    one(bucket(
        "u1",
        "api",
        vec![per_minute("rpm", n, None, amount)],
    ))
}

async fn item<S: BucketStore>(
    rig: &Rig<S>,
    entity: &str,
    resource: &str,
    shard: u32,
) -> BucketItem {
    rig.store
        .get(&BucketKey::new(entity, resource, shard))
        .await
        .unwrap_or_else(|| panic!("no item {entity}/{resource}#{shard}"))
}

async fn tk<S: BucketStore>(rig: &Rig<S>, shard: u32, limit: &str) -> i64 {
    item(rig, "u1", "api", shard).await.limits[limit].balance
}

async fn tk_of<S: BucketStore>(rig: &Rig<S>, entity: &str) -> i64 {
    item(rig, entity, "api", 0).await.limits["rpm"].balance
}

async fn exists<S: BucketStore>(rig: &Rig<S>, entity: &str, shard: u32) -> bool {
    rig.store
        .get(&BucketKey::new(entity, "api", shard))
        .await
        .is_some()
}

/// An item holding `tk` of an `rpm` limit of `rate`/min and `wcu` tokens of `wcu`.
fn rpm_item(count: u32, rate: u64, tk: i64, wcu_tk: i64) -> BucketItem {
    let p = LimitParams::new(rate, rate, 60_000);
    let wcu = LimitParams::new(1_000, 1_000, 1_000);
    let mut limits = shardgate::store::Limits::new();
    limits.insert("rpm", LimitState::new(p, tk, 0));
    limits.insert(WCU_LIMIT, LimitState::new(wcu, wcu_tk, 0));
    BucketItem {
        refilled_at: T0,
        shard_count: count,
        count_raised_at: 0,
        ttl: Some(T0 / 1_000 + 3_600),
        limits,
    }
}

/// Puts a shard of `u1/api` holding `tk` of an `rpm` limit of `rate`/min.
async fn put_rpm_shard<S: BucketStore>(rig: &Rig<S>, shard: u32, count: u32, rate: u64, tk: i64) {
    rig.store
        .put(
            BucketKey::new("u1", "api", shard),
            rpm_item(count, rate, tk, 1_000_000),
        )
        .await;
}

async fn acquire<S: BucketStore>(rig: &Rig<S>, req: &Acquire) -> Decision {
    rig.engine
        .acquire(req)
        .await
        .expect("store never fails here")
}

fn debits(calls: &[Call]) -> usize {
    calls
        .iter()
        .filter(|c| matches!(c, Call::Debit { .. }))
        .count()
}

fn reads(calls: &[Call]) -> usize {
    calls
        .iter()
        .filter(|c| matches!(c, Call::Read { .. }))
        .count()
}

fn commits(calls: &[Call]) -> usize {
    calls
        .iter()
        .filter(|c| matches!(c, Call::Commit { .. }))
        .count()
}

// ---------------------------------------------------------------- B. single shard

cross_store! {
    /// S06 ten per minute.
    async fn s06_ten_per_minute<S: BucketStore>(store: S) {
        let rig = rig(store);
        for i in 1..=10 {
            assert!(acquire(&rig, &rpm(10, 1)).await.admitted, "request {i}");
        }
        let d = acquire(&rig, &rpm(10, 1)).await;
        assert!(!d.admitted);
        let l = d.buckets[0].limits[0];
        assert_eq!(l.wait_ms, Some(6_001));
        assert_eq!(l.remaining / 1_000, 0);
        assert_eq!(l.share.ceiling, 10_000);
        let it = item(&rig, "u1", "api", 0).await;
        assert_eq!(it.limits["rpm"].balance, 0);
        assert_eq!(it.limits["rpm"].taken, 10_000);
        // The creating slow path does not debit `wcu`; nine fast-path writes did.
        assert_eq!(it.limits[WCU_LIMIT].balance, 991_000);
        assert_eq!(it.limits[WCU_LIMIT].taken, 9_000);
        assert_eq!(
            (it.refilled_at, it.shard_count, it.ttl),
            (T0, 1, Some(1_800_000_420))
        );
    }
}

cross_store! {
    /// Ours: a bucket's first request is one store call on every store, which creates the
    /// missing shard with its debit; the item and the answer are the slow pass's create:
    /// the claim taken, `wcu` untouched, the same `ttl`.
    async fn a_new_buckets_first_request_is_one_call_and_admitted<S: BucketStore>(store: S) {
        let rig = rig(store);
        let d = acquire(&rig, &rpm(10, 3)).await;
        assert!(d.admitted);
        let l = d.buckets[0].limits[0];
        assert_eq!((l.remaining, l.share.ceiling, l.wait_ms), (7_000, 10_000, Some(0)));
        let calls = rig.store.calls();
        let expected = vec![Call::Debit {
            shard: 0,
            retry_only: false,
            applied: true,
            missing: false,
        }];
        assert_eq!(calls, expected);
        let it = item(&rig, "u1", "api", 0).await;
        assert_eq!((it.limits["rpm"].balance, it.limits["rpm"].taken), (7_000, 3_000));
        assert_eq!((it.limits[WCU_LIMIT].balance, it.limits[WCU_LIMIT].taken), (1_000_000, 0));
        assert_eq!(
            (it.refilled_at, it.shard_count, it.ttl),
            (T0, 1, Some(1_800_000_420))
        );
        // A claim larger than a new shard holds creates nothing, and is refused.
        let d = acquire(&rig, &one(bucket("u2", "api", vec![per_minute("rpm", 10, None, 11)]))).await;
        assert!(!d.admitted);
        assert!(!exists(&rig, "u2", 0).await);
    }
}

cross_store! {
    /// Ours: a cascade whose parent has no item and whose child is short is refused
    /// whole: the parent a debit created is given back.
    async fn a_cascade_refused_by_its_child_leaves_a_new_parent_full<S: BucketStore>(store: S) {
        let rig = rig(store);
        let mut drained = rpm_item(1, 10, 0, 1_000_000);
        drained.ttl = None;
        rig.store.put(BucketKey::new("key1", "api", 0), drained).await;
        let d = acquire(&rig, &cascade(10, 100)).await;
        assert!(!d.admitted);
        assert_eq!(tk_of(&rig, "key1").await, 0);
        let parent = item(&rig, "org", "api", 0).await;
        assert_eq!(
            (parent.limits["rpm"].balance, parent.limits["rpm"].taken),
            (100_000, 0),
            "the parent's debit refunded"
        );
        // And then admitted once the child refills: the parent debited from full.
        rig.clock.set(T0 + 6_000);
        assert!(acquire(&rig, &cascade(10, 100)).await.admitted);
        let parent = item(&rig, "org", "api", 0).await;
        assert_eq!(parent.limits["rpm"].balance, 99_000);
    }
}

cross_store! {
    /// S07 local rejection: with the 1 s rejection cache, the 11th and 12th requests are
    /// refused without a store call, and requests 2–10 are one debit each.
    async fn s07_rejection_cache_answers_repeat_refusals_without_a_call<S: BucketStore>(store: S) {
        let rig = rig_with(store, EngineOptions::default());
        assert!(acquire(&rig, &rpm(10, 1)).await.admitted);
        rig.store.clear();
        for _ in 2..=10 {
            assert!(acquire(&rig, &rpm(10, 1)).await.admitted);
        }
        let calls = rig.store.calls();
        assert_eq!(calls.len(), 9);
        assert!(calls
            .iter()
            .all(|c| matches!(c, Call::Debit { applied: true, .. })));
        rig.store.clear();
        assert!(!acquire(&rig, &rpm(10, 1)).await.admitted);
        assert!(!acquire(&rig, &rpm(10, 1)).await.admitted);
        assert!(rig.store.calls().is_empty(), "{:?}", rig.store.calls());
        assert_eq!(
            EngineStats::get(&rig.engine.stats().rejection_cache_hits),
            2
        );
    }
}

cross_store! {
    /// S08 recovery without an aggregator: the slow path refills and drops the remainder.
    async fn s08_recovery_by_the_slow_path<S: BucketStore>(store: S) {
        let rig = rig(store);
        for _ in 0..11 {
            acquire(&rig, &rpm(10, 1)).await;
        }
        rig.clock.set(T0 + 6_001);
        rig.store.clear();
        assert!(acquire(&rig, &rpm(10, 1)).await.admitted);
        let calls = rig.store.calls();
        assert!(matches!(calls[0], Call::Debit { applied: false, .. }));
        assert_eq!(calls[1], Call::Read { shards: vec![0] });
        assert_eq!(
            calls[2],
            Call::Commit {
                kinds: vec!["update"],
                committed: true
            }
        );
        let it = item(&rig, "u1", "api", 0).await;
        assert_eq!(it.limits["rpm"].balance, 0);
        assert_eq!(it.limits["rpm"].taken, 11_000);
        assert_eq!(it.refilled_at, T0 + 6_001);
        assert_eq!(it.limits[WCU_LIMIT].balance, 1_000_000);
        assert_eq!(it.ttl, Some(1_800_000_426));
    }
}

cross_store! {
    /// S10 burst and TTL: the item TTL is 7 × the longest time-to-full.
    async fn s10_burst_and_ttl<S: BucketStore>(store: S) {
        let rig = rig(store);
        let req = one(bucket(
            "u1",
            "api",
            vec![
                per_minute("rpm", 100, None, 1),
                per_minute("tpm", 10_000, Some(15_000), 10),
            ],
        ));
        assert!(acquire(&rig, &req).await.admitted);
        let it = item(&rig, "u1", "api", 0).await;
        let tpm = it.limits["tpm"];
        assert_eq!(
            (tpm.capacity, tpm.refill_amount, tpm.refill_period_ms, tpm.balance),
            (15_000_000, 10_000_000, 60_000, 14_990_000)
        );
        assert_eq!(it.limits["rpm"].balance, 99_000);
        assert_eq!(it.ttl, Some(1_800_000_000 + 630));
    }
}

cross_store! {
    /// S12 multi-limit is all-or-nothing: one limit short refuses the whole item.
    async fn s12_composite_item_is_all_or_nothing<S: BucketStore>(store: S) {
        let rig = rig(store);
        let req = |r, t| {
            one(bucket(
                "u1",
                "api",
                vec![
                    per_minute("rpm", 100, None, r),
                    per_minute("tpm", 1_000, None, t),
                ],
            ))
        };
        assert!(acquire(&rig, &req(1, 900)).await.admitted);
        rig.store.clear();
        let d = acquire(&rig, &req(1, 200)).await;
        assert!(!d.admitted);
        assert_eq!(rig.store.calls().len(), 1, "one failed debit, no read");
        let [r, t] = [d.buckets[0].limits[0], d.buckets[0].limits[1]];
        assert!(r.fits && !t.fits);
        assert_eq!((r.remaining / 1_000, t.remaining / 1_000), (99, 100));
        assert_eq!(t.wait_ms, Some(6_001));
        assert_eq!(tk(&rig, 0, "rpm").await, 99_000);
        assert_eq!(tk(&rig, 0, "tpm").await, 100_000);
    }
}

// ---------------------------------------------------------------- D. sharding

/// Creates `u1/api` at T0 and spends all 1000 `wcu` tokens of shard 0 (S19's setup).
async fn exhaust_wcu<S: BucketStore>(rig: &Rig<S>) -> Acquire {
    let req = rpm(100_000, 1);
    for _ in 0..1_001 {
        assert!(acquire(rig, &req).await.admitted);
    }
    assert_eq!(tk(rig, 0, WCU_LIMIT).await, 0);
    req
}

cross_store! {
    /// S19 wcu-driven doubling: shard 0's count moves 1→2 and, in the same commit, shard 1
    /// is created holding half of what shard 0 held (a split: no token created); the
    /// request then goes to shard 1.
    async fn s19_wcu_exhaustion_doubles_and_creates_the_drawn_shard<S: BucketStore>(store: S) {
        let rig = rig(store);
        let req = exhaust_wcu(&rig).await;
        rig.store.clear();
        assert!(acquire(&rig, &req).await.admitted);
        assert_eq!(
            rig.store.calls(),
            vec![
                Call::Debit {
                    shard: 0,
                    retry_only: false,
                    applied: false,
                    missing: false
                },
                Call::Read { shards: vec![0] },
                // Which of the shards shard 0 gives up exist.
                Call::Read { shards: vec![1] },
                Call::Commit {
                    kinds: vec!["raise", "create"],
                    committed: true
                },
                Call::Read { shards: vec![1] },
                Call::Commit {
                    kinds: vec!["update"],
                    committed: true
                },
            ]
        );
        let s1 = item(&rig, "u1", "api", 1).await;
        assert_eq!(s1.limits["rpm"].balance, 49_499_500 - 1_000);
        assert_eq!(s1.shard_count, 2);
        assert_eq!(s1.limits[WCU_LIMIT].balance, 1_000_000);
        let s0 = item(&rig, "u1", "api", 0).await;
        assert_eq!(s0.shard_count, 2);
        assert_eq!(
            s0.limits["rpm"].balance, 49_499_500,
            "the doubling splits shard 0's 98,999 tokens with shard 1 (the reference leaves \
             shard 0 all of them and creates shard 1 at half the capacity)"
        );
        assert_eq!(rig.engine.known_shard_count("u1", "api"), 2);
    }
}

cross_store! {
    /// S20 an exhausted `wcu` that a refill cures does not double.
    async fn s20_wcu_projection_prevents_a_spurious_doubling<S: BucketStore>(store: S) {
        let rig = rig(store);
        let req = exhaust_wcu(&rig).await;
        acquire(&rig, &req).await; // S19
        rig.clock.advance(1);
        rig.draw.push(0);
        rig.store.clear();
        assert!(acquire(&rig, &req).await.admitted);
        let calls = rig.store.calls();
        assert!(!doubled(&calls), "{calls:?}");
        assert_eq!(
            calls.last(),
            Some(&Call::Commit {
                kinds: vec!["update"],
                committed: true
            })
        );
        let s0 = item(&rig, "u1", "api", 0).await;
        assert_eq!(s0.limits[WCU_LIMIT].balance, 1_000, "1 ms of refill");
        assert_eq!(
            s0.limits["rpm"].balance, 49_499_333,
            "its half of the split, 1 ms of refill at half the rate (833), then debited"
        );
        assert_eq!(s0.refilled_at, T0 + 1);
    }
}

cross_store! {
    /// S21 the shard count stops at 32: no bump is written.
    async fn s21_no_doubling_beyond_32_shards<S: BucketStore>(store: S) {
        let rig = rig(store);
        rig.store
            .put(
                BucketKey::new("u1", "api", 0),
                rpm_item(32, 100_000, 100_000_000, 0),
            )
            .await;
        rig.engine.learn_shard_count("u1", "api", 32);
        rig.draw.push(0);
        assert!(acquire(&rig, &rpm(100_000, 1)).await.admitted);
        assert!(!doubled(&rig.store.calls()));
        assert_eq!(
            EngineStats::get(&rig.engine.stats().shard_doublings_declined_at_max),
            1
        );
        assert_eq!(item(&rig, "u1", "api", 0).await.shard_count, 32);
    }
}

/// `entity/api` spread over 16 shards of an `rpm` limit of `rate`/min, each full at its
/// share, shard 0 the hot one: its `wcu` spent at this very instant, so no refill helps.
/// `hot` adjusts shard 0's item; the next draw is shard 0, the calls are cleared.
async fn sixteen_shards_hot_on_zero<S: BucketStore>(
    rig: &Rig<S>,
    entity: &str,
    rate: u64,
    hot: impl Fn(&mut BucketItem),
) {
    let p = LimitParams::new(rate, rate, 60_000);
    for shard in 0..16 {
        let wcu_tk = if shard == 0 { 0 } else { 1_000_000 };
        let mut it = rpm_item(16, rate, p.share(16).ceiling, wcu_tk);
        if shard == 0 {
            hot(&mut it);
        }
        rig.store
            .put(BucketKey::new(entity, "api", shard), it)
            .await;
    }
    rig.engine.learn_shard_count(entity, "api", 16);
    rig.draw.push(0);
    rig.store.clear();
}

cross_store! {
    /// S21b no doubling that would leave a shard's share smaller than the request: a limit
    /// of 20/min over 16 shards holds 1.25 tokens per shard, over 32 it would hold 0.625,
    /// and a 1-token request could never be admitted again on any shard.
    async fn s21b_no_doubling_below_one_request_per_shard<S: BucketStore>(store: S) {
        let rig = rig(store);
        sixteen_shards_hot_on_zero(&rig, "u1", 20, |_| {}).await;
        let d = acquire(&rig, &rpm(20, 1)).await;
        assert!(d.admitted, "the slow pass on the hot shard admits: {d:?}");
        let calls = rig.store.calls();
        assert!(!doubled(&calls), "{calls:?}");
        assert_eq!(
            EngineStats::get(&rig.engine.stats().shard_doublings_declined_small_share),
            1
        );
        assert_eq!(EngineStats::get(&rig.engine.stats().shard_doublings), 0);
        let s0 = item(&rig, "u1", "api", 0).await;
        assert_eq!(s0.shard_count, 16);
        assert_eq!(s0.limits["rpm"].balance, 250, "1.25 tokens, one taken");
        assert!(!exists(&rig, "u1", 16).await, "no shard beyond the 16");
    }
}

/// Another server's doubling of `u1/api` from `old` shards: shard 0's count raised in a
/// write under its lock (as `double` does), balances clamped by that server's pass.
async fn double_elsewhere<S: BucketStore>(s: &S, old: u32, new: u32) {
    assert_eq!((old, new), (1, 2), "splits one shard into two");
    let key = BucketKey::new("u1", "api", 0);
    let zero = s.read(std::slice::from_ref(&key)).await.unwrap()[0]
        .clone()
        .expect("shard 0 exists");
    assert_eq!(zero.shard_count, old);
    // As another server's doubling does it: shard 0 raised and halved in one commit with
    // the create of shard 1 holding the other half (`engine/acquire/split.rs`).
    let mut child = BucketItem {
        refilled_at: zero.refilled_at + 1,
        shard_count: new,
        count_raised_at: 0,
        ttl: zero.ttl,
        limits: Default::default(),
    };
    let mut halves = Vec::new();
    for (name, st) in zero.limits.iter() {
        let given = if name == WCU_LIMIT { 0 } else { st.balance / 2 };
        let balance = if name == WCU_LIMIT {
            st.capacity
        } else {
            given
        };
        child
            .limits
            .insert(name, LimitState::new(st.params(), balance, 0));
        if given > 0 {
            halves.push(LimitWrite::Add {
                limit: name.into(),
                balance_delta: -given,
                taken_delta: 0,
                floor: Some(given),
                cap: None,
                claimed: 0,
            });
        }
    }
    let raise = Write::Update {
        key,
        expected_refilled_at: zero.refilled_at,
        refilled_at: zero.refilled_at + 1,
        ttl: zero.ttl,
        shard_count: Some(CountChange { read: old, new }),
        limits: halves,
    };
    let create = Write::Create {
        key: BucketKey::new("u1", "api", 1),
        item: child,
    };
    assert_eq!(
        s.commit(&[raise, create]).await.unwrap(),
        CommitOutcome::Committed
    );
}

/// Whether the calls include a committed doubling (a raise of shard 0's count).
fn doubled(calls: &[Call]) -> bool {
    calls.iter().any(
        |c| matches!(c, Call::Commit { kinds, committed: true } if kinds.first() == Some(&"raise")),
    )
}

cross_store! {
    /// S22 doubling loser: another server doubled first; we adopt its count and raise nothing.
    async fn s22_bump_loser_adopts_the_winners_count<S: BucketStore>(store: S) {
        let rig = rig(store);
        let req = exhaust_wcu(&rig).await;
        let other_server: Hook<S> =
            Box::new(|s| Box::pin(async move { double_elsewhere(&*s, 1, 2).await }));
        rig.store.before_commit(other_server);
        rig.store.clear();
        assert!(acquire(&rig, &req).await.admitted);
        let calls = rig.store.calls();
        assert!(
            calls.contains(&Call::Commit {
                kinds: vec!["raise", "create"],
                committed: false
            }),
            "{calls:?}"
        );
        assert!(!doubled(&calls), "{calls:?}");
        assert_eq!(rig.engine.known_shard_count("u1", "api"), 2);
        assert_eq!(EngineStats::get(&rig.engine.stats().shard_doublings), 0);
        assert_eq!(item(&rig, "u1", "api", 0).await.shard_count, 2);
    }
}

cross_store! {
    /// S23 the doubling's winner splits every existing shard: each keeps half of what it
    /// held and creates the shard it gives up with the other half.
    async fn s23_bump_winner_propagates_to_existing_shards<S: BucketStore>(store: S) {
        let rig = rig(store);
        rig.store
            .put(
                BucketKey::new("u1", "api", 0),
                rpm_item(2, 100_000, 50_000_000, 0),
            )
            .await;
        put_rpm_shard(&rig, 1, 2, 100_000, 50_000_000).await;
        rig.engine.learn_shard_count("u1", "api", 2);
        rig.draw.push(0);
        assert!(acquire(&rig, &rpm(100_000, 1)).await.admitted);
        let calls = rig.store.calls();
        assert!(
            calls.contains(&Call::Read { shards: vec![0, 1] }),
            "{calls:?}"
        );
        let raises = calls
            .iter()
            .filter(|c| {
                **c == Call::Commit {
                    kinds: vec!["raise", "create"],
                    committed: true,
                }
            })
            .count();
        assert_eq!(raises, 2, "shard 0 doubles, shard 1 learns: {calls:?}");
        for shard in [0, 1] {
            let it = item(&rig, "u1", "api", shard).await;
            assert_eq!(it.shard_count, 4);
            assert_eq!(it.limits["rpm"].balance, 25_000_000, "half of its half");
        }
        // The request itself went to one brand-new shard (2 here), shard 0's other half.
        assert_eq!(tk(&rig, 2, "rpm").await, 25_000_000 - 1_000);
        assert_eq!(tk(&rig, 3, "rpm").await, 25_000_000, "shard 1's other half");
    }
}

cross_store! {
    /// S24 an exhausted shard retries another: two debits, no read.
    async fn s24_retry_on_another_shard<S: BucketStore>(store: S) {
        let rig = rig(store);
        put_rpm_shard(&rig, 0, 2, 100, 0).await;
        put_rpm_shard(&rig, 1, 2, 100, 50_000).await;
        rig.engine.learn_shard_count("u1", "api", 2);
        rig.draw.push(0);
        assert!(acquire(&rig, &rpm(100, 1)).await.admitted);
        let calls = rig.store.calls();
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert!(matches!(
            calls[0],
            Call::Debit {
                shard: 0,
                applied: false,
                ..
            }
        ));
        assert!(matches!(
            calls[1],
            Call::Debit {
                shard: 1,
                applied: true,
                ..
            }
        ));
        assert_eq!(tk(&rig, 1, "rpm").await, 49_000);
    }
}

cross_store! {
    /// S25 retries are capped at two; the refusal quotes the shard's share.
    async fn s25_retries_capped_at_two<S: BucketStore>(store: S) {
        let rig = rig(store);
        for s in 0..4 {
            put_rpm_shard(&rig, s, 4, 100, 0).await;
        }
        rig.engine.learn_shard_count("u1", "api", 4);
        let d = acquire(&rig, &rpm(100, 1)).await;
        assert!(!d.admitted);
        let calls = rig.store.calls();
        assert_eq!(calls.len(), 3, "{calls:?}");
        assert!(calls
            .iter()
            .all(|c| matches!(c, Call::Debit { applied: false, .. })));
        let l = d.buckets[0].limits[0];
        assert_eq!(l.wait_ms, Some(2_401));
        assert_eq!((l.share.ceiling, l.share.refill_amount), (25_000, 25_000));
        assert_eq!(l.remaining, 0);
    }
}

cross_store! {
    /// S26 a retry that finds a missing shard creates it there.
    async fn s26_retry_that_finds_a_missing_shard_creates_it<S: BucketStore>(store: S) {
        let rig = rig(store);
        put_rpm_shard(&rig, 0, 4, 100, 0).await;
        rig.engine.learn_shard_count("u1", "api", 4);
        rig.draw.push(0);
        rig.draw.push(3);
        assert!(acquire(&rig, &rpm(100, 1)).await.admitted);
        assert_eq!(
            rig.store.calls(),
            vec![
                Call::Debit {
                    shard: 0,
                    retry_only: false,
                    applied: false,
                    missing: false
                },
                Call::Debit {
                    shard: 3,
                    retry_only: false,
                    applied: false,
                    missing: true
                },
                Call::Read { shards: vec![3] },
                // Shard 3's ancestors: none owns it (shard 0 holds four), so it is
                // created full, for the count shard 0 holds (X07).
                Call::Read { shards: vec![0, 1] },
                Call::Commit {
                    kinds: vec!["create"],
                    committed: true
                },
            ]
        );
        let s3 = item(&rig, "u1", "api", 3).await;
        assert_eq!((s3.limits["rpm"].balance, s3.shard_count), (24_000, 4));
    }
}

cross_store! {
    /// S27 the per-shard request ceiling: a request above one shard's share never fits.
    async fn s27_per_shard_request_ceiling<S: BucketStore>(store: S) {
        let rig = rig(store);
        for s in 0..4 {
            put_rpm_shard(&rig, s, 4, 10, 2_500).await;
        }
        rig.engine.learn_shard_count("u1", "api", 4);
        let d = acquire(&rig, &rpm(10, 3)).await;
        assert!(!d.admitted);
        assert_eq!(debits(&rig.store.calls()), 3);
        let l = d.buckets[0].limits[0];
        assert_eq!(l.remaining / 1_000, 2);
        assert_eq!(l.share.ceiling, 2_500);
        // The reference quotes a retry-after that can never pay off; we say "never".
        assert_eq!(l.wait_ms, None);
        assert!(EngineStats::get(&rig.engine.stats().per_shard_ceiling_rejections) >= 1);
        for s in 0..4 {
            assert_eq!(tk(&rig, s, "rpm").await, 2_500);
        }
    }
}

cross_store! {
    /// S28 the doubling transient, which the reference engine bounds by 1.5 × capacity (its
    /// shard 0 keeps what it held, up to the whole capacity, while shard 1 starts at half).
    /// A doubling here splits what shard 0 holds between it and shard 1 (issue 50), so the
    /// bucket admits what it held: 1 taken before, then the 99 left, halved.
    async fn s28_a_doubling_elsewhere_admits_what_the_bucket_held<S: BucketStore>(store: S) {
        let rig = rig(store);
        // Random draws, as in production.
        let engine = Engine::with_parts(
            rig.store.clone(),
            EngineOptions {
                rejection_cache_ms: 0,
                ..EngineOptions::default()
            },
            rig.clock.clone(),
            Arc::new(shardgate::engine::RandomDraw),
        );
        let req = rpm(100, 1);
        assert!(engine.acquire(&req).await.unwrap().admitted);
        // Another server doubles the bucket; this one learns it from shard 0's refusal.
        double_elsewhere(&*rig.store.inner, 1, 2).await;
        // 99 tokens left, split 49.5 and 49.5: the reference lets the new shard start full
        // (up to 150 in all); here the split moves tokens and never makes any.
        let admitted = 1 + admit_until_refused(&engine, &req).await;
        assert_eq!(admitted, 99);
    }
}

/// Admits `req` on `engine` until 20 refusals in a row; returns how many were admitted.
async fn admit_until_refused<S: BucketStore>(engine: &Engine<S>, req: &Acquire) -> u32 {
    let mut admitted = 0;
    let mut refusals_in_a_row = 0;
    for _ in 0..1_000 {
        if engine.acquire(req).await.unwrap().admitted {
            admitted += 1;
            refusals_in_a_row = 0;
        } else {
            refusals_in_a_row += 1;
            if refusals_in_a_row == 20 {
                break;
            }
        }
    }
    admitted
}

cross_store! {
    /// X04 concurrent doublings: a second server whose count is behind sees the hot shard's
    /// spent `wcu` right after the first server doubled the bucket. That exhaustion is the one
    /// the first doubling answered: it must not double again (the reference does: 2 → 4, and
    /// its transient compounds). Across both servers the bucket admits no more than the
    /// documented transient.
    async fn x04_a_doubling_already_made_is_not_made_again<S: BucketStore>(store: S) {
        let rig = rig(store);
        let req = exhaust_wcu(&rig).await; // 1001 admitted on shard 0 (100,000/min)
        assert!(acquire(&rig, &req).await.admitted, "server A doubles 1 → 2");
        assert_eq!(item(&rig, "u1", "api", 0).await.shard_count, 2);
        // Server B has never seen the bucket sharded; it draws shard 0 under one shard.
        let b = Engine::with_parts(
            rig.store.clone(),
            EngineOptions {
                rejection_cache_ms: 0,
                ..EngineOptions::default()
            },
            rig.clock.clone(),
            Arc::new(ScriptedDraw::new([0])),
        );
        rig.store.clear();
        assert!(b.acquire(&req).await.unwrap().admitted);
        let calls = rig.store.calls();
        assert!(!doubled(&calls), "{calls:?}");
        assert_eq!(b.known_shard_count("u1", "api"), 2);
        assert_eq!(item(&rig, "u1", "api", 0).await.shard_count, 2);
        assert_eq!(EngineStats::get(&b.stats().shard_doublings), 0);
    }
}

cross_store! {
    /// X05 a shard is never created with fewer shards than it was drawn under, even when the
    /// count cache forgets the bucket in between (a full cache partition is cleared).
    async fn x05_a_shard_drawn_under_four_is_created_for_four<S: BucketStore>(store: S) {
        let rig = rig(store);
        for shard in 0..3 {
            put_rpm_shard(&rig, shard, 4, 100, 25_000).await;
        }
        rig.engine.learn_shard_count("u1", "api", 4);
        rig.draw.push(3);
        let forget = rig.engine.view();
        rig.store.after_debit(Box::new(move |_| {
            Box::pin(async move {
                forget.forget_shard_counts();
            })
        }));
        assert!(acquire(&rig, &rpm(100, 1)).await.admitted);
        let s3 = item(&rig, "u1", "api", 3).await;
        assert_eq!(s3.shard_count, 4);
        assert_eq!(
            s3.limits["rpm"].balance,
            25_000 - 1_000,
            "a quarter, not the whole 100"
        );
    }
}

cross_store! {
    /// X06 shard 0 expired and was created again by a server that knew one shard while
    /// shards 1–3 still say four: it holds the whole capacity. A server that knows four
    /// shards repairs it on its first touch (the fast path refuses a shard whose count is
    /// behind the drawer's): split to four, keeping a quarter of what it held (the quarters
    /// meant for shards 1–3 are dropped: those exist); the first server then learns.
    async fn x06_a_shard_zero_recreated_with_one_shard_is_repaired<S: BucketStore>(store: S) {
        let rig = rig(store);
        for shard in 1..4 {
            put_rpm_shard(&rig, shard, 4, 100, 25_000).await;
        }
        // A server that knew no shards creates shard 0 for one.
        let stale = Engine::with_parts(
            rig.store.clone(),
            EngineOptions {
                rejection_cache_ms: 0,
                ..EngineOptions::default()
            },
            rig.clock.clone(),
            Arc::new(ScriptedDraw::default()),
        );
        assert!(stale.acquire(&rpm(100, 1)).await.unwrap().admitted);
        let s0 = item(&rig, "u1", "api", 0).await;
        assert_eq!((s0.shard_count, s0.limits["rpm"].balance), (1, 99_000));
        // A server that knows four draws shard 0.
        rig.engine.learn_shard_count("u1", "api", 4);
        rig.draw.push(0);
        rig.store.clear();
        assert!(acquire(&rig, &rpm(100, 1)).await.admitted);
        let s0 = item(&rig, "u1", "api", 0).await;
        assert_eq!(s0.shard_count, 4, "repaired: {:?}", rig.store.calls());
        assert_eq!(s0.limits["rpm"].balance, 99_000 / 4 - 1_000, "a quarter of what it held");
        // The stale server learns four from shard 0's refusal of its count.
        assert!(stale.acquire(&rpm(100, 1)).await.unwrap().admitted);
        assert_eq!(stale.known_shard_count("u1", "api"), 4);
    }
}

cross_store! {
    /// X07 a shard never created is created for the count shard 0 holds, not the stale one
    /// the drawing server knows: this server believes two shards while another doubled the
    /// bucket to four and created none of the new ones. Created for two, shard 1 would
    /// hold half the capacity (50 tokens) next to the quarters of the others: 25 tokens of
    /// over-admission that no later pass takes back.
    async fn x07_a_shard_created_under_a_stale_count_takes_shard_zeros<S: BucketStore>(store: S) {
        let rig = rig(store);
        put_rpm_shard(&rig, 0, 4, 100, 25_000).await;
        rig.engine.learn_shard_count("u1", "api", 2);
        rig.draw.push(1);
        assert!(acquire(&rig, &rpm(100, 1)).await.admitted);
        let s1 = item(&rig, "u1", "api", 1).await;
        assert_eq!(s1.shard_count, 4, "created for shard 0's count: {:?}", rig.store.calls());
        assert_eq!(
            s1.limits["rpm"].balance,
            25_000 - 1_000,
            "a quarter less the request, not half"
        );
        assert_eq!(rig.engine.known_shard_count("u1", "api"), 4);
    }
}

/// S29 a lost create race becomes a consumption-only debit of the winner's item; if the
/// winner's item cannot cover the request, the retry refuses and writes nothing.
async fn s29_case<S: BucketStore>(store: S, winner_tk: i64, admitted: bool) {
    let rig = rig(store);
    put_rpm_shard(&rig, 0, 2, 100, 50_000).await;
    rig.engine.learn_shard_count("u1", "api", 2);
    rig.draw.push(1);
    let winner: Hook<S> = Box::new(move |s| {
        Box::pin(async move {
            let mut it = rpm_item(2, 100, winner_tk, 1_000_000);
            it.ttl = None;
            common::put(&*s, BucketKey::new("u1", "api", 1), it).await;
        })
    });
    rig.store.before_commit(winner);
    let d = acquire(&rig, &rpm(100, 2)).await;
    assert_eq!(d.admitted, admitted, "winner held {winner_tk}");
    let calls = rig.store.calls();
    assert!(calls.contains(&Call::Commit {
        kinds: vec!["create"],
        committed: false
    }));
    assert!(calls.contains(&Call::Commit {
        kinds: vec!["debit"],
        committed: admitted
    }));
    let s1 = item(&rig, "u1", "api", 1).await;
    if admitted {
        assert_eq!(
            (s1.limits["rpm"].balance, s1.limits["rpm"].taken),
            (48_000, 2_000)
        );
    } else {
        assert_eq!(
            s1.limits["rpm"].balance, 1_000,
            "a refused retry writes nothing"
        );
    }
}

cross_store! {
    async fn s29_lost_create_race_debits_the_winners_item<S: BucketStore>(store: S) {
        s29_case(store, 50_000, true).await;
    }
}

cross_store! {
    async fn s29_lost_create_race_refuses_when_the_winner_is_short<S: BucketStore>(store: S) {
        s29_case(store, 1_000, false).await;
    }
}

cross_store! {
    /// A slow pass never moves an item's expiry earlier: another server's overdraft, taken
    /// by a consumption-only debit between the pass's read and its write, raised the `ttl`
    /// to cover its debt without moving `rf`, so the pass's lock still holds; its write of
    /// the `ttl` it planned from what it read would forget that debt's expiry.
    async fn a_slow_pass_never_lowers_an_expiry_an_overdraft_raised<S: BucketStore>(store: S) {
        let rig = rig(store);
        // Empty a minute ago: the refill that makes the request fit needs a slow pass.
        let mut it = rpm_item(1, 100, 0, 1_000_000);
        it.refilled_at = T0 - 60_000;
        rig.store.put(BucketKey::new("u1", "api", 0), it).await;
        let raised = T0 / 1_000 + 1_000_000;
        let overdraft: Hook<S> = Box::new(move |s| {
            Box::pin(async move {
                let w = Write::Debit {
                    key: BucketKey::new("u1", "api", 0),
                    debits: vec![shardgate::store::Debit {
                        limit: "rpm".into(),
                        amount: 1_000,
                        gated: false,
                        params: None,
                    }],
                    ttl: Some(raised),
                };
                assert_eq!(s.commit(&[w]).await.unwrap(), CommitOutcome::Committed);
            })
        });
        rig.store.before_commit(overdraft);
        acquire(&rig, &rpm(100, 1)).await;
        let ttl = item(&rig, "u1", "api", 0).await.ttl;
        assert!(ttl.is_some_and(|t| t >= raised), "expiry {ttl:?} moved before {raised}");
    }
}

cross_store! {
    /// S31 the shard count is learnt and never unlearnt.
    async fn s31_shard_count_never_shrinks<S: BucketStore>(store: S) {
        let rig = rig(store);
        put_rpm_shard(&rig, 0, 2, 100, 50_000).await;
        rig.engine.learn_shard_count("u1", "api", 4);
        rig.draw.push(0);
        assert!(acquire(&rig, &rpm(100, 1)).await.admitted);
        assert_eq!(rig.engine.known_shard_count("u1", "api"), 4);
    }
}

// ---------------------------------------------------------------- E. cascade

fn cascade(child_rate: u64, parent_rate: u64) -> Acquire {
    let mut child = bucket("key1", "api", vec![per_minute("rpm", child_rate, None, 1)]);
    child.cascades = true;
    Acquire {
        buckets: smallvec::smallvec![
            child,
            bucket("org", "api", vec![per_minute("rpm", parent_rate, None, 1)]),
        ],
    }
}

cross_store! {
    /// S32 cascade: one commit creates both; then parallel debits; the parent's exhaustion
    /// refunds the child and refuses.
    async fn s32_cascade_hot_path_and_parent_exhaustion<S: BucketStore>(store: S) {
        let rig = rig(store);
        let req = cascade(10, 3);
        assert!(acquire(&rig, &req).await.admitted);
        let calls = rig.store.calls();
        // Each debit created its bucket.
        assert_eq!(commits(&calls), 0, "{calls:?}");
        assert!(calls.iter().all(|c| matches!(c, Call::Debit { applied: true, .. })));
        for _ in 0..2 {
            rig.store.clear();
            assert!(acquire(&rig, &req).await.admitted);
            assert_eq!(rig.store.calls().len(), 2, "two debits, nothing else");
        }
        rig.store.clear();
        let d = acquire(&rig, &req).await;
        assert!(!d.admitted);
        let calls = rig.store.calls();
        assert_eq!(debits(&calls), 2);
        assert!(
            calls.contains(&Call::Credit { shard: 0 }),
            "child refunded: {calls:?}"
        );
        let (child, parent) = (d.buckets[0].limits[0], d.buckets[1].limits[0]);
        assert!(child.fits && !parent.fits);
        assert_eq!(parent.remaining, 0);
        assert_eq!(parent.wait_ms, Some(20_001));
        assert_eq!(item(&rig, "key1", "api", 0).await.limits["rpm"].balance, 7_000);
        assert_eq!(item(&rig, "org", "api", 0).await.limits["rpm"].balance, 0);
    }
}

cross_store! {
    /// S33 the parent alone takes the slow path; the child keeps its debit.
    async fn s33_parent_only_slow_path<S: BucketStore>(store: S) {
        let rig = rig(store);
        let req = cascade(10, 2);
        assert!(acquire(&rig, &req).await.admitted);
        assert!(acquire(&rig, &req).await.admitted);
        assert_eq!(item(&rig, "org", "api", 0).await.limits["rpm"].balance, 0);
        rig.clock.set(T0 + 30_000);
        rig.store.clear();
        assert!(acquire(&rig, &req).await.admitted);
        let calls = rig.store.calls();
        assert_eq!(debits(&calls), 2);
        assert!(calls.contains(&Call::Read { shards: vec![0] }));
        assert!(calls.contains(&Call::Commit {
            kinds: vec!["update"],
            committed: true
        }));
        let org = item(&rig, "org", "api", 0).await;
        assert_eq!((org.limits["rpm"].balance, org.refilled_at), (0, T0 + 30_000));
        assert_eq!(item(&rig, "key1", "api", 0).await.limits["rpm"].balance, 7_000);
    }
}

cross_store! {
    /// S34 our plans know the parent from config, so even a fresh process debits child and
    /// parent in one round (the reference's cold cache took two).
    async fn s34_fresh_process_debits_child_and_parent_together<S: BucketStore>(store: S) {
        let rig = rig(store);
        let req = cascade(10, 3);
        assert!(acquire(&rig, &req).await.admitted);
        let fresh = Engine::with_parts(
            rig.store.clone(),
            EngineOptions {
                rejection_cache_ms: 0,
                ..EngineOptions::default()
            },
            rig.clock.clone(),
            rig.draw.clone(),
        );
        rig.store.clear();
        assert!(fresh.acquire(&req).await.unwrap().admitted);
        let calls = rig.store.calls();
        assert_eq!(calls.len(), 2);
        assert!(calls
            .iter()
            .all(|c| matches!(c, Call::Debit { applied: true, .. })));
    }
}

cross_store! {
    /// S35 a cascading child never takes the child-only shard retry: slow path on another
    /// shard instead.
    async fn s35_cascading_child_takes_the_slow_path_not_a_retry<S: BucketStore>(store: S) {
        let rig = rig(store);
        // key1 has two shards of 10/min (5 each): shard 0 drained at T0, shard 1 full.
        for (s, tk) in [(0, 0), (1, 5_000)] {
            let mut it = rpm_item(2, 10, tk, 1_000_000);
            it.ttl = None;
            rig.store.put(BucketKey::new("key1", "api", s), it).await;
        }
        rig.engine.learn_shard_count("key1", "api", 2);
        // 12 s refill one token on a shard holding half of 10/min: a refill would help.
        rig.clock.set(T0 + 12_000);
        rig.draw.push(0);
        let d = acquire(&rig, &cascade(10, 100)).await;
        assert!(d.admitted);
        assert_eq!(EngineStats::get(&rig.engine.stats().shard_retries), 0);
        // The parent has no item yet: the child (on the untried shard 1) is read, the
        // parent not (its fast debit found it absent; the reference read both), and both
        // are committed in one transaction, as in the reference; here the parent's
        // debit created it, so the commit is the child's alone.
        let calls = rig.store.calls();
        assert!(calls.contains(&Call::Read { shards: vec![1] }), "{calls:?}");
        assert!(!calls.contains(&Call::Read { shards: vec![1, 0] }), "{calls:?}");
        assert!(calls.contains(&Call::Commit {
            kinds: vec!["update"],
            committed: true
        }), "{calls:?}");
        assert_eq!(d.buckets[0].shard, 1);
        assert!(item(&rig, "key1", "api", 1).await.limits["rpm"].taken > 0);
        assert_eq!(item(&rig, "org", "api", 0).await.limits["rpm"].taken, 1_000);
    }
}

// ------------------------------------------------------- ours, beyond the reference

/// Returns once `done` holds, or after 10 s (the test's assertions then fail).
async fn until(done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !done() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

cross_store! {
    /// A request on a shard whose refill another request of this process is running waits
    /// for it and then takes the fast path: no refused debit, no read, no commit and no lost
    /// `rf` race of its own.
    async fn x01_a_slow_pass_in_flight_is_followed_not_raced<S: BucketStore>(store: S) {
        let rig = exhausted_a_minute_ago(store).await;
        let release = Arc::new(tokio::sync::Notify::new());
        let held = release.clone();
        rig.store.before_commit(Box::new(move |_| {
            Box::pin(async move { held.notified().await })
        }));
        let followers = || EngineStats::get(&rig.engine.stats().slow_passes_followed);
        let req = rpm(10, 1);
        let (first, second, ()) = tokio::join!(
            acquire(&rig, &req),
            async {
                // Starts once the first request is in its pass (it has read the item).
                until(|| reads(&rig.store.calls()) >= 1).await;
                acquire(&rig, &req).await
            },
            async {
                // The first request holds its commit; release it once the second waits for it.
                until(|| followers() >= 1).await;
                release.notify_one();
            }
        );
        assert!(first.admitted && second.admitted);
        // One pass for both, and the second request sent nothing until it ended.
        one_pass_followed(&rig, 2).await;
    }
}

/// Ten of ten tokens taken, then the clock a minute on: the next request's fast debit is
/// refused and a refill (one slow pass) admits it. The store's calls are cleared.
async fn exhausted_a_minute_ago<S: BucketStore>(store: S) -> Rig<S> {
    let rig = rig(store);
    for _ in 0..10 {
        assert!(acquire(&rig, &rpm(10, 1)).await.admitted);
    }
    rig.clock.set(T0 + 60_000);
    rig.store.clear();
    rig
}

/// Both requests of x01/x03 admitted through one slow pass that one of them followed:
/// one read, one commit, `debits_sent` debits, the last an applied fast debit, two tokens
/// taken from the refilled ten.
async fn one_pass_followed<S: BucketStore>(rig: &Rig<S>, debits_sent: usize) {
    let calls = rig.store.calls();
    assert_eq!(
        (reads(&calls), commits(&calls), debits(&calls)),
        (1, 1, debits_sent),
        "{calls:?}"
    );
    assert_eq!(
        calls.last(),
        Some(&Call::Debit {
            shard: 0,
            retry_only: false,
            applied: true,
            missing: false
        })
    );
    assert_eq!(
        EngineStats::get(&rig.engine.stats().slow_passes_followed),
        1
    );
    assert_eq!(tk(rig, 0, "rpm").await, 8_000);
}

cross_store! {
    /// A request whose fast debit was refused *before* another request of this process began
    /// refilling that shard finds the pass in flight only afterwards: it waits for the pass
    /// and debits again by the fast path, rather than reading and racing the same `rf` lock.
    async fn x03_a_refused_request_follows_a_pass_begun_since<S: BucketStore>(store: S) {
        let rig = exhausted_a_minute_ago(store).await;
        let followers = || EngineStats::get(&rig.engine.stats().slow_passes_followed);
        // The first request's refused debit is held until the second has begun its pass.
        let pass_begun = Arc::new(tokio::sync::Notify::new());
        let begun = pass_begun.clone();
        rig.store.after_debit(Box::new(move |_| {
            Box::pin(async move { begun.notified().await })
        }));
        // The second request's commit is held until the first waits for its pass.
        let release = Arc::new(tokio::sync::Notify::new());
        let held = release.clone();
        rig.store.before_commit(Box::new(move |_| {
            Box::pin(async move { held.notified().await })
        }));
        let req = rpm(10, 1);
        let (first, second, ()) = tokio::join!(
            acquire(&rig, &req),
            async {
                until(|| debits(&rig.store.calls()) >= 1).await;
                acquire(&rig, &req).await
            },
            async {
                until(|| reads(&rig.store.calls()) >= 1).await;
                pass_begun.notify_one();
                until(|| followers() >= 1).await;
                release.notify_one();
            }
        );
        assert!(first.admitted && second.admitted);
        // Two refused debits, one pass (the second request's), then the first request's
        // fast debit again.
        one_pass_followed(&rig, 3).await;
    }
}

cross_store! {
    /// A config rollout that changes a limit's parameters: the first new-config request
    /// rewrites the limit by the slow path, while a server still on the old parameters
    /// debits it by the fast path between that read and that commit. The rewrite must not
    /// overwrite that debit: it fails, and the request is taken from the item as it stands.
    async fn x02_a_parameter_rewrite_never_overwrites_a_concurrent_debit<S: BucketStore>(store: S) {
        let rig = rig(store);
        assert!(acquire(&rig, &rpm(10, 1)).await.admitted);
        let old = LimitParams::new(10, 10, 60_000);
        rig.store.before_commit(Box::new(move |inner| {
            Box::pin(async move {
                let debit = shardgate::store::Debit {
                    limit: "rpm".into(),
                    amount: 1_000,
                    gated: true,
                    params: Some(old),
                };
                let out = inner
                    .debit(
                        &BucketKey::new("u1", "api", 0),
                        &[debit],
                        shardgate::store::DebitMode::Fast {
                            now_s: T0 / 1_000,
                            shard_count: 1,
                        },
                    )
                    .await
                    .unwrap();
                assert!(matches!(out, shardgate::store::DebitOutcome::Applied(_)));
            })
        }));
        rig.store.clear();
        assert!(acquire(&rig, &rpm(20, 1)).await.admitted);
        let calls = rig.store.calls();
        let commits: Vec<_> = calls
            .iter()
            .filter(|c| matches!(c, Call::Commit { .. }))
            .collect();
        assert_eq!(
            commits,
            [
                &Call::Commit {
                    kinds: vec!["update"],
                    committed: false
                },
                &Call::Commit {
                    kinds: vec!["debit"],
                    committed: true
                }
            ],
            "{calls:?}"
        );
        let it = item(&rig, "u1", "api", 0).await;
        assert_eq!(it.limits["rpm"].taken, 3_000, "three debits, none overwritten");
        assert_eq!(it.limits["rpm"].balance, 7_000);
        // The next request rewrites the parameters, keeping every debit.
        assert!(acquire(&rig, &rpm(20, 1)).await.admitted);
        let it = item(&rig, "u1", "api", 0).await;
        assert_eq!(it.limits["rpm"].params(), LimitParams::new(20, 20, 60_000));
        assert_eq!((it.limits["rpm"].balance, it.limits["rpm"].taken), (6_000, 4_000));
    }
}

cross_store! {
    /// X07 a request that waits for another's slow pass decides at the time the pass ended,
    /// not the time it arrived: here the clock moves 30 s during the wait, so the bucket has
    /// refilled to full by the time the follower's debit lands (the reference engine reads the
    /// clock once per request).
    async fn x07_a_follower_decides_at_the_time_it_stopped_waiting<S: BucketStore>(store: S) {
        let rig = exhausted_a_minute_ago(store).await;
        // The first request's commit (its pass planned at T0 + 60 s) is held; the clock moves
        // only once it is.
        let release = Arc::new(tokio::sync::Notify::new());
        let committing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (held, flag) = (release.clone(), committing.clone());
        rig.store.before_commit(Box::new(move |_| {
            Box::pin(async move {
                flag.store(true, std::sync::atomic::Ordering::SeqCst);
                held.notified().await
            })
        }));
        let followers = || EngineStats::get(&rig.engine.stats().slow_passes_followed);
        let req = rpm(10, 1);
        let (first, second, ()) = tokio::join!(
            acquire(&rig, &req),
            async {
                until(|| reads(&rig.store.calls()) >= 1).await;
                acquire(&rig, &req).await
            },
            async {
                until(|| followers() >= 1 && committing.load(std::sync::atomic::Ordering::SeqCst))
                    .await;
                rig.clock.advance(30_000);
                release.notify_one();
            }
        );
        assert!(first.admitted && second.admitted);
        // Stored: 8 tokens as of the pass (T0 + 60 s); 30 s later the bucket is full again.
        assert_eq!(tk(&rig, 0, "rpm").await, 8_000);
        assert_eq!(
            second.buckets[0].limits[0].remaining,
            10_000,
            "{second:?} {:?}",
            rig.store.calls()
        );
    }
}

cross_store! {
    /// X08 a refund that lands after another request's slow pass refilled the shard must not
    /// credit what that refill already gave back. The shard is full at 10 (its baseline a
    /// minute old); X takes 5 by the fast path; Y needs 6, refills (the clamp had removed the
    /// minute's refill, which now covers X's 5 again) and takes 6; X's sibling refuses and X
    /// is refunded. Credited on top, the shard would hold 9 after 6 served (15 from a bucket
    /// of 10); left alone, it holds 4.
    async fn x08_a_refund_after_a_refill_is_not_credited<S: BucketStore>(store: S) {
        let rig = rig(store);
        let mut a = rpm_item(1, 10, 10_000, 1_000_000);
        a.refilled_at = T0 - 60_000;
        rig.store.put(BucketKey::new("u1", "api", 0), a).await;
        // The sibling: a bucket with nothing left, refused from its image.
        rig.store
            .put(
                BucketKey::new("sib", "api", 0),
                rpm_item(1, 10, 0, 1_000_000),
            )
            .await;
        let y_engine = Engine::with_parts(
            rig.store.inner.clone(),
            EngineOptions {
                rejection_cache_ms: 0,
                ..EngineOptions::default()
            },
            rig.clock.clone(),
            Arc::new(ScriptedDraw::default()),
        );
        let y_engine = Arc::new(y_engine);
        let y = y_engine.clone();
        let y_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let y_flag = y_done.clone();
        // After X's first debit (on u1, applied) and before X learns its sibling refused.
        rig.store.after_debit(Box::new(move |_| {
            Box::pin(async move {
                let d = y.acquire(&rpm(10, 6)).await.unwrap();
                assert!(d.admitted, "Y refills and takes 6");
                y_flag.store(true, std::sync::atomic::Ordering::SeqCst);
            })
        }));
        let x = Acquire {
            buckets: smallvec::smallvec![
                bucket("u1", "api", vec![per_minute("rpm", 10, None, 5)]),
                bucket("sib", "api", vec![per_minute("rpm", 10, None, 1)]),
            ],
        };
        let d = acquire(&rig, &x).await;
        assert!(!d.admitted);
        assert!(y_done.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(
            tk(&rig, 0, "rpm").await,
            4_000,
            "6 served from a full 10 leave 4"
        );
    }
}

cross_store! {
    /// X09 check-only requests (0 hits) that find a shard's `wcu` spent must not spread the
    /// bucket until an ordinary request no longer fits one shard: the guard judges the claim
    /// the bucket usually carries — at least one token, and the average a write has taken on
    /// the hot shard.
    async fn x09_check_only_requests_do_not_double_past_an_ordinary_request<S: BucketStore>(store: S) {
        // 20/min over 16 shards: 1.25 tokens each; 32 would leave 0.625.
        let rig = rig(store);
        sixteen_shards_hot_on_zero(&rig, "u1", 20, |_| {}).await;
        let d = acquire(&rig, &rpm(20, 0)).await;
        assert!(d.admitted, "{d:?}");
        assert!(!doubled(&rig.store.calls()), "{:?}", rig.store.calls());
        assert_eq!(
            EngineStats::get(&rig.engine.stats().shard_doublings_declined_small_share),
            1
        );
        // 100/min over 16 shards (6.25 tokens each), where each write took 5 tokens on
        // average: 1-token requests would spread it to 32 (3.125 each), and the usual
        // 5-token request could never be admitted again.
        let rig = rig_again(&rig);
        sixteen_shards_hot_on_zero(&rig, "u2", 100, |it| {
            let w = it.limits.get_mut(WCU_LIMIT).unwrap();
            w.taken = 1_000_000; // a thousand writes...
            it.limits.get_mut("rpm").unwrap().taken = 5_000_000; // ...of 5 tokens each
        })
        .await;
        let req = one(bucket("u2", "api", vec![per_minute("rpm", 100, None, 1)]));
        assert!(acquire(&rig, &req).await.admitted);
        assert_eq!(
            EngineStats::get(&rig.engine.stats().shard_doublings_declined_small_share),
            1
        );
        assert_eq!(rig.engine.known_shard_count("u2", "api"), 16);
    }
}

/// Hammers `entity/api` with `req` (frozen clock, so a shard's `wcu` never refills and
/// every exhaustion asks for a doubling) `n` times; returns shard 0's count after.
async fn hammer<S: BucketStore>(rig: &Rig<S>, entity: &str, reqs: &[Acquire], n: usize) -> u32 {
    for i in 0..n {
        rig.engine
            .acquire(&reqs[i % reqs.len()])
            .await
            .expect("store never fails here");
    }
    item(rig, entity, "api", 0).await.shard_count
}

cross_store! {
    /// X11 check-only and one-token traffic that keeps a 100-token bucket hot spreads it
    /// only while each shard's share holds four usual claims (`MIN_CLAIMS_PER_SHARD`): 16
    /// shards hold 6.25 tokens each, 32 would hold 3.125. And a limit the shard holds that
    /// the requests do not name (another rule's 100 per hour) guards the doubling as much
    /// as a named one: requests naming only a vast per-minute limit must not spread it.
    async fn x11_light_traffic_doubles_to_four_claims_a_shard<S: BucketStore>(store: S) {
        let options = EngineOptions {
            partition_write_budget: 4,
            rejection_cache_ms: 0,
            ..EngineOptions::default()
        };
        let rig = rig_with(store, options);
        let check = one(bucket("u1", "api", vec![per_minute("rpm", 100, None, 0)]));
        let take = one(bucket("u1", "api", vec![per_minute("rpm", 100, None, 1)]));
        let reqs = [check.clone(), check.clone(), check, take];
        let count = hammer(&rig, "u1", &reqs, 400).await;
        assert!(EngineStats::get(&rig.engine.stats().shard_doublings) >= 1, "it was hot");
        assert_eq!(count, 16, "at most 16 shards of 6.25 tokens, never 32 of 3.125");
        assert!(!exists(&rig, "u1", 16).await, "no shard beyond the 16");

        // u2 holds a vast per-minute limit the requests name and 100/hour they do not.
        let doublings = EngineStats::get(&rig.engine.stats().shard_doublings);
        let both = one(bucket(
            "u2",
            "api",
            vec![
                per_minute("rpm", 1_000_000, None, 1),
                LimitClaim {
                    limit: "rph".into(),
                    params: LimitParams::new(100, 100, 3_600_000),
                    amount: 1_000,
                    forced: false,
                },
            ],
        ));
        assert!(acquire(&rig, &both).await.admitted, "creates both limits");
        let check = one(bucket("u2", "api", vec![per_minute("rpm", 1_000_000, None, 0)]));
        let count = hammer(&rig, "u2", &[check], 400).await;
        assert!(EngineStats::get(&rig.engine.stats().shard_doublings) > doublings, "it was hot");
        assert_eq!(count, 16, "the unnamed 100/hour keeps four claims a shard");
    }
}

/// A fresh rig on the same store (a second server, or a clean slate for another case).
fn rig_again<S: BucketStore>(rig: &Rig<S>) -> Rig<S> {
    let store = rig.store.clone();
    let clock = rig.clock.clone();
    let draw = Arc::new(ScriptedDraw::default());
    let engine = Engine::with_parts(
        store.clone(),
        EngineOptions {
            rejection_cache_ms: 0,
            ..EngineOptions::default()
        },
        clock.clone(),
        draw.clone(),
    );
    Rig {
        engine,
        store,
        clock,
        draw,
    }
}

cross_store! {
    /// X10 an overdraft that would take a balance past the lowest one a store holds is
    /// refused and writes nothing, whatever the store; one that reaches it exactly is
    /// recorded, and the balance reads back exactly (DynamoDB's numbers would hold more
    /// digits than an `i64` decodes, so the bound keeps both stores alike).
    async fn x10_debt_stops_at_the_lowest_balance_on_every_store<S: BucketStore>(store: S) {
        use shardgate::store::MIN_BALANCE;
        let rig = rig(store);
        let near = MIN_BALANCE + 5_000;
        rig.store
            .put(
                BucketKey::new("u1", "api", 0),
                rpm_item(1, 10, near, 1_000_000),
            )
            .await;
        let overdraft = |tokens: i64| {
            let mut c = per_minute("rpm", 10, None, tokens);
            c.forced = true;
            one(bucket("u1", "api", vec![c]))
        };
        let d = acquire(&rig, &overdraft(6)).await;
        assert!(!d.admitted, "6 tokens would pass the lowest balance: {d:?}");
        assert_eq!(tk(&rig, 0, "rpm").await, near, "nothing written");
        let d = acquire(&rig, &overdraft(5)).await;
        assert!(!d.buckets[0].limits[0].fits, "reported over, being in debt");
        assert_eq!(tk(&rig, 0, "rpm").await, MIN_BALANCE, "recorded, exactly");
    }
}

cross_store! {
    /// Ours, not the reference's: a key at its limit under a fast refill (2000 tokens/s,
    /// burst 2000). For `REFILL_HOLD_MS` (5 ms) after the pass that last refilled it, a
    /// refused request makes no store call for the refill accrued since (before, each
    /// such request took a slow pass: a read and a commit racing the next request's);
    /// after the hold that refill is admitted whole: nothing lost, nothing early.
    async fn a_limited_key_holds_back_its_last_milliseconds_of_refill<S: BucketStore>(store: S) {
        let rig = rig_with(store, EngineOptions::default());
        let per_second = |amount: i64| {
            one(bucket(
                "u1",
                "api",
                vec![LimitClaim {
                    limit: "rps".into(),
                    params: LimitParams::new(2_000, 2_000, 1_000),
                    amount: amount * 1_000,
                    forced: false,
                }],
            ))
        };
        // Drained in one request: the bucket's refill baseline is T0.
        assert!(acquire(&rig, &per_second(2_000)).await.admitted);
        rig.store.clear();
        // 2 ms on, 4 tokens have accrued: held back, refused with no read and no commit.
        rig.clock.set(T0 + 2);
        let d = acquire(&rig, &per_second(1)).await;
        assert!(!d.admitted);
        assert_eq!(d.buckets[0].limits[0].wait_ms, Some(3), "until the hold ends");
        let calls = rig.store.calls();
        assert!(
            !calls.iter().any(|c| matches!(c, Call::Read { .. } | Call::Commit { .. })),
            "{calls:?}"
        );
        // At the hold's end the 10 tokens of its 5 ms are there, all of them.
        rig.clock.set(T0 + 5);
        assert!(acquire(&rig, &per_second(10)).await.admitted);
        assert_eq!(tk(&rig, 0, "rps").await, 0);
        // And the next refill is held again.
        rig.clock.set(T0 + 6);
        assert!(!acquire(&rig, &per_second(1)).await.admitted);
    }
}

/// A refused bucket's refill seen by many requests in flight at once: the cached image
/// lets as many through to the store as the refill holds tokens, each taking its share
/// from the image, and refuses the rest without a store call. (Each trusting the same
/// projected refill, all twenty went to the store.)
#[tokio::test]
async fn a_refill_lets_through_to_the_store_only_the_requests_it_can_hold() {
    let (held, release) = common::held::Held::new();
    let store = Arc::new(held);
    release.send(true).unwrap();
    let clock = Arc::new(ManualClock::new(T0));
    let engine = Engine::with_parts(
        store.clone(),
        EngineOptions::default(),
        clock.clone(),
        Arc::new(ScriptedDraw::default()),
    );
    let req = rpm(10, 1);
    for _ in 0..10 {
        assert!(engine.acquire(&req).await.unwrap().admitted);
    }
    assert!(!engine.acquire(&req).await.unwrap().admitted);
    // 10 a minute: three tokens in 18 s.
    clock.advance(18_000);
    let before = store.calls.load(std::sync::atomic::Ordering::SeqCst);
    release.send(false).unwrap();
    let all = futures::future::join_all((0..20).map(|_| engine.acquire(&req)));
    tokio::pin!(all);
    // Every request runs until it waits on the store or is answered.
    assert!(futures::poll!(&mut all).is_pending());
    let sent = store.calls.load(std::sync::atomic::Ordering::SeqCst) - before;
    release.send(true).unwrap();
    let decisions = all.await;
    let admitted = decisions
        .iter()
        .filter(|d| d.as_ref().unwrap().admitted)
        .count();
    assert!(
        (1..=3).contains(&admitted),
        "{admitted} admitted on three tokens"
    );
    assert_eq!(sent, 3, "store calls made while the first were in flight");
}

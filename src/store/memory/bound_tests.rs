//! The bound's eviction order, on one partition (whose items a test chooses) and through
//! the store's calls: full items first, then the least recently used, never an item used
//! more recently than one still held that is older or full.

use std::sync::Arc;

use futures::executor::block_on;
use smallvec::smallvec;

use super::partition::Partition;
use super::slot::{Balance, CompactItem, Shape};
use super::*;
use crate::store::{LimitParams, LimitState, WCU_LIMIT};

/// 100 a day, the rule of the issue: one token back every 864 s.
fn day() -> LimitParams {
    LimitParams {
        capacity: 100_000,
        refill_amount: 100_000,
        refill_period_ms: 86_400_000,
    }
}

/// The memory store's default `wcu`: refilled within the second.
fn wcu() -> LimitParams {
    LimitParams {
        capacity: 1_000_000_000_000_000,
        refill_amount: 1_000_000_000_000_000,
        refill_period_ms: 1_000,
    }
}

const T0_S: i64 = 1_800_000_000;

/// A slot of the day rule holding `tk`, refilled last at `rf_s`, last used at
/// `touched_s`, of a bucket of `shard_count` shards.
fn slot(tk: i64, rf_s: i64, touched_s: i64, shard_count: u16) -> CompactItem {
    CompactItem {
        refilled_at: rf_s * 1_000,
        ttl: NO_TTL,
        shard_count,
        raised_age_min: super::slot::NEVER_RAISED,
        touched: bound::mark_of(touched_s),
        shape: Arc::new(Shape(
            vec![("rps".into(), day()), (WCU_LIMIT.into(), wcu())].into_boxed_slice(),
        )),
        balances: smallvec![
            Balance {
                balance: tk,
                taken: 0
            },
            Balance {
                balance: wcu().capacity,
                taken: 0
            }
        ],
    }
}

/// A slot in use: emptied when last used, a day from full.
fn in_use(touched_s: i64) -> CompactItem {
    slot(0, touched_s, touched_s, 1)
}

fn key(i: usize) -> BucketKey {
    BucketKey::new(format!("ip={i}"), "r", 0)
}

/// A partition with room for exactly `items` slots like these.
fn partition_of(items: usize) -> Partition {
    let mut probe = Partition::new(usize::MAX);
    probe.insert(&key(0), in_use(T0_S), T0_S);
    Partition::new(probe.charged() * items)
}

#[test]
fn a_full_item_goes_before_any_item_in_use_however_recently_used() {
    let mut p = partition_of(4);
    let now = T0_S + 10_000;
    // Keys 0-2 unused for 10,000 s but in use; key 3 used a second ago, refilled since.
    for i in 0..3 {
        p.insert(&key(i), in_use(T0_S), T0_S);
    }
    p.insert(&key(3), slot(99_000, T0_S, now - 1, 1), T0_S);
    let evicted = p.insert(&key(4), in_use(now), now);
    assert_eq!(evicted, Evicted { full: 1, active: 0 });
    assert!(p.get(&key(3)).is_none(), "the full item went");
    assert!((0..3).all(|i| p.get(&key(i)).is_some()));
    assert!(p.charged() <= p.budget());
}

#[test]
fn then_the_least_recently_used_goes_one_at_a_time() {
    let mut p = partition_of(4);
    let now = T0_S + 100;
    for (i, touched) in [(0, T0_S + 30), (1, T0_S), (2, T0_S + 90), (3, T0_S + 60)] {
        p.insert(&key(i), in_use(touched), touched);
    }
    let mut gone = Vec::new();
    for new in 10..13 {
        let evicted = p.insert(&key(new), in_use(now), now);
        assert_eq!(evicted, Evicted { full: 0, active: 1 });
        let now_gone: Vec<usize> = (0..4)
            .filter(|&i| p.get(&key(i)).is_none() && !gone.contains(&i))
            .collect();
        gone.extend(now_gone);
    }
    assert_eq!(gone, [1, 0, 3], "oldest first");
    assert!(p.get(&key(2)).is_some());
    assert_eq!(p.len(), 4);
}

#[test]
fn a_partly_refilled_limit_or_an_empty_wcu_keeps_an_item_in_use() {
    let now_s = T0_S + 500;
    let moment = bound::Moment { now_s };
    // 500 s refill half a token of the one taken: not full.
    assert_eq!(
        moment.class(0, &slot(99_000, T0_S, T0_S, 1)),
        bound::Class::Active
    );
    // 864 s and more: full.
    let refilled = slot(99_000, T0_S - 400, T0_S, 1);
    assert_eq!(moment.class(0, &refilled), bound::Class::Full);
    // The limit full, `wcu` drained at this very second: in use.
    let mut hot = refilled.clone();
    hot.balances[1].balance = 0;
    hot.refilled_at = now_s * 1_000;
    hot.balances[0].balance = day().capacity;
    assert_eq!(moment.class(0, &hot), bound::Class::Active);
    assert_eq!(
        bound::Moment { now_s: now_s + 1 }.class(0, &hot),
        bound::Class::Full
    );
    // Debt repays at the rate: 10 tokens owed are a day and more from full.
    assert_eq!(
        moment.class(0, &slot(-10_000, T0_S, T0_S, 1)),
        bound::Class::Active
    );
}

#[test]
fn a_limit_that_never_refills_is_full_only_at_its_ceiling_and_shard_zero_of_several_never() {
    let moment = bound::Moment {
        now_s: T0_S + 1_000_000,
    };
    let mut spent = slot(2_000, T0_S, T0_S, 1);
    spent.shape = Arc::new(Shape(
        vec![
            (
                "lifetime".into(),
                LimitParams {
                    capacity: 3_000,
                    refill_amount: 0,
                    refill_period_ms: 1_000,
                },
            ),
            (WCU_LIMIT.into(), wcu()),
        ]
        .into_boxed_slice(),
    ));
    assert_eq!(moment.class(1, &spent), bound::Class::Active);
    spent.balances[0].balance = 3_000;
    assert_eq!(moment.class(1, &spent), bound::Class::Full);
    // Shard 0 carries the bucket's count: dropped, it could come back holding it all.
    let sharded = slot(50_000, T0_S, T0_S, 4);
    assert_eq!(moment.class(1, &sharded), bound::Class::Full);
    assert_eq!(moment.class(0, &sharded), bound::Class::Active);
}

#[test]
fn an_expired_item_is_full() {
    let mut s = in_use(T0_S);
    s.ttl = T0_S + 5;
    assert_eq!(
        bound::Moment { now_s: T0_S + 4 }.class(0, &s),
        bound::Class::Active
    );
    assert_eq!(
        bound::Moment { now_s: T0_S + 5 }.class(0, &s),
        bound::Class::Full
    );
}

#[test]
fn a_pass_frees_a_thirty_second_of_the_budget_at_least() {
    let mut p = partition_of(320);
    for i in 0..320 {
        p.insert(&key(i), in_use(T0_S + i as i64), T0_S + i as i64);
    }
    assert_eq!(p.len(), 320);
    let evicted = p.insert(&key(1_000), in_use(T0_S + 400), T0_S + 400);
    assert_eq!(evicted.active, 10, "320 / 32");
    // Ages 384-400 s share an age bucket (a quarter of a power of two): ten of them go.
    let oldest = (0..17).filter(|&i| p.get(&key(i)).is_none()).count();
    assert_eq!(oldest, 10);
    assert!((17..320).all(|i| p.get(&key(i)).is_some()));
}

#[test]
fn charges_follow_replacements_and_expiry_and_never_pass_the_budget() {
    let mut p = partition_of(50);
    for i in 0..500 {
        p.insert(&key(i), in_use(T0_S + i as i64), T0_S + i as i64);
        assert!(p.charged() <= p.budget(), "after {i}");
    }
    let before = p.charged();
    p.insert(&key(499), in_use(T0_S + 600), T0_S + 600);
    assert_eq!(p.charged(), before, "a replacement is charged once");
    let long = BucketKey::new("x".repeat(1_000), "r", 0);
    p.insert(&long, in_use(T0_S + 600), T0_S + 600);
    assert!(p.charged() <= p.budget());
    assert!(p.len() < 50, "a long entity is charged its bytes");
    let mut expiring = in_use(T0_S);
    expiring.ttl = T0_S + 700;
    p.insert(&key(600), expiring, T0_S + 600);
    let held = p.charged();
    assert_eq!(p.evict_expired(T0_S + 700), 1);
    assert!(p.charged() < held);
}

/// A partition at its bound evicts about as fast as it inserts: its table keeps the size
/// its items needed (hashbrown would double a table whose spare slots are all tombstones).
#[test]
fn a_partition_churning_at_its_bound_keeps_its_table_at_its_size() {
    let mut p = partition_of(1_500);
    for i in 0..1_500 {
        p.insert(&key(i), in_use(T0_S), T0_S);
    }
    let sized = p.table_bytes();
    for i in 1_500..100_000 {
        let now = T0_S + i as i64 / 50;
        p.insert(&key(i), in_use(now), now);
        assert!(
            p.table_bytes() <= sized,
            "grew at {i}: {} > {sized}",
            p.table_bytes()
        );
    }
    assert!(p.len() > 1_400, "{}", p.len());
}

/// Through the store: a debit refused for want of tokens marks the bucket used as much as
/// one admitted, so neither is evicted while older items remain.
///
/// Keys fall on the 64 partitions by a hash seeded per process, so each partition's
/// count varies from run to run; at the smallest bound (~67 items a partition) one
/// partition in a few runs overflowed while being filled and evicted a bucket the test
/// then used. At 16 times the bound (~1,070 a partition) the counts stay within a few
/// percent of their mean.
#[test]
fn a_debited_or_refused_bucket_outlives_older_ones_in_the_store() {
    const SCALE: usize = 16;
    let store = MemoryStore::with_max_bytes(MIN_MAX_BYTES * SCALE as u64).unwrap();
    let debit = |k: &BucketKey, now_s: i64| {
        block_on(store.debit(
            k,
            &[Debit {
                limit: "rps".into(),
                amount: 1_000,
                gated: true,
                params: None,
            }],
            DebitMode::Fast {
                now_s,
                shard_count: 1,
            },
        ))
        .unwrap()
    };
    let item = |tk: i64, now_s: i64| BucketItem {
        refilled_at: now_s * 1_000,
        shard_count: 1,
        count_raised_at: 0,
        ttl: Some(now_s + 7 * 86_400),
        limits: [
            ("rps", LimitState::new(day(), tk, 0)),
            (WCU_LIMIT, LimitState::new(wcu(), wcu().capacity, 0)),
        ]
        .into_iter()
        .collect(),
    };
    store.evict_expired(T0_S);
    // 3,000 × SCALE buckets (about 70 % of what the bound holds), one token taken each.
    for i in 0..3_000 * SCALE {
        store.put(key(i), item(99_000, T0_S));
    }
    // A second later: a tenth of them used, half debited, half refused (empty).
    let kept: Vec<usize> = (0..3_000 * SCALE).step_by(10).collect();
    for (n, &i) in kept.iter().enumerate() {
        if n % 2 == 1 {
            store.put(key(i), item(0, T0_S));
        }
    }
    let mut refused = 0;
    for &i in &kept {
        refused += usize::from(matches!(
            debit(&key(i), T0_S + 1),
            DebitOutcome::Refused(Some(_))
        ));
    }
    assert_eq!(refused, 150 * SCALE);
    // Two seconds later, 2,000 × SCALE new buckets: about a quarter of the old ones must go.
    store.evict_expired(T0_S + 2);
    for i in 100_000..100_000 + 2_000 * SCALE {
        store.put(key(i), item(99_000, T0_S + 2));
    }
    let stats = store.stats();
    assert!(stats.evicted_active >= 300 * SCALE as u64, "{stats:?}");
    assert!(stats.bytes <= stats.max_bytes);
    let lost: Vec<usize> = kept
        .iter()
        .copied()
        .filter(|&i| store.get(&key(i)).is_none())
        .collect();
    assert!(lost.is_empty(), "used buckets evicted: {lost:?}");
}

//! The store contract, as one list of cases run against every store: the memory store,
//! DynamoDB (Local) and Redis (one server and a Cluster) must provably behave the same. A
//! store passes only if it evaluates exactly the conditions `src/store/contract.rs` and
//! the types it passes (`write.rs`, `credit.rs`) document.

#[macro_use]
mod common;

use shardgate::engine::LimitParams;
use shardgate::store::key::{MAX_ITEM_BYTES, MAX_PARTITION_KEY_BYTES};
use shardgate::store::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, CountChange, Credit, Debit, DebitMode,
    DebitOutcome, LimitState, LimitWrite, Limits, Stamp, StoreError, Write, MIN_BALANCE, WCU_LIMIT,
};

const NOW_S: i64 = 1_800_000_000;

fn rpm() -> LimitParams {
    LimitParams::new(10, 10, 60_000)
}

fn wcu() -> LimitParams {
    LimitParams::new(1_000, 1_000, 1_000)
}

fn key(shard: u32) -> BucketKey {
    BucketKey::new("tenant=acme", "api", shard)
}

fn item(tk: i64, wcu_tk: i64) -> BucketItem {
    let mut limits = Limits::new();
    limits.insert("rpm", LimitState::new(rpm(), tk, 0));
    limits.insert(WCU_LIMIT, LimitState::new(wcu(), wcu_tk, 0));
    BucketItem {
        refilled_at: NOW_S * 1_000,
        shard_count: 1,
        count_raised_at: 0,
        ttl: Some(NOW_S + 420),
        limits,
    }
}

fn debit(amount: i64) -> Vec<Debit> {
    vec![Debit {
        limit: "rpm".into(),
        amount,
        gated: true,
        params: Some(rpm()),
    }]
}

const FAST: DebitMode = DebitMode::Fast {
    now_s: NOW_S,
    shard_count: 1,
};

/// The `rf` every item of [`item`] is created with.
const RF: i64 = NOW_S * 1_000;

/// The stamp of every item of [`item`].
const STAMP: Stamp = Stamp {
    refilled_at: RF,
    shard_count: 1,
};

async fn create<S: BucketStore>(s: &S, k: BucketKey, it: BucketItem) {
    let out = s
        .commit(&[Write::Create { key: k, item: it }])
        .await
        .unwrap();
    assert!(matches!(out, CommitOutcome::Committed));
}

cross_store! {
    async fn fast_debit_applies_and_takes_one_wcu<S: BucketStore>(s: S) {
        create(&s, key(0), item(5_000, 1_000_000)).await;
        let DebitOutcome::Applied(after) = s.debit(&key(0), &debit(1_000), FAST).await.unwrap() else {
            panic!("should apply");
        };
        assert_eq!(after.limits["rpm"].balance, 4_000);
        assert_eq!(after.limits["rpm"].taken, 1_000);
        assert_eq!(after.limits[WCU_LIMIT].balance, 999_000);
        assert_eq!(after.limits[WCU_LIMIT].taken, 1_000);
    }
}

cross_store! {
    async fn fast_debit_refuses_missing_item<S: BucketStore>(s: S) {
        assert_eq!(
            s.debit(&key(0), &debit(1_000), FAST).await.unwrap(),
            DebitOutcome::Refused(None)
        );
    }
}

cross_store! {
    async fn fast_debit_refuses_short_balance_with_old_image<S: BucketStore>(s: S) {
        create(&s, key(0), item(500, 1_000_000)).await;
        let out = s.debit(&key(0), &debit(1_000), FAST).await.unwrap();
        assert_eq!(out, DebitOutcome::Refused(Some(item(500, 1_000_000))));
    }
}

cross_store! {
    async fn fast_debit_refuses_without_a_wcu_token<S: BucketStore>(s: S) {
        create(&s, key(0), item(5_000, 999)).await;
        assert!(matches!(
            s.debit(&key(0), &debit(1_000), FAST).await.unwrap(),
            DebitOutcome::Refused(Some(_))
        ));
    }
}

cross_store! {
    async fn fast_debit_refuses_expired_item<S: BucketStore>(s: S) {
        let mut it = item(5_000, 1_000_000);
        it.ttl = Some(NOW_S);
        create(&s, key(0), it).await;
        assert!(matches!(
            s.debit(&key(0), &debit(1_000), FAST).await.unwrap(),
            DebitOutcome::Refused(Some(_))
        ));
    }
}

cross_store! {
    async fn fast_debit_refuses_changed_parameters<S: BucketStore>(s: S) {
        create(&s, key(0), item(5_000, 1_000_000)).await;
        let mut d = debit(1_000);
        d[0].params = Some(LimitParams::new(20, 20, 60_000));
        assert!(matches!(
            s.debit(&key(0), &d, FAST).await.unwrap(),
            DebitOutcome::Refused(Some(_))
        ));
    }
}

cross_store! {
    async fn fast_debit_refuses_unknown_limit<S: BucketStore>(s: S) {
        create(&s, key(0), item(5_000, 1_000_000)).await;
        let mut d = debit(1_000);
        d[0].limit = "tpm".into();
        assert!(matches!(
            s.debit(&key(0), &d, FAST).await.unwrap(),
            DebitOutcome::Refused(Some(_))
        ));
    }
}

cross_store! {
    async fn zero_amount_checks_debt<S: BucketStore>(s: S) {
        create(&s, key(0), item(-1, 1_000_000)).await;
        assert!(matches!(
            s.debit(&key(0), &debit(0), FAST).await.unwrap(),
            DebitOutcome::Refused(Some(_))
        ));
        create(&s, key(1), item(0, 1_000_000)).await;
        assert!(matches!(
            s.debit(&key(1), &debit(0), FAST).await.unwrap(),
            DebitOutcome::Applied(_)
        ));
    }
}

cross_store! {
    async fn retry_only_debit_ignores_wcu_and_parameters<S: BucketStore>(s: S) {
        let mut it = item(5_000, 0);
        it.ttl = Some(NOW_S - 10);
        create(&s, key(0), it).await;
        let mut d = debit(2_000);
        d[0].params = None;
        let DebitOutcome::Applied(after) = s.debit(&key(0), &d, DebitMode::RetryOnly).await.unwrap()
        else {
            panic!("retry-only ignores wcu and ttl");
        };
        assert_eq!(after.limits["rpm"].balance, 3_000);
        assert_eq!(after.limits[WCU_LIMIT].balance, 0, "no wcu debit");
        assert!(matches!(
            s.debit(&key(0), &debit(4_000), DebitMode::RetryOnly)
                .await
                .unwrap(),
            DebitOutcome::Refused(Some(_))
        ));
    }
}

cross_store! {
    async fn ungated_debit_may_go_negative<S: BucketStore>(s: S) {
        create(&s, key(0), item(1_000, 1_000_000)).await;
        let d = vec![Debit {
            limit: "rpm".into(),
            amount: 5_000,
            gated: false,
            params: None,
        }];
        let DebitOutcome::Applied(after) = s.debit(&key(0), &d, DebitMode::RetryOnly).await.unwrap()
        else {
            panic!("ungated");
        };
        assert_eq!(after.limits["rpm"].balance, -4_000);
    }
}

cross_store! {
    async fn create_is_conditional<S: BucketStore>(s: S) {
        create(&s, key(0), item(5_000, 1_000_000)).await;
        let out = s
            .commit(&[Write::Create {
                key: key(0),
                item: item(9_000, 1_000_000),
            }])
            .await
            .unwrap();
        assert_eq!(
            out,
            CommitOutcome::Conflict(vec![(0, Some(item(5_000, 1_000_000)))])
        );
    }
}

cross_store! {
    async fn update_needs_the_rf_lock_and_applies_deltas<S: BucketStore>(s: S) {
        create(&s, key(0), item(5_000, 1_000_000)).await;
        let rf = NOW_S * 1_000;
        let upd = |expected_rf| Write::Update {
            key: key(0),
            expected_refilled_at: expected_rf,
            refilled_at: rf + 10,
            ttl: Some(NOW_S + 500),
            shard_count: None,
            limits: vec![LimitWrite::Add {
                limit: "rpm".into(),
                balance_delta: -2_000,
                taken_delta: 2_000,
                floor: Some(2_000),
                cap: None,
                claimed: 2_000,
            }],
        };
        assert!(matches!(
            s.commit(&[upd(rf - 1)]).await.unwrap(),
            CommitOutcome::Conflict(_)
        ));
        assert_eq!(
            s.commit(&[upd(rf)]).await.unwrap(),
            CommitOutcome::Committed,
            "lock held"
        );
        let after = s.read(&[key(0)]).await.unwrap()[0].clone().unwrap();
        assert_eq!((after.refilled_at, after.ttl), (rf + 10, Some(NOW_S + 500)));
        assert_eq!(
            (after.limits["rpm"].balance, after.limits["rpm"].taken),
            (3_000, 2_000)
        );
    }
}

cross_store! {
    async fn update_floor_and_cap_guard_concurrent_changes<S: BucketStore>(s: S) {
        create(&s, key(0), item(1_000, 1_000_000)).await;
        let rf = NOW_S * 1_000;
        let upd = |floor, cap| Write::Update {
            key: key(0),
            expected_refilled_at: rf,
            refilled_at: rf,
            ttl: None,
            shard_count: None,
            limits: vec![LimitWrite::Add {
                limit: "rpm".into(),
                balance_delta: 0,
                taken_delta: 0,
                floor,
                cap,
                claimed: 0,
            }],
        };
        assert!(matches!(
            s.commit(&[upd(Some(1_001), None)]).await.unwrap(),
            CommitOutcome::Conflict(_)
        ));
        assert!(matches!(
            s.commit(&[upd(None, Some(999))]).await.unwrap(),
            CommitOutcome::Conflict(_)
        ));
        assert!(matches!(
            s.commit(&[upd(Some(1_000), Some(1_000))]).await.unwrap(),
            CommitOutcome::Committed
        ));
    }
}

cross_store! {
    async fn set_seeds_a_limit<S: BucketStore>(s: S) {
        create(&s, key(0), item(1_000, 1_000_000)).await;
        let tpm = LimitState::new(LimitParams::new(100, 100, 60_000), 90_000, 10_000);
        let w = Write::Update {
            key: key(0),
            expected_refilled_at: NOW_S * 1_000,
            refilled_at: NOW_S * 1_000,
            ttl: Some(NOW_S + 420),
            shard_count: None,
            limits: vec![LimitWrite::Set {
                limit: "tpm".into(),
                state: tpm,
                read_tc: None,
                claimed: 10_000,
            }],
        };
        assert!(matches!(
            s.commit(&[w]).await.unwrap(),
            CommitOutcome::Committed
        ));
        assert_eq!(
            s.read(&[key(0)]).await.unwrap()[0].as_ref().unwrap().limits["tpm"],
            tpm
        );
    }
}

cross_store! {
    /// A rewrite of a limit (new parameters) applies only to the limit as it was read: a
    /// debit that landed since (a server still on the old parameters, by the fast path) fails
    /// it, so that debit is never overwritten; a seed requires the limit still absent.
    async fn set_requires_the_limit_as_read<S: BucketStore>(s: S) {
        create(&s, key(0), item(5_000, 1_000_000)).await;
        let rewritten = LimitState::new(LimitParams::new(20, 20, 60_000), 9_000, 1_000);
        let set = |limit: &str, read_tc| Write::Update {
            key: key(0),
            expected_refilled_at: NOW_S * 1_000,
            refilled_at: NOW_S * 1_000,
            ttl: Some(NOW_S + 420),
            shard_count: None,
            limits: vec![LimitWrite::Set {
                limit: limit.into(),
                state: rewritten,
                read_tc,
                claimed: 1_000,
            }],
        };
        // Read at tc = 0; a fast-path debit of 1 token lands before the rewrite.
        let applied = s.debit(&key(0), &debit(1_000), FAST).await.unwrap();
        assert!(matches!(applied, DebitOutcome::Applied(_)));
        for stale in [set("rpm", Some(0)), set("rpm", None), set("wcu", None)] {
            let CommitOutcome::Conflict(failed) = s.commit(&[stale]).await.unwrap() else {
                panic!("a rewrite of a limit that moved since the read must fail");
            };
            assert_eq!(failed[0].1.as_ref().unwrap().limits["rpm"].balance, 4_000);
        }
        assert!(matches!(
            s.commit(&[set("rpm", Some(1_000))]).await.unwrap(),
            CommitOutcome::Committed
        ));
        assert_eq!(
            s.read(&[key(0)]).await.unwrap()[0].as_ref().unwrap().limits["rpm"],
            rewritten
        );
    }
}

cross_store! {
    async fn commit_is_all_or_nothing<S: BucketStore>(s: S) {
        create(&s, key(0), item(5_000, 1_000_000)).await;
        let writes = [
            Write::Create {
                key: key(1),
                item: item(5_000, 1_000_000),
            },
            Write::Update {
                key: key(0),
                expected_refilled_at: 0,
                refilled_at: 0,
                ttl: None,
                shard_count: None,
                limits: vec![],
            },
        ];
        let CommitOutcome::Conflict(failed) = s.commit(&writes).await.unwrap() else {
            panic!("the stale lock must fail the commit");
        };
        assert_eq!(failed.iter().map(|f| f.0).collect::<Vec<_>>(), vec![1]);
        assert_eq!(
            s.read(&[key(1)]).await.unwrap(),
            vec![None],
            "the create did not land"
        );
    }
}

cross_store! {
    async fn read_returns_images_in_key_order<S: BucketStore>(s: S) {
        create(&s, key(2), item(2_000, 1_000_000)).await;
        let images = s.read(&[key(1), key(2)]).await.unwrap();
        assert_eq!(images, vec![None, Some(item(2_000, 1_000_000))]);
    }
}

cross_store! {
    async fn credit_never_lifts_above_the_ceiling<S: BucketStore>(s: S) {
        create(&s, key(0), item(4_000, 1_000_000)).await;
        let c = |amount| {
            vec![Credit {
                limit: "rpm".into(),
                amount,
                ceiling: 5_000,
                params: rpm(),
            }]
        };
        assert_eq!(
            s.credit(&key(0), STAMP.into(), &c(2_000)).await.unwrap(),
            vec![],
            "would exceed"
        );
        assert_eq!(s.credit(&key(0), STAMP.into(), &c(1_000)).await.unwrap(), c(1_000));
        let image = s.read(&[key(0)]).await.unwrap()[0].clone().unwrap();
        assert_eq!(
            (image.limits["rpm"].balance, image.limits["rpm"].taken),
            (5_000, -1_000)
        );
        assert_eq!(
            s.credit(&key(9), STAMP.into(), &c(1)).await.unwrap(),
            vec![],
            "never creates"
        );
    }
}

cross_store! {
    /// A fast debit applies only to an item holding the shard count it was drawn under: its
    /// balance was sized for that count.
    async fn fast_debit_refuses_another_shard_count<S: BucketStore>(s: S) {
        create(&s, key(0), item(5_000, 1_000_000)).await;
        for count in [2, 4] {
            let mode = DebitMode::Fast {
                now_s: NOW_S,
                shard_count: count,
            };
            assert_eq!(
                s.debit(&key(0), &debit(1_000), mode).await.unwrap(),
                DebitOutcome::Refused(Some(item(5_000, 1_000_000)))
            );
        }
    }
}

cross_store! {
    /// An update may raise the item's shard count, only from the count it read (a bump or a
    /// raise landed since must not be undone), and the item records when: the update's
    /// `rf` (`count_raised_at`, which a later update without a raise keeps).
    async fn update_raises_the_shard_count_from_the_count_read<S: BucketStore>(s: S) {
        create(&s, key(0), item(5_000, 1_000_000)).await;
        let first = s.read(&[key(0)]).await.unwrap()[0].clone().unwrap();
        assert_eq!(first.count_raised_at, 0, "created at its count: never raised");
        let raise = |read| Write::Update {
            key: key(0),
            expected_refilled_at: RF,
            refilled_at: RF + 5,
            ttl: Some(NOW_S + 420),
            shard_count: Some(CountChange { read, new: 4 }),
            limits: vec![],
        };
        assert!(matches!(
            s.commit(&[raise(2)]).await.unwrap(),
            CommitOutcome::Conflict(_)
        ));
        assert_eq!(
            s.commit(&[raise(1)]).await.unwrap(),
            CommitOutcome::Committed
        );
        let image = s.read(&[key(0)]).await.unwrap()[0].clone().unwrap();
        assert_eq!(image.shard_count, 4);
        assert_eq!(image.count_raised_at, RF + 5);
        let later = Write::Update {
            key: key(0),
            expected_refilled_at: RF + 5,
            refilled_at: RF + 200_000,
            ttl: Some(NOW_S + 420),
            shard_count: None,
            limits: vec![],
        };
        assert_eq!(s.commit(&[later]).await.unwrap(), CommitOutcome::Committed);
        let image = s.read(&[key(0)]).await.unwrap()[0].clone().unwrap();
        assert_eq!(image.refilled_at, RF + 200_000);
        // Exact on DynamoDB and Redis; the memory store keeps whole minutes before `rf`
        // (never earlier than the raise: a shard given up is refilled no more).
        let at = image.count_raised_at;
        assert!((RF + 5..RF + 5 + 60_000).contains(&at), "{at}");
    }
}

cross_store! {
    /// A refund lands only on an item not refilled nor doubled since the debit it refunds
    /// (`rf` and shard count as that debit's image showed).
    async fn credit_needs_the_stamp_the_debit_saw<S: BucketStore>(s: S) {
        create(&s, key(0), item(4_000, 1_000_000)).await;
        let c = vec![Credit {
            limit: "rpm".into(),
            amount: 1_000,
            ceiling: 10_000,
            params: rpm(),
        }];
        let refilled = Stamp {
            refilled_at: RF - 1,
            ..STAMP
        };
        let doubled = Stamp {
            shard_count: 2,
            ..STAMP
        };
        for other in [refilled, doubled] {
            assert_eq!(s.credit(&key(0), other.into(), &c).await.unwrap(), vec![]);
        }
        let image = s.read(&[key(0)]).await.unwrap()[0].clone().unwrap();
        assert_eq!(image.limits["rpm"].balance, 4_000, "nothing credited");
        assert_eq!(s.credit(&key(0), STAMP.into(), &c).await.unwrap(), c);
    }
}

cross_store! {
    /// A debit that may go into debt still stops at the lowest balance.
    async fn ungated_debit_stops_at_the_lowest_balance<S: BucketStore>(s: S) {
        create(&s, key(0), item(0, 1_000_000)).await;
        let d = |amount| {
            vec![Debit {
                limit: "rpm".into(),
                amount,
                gated: false,
                params: None,
            }]
        };
        assert!(matches!(
            s.debit(&key(0), &d(-MIN_BALANCE + 1), DebitMode::RetryOnly)
                .await
                .unwrap(),
            DebitOutcome::Refused(Some(_))
        ));
        let DebitOutcome::Applied(after) = s
            .debit(&key(0), &d(-MIN_BALANCE), DebitMode::RetryOnly)
            .await
            .unwrap()
        else {
            panic!("down to the lowest balance");
        };
        assert_eq!(after.limits["rpm"].balance, MIN_BALANCE);
        assert_eq!(
            s.read(&[key(0)]).await.unwrap()[0].clone().unwrap().limits["rpm"].balance,
            MIN_BALANCE,
            "stored and read back exactly"
        );
    }
}

cross_store! {
    /// A call naming one limit twice (DynamoDB refuses the overlapping update) is refused
    /// by every store alike, as that call's error, and writes nothing.
    async fn a_limit_named_twice_in_one_call_is_refused_by_every_store<S: BucketStore>(s: S) {
        create(&s, key(0), item(5_000, 1_000_000)).await;
        let twice = [debit(1_000), debit(1_000)].concat();
        let refused = |r: Result<(), StoreError>| match r {
            Err(StoreError::Invalid { reason, .. }) => {
                assert!(reason.contains("'rpm' is named twice"), "{reason}")
            }
            other => panic!("{other:?}"),
        };
        refused(s.debit(&key(0), &twice, FAST).await.map(drop));
        refused(
            s.debit_or_create(&key(1), &twice, FAST, &|| item(5_000, 1_000_000))
                .await
                .map(drop),
        );
        let c = Credit {
            limit: "rpm".into(),
            amount: 1_000,
            ceiling: 10_000,
            params: rpm(),
        };
        refused(s.credit(&key(0), STAMP.into(), &[c.clone(), c]).await.map(drop));
        let add = LimitWrite::Add {
            limit: "rpm".into(),
            balance_delta: -1_000,
            taken_delta: 1_000,
            floor: None,
            cap: None,
            claimed: 1_000,
        };
        let update = Write::Update {
            key: key(0),
            expected_refilled_at: RF,
            refilled_at: RF + 10,
            ttl: Some(NOW_S + 500),
            shard_count: None,
            limits: vec![add.clone(), add],
        };
        refused(s.commit(&[update]).await.map(drop));
        let retry = Write::Debit {
            key: key(0),
            debits: twice.clone(),
            ttl: None,
        };
        refused(s.commit(&[retry]).await.map(drop));
        let stored = s.read(&[key(0), key(1)]).await.unwrap();
        assert_eq!(stored[0], Some(item(5_000, 1_000_000)), "untouched");
        assert_eq!(stored[1], None, "nothing created");
    }
}

cross_store! {
    /// A debit's arithmetic is exact at every size: balances and counters on either side
    /// of 2^53 (where Redis's script stops computing in Lua's doubles and asks Redis to
    /// add), a counter saturating at i64::MAX.
    /// The answered image is the stored one.
    async fn debit_arithmetic_is_exact_at_every_size<S: BucketStore>(s: S) {
        let big = (1_i64 << 53) + 1;
        let mut it = item(999_999_999_999_999, 1_000_000);
        it.limits.insert("wide", LimitState::new(rpm(), big, 999_999_999_999_999));
        it.limits.insert("full", LimitState::new(rpm(), big, i64::MAX - 1));
        create(&s, key(0), it).await;
        let d = |limit: &str, amount| Debit {
            limit: limit.into(),
            amount,
            gated: false,
            params: None,
        };
        let debits = [
            d("rpm", 1_000_000_000_000_000),
            d("wide", 1_000_000_000_000_003),
            d("full", 7),
        ];
        let DebitOutcome::Applied(after) = s.debit(&key(0), &debits, FAST).await.unwrap() else {
            panic!("should apply");
        };
        let state = |l: &str| (after.limits[l].balance, after.limits[l].taken);
        assert_eq!(state("rpm"), (-1, 1_000_000_000_000_000));
        assert_eq!(
            state("wide"),
            (big - 1_000_000_000_000_003, 1_999_999_999_999_999 + 3)
        );
        assert_eq!(state("full"), (big - 7, i64::MAX));
        assert_eq!(after.limits[WCU_LIMIT].balance, 999_000);
        let stored = s.read(&[key(0)]).await.unwrap()[0].clone().unwrap();
        assert_eq!(stored, after, "the answer is what was stored");
    }
}

cross_store! {
    /// A retry-only debit carrying a `ttl` writes it with the debit.
    async fn retry_debit_writes_its_ttl<S: BucketStore>(s: S) {
        create(&s, key(0), item(1_000, 1_000_000)).await;
        let w = Write::Debit {
            key: key(0),
            debits: vec![Debit {
                limit: "rpm".into(),
                amount: 5_000,
                gated: false,
                params: None,
            }],
            ttl: Some(NOW_S + 9_000),
        };
        assert_eq!(s.commit(&[w]).await.unwrap(), CommitOutcome::Committed);
        let image = s.read(&[key(0)]).await.unwrap()[0].clone().unwrap();
        assert_eq!(
            (image.limits["rpm"].balance, image.ttl),
            (-4_000, Some(NOW_S + 9_000))
        );
    }
}

cross_store! {
    /// A key longer than DynamoDB's partition-key limit (under the longest namespace) is
    /// refused by every call, as this request's error, by every store alike.
    async fn a_key_too_long_is_refused_by_every_call<S: BucketStore>(s: S) {
        let long = BucketKey::new("x".repeat(MAX_PARTITION_KEY_BYTES), "api", 0);
        let invalid = |r: Result<(), StoreError>| {
            assert!(matches!(r, Err(StoreError::Invalid { .. })), "{r:?}");
            let message = r.unwrap_err().to_string();
            assert!(message.len() < 600, "elided: {message}");
        };
        invalid(s.debit(&long, &debit(1_000), FAST).await.map(drop));
        invalid(s.read(std::slice::from_ref(&long)).await.map(drop));
        let create = Write::Create {
            key: long.clone(),
            item: item(1_000, 1_000_000),
        };
        invalid(s.commit(&[create]).await.map(drop));
        invalid(s.credit(&long, STAMP.into(), &[]).await.map(drop));
        // The longest key every store holds.
        let at_bound = BucketKey::new("x".repeat(MAX_PARTITION_KEY_BYTES - 256 - 10 - 4), "api", 0);
        create_ok(&s, at_bound.clone()).await;
        assert!(s.read(&[at_bound]).await.unwrap()[0].is_some());
    }
}

async fn create_ok<S: BucketStore>(s: &S, k: BucketKey) {
    let out = s
        .commit(&[Write::Create {
            key: k,
            item: item(1_000, 1_000_000),
        }])
        .await
        .unwrap();
    assert_eq!(out, CommitOutcome::Committed);
}

cross_store! {
    /// An item larger than DynamoDB's 400 KB is refused by every store alike.
    async fn an_item_too_large_is_refused<S: BucketStore>(s: S) {
        let mut big = item(1_000, 1_000_000);
        let name = "l".repeat(64);
        let mut i = 0;
        while shardgate::store::key::item_bytes(&key(0), &big) <= MAX_ITEM_BYTES {
            big.limits
                .insert(format!("{name}{i}"), LimitState::new(rpm(), 1_000, 0));
            i += 1;
        }
        let out = s
            .commit(&[Write::Create {
                key: key(0),
                item: big,
            }])
            .await;
        assert!(matches!(out, Err(StoreError::Invalid { .. })), "{out:?}");
        assert_eq!(s.read(&[key(0)]).await.unwrap(), vec![None]);
    }
}

cross_store! {
    /// An update that would grow an item past DynamoDB's 400 KB (twenty limits seeded on
    /// an item just under it by `item_bytes`) is refused by every store alike, and writes
    /// nothing. Twenty, not one: `item_bytes` counts a byte more per limit field than
    /// DynamoDB's `b_{name}_{field}` spells, so DynamoDB Local takes one limit more.
    async fn an_update_growing_an_item_too_large_is_refused<S: BucketStore>(s: S) {
        let mut big = item(1_000, 1_000_000);
        let name = "l".repeat(64);
        let mut i = 0;
        let seeded = LimitState::new(rpm(), 1_000, 0);
        loop {
            let mut next = big.clone();
            next.limits.insert(format!("{name}{i}"), seeded);
            if shardgate::store::key::item_bytes(&key(0), &next) > MAX_ITEM_BYTES {
                break;
            }
            big = next;
            i += 1;
        }
        create(&s, key(0), big.clone()).await;
        let grow = Write::Update {
            key: key(0),
            expected_refilled_at: RF,
            refilled_at: RF + 1,
            ttl: big.ttl,
            shard_count: None,
            limits: (i..i + 20)
                .map(|j| LimitWrite::Set {
                    limit: format!("{name}{j}").into(),
                    state: seeded,
                    read_tc: None,
                    claimed: 0,
                })
                .collect(),
        };
        let out = s.commit(&[grow]).await;
        assert!(matches!(out, Err(StoreError::Invalid { .. })), "{out:?}");
        assert_eq!(s.read(&[key(0)]).await.unwrap(), vec![Some(big)]);
    }
}

cross_store! {
    /// A credit lands only on a limit that still has the parameters its tokens were taken
    /// under: after a reload rewrote them (a lower limit), the old ceiling means nothing.
    async fn credit_needs_the_parameters_it_was_taken_under<S: BucketStore>(s: S) {
        create(&s, key(0), item(4_000, 1_000_000)).await;
        let credit = |params| {
            vec![Credit {
                limit: "rpm".into(),
                amount: 1_000,
                ceiling: 10_000,
                params,
            }]
        };
        let old = LimitParams::new(20, 20, 60_000);
        assert_eq!(
            s.credit(&key(0), STAMP.into(), &credit(old)).await.unwrap(),
            vec![],
            "taken under other parameters"
        );
        assert_eq!(
            s.credit(&key(0), STAMP.into(), &credit(rpm())).await.unwrap(),
            credit(rpm())
        );
        let image = s.read(&[key(0)]).await.unwrap()[0].clone().unwrap();
        assert_eq!(image.limits["rpm"].balance, 5_000);
    }
}

cross_store! {
    /// An update never moves an item's expiry earlier: a consumption-only retry may have
    /// raised it since the update's read without moving `rf`.
    async fn update_never_moves_the_expiry_earlier<S: BucketStore>(s: S) {
        create(&s, key(0), item(5_000, 1_000_000)).await;
        let update = |ttl| Write::Update {
            key: key(0),
            expected_refilled_at: RF,
            refilled_at: RF,
            ttl,
            shard_count: None,
            limits: vec![],
        };
        // The item's ttl is NOW_S + 420.
        assert!(matches!(
            s.commit(&[update(Some(NOW_S + 419))]).await.unwrap(),
            CommitOutcome::Conflict(_)
        ));
        assert_eq!(s.commit(&[update(Some(NOW_S + 420))]).await.unwrap(), CommitOutcome::Committed);
        assert_eq!(s.commit(&[update(Some(NOW_S + 500))]).await.unwrap(), CommitOutcome::Committed);
        // Removing it (the item never expires) is the latest of all ...
        assert_eq!(s.commit(&[update(None)]).await.unwrap(), CommitOutcome::Committed);
        // ... and an item that never expires is not given an expiry again.
        assert!(matches!(
            s.commit(&[update(Some(NOW_S + 10_000))]).await.unwrap(),
            CommitOutcome::Conflict(_)
        ));
        let image = s.read(&[key(0)]).await.unwrap()[0].clone().unwrap();
        assert_eq!(image.ttl, None);
    }
}

/// [`BucketStore::debit_or_create`] of `debit(amount)` on `key(0)` with `seed`.
async fn debit_seeded<S: BucketStore>(s: &S, amount: i64, seed: &BucketItem) -> DebitOutcome {
    s.debit_or_create(&key(0), &debit(amount), FAST, &|| seed.clone())
        .await
        .unwrap()
}

cross_store! {
    /// A missing item is created from the seed and debited in the same call, `wcu`
    /// untouched (a create takes none).
    async fn debit_or_create_creates_a_missing_item_and_debits_it<S: BucketStore>(s: S) {
        let out = debit_seeded(&s, 3_000, &item(10_000, 1_000_000)).await;
        let stored = s.read(&[key(0)]).await.unwrap().pop().unwrap();
        let mut expected = item(7_000, 1_000_000);
        expected.limits.get_mut("rpm").unwrap().taken = 3_000;
        assert_eq!(out, DebitOutcome::Applied(expected.clone()));
        assert_eq!(stored, Some(expected));
    }
}

cross_store! {
    /// A seed the debit does not fit (short, or expired, or of another shard count) is
    /// not written: refused as missing.
    async fn debit_or_create_writes_nothing_the_debit_does_not_fit<S: BucketStore>(s: S) {
        assert_eq!(debit_seeded(&s, 3_000, &item(2_000, 1_000_000)).await, DebitOutcome::Refused(None));
        let mut expired = item(10_000, 1_000_000);
        expired.ttl = Some(NOW_S);
        assert_eq!(debit_seeded(&s, 3_000, &expired).await, DebitOutcome::Refused(None));
        let mut other_count = item(10_000, 1_000_000);
        other_count.shard_count = 2;
        assert_eq!(debit_seeded(&s, 3_000, &other_count).await, DebitOutcome::Refused(None));
        assert_eq!(s.read(&[key(0)]).await.unwrap(), vec![None]);
    }
}

cross_store! {
    /// An item that exists is debited as by `debit` (one `wcu` token), the seed unused;
    /// one the fast path refuses (expired) is refused with its image, never replaced.
    async fn debit_or_create_on_an_existing_item_is_a_debit<S: BucketStore>(s: S) {
        create(&s, key(0), item(5_000, 1_000_000)).await;
        let DebitOutcome::Applied(after) = debit_seeded(&s, 1_000, &item(10_000, 1_000_000)).await
        else {
            panic!("should apply");
        };
        assert_eq!(after.limits["rpm"].balance, 4_000);
        assert_eq!(after.limits[WCU_LIMIT].balance, 999_000);
        let mut expired = item(5_000, 1_000_000);
        expired.ttl = Some(NOW_S);
        create(&s, key(1), expired.clone()).await;
        let out = s
            .debit_or_create(&key(1), &debit(1_000), FAST, &|| item(10_000, 1_000_000))
            .await
            .unwrap();
        assert_eq!(out, DebitOutcome::Refused(Some(expired)));
    }
}

cross_store! {
    /// A limit whose name holds a space (no rule names one; the contract allows it) is
    /// debited, refused and answered like any other: Redis's debit answers an image as
    /// one string joined by spaces, and falls back to the list for such an item.
    async fn a_limit_named_with_a_space_is_debited_and_answered<S: BucketStore>(s: S) {
        let mut it = item(5_000, 1_000_000);
        it.limits.insert("per minute", LimitState::new(rpm(), 1_500, 0));
        create(&s, key(0), it.clone()).await;
        let spaced = |amount| Debit {
            limit: "per minute".into(),
            amount,
            gated: true,
            params: Some(rpm()),
        };
        let DebitOutcome::Applied(after) = s.debit(&key(0), &[spaced(1_000)], FAST).await.unwrap()
        else {
            panic!("1 of 1.5 tokens is there");
        };
        assert_eq!(after.limits["per minute"].balance, 500);
        assert_eq!(after.limits["per minute"].taken, 1_000);
        let DebitOutcome::Refused(Some(seen)) =
            s.debit(&key(0), &[spaced(1_000)], FAST).await.unwrap()
        else {
            panic!("0.5 tokens do not cover 1");
        };
        assert_eq!(seen, after, "the refusal answers the stored image");
        assert_eq!(s.read(&[key(0)]).await.unwrap()[0], Some(after));
    }
}

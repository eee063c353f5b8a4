//! Unit tests of `pass.rs`: each planning rule on its own.
use super::*;
use crate::engine::bucket::MILLI;

const NOW: i64 = 1_800_000_000_000;

fn ctx() -> PassContext {
    PassContext {
        now: NOW,
        wcu: LimitParams::new(1_000, 1_000, 1_000),
        ttl_multiplier: 7,
    }
}

fn claim(params: LimitParams, tokens: i64, forced: bool) -> BucketClaim {
    BucketClaim {
        entity: "e".into(),
        resource: "r".into(),
        limits: smallvec::smallvec![LimitClaim {
            limit: "l".into(),
            params,
            amount: tokens * MILLI,
            forced,
        }],
        cascades: false,
        strict: false,
    }
}

fn key() -> BucketKey {
    BucketKey::new("e", "r", 0)
}

fn ttl_of(w: &Write) -> Option<i64> {
    match w {
        Write::Create { item, .. } => item.ttl,
        Write::Update { ttl, .. } => *ttl,
        Write::Debit { ttl, .. } => *ttl,
    }
}

#[test]
fn a_full_item_expires_after_seven_times_its_time_from_empty() {
    let per_second = LimitParams::new(10, 10, 1_000);
    let plan = plan_bucket(&claim(per_second, 1, false), &key(), None, 1, &ctx());
    assert!(plan.fits);
    assert_eq!(ttl_of(&plan.write), Some(NOW / 1_000 + 7));
}

#[test]
fn debt_keeps_an_item_until_it_is_repaid() {
    // 10/s, burst 10, an overdraft of 5,000 tokens: 4,990 tokens of debt, 499 s on one
    // shard, and up to 32 times that if the bucket later spreads over 32 shards.
    let p = LimitParams::new(10, 10, 1_000);
    let plan = plan_bucket(&claim(p, 5_000, true), &key(), None, 1, &ctx());
    assert!(plan.fits);
    assert_eq!(plan.admitted.limits[0].remaining, -4_990 * MILLI);
    let ttl = ttl_of(&plan.write).expect("expires eventually");
    assert!(ttl >= NOW / 1_000 + 7 * 499 * 32, "{ttl}");
}

#[test]
fn a_limit_that_never_refills_never_expires() {
    let never = LimitParams::new(3, 0, 1_000);
    let plan = plan_bucket(&claim(never, 1, false), &key(), None, 1, &ctx());
    assert_eq!(ttl_of(&plan.write), None);
    // Updating it keeps it so.
    let Write::Create { item, .. } = plan.write else {
        panic!("a create")
    };
    let later = PassContext {
        now: NOW + 60_000,
        ..ctx()
    };
    let plan = plan_bucket(&claim(never, 1, false), &key(), Some(&item), 1, &later);
    assert!(plan.fits);
    assert_eq!(ttl_of(&plan.write), None);
}

#[test]
fn an_overdraft_past_the_lowest_balance_is_refused_not_recorded() {
    let p = LimitParams::new(10, 10, 1_000);
    let mut b = claim(p, 0, true);
    b.limits[0].amount = 10 * MILLI - MIN_BALANCE + 1;
    let plan = plan_bucket(&b, &key(), None, 1, &ctx());
    assert!(!plan.fits);
    assert_eq!(
        plan.admitted.limits[0].remaining,
        10 * MILLI,
        "nothing taken"
    );
}

#[test]
fn tc_is_folded_before_it_can_outgrow_an_i64() {
    let p = LimitParams::new(10, 10, 1_000);
    let mut item = match plan_bucket(&claim(p, 1, false), &key(), None, 1, &ctx()).write {
        Write::Create { item, .. } => item,
        _ => unreachable!(),
    };
    item.limits.get_mut("l").unwrap().taken = TC_FOLD + 5;
    let plan = plan_bucket(&claim(p, 1, false), &key(), Some(&item), 1, &ctx());
    let Write::Update { limits, .. } = plan.write else {
        panic!("an update")
    };
    let LimitWrite::Add {
        taken_delta: tc_delta,
        ..
    } = &limits[0]
    else {
        panic!("an add")
    };
    assert_eq!(*tc_delta, MILLI - TC_FOLD);
}

#[test]
fn a_shard_that_knows_fewer_shards_is_clamped_and_raised() {
    let p = LimitParams::new(100, 100, 60_000);
    let mut item = match plan_bucket(&claim(p, 0, false), &key(), None, 1, &ctx()).write {
        Write::Create { item, .. } => item,
        _ => unreachable!(),
    };
    item.limits.get_mut("l").unwrap().balance = 100 * MILLI;
    let plan = plan_bucket(&claim(p, 1, false), &key(), Some(&item), 4, &ctx());
    let Write::Update {
        shard_count,
        limits,
        ..
    } = &plan.write
    else {
        panic!("an update")
    };
    assert_eq!(*shard_count, Some(CountChange { read: 1, new: 4 }));
    let LimitWrite::Add {
        balance_delta: tk_delta,
        ..
    } = &limits[0]
    else {
        panic!("an add")
    };
    assert_eq!(
        100 * MILLI + tk_delta,
        25 * MILLI - MILLI,
        "a quarter, less one"
    );
}

#[test]
fn a_retried_overdraft_raises_the_ttl_and_never_lowers_it() {
    let p = LimitParams::new(10, 10, 1_000);
    let item = match plan_bucket(&claim(p, 1, false), &key(), None, 1, &ctx()).write {
        Write::Create { item, .. } => item,
        _ => unreachable!(),
    };
    let raised = retry_debit(&claim(p, 5_000, true), &key(), &item, &ctx());
    assert!(ttl_of(&raised).unwrap() > item.ttl.unwrap());
    let gated = retry_debit(&claim(p, 1, false), &key(), &item, &ctx());
    assert_eq!(ttl_of(&gated), None, "a gated retry leaves the ttl alone");
}

#[test]
fn expiry_rounds_up_to_whole_seconds() {
    assert_eq!(expiry(1_000, 7, [Some(1)]), Some(1 + 7));
    assert_eq!(expiry(1_000, 7, [Some(1_000), Some(0)]), Some(1 + 7));
    assert_eq!(expiry(1_000, 7, [Some(5), None]), None);
}

#[test]
fn a_shard_a_raise_gave_up_is_created_as_if_empty_since_the_raise() {
    // 16 tokens at 4 a second over 2 shards: a share of 8, refilled at 2 a second.
    let p = LimitParams::new(16, 4, 1_000);
    let created = |since: i64| match plan_given_up(&claim(p, 1, false), &key(), 2, since, &ctx()) {
        BucketPlan {
            fits,
            write: Write::Create { item, .. },
            ..
        } => (fits, item.limits.get("l").map(|st| (st.balance, st.taken))),
        other => panic!("not a create: {:?}", other.write),
    };
    // Given up 250 ms ago: half a token refilled since, less than the request.
    assert!(!created(NOW - 250).0);
    // 1.5 s ago: three tokens; one taken, two left — never the share of 8.
    assert_eq!(created(NOW - 1_500), (true, Some((2 * MILLI, MILLI))));
    // Long ago (a shard that expired): its whole share.
    assert_eq!(created(NOW - 3_600_000), (true, Some((7 * MILLI, MILLI))));
}

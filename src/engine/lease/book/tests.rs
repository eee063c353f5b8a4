//! The lease book's unit tests: demand, grants, service from a lease, expiry and the
//! bound on what it tracks.

use super::*;
use crate::engine::LimitOutcome;
use crate::store::{LimitParams, Stamp};

const T0: i64 = 1_800_000_000_000;

fn claim(amount: i64) -> BucketClaim {
    BucketClaim {
        entity: "e".into(),
        resource: "r".into(),
        limits: smallvec::smallvec![LimitClaim {
            limit: "l".into(),
            params: LimitParams::new(1_000_000, 1_000_000, 1_000),
            amount,
            forced: false,
        }],
        cascades: false,
        strict: false,
    }
}

fn one(b: BucketClaim) -> Acquire {
    Acquire {
        buckets: smallvec::smallvec![b],
    }
}

fn book() -> LeaseBook {
    LeaseBook::new(LeaseOptions::default())
}

/// `n` requests of one token spread evenly over `ms` from `start`; those not
/// answered from a lease are decided by the store (admitted, the shard left at
/// 900,000 tokens) and the book sees it.
fn drive(book: &LeaseBook, b: &BucketClaim, start: i64, ms: i64, n: i64) -> Vec<Served> {
    (0..n)
        .map(|i| {
            let now = start + i * ms / n;
            let req = one(b.clone());
            let served = book.serve(&req, now, true);
            if !matches!(served, Served::Answered(_)) {
                book.saw(&req, &mut stored(b, 900_000_000), now);
            }
            served
        })
        .collect()
}

/// The store's decision of `b`, admitted, the shard left with `remaining`.
fn stored(b: &BucketClaim, remaining: i64) -> Decision {
    let share = b.limits[0].params.share(1);
    Decision {
        admitted: true,
        buckets: smallvec::smallvec![BucketOutcome {
            shard: 0,
            shard_count: 1,
            stamp: Stamp::default(),
            limits: b
                .limits
                .iter()
                .map(|_| LimitOutcome {
                    fits: true,
                    remaining,
                    share,
                    refill_amount: share.refill_amount,
                    wait_ms: Some(0),
                })
                .collect(),
            from_lease: false,
        }],
    }
}

fn grant(book: &LeaseBook, want: &Want, now: i64) {
    let limits: Vec<LimitClaim> = want
        .limits
        .iter()
        .map(|w| LimitClaim {
            amount: 100_000,
            ..w.claim.clone()
        })
        .collect();
    let share = limits[0].params.share(1);
    let outcome = BucketOutcome {
        shard: 0,
        shard_count: 1,
        stamp: Stamp::default(),
        limits: limits
            .iter()
            .map(|_| LimitOutcome {
                fits: true,
                remaining: 500_000,
                share,
                refill_amount: share.refill_amount,
                wait_ms: Some(0),
            })
            .collect(),
        from_lease: false,
    };
    book.granted(&want.bucket, &limits, &outcome, now);
}

#[test]
fn a_bucket_the_store_has_not_decided_wants_no_lease() {
    let book = book();
    let req = one(claim(1_000));
    // Hot, but every store call failed (or missed its deadline): nothing was seen.
    for i in 0..60 {
        book.serve(&req, T0 + i * 10, true);
    }
    assert!(book.take_wants().is_empty());
    book.saw(&req, &mut stored(&claim(1_000), 900_000_000), T0 + 600);
    book.serve(&req, T0 + 610, true);
    assert_eq!(
        book.take_wants().len(),
        1,
        "wanted once the shard's balance is known"
    );
}

#[test]
fn a_cold_bucket_wants_no_lease() {
    let book = book();
    // 4 requests in a second: below the threshold.
    drive(&book, &claim(1_000), T0, 1_000, 4);
    assert!(book.take_wants().is_empty());
}

/// The milliseconds from the first of a steady stream of `per_s` requests a second to its
/// first wanted lease, if one is wanted within `seconds`.
fn first_want_ms(per_s: i64, seconds: i64) -> Option<i64> {
    let book = book();
    let b = claim(1_000);
    let gap = 1_000 / per_s;
    (0..per_s * seconds).find_map(|i| {
        let now = T0 + i * gap;
        drive(&book, &b, now, 1, 1);
        (!book.take_wants().is_empty()).then_some(now - T0)
    })
}

#[test]
fn a_lease_is_taken_only_where_it_saves_writes() {
    // One a second never pays for a lease's three writes; nor four.
    assert_eq!(first_want_ms(1, 30), None);
    assert_eq!(first_want_ms(4, 30), None);
    // Ten a second does (a lease answers ten requests for three writes), within the
    // first two windows.
    let lukewarm = first_want_ms(10, 30).expect("leased");
    assert!(lukewarm <= 500, "{lukewarm} ms");
    // A hundred a second within a second.
    let hot = first_want_ms(100, 30).expect("leased");
    assert!(hot <= 1_000, "{hot} ms");
}

#[test]
fn a_bucket_that_stops_gives_its_lease_back_within_its_lifetime() {
    let book = book();
    let b = claim(1_000);
    drive(&book, &b, T0, 300, 30);
    let wants = book.take_wants();
    grant(&book, &wants[0], T0 + 300);
    // No request after the grant: nothing tops it up, and its rest goes back at the end
    // of its lifetime, not later.
    let lifetime = book.options().lifetime_ms;
    assert!(book.expire(T0 + 300 + lifetime - 1).is_empty());
    let returned = book.expire(T0 + 300 + lifetime);
    assert_eq!(returned.len(), 1);
    assert_eq!(returned[0].rest[0].2, 100_000, "all of it");
    assert_eq!(book.outstanding(), 0);
}

#[test]
fn a_hot_bucket_wants_one_lease_at_a_time_and_is_served_from_it() {
    let book = book();
    let b = claim(1_000);
    drive(&book, &b, T0, 300, 30); // 100/s over the first window
    let wants = book.take_wants();
    assert_eq!(wants.len(), 1, "{wants:?}");
    assert_eq!(wants[0].limits[0].demand.per_s, 100_000, "{wants:?}");
    drive(&book, &b, T0 + 300, 100, 10);
    assert!(
        book.take_wants().is_empty(),
        "one fetch in flight per bucket"
    );

    grant(&book, &wants[0], T0 + 400);
    let Served::Answered(d) = book.serve(&one(b.clone()), T0 + 401, true) else {
        panic!("covered");
    };
    assert!(d.admitted);
    // The shard's 500 after the grant, and 99 of the lease's 100 left.
    assert_eq!(d.buckets[0].limits[0].remaining, 599_000);
    assert_eq!(book.outstanding(), 99_000);
}

#[test]
fn a_request_larger_than_the_rest_sends_the_lease_back_first() {
    let book = book();
    let b = claim(1_000);
    drive(&book, &b, T0, 300, 30);
    let wants = book.take_wants();
    grant(&book, &wants[0], T0 + 300);
    let Served::Missed(returns) = book.serve(&one(claim(150_000)), T0 + 301, true) else {
        panic!("150 tokens do not fit in a lease of 100");
    };
    assert_eq!(returns.len(), 1);
    assert_eq!(returns[0].rest[0].2, 100_000);
    assert_eq!(book.outstanding(), 0);
}

#[test]
fn a_strict_bucket_is_never_served_from_a_lease() {
    let book = book();
    let mut b = claim(1_000);
    b.strict = true;
    drive(&book, &b, T0, 600, 60);
    assert!(book.take_wants().is_empty());
    assert!(matches!(book.serve(&one(b), T0 + 700, true), Served::Missed(r) if r.is_empty()));
}

#[test]
fn leases_expire_and_everything_goes_back_at_close() {
    let book = book();
    let b = claim(1_000);
    drive(&book, &b, T0, 300, 30);
    let wants = book.take_wants();
    grant(&book, &wants[0], T0 + 300);
    assert!(book.expire(T0 + 1_299).is_empty(), "still live");
    let returned = book.expire(T0 + 1_300);
    assert_eq!(returned.len(), 1);
    assert_eq!(book.outstanding(), 0);
    // The shard held 500 tokens after the grant.
    assert!(
        matches!(
            book.serve(&one(claim(300_000)), T0 + 1_300, true),
            Served::Wait(Landing { tight: true, .. })
        ),
        "a request for more than half of it waits for the return in flight"
    );
    assert!(
        matches!(
            book.serve(&one(claim(250_000)), T0 + 1_300, true),
            Served::Wait(Landing { tight: false, .. })
        ),
        "one the store holds enough for need not"
    );
    book.returned(&returned);

    drive(&book, &b, T0 + 1_300, 300, 30);
    let wants = book.take_wants();
    assert_eq!(wants.len(), 1);
    grant(&book, &wants[0], T0 + 1_600);
    assert_eq!(book.close().len(), 1);
    drive(&book, &b, T0 + 1_600, 600, 60);
    assert!(book.take_wants().is_empty(), "closed");
}

/// `b` renamed to the `i`th of a family of distinct buckets.
fn nth(b: &BucketClaim, i: usize) -> BucketClaim {
    BucketClaim {
        entity: format!("e{i}").into(),
        ..b.clone()
    }
}

#[test]
fn a_churn_of_cold_buckets_stays_out_of_the_book_and_a_hot_one_gets_in() {
    let book = book();
    let b = claim(1_000);
    // 5,000 distinct buckets a second, each asked for once, for 4 s; one bucket at
    // 100/s among them from the second second.
    for i in 0..20_000usize {
        let now = T0 + i as i64 / 5;
        drive(&book, &nth(&b, i), now, 1, 1);
        if i >= 5_000 && i % 50 == 0 {
            drive(&book, &b, now, 1, 1);
        }
    }
    let tracked = book.tracked();
    assert!(
        tracked <= 40,
        "cold buckets are counted, not tracked: {tracked}"
    );
    assert!(book
        .with_entry("e", "r", |e| e.hot(book.options()))
        .unwrap());
    assert_eq!(book.take_wants().len(), 1, "the hot bucket wants a lease");
}

#[test]
fn a_full_partition_makes_room_for_a_bucket_in_demand() {
    let book = book();
    let b = claim(1_000);
    // More buckets than a partition holds, all filed in the hot bucket's partition (the
    // hash is seeded per process: picked, not left to chance), asked for 5 times each at
    // once: each counts as in demand, and the partition fills to its bound.
    let spot = book.spot("e", "r");
    let beside = (0..)
        .map(|i| nth(&b, i))
        .filter(|other| book.spot(&other.entity, &other.resource).part == spot.part);
    for other in beside.take(PER_PART + 50) {
        drive(&book, &other, T0, 1, 5);
    }
    assert_eq!(book.tracked(), PER_PART, "only its partition is filled");
    assert_eq!(book.part(spot).len(), PER_PART, "its partition is full");
    // Two windows later they are quiet: the hot bucket enters in place of one.
    drive(&book, &b, T0 + 600, 300, 30);
    assert!(book.with_entry("e", "r", |_| ()).is_some());
    assert_eq!(book.part(spot).len(), PER_PART, "still bounded");
    assert_eq!(book.take_wants().len(), 1);
}

#[test]
fn idle_buckets_are_forgotten() {
    let book = book();
    drive(&book, &claim(1_000), T0, 300, 30);
    assert_eq!(book.tracked(), 1);
    let wants = book.take_wants();
    book.declined(&wants[0].bucket, T0 + 300);
    assert!(book.expire(T0 + 10_000).is_empty());
    assert_eq!(book.tracked(), 0);
}

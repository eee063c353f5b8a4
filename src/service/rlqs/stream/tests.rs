//! The stream's answers to reports: shares, abandonment, bounds, the fleet's deny before
//! a draw, and the `rlqs:` section's bucket ids.

use super::*;
use crate::service::rlqs::demand::Demands;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
use envoy_types::pb::google::protobuf::Duration as PbDuration;

const RULES: &str = "domain: d\ndescriptors:\n  - key: tenant\n    value: acme\n    rate_limit: {unit: second, requests_per_unit: 50}\n";

fn report(tenant: &str, allowed: u64, denied: u64) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: "d".into(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(BucketId {
                bucket: [("tenant".to_string(), tenant.to_string())].into(),
            }),
            time_elapsed: Some(PbDuration {
                seconds: 1,
                nanos: 0,
            }),
            num_requests_allowed: allowed,
            num_requests_denied: denied,
        }],
    }
}

/// The tokens per second of the only action of `answer`, or the action's name.
fn rate(answer: &Answer) -> Result<f64, &'static str> {
    let a = answer.response.bucket_action[0].bucket_action;
    let Some(Action::QuotaAssignmentAction(q)) = a else {
        return Err("abandon");
    };
    match q.rate_limit_strategy.and_then(|s| s.strategy) {
        Some(Strategy::TokenBucket(t)) => {
            let interval = t.fill_interval.unwrap();
            let secs = interval.seconds as f64 + f64::from(interval.nanos) / 1e9;
            Ok(f64::from(t.tokens_per_fill.unwrap().value) / secs)
        }
        _ => Err("blanket"),
    }
}

#[test]
fn two_streams_of_equal_demand_split_the_limit_and_one_alone_takes_it() {
    let config = Config::from_yaml("r.yaml", RULES).unwrap();
    let demands = Arc::new(Demands::default());
    let mut a = Stream::new(Subscription::new(demands.clone(), 1), 8);
    let mut b = Stream::new(Subscription::new(demands.clone(), 2), 8);
    let now = Instant::now();
    a.answer(report("acme", 100, 100), &config, now).unwrap();
    b.answer(report("acme", 100, 100), &config, now).unwrap();
    let answer_a = a.answer(report("acme", 25, 175), &config, now).unwrap();
    let answer_b = b.answer(report("acme", 25, 175), &config, now).unwrap();
    let (ra, rb) = (rate(&answer_a).unwrap(), rate(&answer_b).unwrap());
    assert!(
        (ra - 25.0).abs() < 1.0 && (rb - 25.0).abs() < 1.0,
        "{ra} {rb}"
    );
    // Each answer says the share it sent (the metric's observations).
    for answer in [&answer_a, &answer_b] {
        assert_eq!(answer.shares.len(), 1);
        assert!((answer.shares[0] - 0.5).abs() < 0.01, "{:?}", answer.shares);
    }
    assert!(ra + rb <= 50.0 + 1e-9);
    drop(b);
    let ra = rate(&a.answer(report("acme", 25, 175), &config, now).unwrap()).unwrap();
    assert!((ra - 50.0).abs() < 1e-6, "{ra}");
}

#[test]
fn an_idle_bucket_is_abandoned_and_a_stream_holds_a_bounded_number() {
    let config = Config::from_yaml("r.yaml", RULES).unwrap();
    let demands = Arc::new(Demands::default());
    let mut s = Stream::new(Subscription::new(demands.clone(), 1), 2);
    let now = Instant::now();
    for _ in 1..ABANDON_AFTER {
        let answer = s.answer(report("acme", 0, 0), &config, now).unwrap();
        assert!(rate(&answer).is_ok());
    }
    let answer = s.answer(report("acme", 0, 0), &config, now).unwrap();
    assert_eq!(rate(&answer), Err("abandon"));
    assert_eq!((s.buckets(), demands.buckets()), (0, 0));
    for t in ["a", "b", "c"] {
        s.answer(report(t, 1, 0), &config, now).unwrap();
    }
    let answer = s.answer(report("d", 1, 0), &config, now).unwrap();
    assert_eq!((s.buckets(), answer.refused), (2, 1));
    assert!(answer.response.bucket_action.is_empty());
}

#[test]
fn in_a_fleet_a_limit_not_yet_drawn_is_denied_never_divided_locally() {
    let config = Config::from_yaml("r.yaml", RULES).unwrap();
    let fleet = Arc::new(Fleet::new(
        Arc::new(crate::service::metrics::Metrics::new()),
    ));
    let mut s = Stream::new(Subscription::new(Arc::default(), 1), 8).in_fleet(fleet);
    let answer = s
        .answer(report("acme", 10, 0), &config, Instant::now())
        .unwrap();
    assert_eq!(rate(&answer), Err("blanket"));
    assert_eq!(answer.sent, ["deny_all"]);
}

#[test]
fn a_stream_past_its_bound_names_no_new_bucket_to_draw_for() {
    let config = Config::from_yaml("r.yaml", RULES).unwrap();
    let mut s = Stream::new(Subscription::new(Arc::default(), 1), 2);
    let now = Instant::now();
    for t in ["a", "b"] {
        s.answer(report(t, 1, 0), &config, now).unwrap();
    }
    let tenants = |keys: Vec<BucketKey>| -> Vec<String> {
        keys.into_iter().map(|(_, e)| e[0].1.clone()).collect()
    };
    assert_eq!(
        tenants(s.keys(&report("c", 1, 0), &config)),
        Vec::<String>::new()
    );
    assert_eq!(tenants(s.keys(&report("a", 1, 0), &config)), ["a"]);
}

#[test]
fn bucket_ids_an_rlqs_section_maps_to_one_descriptor_share_its_limit() {
    let rules = format!("{RULES}rlqs:\n  keys: [tenant]\n");
    let config = Config::from_yaml("r.yaml", &rules).unwrap();
    let demands = Arc::new(Demands::default());
    let mut s = Stream::new(Subscription::new(demands.clone(), 1), 8);
    let on_path = |path: &str| {
        let mut r = report("acme", 25, 0);
        let id = r.bucket_quota_usages[0].bucket_id.as_mut().unwrap();
        id.bucket.insert("path".into(), path.into());
        r
    };
    let keys = s.keys(&on_path("/a"), &config);
    assert_eq!(keys[0].1, [("tenant".to_string(), "acme".to_string())]);
    let now = Instant::now();
    for _ in 0..2 {
        s.answer(on_path("/a"), &config, now).unwrap();
        s.answer(on_path("/b"), &config, now).unwrap();
    }
    let a = rate(&s.answer(on_path("/a"), &config, now).unwrap()).unwrap();
    let b = rate(&s.answer(on_path("/b"), &config, now).unwrap()).unwrap();
    // Two Envoy buckets, one rule of 50/s: half each, not 50/s each.
    assert!((a - 25.0).abs() < 1.0 && (b - 25.0).abs() < 1.0, "{a} {b}");
    // Each answer names the bucket id it was asked for, whole.
    let answer = s.answer(on_path("/b"), &config, now).unwrap();
    let id = answer.response.bucket_action[0].bucket_id.as_ref().unwrap();
    assert_eq!(id.bucket["path"], "/b");
    assert_eq!((s.buckets(), demands.buckets()), (2, 1));
}

#[test]
fn in_one_report_a_falling_share_leaves_room_for_a_rising_one() {
    let rules = format!("{RULES}rlqs:\n  keys: [tenant]\n");
    let config = Config::from_yaml("r.yaml", &rules).unwrap();
    let mut s = Stream::new(Subscription::new(Arc::default(), 1), 8);
    let usage = |path: &str| {
        let mut r = report("acme", 50, 50);
        let mut u = r.bucket_quota_usages.remove(0);
        u.bucket_id
            .as_mut()
            .unwrap()
            .bucket
            .insert("path".into(), path.into());
        u
    };
    let both = |first: &str, second: &str| RateLimitQuotaUsageReports {
        domain: "d".into(),
        bucket_quota_usages: vec![usage(first), usage(second)],
    };
    let now = Instant::now();
    // /a alone holds the whole limit.
    let alone = RateLimitQuotaUsageReports {
        domain: "d".into(),
        bucket_quota_usages: vec![usage("/a")],
    };
    s.answer(alone, &config, now).unwrap();
    // /b arrives, named first: /a's share falls before /b's is taken, so both are at
    // half in this one answer (taken in the report's order, /b would get its floor
    // beside /a's whole limit and its half one report later).
    let answer = s.answer(both("/b", "/a"), &config, now).unwrap();
    let rates: Vec<f64> = answer
        .response
        .bucket_action
        .iter()
        .map(|a| {
            let one = Answer {
                response: RateLimitQuotaResponse {
                    bucket_action: vec![a.clone()],
                },
                ..Answer::default()
            };
            rate(&one).unwrap()
        })
        .collect();
    assert!(rates.iter().all(|r| (r - 25.0).abs() < 1.0), "{rates:?}");
}

#[test]
fn the_domain_is_the_first_reports() {
    let config = Config::from_yaml("r.yaml", RULES).unwrap();
    let mut s = Stream::new(Subscription::new(Arc::default(), 1), 2);
    let mut r = report("acme", 1, 0);
    r.domain.clear();
    assert_eq!(
        s.answer(r, &config, Instant::now()).unwrap_err(),
        StreamError::NoDomain
    );
}

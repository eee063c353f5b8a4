//! The answer's shape, case by case from envoyproxy/ratelimit's service tests
//! (`test/service/ratelimit_test.go`; the function each case comes from is named with
//! it): global and per-rule shadow mode, `RateLimit-*` headers, dynamic metadata, a
//! request's own limit override, and the requests it refuses. Upstream mocks its cache;
//! here the statuses come from real buckets on a frozen clock, driven to the state the
//! upstream case starts from.

mod common;

use std::sync::Arc;

use common::server::*;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use shardgate::config::Config;
use shardgate::engine::{Engine, ManualClock, RandomDraw};
use shardgate::service::{AnswerOptions, CallError, RateLimitHeaders, RateLimiter};
use shardgate::store::memory::MemoryStore;

const RULES: &str = r#"
domain: different-domain
descriptors:
  - key: foo
    value: bar
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: daily
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: first
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: second
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  # upstream's quota-domain cases
  - key: regular
    metadata: {name: service_1}
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: quota
    quota_mode: true
    metadata: {name: service_2}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: other_quota
    quota_mode: true
    metadata: {some_other_name: service_2}
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: same_name
    quota_mode: true
    metadata: {name: service_2}
    rate_limit: {unit: minute, requests_per_unit: 5}
"#;

fn limiter(answer: AnswerOptions) -> RateLimiter<MemoryStore> {
    let config = Config::from_yaml("rules.yaml", RULES).unwrap_or_else(|e| panic!("{e}"));
    let engine = Engine::with_parts(
        Arc::new(MemoryStore::new()),
        serve_defaults(),
        Arc::new(ManualClock::new(FROZEN_START_MS)),
        Arc::new(RandomDraw),
    );
    RateLimiter::new(Arc::new(config), Arc::new(engine)).with_answer(answer)
}

async fn answer(l: &RateLimiter<MemoryStore>, req: &RateLimitRequest) -> RateLimitResponse {
    l.should_rate_limit(req)
        .await
        .unwrap_or_else(|e| panic!("{req:?}: {e}"))
}

/// upstream's request: `(foo=bar)` and `(hello=world)`, the first one over its 10/min.
fn foo_and_hello() -> RateLimitRequest {
    request(
        "different-domain",
        vec![desc(&[("foo", "bar")]), desc(&[("hello", "world")])],
    )
}

/// Spends `(foo=bar)`'s ten tokens.
async fn exhaust_foo(l: &RateLimiter<MemoryStore>) {
    let r = answer(
        l,
        &request("different-domain", vec![desc_hits(&[("foo", "bar")], 10)]),
    )
    .await;
    assert_eq!(code(r.overall_code), Code::Ok, "{r:?}");
}

fn codes(r: &RateLimitResponse) -> Vec<Code> {
    r.statuses.iter().map(|s| code(s.code)).collect()
}

fn assert_ten_per_minute(s: &DescriptorStatus) {
    let l = s.current_limit.as_ref().expect("current_limit");
    assert_eq!(
        (l.requests_per_unit, l.unit),
        (10, ProtoUnit::Minute as i32)
    );
}

#[tokio::test]
async fn global_shadow_mode_keeps_each_descriptors_code() {
    // TestServiceGlobalShadowMode: OVER_LIMIT stays in `statuses`, the overall code is
    // OK, and the global_shadow_mode counter moves.
    let l = limiter(AnswerOptions {
        global_shadow: true,
        ..Default::default()
    });
    exhaust_foo(&l).await;
    let r = answer(&l, &foo_and_hello()).await;
    assert_eq!(code(r.overall_code), Code::Ok, "{r:?}");
    assert_eq!(codes(&r), [Code::OverLimit, Code::Ok]);
    assert_ten_per_minute(&r.statuses[0]);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert!(r.statuses[1].current_limit.is_none());
    let metrics = l.metrics().render();
    assert!(
        metrics.contains("\nshardgate_global_shadow_mode_total 1\n"),
        "shardgate_global_shadow_mode_total must be 1:\n{metrics}"
    );

    // Without it, the same request is refused.
    let plain = limiter(AnswerOptions::default());
    exhaust_foo(&plain).await;
    let r = answer(&plain, &foo_and_hello()).await;
    assert_eq!(code(r.overall_code), Code::OverLimit, "{r:?}");
    assert_eq!(codes(&r), [Code::OverLimit, Code::Ok]);
}

#[tokio::test]
async fn rule_shadow_mode_answers_ok() {
    // TestRuleShadowMode: a shadow rule over its limit is reported OK, overall OK.
    let l = limiter(AnswerOptions::default());
    let req = request("different-domain", vec![desc(&[("shadow", "x")])]);
    answer(&l, &req).await;
    let r = answer(&l, &req).await;
    assert_eq!(code(r.overall_code), Code::Ok, "{r:?}");
    assert_eq!(codes(&r), [Code::Ok]);
}

fn header_pairs(r: &RateLimitResponse) -> Vec<(&str, &str)> {
    r.response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect()
}

#[tokio::test]
async fn rate_limit_headers_speak_for_the_refused_descriptor() {
    // TestServiceWithCustomRatelimitHeaders and TestServiceWithDefaultRatelimitHeaders.
    // Upstream's reset is the end of its fixed window (58 s into a minute there); a
    // token bucket's is when the refused request would fit: one token of a 10/min
    // bucket, 6 s and the 1 ms that makes it fit, 7 in whole seconds.
    let custom = RateLimitHeaders {
        limit: "A-Ratelimit-Limit".into(),
        remaining: "A-Ratelimit-Remaining".into(),
        reset: "A-Ratelimit-Reset".into(),
    };
    for names in [custom, RateLimitHeaders::default()] {
        let l = limiter(AnswerOptions {
            headers: Some(names.clone()),
            ..Default::default()
        });
        exhaust_foo(&l).await;
        let r = answer(&l, &foo_and_hello()).await;
        assert_eq!(code(r.overall_code), Code::OverLimit);
        assert_eq!(
            header_pairs(&r),
            [
                (names.limit.as_str(), "10"),
                (names.remaining.as_str(), "0"),
                (names.reset.as_str(), "7"),
            ]
        );
    }
}

#[tokio::test]
async fn rate_limit_headers_on_an_allowed_request_and_none_when_off() {
    let l = limiter(AnswerOptions {
        headers: Some(RateLimitHeaders::default()),
        ..Default::default()
    });
    // One of ten spent: 9 left, full again in 6 s.
    let r = answer(&l, &foo_and_hello()).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(
        header_pairs(&r),
        [
            ("RateLimit-Limit", "10"),
            ("RateLimit-Remaining", "9"),
            ("RateLimit-Reset", "6"),
        ]
    );
    // No descriptor with a limit: no headers (upstream's minimumDescriptor stays nil).
    let r = answer(
        &l,
        &request("different-domain", vec![desc(&[("hello", "world")])]),
    )
    .await;
    assert!(r.response_headers_to_add.is_empty(), "{r:?}");

    let off = limiter(AnswerOptions::default());
    let r = answer(&off, &foo_and_hello()).await;
    assert!(r.response_headers_to_add.is_empty(), "{r:?}");
}

fn string_field<'a>(s: &'a Struct, key: &str) -> Option<&'a str> {
    match s.fields.get(key)?.kind.as_ref()? {
        Kind::StringValue(v) => Some(v),
        _ => None,
    }
}

fn struct_field<'a>(s: &'a Struct, key: &str) -> Option<&'a Struct> {
    match s.fields.get(key)?.kind.as_ref()? {
        Kind::StructValue(v) => Some(v),
        _ => None,
    }
}

fn list_field<'a>(s: &'a Struct, key: &str) -> &'a [Value] {
    match s.fields.get(key).and_then(|v| v.kind.as_ref()) {
        Some(Kind::ListValue(l)) => &l.values,
        other => panic!("{key} is not a list: {other:?}"),
    }
}

fn with_metadata() -> RateLimiter<MemoryStore> {
    limiter(AnswerOptions {
        dynamic_metadata: true,
        ..Default::default()
    })
}

fn quota_request(second: &str) -> RateLimitRequest {
    request(
        "different-domain",
        vec![desc(&[("regular", "limit")]), desc(&[(second, "limit")])],
    )
}

#[tokio::test]
async fn metadata_comes_from_passed_descriptors_only() {
    // TestMetadataReturnedForPassedDescriptors: the quota descriptor is over, so only
    // the first descriptor's metadata is returned.
    let l = with_metadata();
    answer(
        &l,
        &request(
            "different-domain",
            vec![desc_hits(&[("quota", "limit")], 5)],
        ),
    )
    .await;
    let r = answer(&l, &quota_request("quota")).await;
    assert_eq!(
        code(r.overall_code),
        Code::OverLimit,
        "all quota descriptors over"
    );
    assert_eq!(codes(&r), [Code::Ok, Code::OverLimit]);
    let meta = r.dynamic_metadata.as_ref().expect("dynamic metadata");
    let passed = struct_field(meta, "metadata").expect("metadata of passed descriptors");
    assert_eq!(string_field(passed, "name"), Some("service_1"));
    assert_eq!(passed.fields.len(), 1);
}

#[tokio::test]
async fn metadata_of_all_passed_descriptors_is_merged_first_value_first() {
    // TestMetadataReturnedForAllPassedDescriptors.
    let l = with_metadata();
    let r = answer(&l, &quota_request("other_quota")).await;
    let passed = struct_field(r.dynamic_metadata.as_ref().unwrap(), "metadata").unwrap();
    assert_eq!(string_field(passed, "name"), Some("service_1"));
    assert_eq!(string_field(passed, "some_other_name"), Some("service_2"));

    // TestOverlappingMetadataReturnsTheFirstValue.
    let r = answer(&l, &quota_request("same_name")).await;
    let passed = struct_field(r.dynamic_metadata.as_ref().unwrap(), "metadata").unwrap();
    assert_eq!(string_field(passed, "name"), Some("service_1"));
}

#[tokio::test]
async fn metadata_describes_the_request_and_is_sent_only_when_asked() {
    // upstream's ratelimitToMetadata: domain, each descriptor's entries as key=value, its
    // limit override and hits_addend when set, the request's hits_addend when not zero.
    let l = with_metadata();
    let mut req = request(
        "different-domain",
        vec![
            desc_hits(&[("foo", "bar")], 2),
            RateLimitDescriptor {
                limit: Some(RateLimitOverride {
                    requests_per_unit: 7,
                    unit: ProtoUnit::Hour as i32,
                }),
                ..desc(&[("a", "1"), ("b", "2")])
            },
        ],
    );
    req.hits_addend = 3;
    let r = answer(&l, &req).await;
    let meta = r.dynamic_metadata.as_ref().expect("dynamic metadata");
    assert_eq!(string_field(meta, "domain"), Some("different-domain"));
    assert!(matches!(
        meta.fields.get("hitsAddend").and_then(|v| v.kind.as_ref()),
        Some(Kind::NumberValue(n)) if *n == 3.0
    ));
    let descriptors = list_field(meta, "descriptors");
    assert_eq!(descriptors.len(), 2);
    let d = |i: usize| match descriptors[i].kind.as_ref() {
        Some(Kind::StructValue(s)) => s,
        other => panic!("descriptor {i}: {other:?}"),
    };
    let entries = |s: &Struct| -> Vec<String> {
        list_field(s, "entries")
            .iter()
            .map(|v| match v.kind.as_ref() {
                Some(Kind::StringValue(e)) => e.clone(),
                other => panic!("{other:?}"),
            })
            .collect()
    };
    assert_eq!(entries(d(0)), ["foo=bar"]);
    assert!(matches!(
        d(0).fields.get("hitsAddend").and_then(|v| v.kind.as_ref()),
        Some(Kind::NumberValue(n)) if *n == 2.0
    ));
    assert_eq!(entries(d(1)), ["a=1", "b=2"]);
    assert_eq!(
        string_field(d(1), "limit"),
        Some("requests_per_unit:7 unit:HOUR")
    );
    assert!(
        !meta.fields.contains_key("metadata"),
        "no passed rule has metadata"
    );

    // An unknown domain is described too.
    let r = answer(&l, &request("nowhere", vec![desc(&[("k", "v")])])).await;
    let meta = r.dynamic_metadata.as_ref().expect("dynamic metadata");
    assert_eq!(string_field(meta, "domain"), Some("nowhere"));

    // Off by default.
    let r = answer(&limiter(AnswerOptions::default()), &quota_request("quota")).await;
    assert!(r.dynamic_metadata.is_none(), "{r:?}");
}

#[tokio::test]
async fn a_request_limit_override_has_no_name() {
    // upstream's GetLimit builds an override's limit with an empty name.
    let l = limiter(AnswerOptions::default());
    let d = RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit: 10,
            unit: ProtoUnit::Minute as i32,
        }),
        ..desc(&[("foo", "bar")])
    };
    let r = answer(&l, &request("different-domain", vec![d])).await;
    let limit = r.statuses[0].current_limit.as_ref().expect("current_limit");
    assert_eq!(limit.name, "");
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (10, ProtoUnit::Minute as i32)
    );
    assert_eq!(r.statuses[0].limit_remaining, 9);
}

#[tokio::test]
async fn descriptors_envoy_never_sends_are_refused_whole() {
    // TestEmptyDomain and TestEmptyDescriptors: upstream refuses both as errors. A
    // descriptor with no entries or an entry with an empty key (which Envoy's proto
    // validation forbids) is refused the same way here, where upstream answers that one
    // descriptor OK (docs/configuration.md, "Differences from envoyproxy/ratelimit").
    let l = limiter(AnswerOptions::default());
    let refused = |req: RateLimitRequest| {
        let l = &l;
        async move {
            match l.should_rate_limit(&req).await {
                Err(CallError::InvalidArgument(m)) => m,
                other => panic!("{req:?} must be INVALID_ARGUMENT: {other:?}"),
            }
        }
    };
    assert_eq!(
        refused(request("", vec![desc(&[("foo", "bar")])])).await,
        "domain must not be empty"
    );
    assert_eq!(
        refused(request("different-domain", vec![])).await,
        "descriptors must not be empty"
    );
    assert_eq!(
        refused(request(
            "different-domain",
            vec![desc(&[("foo", "bar")]), desc(&[])]
        ))
        .await,
        "descriptors[1].entries must not be empty"
    );
    assert_eq!(
        refused(request("different-domain", vec![desc(&[("", "v")])])).await,
        "descriptors[0].entries[0].key must not be empty"
    );
}

#[tokio::test]
async fn the_same_descriptor_twice_draws_twice_at_once() {
    // An intentional difference (docs/configuration.md): upstream increments its counter
    // once per descriptor and answers [OK, OVER_LIMIT]; here both draw on one bucket in
    // one all-or-nothing decision, which two tokens do not fit.
    let l = limiter(AnswerOptions::default());
    let twice = request(
        "different-domain",
        vec![desc(&[("daily", "x")]), desc(&[("daily", "x")])],
    );
    let r = answer(&l, &twice).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(codes(&r), [Code::OverLimit, Code::OverLimit]);
    // Nothing was debited: the one token is still there for one descriptor.
    let once = request("different-domain", vec![desc(&[("daily", "x")])]);
    assert_eq!(codes(&answer(&l, &once).await), [Code::Ok]);
}

/// `(first=x)` (10/min) and `(second=x)` (5/min), neither in quota mode in the config.
fn first_and_second() -> RateLimitRequest {
    request(
        "different-domain",
        vec![desc(&[("first", "x")]), desc(&[("second", "x")])],
    )
}

async fn spend(l: &RateLimiter<MemoryStore>, key: &str, hits: u64) {
    let r = answer(
        l,
        &request("different-domain", vec![desc_hits(&[(key, "x")], hits)]),
    )
    .await;
    assert_eq!(codes(&r), [Code::Ok], "{r:?}");
}

#[tokio::test]
async fn global_quota_mode_refuses_only_when_every_descriptor_is_over() {
    // TestServiceGlobalQuotaMode: both over, the request is refused.
    let l = limiter(AnswerOptions::default()).with_global_quota(true);
    spend(&l, "first", 10).await;
    spend(&l, "second", 5).await;
    let r = answer(&l, &first_and_second()).await;
    assert_eq!(code(r.overall_code), Code::OverLimit, "{r:?}");
    assert_eq!(codes(&r), [Code::OverLimit, Code::OverLimit]);

    // TestServiceQuotaModeOnlySomeOverTheLimit: one over, the request passes.
    let l = limiter(AnswerOptions::default()).with_global_quota(true);
    spend(&l, "first", 10).await;
    let r = answer(&l, &first_and_second()).await;
    assert_eq!(code(r.overall_code), Code::Ok, "{r:?}");
    assert_eq!(codes(&r), [Code::OverLimit, Code::Ok]);

    // Without it the same state refuses the request.
    let l = limiter(AnswerOptions::default());
    spend(&l, "first", 10).await;
    let r = answer(&l, &first_and_second()).await;
    assert_eq!(code(r.overall_code), Code::OverLimit, "{r:?}");
}

#[tokio::test]
async fn global_quota_mode_with_global_shadow_mode() {
    // TestServiceQuotaModeWithShadowMode: both over, shadow mode answers OK overall and
    // each descriptor keeps OVER_LIMIT.
    let l = limiter(AnswerOptions {
        global_shadow: true,
        ..Default::default()
    })
    .with_global_quota(true);
    spend(&l, "first", 10).await;
    spend(&l, "second", 5).await;
    let r = answer(&l, &first_and_second()).await;
    assert_eq!(code(r.overall_code), Code::Ok, "{r:?}");
    assert_eq!(codes(&r), [Code::OverLimit, Code::OverLimit]);
}

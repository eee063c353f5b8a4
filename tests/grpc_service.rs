//! The gRPC service end to end: a real server on a loopback port, Envoy's generated client,
//! and the answers config.md promises — statuses, remaining tokens, reset durations,
//! all-or-nothing, cascade, composite buckets, request rules, health and reflection.
//!
//! Arithmetic is checked exactly on a frozen clock (token-bucket math: a 10/min bucket
//! refills one token every 6 s, so after k requests it is full again in k × 6 s; a refused
//! request waits for its deficit plus 1 ms), and once more on the system clock with the
//! ranges that the elapsed milliseconds allow.

mod common;

use std::time::Instant;

use common::server::*;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use prost::Message;
use shardgate::engine::EngineStats;
use shardgate::store::BucketKey;
use tokio_stream::StreamExt;

const USER_10_PER_MINUTE: &str = "
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10, name: user_rpm}
  - key: global
    rate_limit: {unit: minute, requests_per_unit: 1, name: global_rpm}
";

fn assert_limit(s: &DescriptorStatus, name: &str, rpu: u32, unit: ProtoUnit) {
    let l = s
        .current_limit
        .as_ref()
        .unwrap_or_else(|| panic!("expected current_limit {name}: {s:?}"));
    assert_eq!(
        (l.name.as_str(), l.requests_per_unit, l.unit),
        (name, rpu, unit as i32),
        "current_limit of {s:?}"
    );
}

/// Balance of one limit on shard 0 of a bucket item, in millitokens.
fn stored_tk(server: &TestServer, entity: &str, resource: &str, limit: &str) -> i64 {
    let item = server
        .store
        .get(&BucketKey::new(entity, resource, 0))
        .unwrap_or_else(|| panic!("no bucket item {entity}#{resource}#0"));
    item.limit(limit)
        .unwrap_or_else(|| panic!("item {entity}#{resource}#0 has no limit {limit}: {item:?}"))
        .balance
}

// ---------------------------------------------------------------------------------------
// N per minute: exactly N admitted, then refused; remaining and reset per the spec.
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn ten_per_minute_admits_exactly_ten_then_refuses_with_spec_remaining_and_reset() {
    let server = TestServer::start(USER_10_PER_MINUTE).await;
    let mut c = server.client().await;
    let start = Instant::now();
    // Slack for the server's millisecond clock ticking independently of ours.
    let elapsed_ms = || start.elapsed().as_millis() as i64 + 2;
    for k in 1..=10i64 {
        let r = c.ok(one("api", &[("user", "alice")])).await;
        let s = &r.statuses[0];
        assert_eq!(code(r.overall_code), Code::Ok, "request {k}: {r:?}");
        assert_eq!(code(s.code), Code::Ok, "request {k}: {s:?}");
        assert_limit(s, "user_rpm", 10, ProtoUnit::Minute);
        let e = elapsed_ms();
        assert!(e < 6_000, "too slow to judge: one token refills every 6 s");
        assert_eq!(s.limit_remaining, (10 - k) as u32, "request {k}: {s:?}");
        // Full again after k × 6 s, less whatever has trickled back in since the bucket
        // was created (10 tokens/min = 1 token per 6000 ms: at most `e` ms' worth).
        let reset = reset_ms(s);
        assert!(
            (k * 6_000 - e..=k * 6_000).contains(&reset),
            "request {k}: reset {reset} ms not in {}..={} ms",
            k * 6_000 - e,
            k * 6_000
        );
    }
    let r = c.ok(one("api", &[("user", "alice")])).await;
    let s = &r.statuses[0];
    assert_eq!(code(r.overall_code), Code::OverLimit, "{r:?}");
    assert_eq!(code(s.code), Code::OverLimit, "{s:?}");
    assert_eq!(s.limit_remaining, 0);
    assert_limit(s, "user_rpm", 10, ProtoUnit::Minute);
    // One token's refill time (6000 ms) less what has trickled in, plus the 1 ms guard.
    let (reset, e) = (reset_ms(s), elapsed_ms());
    assert!(
        (6_001 - e..=6_001).contains(&reset),
        "over-limit reset {reset} ms not in {}..=6001 ms",
        6_001 - e
    );
    // Another user has a bucket of their own.
    let r = c.ok(one("api", &[("user", "bob")])).await;
    assert_eq!(code(r.statuses[0].code), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 9);
}

#[tokio::test]
async fn frozen_clock_remaining_and_reset_follow_the_token_bucket_exactly() {
    let server = TestServer::start_frozen(USER_10_PER_MINUTE).await;
    let mut c = server.client().await;
    let alice = || one("api", &[("user", "alice")]);
    for k in 1..=10i64 {
        let s = c.ok(alice()).await.statuses[0].clone();
        assert_eq!(code(s.code), Code::Ok, "request {k}");
        assert_eq!(s.limit_remaining, (10 - k) as u32, "request {k}");
        assert_eq!(
            reset_ms(&s),
            k * 6_000,
            "request {k}: full again after k × 6 s"
        );
    }
    let s = c.ok(alice()).await.statuses[0].clone();
    assert_eq!((code(s.code), s.limit_remaining), (Code::OverLimit, 0));
    assert_eq!(reset_ms(&s), 6_001, "one token's refill + 1 ms");

    server.advance(3_000); // half a token back: still refused, half the wait left
    let s = c.ok(alice()).await.statuses[0].clone();
    assert_eq!((code(s.code), s.limit_remaining), (Code::OverLimit, 0));
    assert_eq!(reset_ms(&s), 3_001);

    server.advance(3_000); // one whole token: admitted, bucket empty again
    let s = c.ok(alice()).await.statuses[0].clone();
    assert_eq!((code(s.code), s.limit_remaining), (Code::Ok, 0));
    assert_eq!(
        reset_ms(&s),
        60_000,
        "an empty 10/min bucket is full after 60 s"
    );
    let s = c.ok(alice()).await.statuses[0].clone();
    assert_eq!(code(s.code), Code::OverLimit);

    server.advance(10 * 60_000); // long idle: refill stops at the capacity (10)
    let s = c.ok(alice()).await.statuses[0].clone();
    assert_eq!((code(s.code), s.limit_remaining), (Code::Ok, 9));
    assert_eq!(reset_ms(&s), 6_000);
}

// ---------------------------------------------------------------------------------------
// Several descriptors in one request.
// ---------------------------------------------------------------------------------------

const THREE_UNITS: &str = "
domain: order
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1, name: a_rpm}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 5, name: b_rps}
  - key: c
    rate_limit: {unit: hour, requests_per_unit: 3, name: c_rph}
";

#[tokio::test]
async fn statuses_come_back_in_request_order_with_each_descriptors_own_limit() {
    let server = TestServer::start_frozen(THREE_UNITS).await;
    let mut c = server.client().await;
    assert_eq!(
        code(c.ok(one("order", &[("a", "1")])).await.overall_code),
        Code::Ok
    );

    let r = c
        .ok(request(
            "order",
            vec![
                desc(&[("c", "1")]),
                desc(&[("x", "no rule")]),
                desc(&[("a", "1")]),
                desc(&[("b", "1")]),
            ],
        ))
        .await;
    assert_eq!(code(r.overall_code), Code::OverLimit, "{r:?}");
    let s = &r.statuses;
    assert_eq!(code(s[0].code), Code::Ok);
    assert_limit(&s[0], "c_rph", 3, ProtoUnit::Hour);
    assert_eq!(
        s[0].limit_remaining, 3,
        "refused request took nothing from c"
    );
    assert_eq!(code(s[1].code), Code::Ok);
    assert_eq!(s[1].current_limit, None, "no rule matches x");
    assert_eq!(code(s[2].code), Code::OverLimit);
    assert_limit(&s[2], "a_rpm", 1, ProtoUnit::Minute);
    assert_eq!((s[2].limit_remaining, reset_ms(&s[2])), (0, 60_001));
    assert_eq!(code(s[3].code), Code::Ok);
    assert_limit(&s[3], "b_rps", 5, ProtoUnit::Second);
    assert_eq!(
        s[3].limit_remaining, 5,
        "refused request took nothing from b"
    );

    // Reversed order, admitted: statuses follow the new order and both are debited once.
    let r = c
        .ok(request(
            "order",
            vec![desc(&[("b", "1")]), desc(&[("c", "1")])],
        ))
        .await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_limit(&r.statuses[0], "b_rps", 5, ProtoUnit::Second);
    assert_eq!(r.statuses[0].limit_remaining, 4);
    assert_eq!(reset_ms(&r.statuses[0]), 200, "5/s: one token per 200 ms");
    assert_limit(&r.statuses[1], "c_rph", 3, ProtoUnit::Hour);
    assert_eq!(r.statuses[1].limit_remaining, 2);
    assert_eq!(
        reset_ms(&r.statuses[1]),
        1_200_000,
        "3/h: one token per 20 min"
    );
}

#[tokio::test]
async fn over_limit_descriptor_takes_nothing_from_the_other_descriptors() {
    let server = TestServer::start_frozen(USER_10_PER_MINUTE).await;
    let mut c = server.client().await;
    for _ in 0..3 {
        c.ok(one("api", &[("user", "alice")])).await;
    }
    assert_eq!(
        c.ok(one("api", &[("global", "all")])).await.statuses[0].limit_remaining,
        0
    );

    let both = || {
        request(
            "api",
            vec![desc(&[("user", "alice")]), desc(&[("global", "all")])],
        )
    };
    let r = c.ok(both()).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(code(r.statuses[0].code), Code::Ok);
    assert_eq!(
        r.statuses[0].limit_remaining, 7,
        "alice's balance, untouched"
    );
    assert_eq!(code(r.statuses[1].code), Code::OverLimit);
    assert_eq!(
        (r.statuses[1].limit_remaining, reset_ms(&r.statuses[1])),
        (0, 60_001)
    );
    for attempt in 2..=4 {
        let r = c.ok(both()).await;
        assert_eq!(code(r.overall_code), Code::OverLimit, "attempt {attempt}");
        assert_eq!(
            code(r.statuses[1].code),
            Code::OverLimit,
            "attempt {attempt}"
        );
    }
    // alice's bucket still holds 7: the refused requests took nothing from it.
    assert_eq!(stored_tk(&server, "user=alice", "api", "user_rpm"), 7_000);
    let r = c.ok(one("api", &[("user", "alice")])).await;
    assert_eq!(r.statuses[0].limit_remaining, 6);
}

/// A client retrying a refused request keeps being told each passing descriptor's real
/// balance (docs/architecture.md, "Statuses": whole tokens left after this request). alice's bucket was never
/// short, so the rejection cache holds no image of it and the first refusal goes to the
/// store: it refunds alice's speculative debit and keeps her image, credited. The retries
/// are refused from the cache, which reports alice from that image.
#[tokio::test]
async fn retried_refused_request_keeps_reporting_the_siblings_real_balance() {
    let server = TestServer::start_frozen(USER_10_PER_MINUTE).await;
    let mut c = server.client().await;
    for _ in 0..3 {
        c.ok(one("api", &[("user", "alice")])).await;
    }
    c.ok(one("api", &[("global", "all")])).await;
    for attempt in 1..=3 {
        let r = c
            .ok(request(
                "api",
                vec![desc(&[("user", "alice")]), desc(&[("global", "all")])],
            ))
            .await;
        assert_eq!(code(r.overall_code), Code::OverLimit, "attempt {attempt}");
        let alice = &r.statuses[0];
        assert_eq!(
            (code(alice.code), alice.limit_remaining, reset_ms(alice)),
            (Code::Ok, 7, 18_000),
            "attempt {attempt}: alice holds 7 tokens, full in 3 × 6 s: {alice:?}"
        );
    }
}

/// A refused request reports every passing descriptor's real balance (docs/architecture.md, "Statuses":
/// whole tokens left after this request — nothing was taken), also when the refusal came
/// from the rejection cache and the sibling's cached image is older than the cache lifetime.
#[tokio::test]
async fn refused_request_reports_a_siblings_real_balance_when_the_rejection_cache_refuses() {
    let server = TestServer::start_frozen(USER_10_PER_MINUTE).await;
    let mut c = server.client().await;
    for _ in 0..3 {
        c.ok(one("api", &[("user", "alice")])).await; // alice: 7 left
    }
    server.advance(2_000); // alice's last image is now older than the 1 s cache
    assert_eq!(
        code(c.ok(one("api", &[("global", "all")])).await.overall_code),
        Code::Ok
    );
    assert_eq!(
        code(c.ok(one("api", &[("global", "all")])).await.overall_code),
        Code::OverLimit
    ); // global's refused image is now fresh in the cache

    let r = c
        .ok(request(
            "api",
            vec![desc(&[("user", "alice")]), desc(&[("global", "all")])],
        ))
        .await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(code(r.statuses[1].code), Code::OverLimit);
    let alice = &r.statuses[0];
    assert_eq!(code(alice.code), Code::Ok);
    // 7 tokens + 2 s of refill (1/3 token) → 7 whole tokens; full in (3 − 1/3) × 6 s =
    // 16 s, give or take the millitoken rounding (333 of 1000: 16.002 s).
    assert_eq!(alice.limit_remaining, 7, "alice's real balance: {alice:?}");
    assert!(
        (16_000..=16_002).contains(&reset_ms(alice)),
        "alice's status in a refused request must show her real balance: {alice:?}"
    );
}

/// Same promise as above, on the fast path: the sibling's stored balance is short but a
/// refill covers it (so it needed a slow pass), while the other descriptor is refused.
#[tokio::test]
async fn refused_request_reports_a_siblings_real_balance_when_that_sibling_needed_a_refill() {
    let server = TestServer::start_frozen(USER_10_PER_MINUTE).await;
    let mut c = server.client().await;
    let r = c
        .ok(request("api", vec![desc_hits(&[("user", "alice")], 10)]))
        .await;
    assert_eq!(r.statuses[0].limit_remaining, 0);
    server.advance(6_000); // one token back for alice (not yet materialised in the store)
    c.ok(one("api", &[("global", "all")])).await; // global: 0 left

    let r = c
        .ok(request(
            "api",
            vec![desc(&[("user", "alice")]), desc(&[("global", "all")])],
        ))
        .await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    let alice = &r.statuses[0];
    assert_eq!(code(alice.code), Code::Ok);
    assert_eq!(
        (alice.limit_remaining, reset_ms(alice)),
        (1, 54_000),
        "alice holds 1 token (full in 9 × 6 s): {alice:?}"
    );
    // And nothing was taken: her one token is still there.
    let r = c.ok(one("api", &[("user", "alice")])).await;
    assert_eq!(
        (code(r.statuses[0].code), r.statuses[0].limit_remaining),
        (Code::Ok, 0)
    );
}

// ---------------------------------------------------------------------------------------
// Cascade (docs/configuration.md, "Cascade").
// ---------------------------------------------------------------------------------------

fn cascade_config(parent_rpm: u32, child_rpm: u32) -> String {
    format!(
        "
domain: edge
descriptors:
  - key: tenant
    rate_limit: {{unit: minute, requests_per_unit: {parent_rpm}, name: tenant_rpm}}
    descriptors:
      - key: api_key
        cascade: true
        rate_limit: {{unit: minute, requests_per_unit: {child_rpm}, name: key_rpm}}
"
    )
}

#[tokio::test]
async fn cascade_parent_exhausted_refuses_the_child_and_the_child_keeps_its_tokens() {
    let server = TestServer::start_frozen(&cascade_config(3, 10)).await;
    let mut c = server.client().await;
    let k1 = || one("edge", &[("tenant", "acme"), ("api_key", "k1")]);
    for k in 1..=3i64 {
        let s = c.ok(k1()).await.statuses[0].clone();
        assert_eq!(code(s.code), Code::Ok, "request {k}");
        // The tighter of child (10 − k) and parent (3 − k) speaks.
        assert_eq!(s.limit_remaining, (3 - k) as u32, "request {k}: {s:?}");
        assert_limit(&s, "tenant_rpm", 3, ProtoUnit::Minute);
        // Full again when both are: the parent needs k × 20 s, the child k × 6 s.
        assert_eq!(reset_ms(&s), k * 20_000, "request {k}");
    }
    let s = c.ok(k1()).await.statuses[0].clone();
    assert_eq!(
        code(s.code),
        Code::OverLimit,
        "4th request: parent is empty"
    );
    assert_limit(&s, "tenant_rpm", 3, ProtoUnit::Minute);
    assert_eq!((s.limit_remaining, reset_ms(&s)), (0, 20_001));

    // All or nothing: the refused 4th request left the child at 7, the parent at 0.
    assert_eq!(
        stored_tk(&server, "tenant=acme/api_key=k1", "edge", "key_rpm"),
        7_000
    );
    assert_eq!(stored_tk(&server, "tenant=acme", "edge", "tenant_rpm"), 0);

    // Another key of the same tenant shares the parent; another tenant does not.
    let r = c
        .ok(one("edge", &[("tenant", "acme"), ("api_key", "k2")]))
        .await;
    assert_eq!(code(r.statuses[0].code), Code::OverLimit);
    assert_limit(&r.statuses[0], "tenant_rpm", 3, ProtoUnit::Minute);
    let r = c
        .ok(one("edge", &[("tenant", "globex"), ("api_key", "k1")]))
        .await;
    assert_eq!(
        (code(r.statuses[0].code), r.statuses[0].limit_remaining),
        (Code::Ok, 2)
    );
}

#[tokio::test]
async fn cascade_child_exhausted_refuses_without_debiting_the_parent() {
    let server = TestServer::start_frozen(&cascade_config(5, 2)).await;
    let mut c = server.client().await;
    let k1 = || one("edge", &[("tenant", "acme"), ("api_key", "k1")]);
    for k in 1..=2u32 {
        let s = c.ok(k1()).await.statuses[0].clone();
        assert_eq!(code(s.code), Code::Ok);
        assert_eq!(s.limit_remaining, 2 - k, "child is the tighter one");
        assert_limit(&s, "key_rpm", 2, ProtoUnit::Minute);
    }
    let s = c.ok(k1()).await.statuses[0].clone();
    assert_eq!(code(s.code), Code::OverLimit);
    assert_limit(&s, "key_rpm", 2, ProtoUnit::Minute);
    assert_eq!((s.limit_remaining, reset_ms(&s)), (0, 30_001));

    // The parent was debited by the two admitted requests only: 5 − 2 = 3, and a request
    // on the tenant alone (which matches the parent rule) leaves 2.
    assert_eq!(
        stored_tk(&server, "tenant=acme", "edge", "tenant_rpm"),
        3_000
    );
    let r = c.ok(one("edge", &[("tenant", "acme")])).await;
    assert_limit(&r.statuses[0], "tenant_rpm", 5, ProtoUnit::Minute);
    assert_eq!(
        (code(r.statuses[0].code), r.statuses[0].limit_remaining),
        (Code::Ok, 2)
    );
}

// ---------------------------------------------------------------------------------------
// Composite bucket: rpm + tpm on one item (docs/configuration.md, "Buckets").
// ---------------------------------------------------------------------------------------

const LLM: &str = "
domain: llm
descriptors:
  - key: tenant
    descriptors:
      - key: model
        descriptors:
          - key: kind
            value: requests
            entity: '{tenant}/{model}'
            rate_limit: {unit: minute, requests_per_unit: 3, name: rpm}
          - key: kind
            value: tokens
            entity: '{tenant}/{model}'
            rate_limit: {unit: minute, requests_per_unit: 1000, name: tpm}
";

fn llm_call(
    model: &str,
    tokens: u64,
) -> envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest {
    request(
        "llm",
        vec![
            desc(&[("tenant", "acme"), ("model", model), ("kind", "requests")]),
            desc_hits(
                &[("tenant", "acme"), ("model", model), ("kind", "tokens")],
                tokens,
            ),
        ],
    )
}

#[tokio::test]
async fn composite_rpm_and_tpm_share_one_bucket_item_debited_together() {
    let server = TestServer::start_frozen(LLM).await;
    let mut c = server.client().await;
    let fast_hits = || EngineStats::get(&server.limiter.engine().stats().fast_path_hits);

    let r = c.ok(llm_call("gpt", 400)).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_limit(&r.statuses[0], "rpm", 3, ProtoUnit::Minute);
    assert_eq!(
        (r.statuses[0].limit_remaining, reset_ms(&r.statuses[0])),
        (2, 20_000)
    );
    assert_limit(&r.statuses[1], "tpm", 1000, ProtoUnit::Minute);
    // 400 tokens at 1000/min = 60 ms per token.
    assert_eq!(
        (r.statuses[1].limit_remaining, reset_ms(&r.statuses[1])),
        (600, 24_000)
    );
    assert_eq!(server.store.len(), 1, "one item holds both limits");

    let before = fast_hits();
    let r = c.ok(llm_call("gpt", 400)).await;
    assert_eq!(
        fast_hits() - before,
        1,
        "both limits debited by one item write"
    );
    assert_eq!(r.statuses[0].limit_remaining, 1);
    assert_eq!(r.statuses[1].limit_remaining, 200);

    // 400 tokens no longer fit: refused whole, the request count is not taken either.
    let r = c.ok(llm_call("gpt", 400)).await;
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(
        (code(r.statuses[0].code), r.statuses[0].limit_remaining),
        (Code::Ok, 1)
    );
    assert_eq!(
        (code(r.statuses[1].code), r.statuses[1].limit_remaining),
        (Code::OverLimit, 200)
    );
    assert_eq!(
        reset_ms(&r.statuses[1]),
        200 * 60 + 1,
        "200 missing tokens + 1 ms"
    );

    let r = c.ok(llm_call("gpt", 200)).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, 0);
    assert_eq!(r.statuses[1].limit_remaining, 0);
    assert_eq!(stored_tk(&server, "acme/gpt", "llm", "rpm"), 0);
    assert_eq!(stored_tk(&server, "acme/gpt", "llm", "tpm"), 0);

    // Another model is another bucket.
    let r = c.ok(llm_call("mini", 10)).await;
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(r.statuses[1].limit_remaining, 990);
    assert_eq!(server.store.len(), 2);
}

// ---------------------------------------------------------------------------------------
// hits_addend: a descriptor's own, else the request's, else 1.
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn hits_addend_descriptor_level_overrides_request_level_and_zero_only_checks() {
    let server = TestServer::start_frozen(USER_10_PER_MINUTE).await;
    let mut c = server.client().await;
    let alice = &[("user", "alice")];
    let with_request_hits = |d, hits| {
        let mut r = request("api", vec![d]);
        r.hits_addend = hits;
        r
    };

    let s = c.ok(with_request_hits(desc(alice), 3)).await.statuses[0].clone();
    assert_eq!(
        (s.limit_remaining, reset_ms(&s)),
        (7, 18_000),
        "request-level 3"
    );

    let s = c
        .ok(with_request_hits(desc_hits(alice, 2), 5))
        .await
        .statuses[0]
        .clone();
    assert_eq!(
        s.limit_remaining, 5,
        "descriptor-level 2 wins over request-level 5"
    );

    for _ in 0..3 {
        let s = c
            .ok(with_request_hits(desc_hits(alice, 0), 4))
            .await
            .statuses[0]
            .clone();
        assert_eq!(code(s.code), Code::Ok);
        assert_eq!(
            s.limit_remaining, 5,
            "hits_addend 0 checks without consuming"
        );
    }

    let s = c.ok(with_request_hits(desc(alice), 0)).await.statuses[0].clone();
    assert_eq!(s.limit_remaining, 4, "request-level 0 means 1");

    let s = c.ok(with_request_hits(desc(alice), 5)).await.statuses[0].clone();
    assert_eq!(
        code(s.code),
        Code::OverLimit,
        "5 hits do not fit in 4 tokens"
    );
    assert_eq!((s.limit_remaining, reset_ms(&s)), (4, 6_001));
    let s = c.ok(with_request_hits(desc(alice), 4)).await.statuses[0].clone();
    assert_eq!(
        (code(s.code), s.limit_remaining),
        (Code::Ok, 0),
        "the refused 5 took nothing"
    );
}

/// A request whose hits can never fit (more than the limit's whole burst) is refused with
/// no `duration_until_reset` at all, as docs/architecture.md ("Statuses") says: no wait
/// would pay off, and a 0 would tell Envoy to retry at once. The bucket is left whole,
/// and a refusal that a wait does cure still quotes its wait.
#[tokio::test]
async fn hits_that_can_never_fit_are_refused_with_no_reset_quoted() {
    let server = TestServer::start_frozen(USER_10_PER_MINUTE).await;
    let mut c = server.client().await;
    let alice = &[("user", "alice")];

    let s = c
        .ok(request("api", vec![desc_hits(alice, 11)]))
        .await
        .statuses[0]
        .clone();
    assert_eq!((code(s.code), s.limit_remaining), (Code::OverLimit, 10));
    assert_eq!(
        s.duration_until_reset, None,
        "11 hits never fit 10/min: {s:?}"
    );

    let s = c
        .ok(request("api", vec![desc_hits(alice, 10)]))
        .await
        .statuses[0]
        .clone();
    assert_eq!(
        (code(s.code), s.limit_remaining),
        (Code::Ok, 0),
        "nothing was taken"
    );
    let s = c
        .ok(request("api", vec![desc_hits(alice, 1)]))
        .await
        .statuses[0]
        .clone();
    assert_eq!(code(s.code), Code::OverLimit);
    assert_eq!(reset_ms(&s), 6_001, "one token's refill + 1 ms");
}

#[tokio::test]
async fn request_level_hits_addend_applies_to_every_descriptor() {
    let server = TestServer::start_frozen(USER_10_PER_MINUTE).await;
    let mut c = server.client().await;
    let mut r = request(
        "api",
        vec![desc(&[("user", "alice")]), desc(&[("user", "bob")])],
    );
    r.hits_addend = 4;
    let r = c.ok(r).await;
    assert_eq!(r.statuses[0].limit_remaining, 6);
    assert_eq!(r.statuses[1].limit_remaining, 6);
}

// ---------------------------------------------------------------------------------------
// Request rules: domains, empty requests, unlimited, shadow, replaces and overrides.
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn unknown_domain_answers_ok_without_limits_and_touches_no_bucket() {
    let server = TestServer::start(USER_10_PER_MINUTE).await;
    let mut c = server.client().await;
    for _ in 0..3 {
        let r = c
            .ok(request(
                "no-such-domain",
                vec![desc(&[("user", "alice")]), desc(&[("global", "all")])],
            ))
            .await;
        assert_eq!(code(r.overall_code), Code::Ok);
        for s in &r.statuses {
            assert_eq!(code(s.code), Code::Ok);
            assert_eq!(s.current_limit, None, "{s:?}");
        }
    }
    assert!(server.store.is_empty(), "no bucket was created");
}

#[tokio::test]
async fn empty_domain_or_empty_descriptor_list_is_invalid_argument() {
    let server = TestServer::start(USER_10_PER_MINUTE).await;
    let mut c = server.client().await;

    let e = c
        .call(request("", vec![desc(&[("user", "alice")])]))
        .await
        .expect_err("empty domain must be refused");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("domain"),
        "message names the field: {e:?}"
    );

    let e = c
        .call(request("api", vec![]))
        .await
        .expect_err("empty descriptor list must be refused");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(
        e.message().contains("descriptors"),
        "message names the field: {e:?}"
    );

    let e = c
        .call(request("api", vec![desc(&[])]))
        .await
        .expect_err("a descriptor without entries must be refused");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(server.store.is_empty());
}

#[tokio::test]
async fn unlimited_rule_answers_ok_with_u32_max_remaining_and_no_store_access() {
    let server = TestServer::start(
        "
domain: api
descriptors:
  - key: internal
    rate_limit: {unlimited: true}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
",
    )
    .await;
    let mut c = server.client().await;
    for i in 0..50 {
        let r = c.ok(one("api", &[("internal", "batch")])).await;
        assert_eq!(code(r.overall_code), Code::Ok, "request {i}");
        assert_eq!(code(r.statuses[0].code), Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    }
    assert!(server.store.is_empty(), "unlimited never touches the store");
}

#[tokio::test]
async fn shadow_mode_rule_reports_ok_even_when_over_and_never_blocks_the_request() {
    let server = TestServer::start_frozen(
        "
domain: api
descriptors:
  - key: probe
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, name: probe_rpm}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10, name: user_rpm}
",
    )
    .await;
    let mut c = server.client().await;
    let r = c.ok(one("api", &[("probe", "p")])).await;
    assert_eq!(
        (code(r.overall_code), r.statuses[0].limit_remaining),
        (Code::Ok, 0)
    );
    for i in 1..=3u32 {
        let r = c
            .ok(request(
                "api",
                vec![desc(&[("probe", "p")]), desc(&[("user", "u")])],
            ))
            .await;
        assert_eq!(
            code(r.overall_code),
            Code::Ok,
            "shadow never refuses: {r:?}"
        );
        assert_eq!(code(r.statuses[0].code), Code::Ok);
        assert_limit(&r.statuses[0], "probe_rpm", 1, ProtoUnit::Minute);
        assert_eq!(r.statuses[0].limit_remaining, 0);
        assert_eq!(
            r.statuses[1].limit_remaining,
            10 - i,
            "the enforced sibling is debited normally"
        );
    }
}

#[tokio::test]
async fn replaced_rule_is_neither_reported_nor_debited() {
    let server = TestServer::start_frozen(
        "
domain: rep
descriptors:
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 1, name: general}
  - key: user
    value: vip
    rate_limit:
      unit: minute
      requests_per_unit: 100
      name: vip
      replaces: [{name: general}]
",
    )
    .await;
    let mut c = server.client().await;
    for i in 1..=3u32 {
        let r = c
            .ok(request(
                "rep",
                vec![desc(&[("path", "/x")]), desc(&[("user", "vip")])],
            ))
            .await;
        assert_eq!(code(r.overall_code), Code::Ok, "request {i}: {r:?}");
        assert_eq!(code(r.statuses[0].code), Code::Ok);
        assert_eq!(r.statuses[0].current_limit, None, "general is replaced");
        assert_limit(&r.statuses[1], "vip", 100, ProtoUnit::Minute);
        assert_eq!(r.statuses[1].limit_remaining, 100 - i);
    }
    // Without the vip descriptor, `general` applies — and still has its one token.
    let r = c.ok(one("rep", &[("path", "/x")])).await;
    assert_eq!(
        (code(r.overall_code), r.statuses[0].limit_remaining),
        (Code::Ok, 0)
    );
    assert_limit(&r.statuses[0], "general", 1, ProtoUnit::Minute);
    assert_eq!(
        code(c.ok(one("rep", &[("path", "/x")])).await.overall_code),
        Code::OverLimit
    );
}

#[tokio::test]
async fn descriptor_limit_override_applies_instead_of_the_tree() {
    let server = TestServer::start_frozen(USER_10_PER_MINUTE).await;
    let mut c = server.client().await;
    let overridden = || {
        let mut d = desc(&[("user", "alice")]);
        d.limit = Some(RateLimitOverride {
            requests_per_unit: 2,
            unit: ProtoUnit::Second as i32,
        });
        request("api", vec![d])
    };
    for k in 1..=2u32 {
        let s = c.ok(overridden()).await.statuses[0].clone();
        assert_eq!(code(s.code), Code::Ok);
        assert_eq!(
            s.current_limit
                .as_ref()
                .map(|l| (l.requests_per_unit, l.unit)),
            Some((2, ProtoUnit::Second as i32))
        );
        assert_eq!(s.limit_remaining, 2 - k);
    }
    let s = c.ok(overridden()).await.statuses[0].clone();
    assert_eq!(code(s.code), Code::OverLimit);
    assert_eq!(reset_ms(&s), 501, "2/s: one token per 500 ms, + 1 ms");
    // The tree's own 10/min bucket for alice was never touched.
    let r = c.ok(one("api", &[("user", "alice")])).await;
    assert_eq!(r.statuses[0].limit_remaining, 9);
}

// ---------------------------------------------------------------------------------------
// Health and reflection.
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn health_reports_serving_for_the_server_and_the_ratelimit_service() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;

    let server = TestServer::start(USER_10_PER_MINUTE).await;
    let mut health = HealthClient::new(server.channel().await);
    for service in [
        "",
        "ratelimit",
        "envoy.service.ratelimit.v3.RateLimitService",
    ] {
        let r = tokio::time::timeout(
            CALL_TIMEOUT,
            health.check(HealthCheckRequest {
                service: service.to_string(),
            }),
        )
        .await
        .expect("health answers")
        .unwrap_or_else(|e| panic!("health check {service:?}: {e:?}"))
        .into_inner();
        assert_eq!(
            r.status,
            ServingStatus::Serving as i32,
            "service {service:?}"
        );
    }
    let e = tokio::time::timeout(
        CALL_TIMEOUT,
        health.check(HealthCheckRequest {
            service: "no.such.Service".into(),
        }),
    )
    .await
    .expect("health answers")
    .expect_err("an unknown service is not reported serving");
    assert_eq!(e.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn reflection_lists_the_ratelimit_service_and_serves_its_descriptor() {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let server = TestServer::start(USER_10_PER_MINUTE).await;
    let mut client = ServerReflectionClient::new(server.channel().await);
    let requests = tokio_stream::iter(vec![
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        },
        ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(
                "envoy.service.ratelimit.v3.RateLimitService".into(),
            )),
        },
    ]);
    let mut stream = tokio::time::timeout(CALL_TIMEOUT, client.server_reflection_info(requests))
        .await
        .expect("reflection answers")
        .expect("reflection stream")
        .into_inner();

    let first = tokio::time::timeout(CALL_TIMEOUT, stream.next())
        .await
        .expect("first answer in time")
        .expect("a first answer")
        .expect("first answer ok");
    let Some(MessageResponse::ListServicesResponse(list)) = first.message_response else {
        panic!("expected a service list, got {first:?}");
    };
    let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"envoy.service.ratelimit.v3.RateLimitService"),
        "{names:?}"
    );
    assert!(names.contains(&"grpc.health.v1.Health"), "{names:?}");

    let second = tokio::time::timeout(CALL_TIMEOUT, stream.next())
        .await
        .expect("second answer in time")
        .expect("a second answer")
        .expect("second answer ok");
    let Some(MessageResponse::FileDescriptorResponse(files)) = second.message_response else {
        panic!("expected file descriptors, got {second:?}");
    };
    let protos: Vec<prost_types::FileDescriptorProto> = files
        .file_descriptor_proto
        .iter()
        .map(|b| prost_types::FileDescriptorProto::decode(b.as_slice()).expect("valid proto"))
        .collect();
    let rls = protos
        .iter()
        .find(|f| f.name() == "envoy/service/ratelimit/v3/rls.proto")
        .unwrap_or_else(|| {
            panic!(
                "rls.proto not served: {:?}",
                protos.iter().map(|f| f.name()).collect::<Vec<_>>()
            )
        });
    let service = rls
        .service
        .iter()
        .find(|s| s.name() == "RateLimitService")
        .expect("RateLimitService declared");
    assert!(service.method.iter().any(|m| m.name() == "ShouldRateLimit"));
}

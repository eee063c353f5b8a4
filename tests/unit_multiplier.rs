//! Any period (issue 31, item 1, an extension): `rate_limit.unit_multiplier: N` makes the
//! period N units. A rule of "3 per 2 hours" admits 3, refuses the 4th, and has refilled
//! one token after 40 minutes and all three after two hours — on every store, with the
//! engine's clock moved by hand; the same file without the key means what upstream's
//! does. Envoy's answer can only name one unit: `current_limit` quotes the same rate in
//! the smallest unit in which it is whole.

#[macro_use]
mod common;

use std::sync::Arc;

use shardgate::config::Config;
use shardgate::engine::plan::Plan;
use shardgate::engine::{Engine, EngineOptions, ManualClock, ScriptedDraw};
use shardgate::store::BucketStore;

const T0: i64 = 1_800_000_000_000;
const MINUTE_MS: i64 = 60_000;

const RULES: &str = "
domain: any_period
descriptors:
  - key: tenant
    rate_limit: {unit: hour, unit_multiplier: 2, requests_per_unit: 3}
";

/// One request of `tenant=acme` through the plan the service builds, decided now.
async fn admitted<S: BucketStore>(engine: &Engine<S>, config: &Config) -> bool {
    let rule = config
        .domain("any_period")
        .unwrap()
        .match_descriptor(&[("tenant", "acme")])
        .unwrap();
    let mut plan = Plan::new();
    plan.add(rule, &[("tenant", "acme")], 1).unwrap();
    engine.acquire(&plan.acquire).await.unwrap().admitted
}

cross_store! {
    async fn a_two_hour_period_refills_over_two_hours<S: BucketStore>(store: S) {
        let config = Config::from_yaml("any_period.yaml", RULES).unwrap();
        let clock = Arc::new(ManualClock::new(T0));
        let engine = Engine::with_parts(
            Arc::new(store),
            EngineOptions::default(),
            clock.clone(),
            Arc::new(ScriptedDraw::default()),
        );
        for i in 0..3 {
            assert!(admitted(&engine, &config).await, "request {i}");
        }
        assert!(!admitted(&engine, &config).await, "the fourth within the period");
        // 3 tokens per 120 minutes: one every 40. Not yet at 39...
        clock.advance(39 * MINUTE_MS);
        assert!(!admitted(&engine, &config).await, "at 39 minutes");
        // ...one at 40 (as an hourly rule of 3 would have given at 20).
        clock.advance(MINUTE_MS);
        assert!(admitted(&engine, &config).await, "at 40 minutes");
        assert!(!admitted(&engine, &config).await, "only one at 40 minutes");
        clock.advance(120 * MINUTE_MS);
        for i in 0..3 {
            assert!(admitted(&engine, &config).await, "after the period, request {i}");
        }
        assert!(!admitted(&engine, &config).await, "full means three, not more");
    }
}

#[tokio::test]
async fn the_answer_quotes_the_rate_in_a_whole_unit() {
    let server = common::server::TestServer::start(
        "
domain: quoted
descriptors:
  - key: per_five_minutes
    rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 100}
  - key: per_week
    rate_limit: {unit: day, unit_multiplier: 7, requests_per_unit: 1000}
  - key: upstream
    rate_limit: {unit: minute, requests_per_unit: 7}
",
    )
    .await;
    let mut client = server.client().await;
    for (key, rate, unit) in [
        ("per_five_minutes", 20, "MINUTE"),
        ("per_week", 1000, "WEEK"),
        ("upstream", 7, "MINUTE"),
    ] {
        let answer = client
            .ok(common::server::one("quoted", &[(key, "x")]))
            .await;
        let limit = answer.statuses[0]
            .current_limit
            .clone()
            .expect("a limit is quoted");
        assert_eq!(limit.requests_per_unit, rate, "{key}");
        let unit_name = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit::try_from(limit.unit)
            .unwrap()
            .as_str_name();
        assert_eq!(unit_name, unit, "{key}");
    }
}

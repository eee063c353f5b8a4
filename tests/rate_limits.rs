//! Several limits on one descriptor (issue 31, item 2, an extension): a node's
//! `rate_limits:` lists what `rate_limit:` holds, and every limit of the list lives in the
//! node's one bucket item. A request is debited from all of them in one write or from
//! none, and answered by the most constraining one — on every store, with the engine's
//! clock moved by hand.

#[macro_use]
mod common;

use std::sync::Arc;

use common::server::{code, limit_name, one, reset_ms};
use common::{Call, Recorder};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    rate_limit::Unit as ProtoUnit, Code,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use shardgate::config::Config;
use shardgate::engine::plan::Plan;
use shardgate::engine::{Engine, EngineOptions, ManualClock, ScriptedDraw};
use shardgate::service::RateLimiter;
use shardgate::store::{BucketKey, BucketStore};

const T0: i64 = 1_800_000_000_000;
const SECOND_MS: i64 = 1_000;

/// "5 a second, and 12 a day", on one API key.
const RULES: &str = "
domain: several
descriptors:
  - key: api_key
    rate_limits:
      - {name: per_second, unit: second, requests_per_unit: 5}
      - {name: per_day, unit: day, requests_per_unit: 12}
";

struct Bench<S: BucketStore> {
    limiter: RateLimiter<Recorder<S>>,
    recorder: Arc<Recorder<S>>,
    clock: Arc<ManualClock>,
    key: BucketKey,
}

impl<S: BucketStore> Bench<S> {
    fn new(store: S) -> Bench<S> {
        let config = Config::from_yaml("several.yaml", RULES).unwrap();
        // The bucket the descriptor maps to, as the service's plan finds it.
        let rule = config
            .domain("several")
            .unwrap()
            .match_descriptor(&[("api_key", "k")])
            .unwrap();
        let mut plan = Plan::new();
        plan.add(rule, &[("api_key", "k")], 1).unwrap();
        let bucket = &plan.acquire.buckets[0];
        assert_eq!(plan.acquire.buckets.len(), 1, "one bucket for both limits");
        assert_eq!(bucket.limits.len(), 2, "both limits claimed");
        let key = BucketKey::new(&bucket.entity, &bucket.resource, 0);
        let recorder = Recorder::new(store);
        let clock = Arc::new(ManualClock::new(T0));
        let engine = Engine::with_parts(
            recorder.clone(),
            EngineOptions::default(),
            clock.clone(),
            Arc::new(ScriptedDraw::default()),
        );
        Bench {
            limiter: RateLimiter::new(Arc::new(config), Arc::new(engine)),
            recorder,
            clock,
            key,
        }
    }

    async fn ask(&self) -> RateLimitResponse {
        self.limiter
            .should_rate_limit(&one("several", &[("api_key", "k")]))
            .await
            .unwrap()
    }

    /// Whole tokens left of `limit` in the stored item.
    async fn stored(&self, limit: &str) -> i64 {
        let item = self.recorder.get(&self.key).await.expect("the item exists");
        item.limit(limit).expect("the limit is in the item").balance / 1_000
    }
}

fn unit_of(r: &RateLimitResponse) -> ProtoUnit {
    ProtoUnit::try_from(r.statuses[0].current_limit.as_ref().unwrap().unit).unwrap()
}

cross_store! {
    async fn several_limits_are_one_item_debited_all_or_nothing<S: BucketStore>(store: S) {
        let bench = Bench::new(store);
        for i in 0..5 {
            let r = bench.ask().await;
            assert_eq!(code(r.overall_code), Code::Ok, "request {i}");
        }
        assert_eq!(bench.stored("per_second").await, 0);
        assert_eq!(bench.stored("per_day").await, 7);
        // A second later per_second is empty until refilled: the fast debit is refused
        // and the slow pass refills and debits both limits in one item update.
        bench.clock.advance(SECOND_MS);
        bench.recorder.clear();
        let r = bench.ask().await;
        assert_eq!(code(r.overall_code), Code::Ok);
        let calls = bench.recorder.calls();
        assert!(
            matches!(
                calls.as_slice(),
                [Call::Debit { applied: false, .. }, Call::Read { .. }, Call::Commit { kinds, committed: true }]
                    if kinds == &["update"]
            ),
            "one item written for both limits: {calls:?}"
        );
        assert_eq!(bench.stored("per_second").await, 4);
        assert_eq!(bench.stored("per_day").await, 6);
        // With room in both, a request is one debit, both limits in it.
        bench.recorder.clear();
        let r = bench.ask().await;
        assert_eq!(code(r.overall_code), Code::Ok);
        let calls = bench.recorder.calls();
        assert!(
            matches!(calls.as_slice(), [Call::Debit { applied: true, .. }]),
            "one write for both limits: {calls:?}"
        );
        assert_eq!(bench.stored("per_second").await, 3);
        assert_eq!(bench.stored("per_day").await, 5);
    }
}

cross_store! {
    async fn the_most_constraining_limit_answers<S: BucketStore>(store: S) {
        let bench = Bench::new(store);
        // Admitted: the limit with least left speaks (per_second: 4 left of 5; per_day 11).
        let first = bench.ask().await;
        assert_eq!(limit_name(&first.statuses[0]), "per_second");
        assert_eq!(first.statuses[0].limit_remaining, 4);
        for _ in 0..4 {
            bench.ask().await;
        }
        // The sixth this second: per_second refuses, per_day would have room. Nothing is
        // taken from per_day, and the answer waits for one per_second token.
        let refused = bench.ask().await;
        assert_eq!(code(refused.overall_code), Code::OverLimit);
        assert_eq!(limit_name(&refused.statuses[0]), "per_second");
        assert_eq!(unit_of(&refused), ProtoUnit::Second);
        // One token at 5 a second, and the millisecond every refusal's wait adds.
        assert_eq!(reset_ms(&refused.statuses[0]), 201);
        assert_eq!(bench.stored("per_day").await, 7, "a refusal takes from no limit");
        // Two seconds later: per_second has room again, and per_day runs out at 12.
        bench.clock.advance(SECOND_MS);
        for i in 0..5 {
            let r = bench.ask().await;
            assert_eq!(code(r.overall_code), Code::Ok, "second 2, request {i}");
        }
        bench.clock.advance(SECOND_MS);
        for i in 0..2 {
            let r = bench.ask().await;
            assert_eq!(code(r.overall_code), Code::Ok, "second 3, request {i}");
        }
        let refused = bench.ask().await;
        assert_eq!(code(refused.overall_code), Code::OverLimit);
        assert_eq!(limit_name(&refused.statuses[0]), "per_day");
        assert_eq!(unit_of(&refused), ProtoUnit::Day);
        // One token of 12 a day: two hours (and the millisecond).
        assert_eq!(reset_ms(&refused.statuses[0]), 2 * 3_600_000 + 1);
        assert_eq!(bench.stored("per_second").await, 3, "per_day's refusal took nothing");
        assert_eq!(bench.stored("per_day").await, 0);
    }
}

#[test]
fn unnamed_limits_of_a_list_get_names_by_place() {
    let yaml = "
domain: d
descriptors:
  - key: k
    rate_limits:
      - {unit: second, requests_per_unit: 10, burst: 20}
      - {unit: day, requests_per_unit: 250}
      - {unit: minute, unit_multiplier: 5, requests_per_unit: 100, name: per_5m}
";
    let config = Config::from_yaml("d.yaml", yaml).unwrap();
    let rule = config
        .domain("d")
        .unwrap()
        .match_descriptor(&[("k", "v")])
        .unwrap();
    let names: Vec<_> = rule
        .stated_limits()
        .map(|l| (l.name, l.item_name))
        .collect();
    assert_eq!(
        names,
        [(None, "rl"), (None, "rl2"), (Some("per_5m"), "per_5m")]
    );
}

#[test]
fn a_list_is_checked_as_each_rate_limit_is_and_as_a_whole() {
    for (body, needle) in [
        (
            "    rate_limit: {unit: second, requests_per_unit: 1}\n    rate_limits:\n      - {unit: day, requests_per_unit: 2}\n",
            "limits.yaml:5:5: a descriptor has 'rate_limit' and 'rate_limits'",
        ),
        ("    rate_limits: []\n", "limits.yaml:4:18: 'rate_limits' must not be empty"),
        (
            "    rate_limits: {unit: day, requests_per_unit: 2}\n",
            "limits.yaml:4:18: 'rate_limits' must be a list of limits",
        ),
        (
            "    rate_limits:\n      - {unlimited: true}\n",
            "limits.yaml:5:9: a 'rate_limits' entry cannot be 'unlimited: true'",
        ),
        (
            "    rate_limits:\n      - {unit: second, requests_per_unit: 1}\n      - {unit: day, requests_per_unit: 2, name: rl}\n",
            "limits.yaml:6:9: 'rate_limits' names limit 'rl' twice",
        ),
        (
            "    rate_limits:\n      - {unit: second, requests_per_unit: 1, overdraft: true}\n      - {unit: day, requests_per_unit: 2}\n",
            "limits.yaml:6:9: 'overdraft' must be the same on every entry of 'rate_limits'",
        ),
        (
            "    rate_limits:\n      - {unit: fortnight, requests_per_unit: 1}\n",
            "limits.yaml:5:16: invalid unit 'fortnight'",
        ),
        (
            "    rate_limits:\n      - {unit: second, requests_per_unit: 1, brust: 2}\n",
            "limits.yaml:5:46: unknown key 'brust' in rate_limit",
        ),
    ] {
        let yaml = format!("domain: d\ndescriptors:\n  - key: k\n{body}");
        let errors = Config::from_yaml("limits.yaml", &yaml)
            .map(|_| ())
            .expect_err(body)
            .to_string();
        assert!(
            errors.lines().any(|l| l.starts_with(needle)),
            "{needle:?} not in:\n{errors}"
        );
    }
    let seventeen: String = (0..17)
        .map(|i| format!("      - {{unit: second, requests_per_unit: 1, name: l{i}}}\n"))
        .collect();
    let yaml = format!("domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n{seventeen}");
    let errors = Config::from_yaml("limits.yaml", &yaml)
        .unwrap_err()
        .to_string();
    assert!(
        errors.contains("'rate_limits' lists 17 limits, at most 16"),
        "{errors}"
    );
}

#[test]
fn a_list_s_limits_share_a_bucket_with_other_rules_by_name() {
    // Two rules on one entity template: a name in both must mean the same limit.
    let yaml = "
domain: d
descriptors:
  - key: a
    entity: tenant
    rate_limits:
      - {name: rps, unit: second, requests_per_unit: 10}
      - {name: daily, unit: day, requests_per_unit: 1000}
  - key: b
    entity: tenant
    rate_limit: {name: daily, unit: day, requests_per_unit: 2000}
";
    let errors = Config::from_yaml("limits.yaml", yaml)
        .unwrap_err()
        .to_string();
    assert!(
        errors.contains("limits.yaml:9:5: limit 'daily' differs from the one at line 4"),
        "{errors}"
    );
}

//! Matching beyond a trailing `*` (issue 31, item 3, an extension): `value_regex:` in
//! place of `value:` matches the whole request value against a regular expression,
//! compiled once at load, placed among the wildcards in file order. Buckets are per value
//! (or shared, with `share_threshold`), on every store.

#[macro_use]
mod common;

use std::sync::Arc;

use shardgate::config::{hit_key, Config};
use shardgate::engine::plan::Plan;
use shardgate::engine::{Engine, EngineOptions, ManualClock, ScriptedDraw};
use shardgate::store::BucketStore;

const T0: i64 = 1_800_000_000_000;

const RULES: &str = r#"
domain: hosts
descriptors:
  - key: host
    value: api.example.com
    rate_limit: {unit: minute, requests_per_unit: 100, name: exact}
  - key: host
    value_regex: '[a-z0-9-]+\.example\.com'
    rate_limit: {unit: minute, requests_per_unit: 2, name: subdomain}
  - key: host
    value: "*.example.com"
    rate_limit: {unit: minute, requests_per_unit: 50, name: glob_after_regex}
  - key: host
    value: "*.example.org"
    rate_limit: {unit: minute, requests_per_unit: 40, name: glob_before_regex}
  - key: host
    value_regex: '.*\.example\.(org|net)'
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3, name: shared}
  - key: host
    rate_limit: {unit: minute, requests_per_unit: 10, name: any_host}
"#;

fn config() -> Config {
    Config::from_yaml("hosts.yaml", RULES).unwrap()
}

/// The name of the rule `host=<value>` matches.
fn matched(config: &Config, value: &str) -> String {
    let rule = config
        .domain("hosts")
        .unwrap()
        .match_descriptor(&[("host", value)])
        .unwrap();
    rule.name.clone().unwrap()
}

#[test]
fn exact_first_then_wildcards_and_expressions_in_file_order_then_the_default() {
    let config = config();
    for (value, rule) in [
        ("api.example.com", "exact"),
        // The regex is written before the glob that also matches: it wins.
        ("shop.example.com", "subdomain"),
        // Not the regex's character class (upper case, dots): the glob after it.
        ("Shop.example.com", "glob_after_regex"),
        ("a.b.example.com", "glob_after_regex"),
        // The glob is written before the regex that also matches: it wins.
        ("www.example.org", "glob_before_regex"),
        ("www.example.net", "shared"),
        // The whole value must match: a suffix or a prefix is not enough.
        ("shop.example.com.evil", "any_host"),
        ("www.example.network", "any_host"),
        ("", "any_host"),
    ] {
        assert_eq!(matched(&config, value), rule, "host={value}");
    }
}

#[test]
fn the_stats_key_carries_the_expression_as_written() {
    let config = config();
    let rule = config
        .domain("hosts")
        .unwrap()
        .match_descriptor(&[("host", "shop.example.com")])
        .unwrap();
    assert_eq!(rule.stats_key, r"hosts.host_[a-z0-9-]+\.example\.com");
    assert_eq!(
        hit_key(rule, &[("host", "shop.example.com")]),
        rule.stats_key
    );
}

/// One request of `host=<value>` through the plan the service builds, decided now.
async fn admitted<S: BucketStore>(engine: &Engine<S>, config: &Config, value: &str) -> bool {
    let entries = [("host", value)];
    let rule = config
        .domain("hosts")
        .unwrap()
        .match_descriptor(&entries)
        .unwrap();
    let mut plan = Plan::new();
    plan.add(rule, &entries, 1).unwrap();
    engine.acquire(&plan.acquire).await.unwrap().admitted
}

cross_store! {
    async fn each_matching_value_has_its_bucket_unless_shared<S: BucketStore>(store: S) {
        let config = config();
        let engine = Engine::with_parts(
            Arc::new(store),
            EngineOptions::default(),
            Arc::new(ManualClock::new(T0)),
            Arc::new(ScriptedDraw::default()),
        );
        // `subdomain`, 2 a minute, per value.
        for host in ["a.example.com", "b.example.com"] {
            assert!(admitted(&engine, &config, host).await, "{host} 1");
            assert!(admitted(&engine, &config, host).await, "{host} 2");
            assert!(!admitted(&engine, &config, host).await, "{host} 3");
        }
        // `shared`, 3 a minute for every value it matches together.
        assert!(admitted(&engine, &config, "x.example.net").await);
        assert!(admitted(&engine, &config, "y.example.net").await);
        assert!(admitted(&engine, &config, "z.example.net").await);
        assert!(!admitted(&engine, &config, "w.example.net").await, "the shared bucket is empty");
    }
}

/// The rendered errors of loading `descriptor` (one node under `domain: d`).
fn errors(descriptor: &str) -> String {
    let yaml = format!("domain: d\ndescriptors:\n  - key: k\n{descriptor}");
    match Config::from_yaml("limits.yaml", &yaml) {
        Ok(_) => panic!("expected an error for:\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_bad_expression_is_refused_with_a_short_reason_and_its_line() {
    for (descriptor, expected) in [
        (
            "    value: a\n    value_regex: b\n",
            "limits.yaml:5:5: a descriptor has 'value' and 'value_regex': use one",
        ),
        (
            "    value_regex: '(unclosed'\n",
            "limits.yaml:4:18: invalid value_regex '(unclosed': unclosed group",
        ),
        (
            "    value_regex: 'a)|(b'\n",
            "limits.yaml:4:18: invalid value_regex 'a)|(b': unopened group",
        ),
        (
            "    value_regex: '\\w{1000}'\n",
            "limits.yaml:4:18: invalid value_regex '\\w{1000}': it compiles to more than 256 KiB",
        ),
        (
            "    value_regex: ''\n",
            "limits.yaml:4:18: 'value_regex' must not be empty",
        ),
    ] {
        let all = errors(descriptor);
        assert!(
            all.lines().any(|l| l == expected),
            "{expected:?} not in:\n{all}"
        );
    }
    let long = errors(&format!("    value_regex: '{}'\n", "a".repeat(1025)));
    assert!(
        long.contains("it is 1025 bytes long, at most 1024"),
        "{long}"
    );
}

#[test]
fn the_same_expression_twice_is_a_duplicate_and_a_value_equal_to_it_is_not() {
    let yaml = "
domain: d
descriptors:
  - key: k
    value_regex: 'a.c'
  - key: k
    value: 'a.c'
  - key: k
    value_regex: 'a.c'
";
    let all = Config::from_yaml("limits.yaml", yaml)
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert_eq!(all.lines().count(), 1, "{all}");
    assert!(
        all.starts_with(
            "limits.yaml:8:5: duplicate descriptor composite key 'd.k_a.c' (first at line 4)"
        ),
        "{all}"
    );
}

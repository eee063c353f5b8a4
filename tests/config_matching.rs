//! Matching conformance (docs/configuration.md, "Matching"), ported from the behaviour of
//! envoyproxy/ratelimit's basic config test, plus the compiled rule fields.

use std::sync::Arc;

use shardgate::config::{Config, Domain, FailureMode, Rule, RuleLimit, Unit};

const BASIC: &str = r#"
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit:
          unit: second
          requests_per_unit: 5
      - key: subkey1
        value: subvalue1
        rate_limit:
          unit: SECOND
          requests_per_unit: 10
  - key: key2
    rate_limit:
      unit: minute
      requests_per_unit: 20
  - key: key2
    value: value2
    rate_limit:
      unit: minute
      requests_per_unit: 30
    descriptors:
      - key: subkey
        rate_limit:
          unit: hour
          requests_per_unit: 40
  - key: key2
    value: value3
  - key: key3
    rate_limit:
      unlimited: true
  - key: wild
    value: foo*
    rate_limit: {unit: second, requests_per_unit: 1, name: foo_star}
  - key: wild
    value: bar*b
    rate_limit: {unit: second, requests_per_unit: 2, name: bar_star_b}
  - key: wild
    value: foo*bar*baz
    rate_limit: {unit: second, requests_per_unit: 3, name: multi}
  - key: parent
    value: exact
    descriptors:
      - key: path
        value: /api/*
        rate_limit: {unit: second, requests_per_unit: 4, name: api}
"#;

fn basic() -> Config {
    Config::from_yaml("basic.yaml", BASIC).expect("basic config loads")
}

fn domain(config: &Config) -> &Domain {
    config.domain("test-domain").expect("domain exists")
}

fn rpu(rule: &Rule) -> u32 {
    match &rule.limit {
        RuleLimit::Limited(l) => l.requests_per_unit,
        RuleLimit::Unlimited => panic!("unexpectedly unlimited"),
    }
}

fn matched<'a>(d: &'a Domain, entries: &[(&str, &str)]) -> Option<&'a Arc<Rule>> {
    d.match_descriptor(entries)
}

#[test]
fn node_with_only_children_has_no_limit() {
    let c = basic();
    assert!(matched(domain(&c), &[("key1", "value1")]).is_none());
}

#[test]
fn key_only_child_is_the_default_for_any_value() {
    let c = basic();
    let r = matched(domain(&c), &[("key1", "value1"), ("subkey1", "x")]).unwrap();
    assert_eq!(rpu(r), 5);
    assert_eq!(
        r.limit,
        RuleLimit::Limited(shardgate::config::RateLimit {
            unit_multiplier: 1,
            unit: Unit::Second,
            requests_per_unit: 5,
            burst: None,
            overdraft: false,
            lease: true,
        })
    );
}

#[test]
fn exact_child_wins_over_key_only_sibling() {
    let c = basic();
    let r = matched(domain(&c), &[("key1", "value1"), ("subkey1", "subvalue1")]).unwrap();
    assert_eq!(rpu(r), 10);
}

#[test]
fn exact_node_without_limit_does_not_fall_back_to_key_only() {
    let c = basic();
    assert!(matched(domain(&c), &[("key2", "value3")]).is_none());
    // The key-only default still applies to other values.
    assert_eq!(rpu(matched(domain(&c), &[("key2", "other")]).unwrap()), 20);
    assert_eq!(rpu(matched(domain(&c), &[("key2", "value2")]).unwrap()), 30);
}

#[test]
fn deeper_request_than_the_tree_has_no_limit() {
    let c = basic();
    assert!(matched(
        domain(&c),
        &[("key2", "value2"), ("subkey", "x"), ("z", "z")]
    )
    .is_none());
    assert!(matched(domain(&c), &[("key2", "other"), ("subkey", "x")]).is_none());
    assert_eq!(
        rpu(matched(domain(&c), &[("key2", "value2"), ("subkey", "x")]).unwrap()),
        40
    );
}

#[test]
fn shallower_limit_does_not_apply_to_deeper_request() {
    let c = basic();
    assert!(matched(domain(&c), &[("key2", "value2"), ("nokey", "x")]).is_none());
}

#[test]
fn unknown_key_and_empty_descriptor_have_no_limit() {
    let c = basic();
    assert!(matched(domain(&c), &[("nope", "x")]).is_none());
    assert!(matched(domain(&c), &[]).is_none());
}

#[test]
fn wildcard_trailing_star() {
    let c = basic();
    for v in ["foo", "foo1", "foo2"] {
        assert_eq!(
            matched(domain(&c), &[("wild", v)]).unwrap().limit_name(),
            "foo_star"
        );
    }
}

#[test]
fn wildcard_in_the_middle() {
    let c = basic();
    for v in ["barab", "bar123b", "barb"] {
        assert_eq!(
            matched(domain(&c), &[("wild", v)]).unwrap().limit_name(),
            "bar_star_b",
            "{v}"
        );
    }
    for v in ["bara", "xbarb"] {
        assert!(matched(domain(&c), &[("wild", v)]).is_none(), "{v}");
    }
}

#[test]
fn wildcard_multi_segment_and_file_order() {
    let c = basic();
    // `foo*` comes first in the file, so it wins for every value it matches.
    assert_eq!(
        matched(domain(&c), &[("wild", "foo1bar2baz")])
            .unwrap()
            .limit_name(),
        "foo_star"
    );
    let c = Config::from_yaml(
        "m.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    value: foo*bar*baz\n    rate_limit: {unit: second, requests_per_unit: 3}\n",
    )
    .unwrap();
    let d = c.domain("d").unwrap();
    assert!(d.match_descriptor(&[("k", "foo1bar2baz")]).is_some());
    assert!(d.match_descriptor(&[("k", "foobarbaz")]).is_some());
    assert!(d.match_descriptor(&[("k", "foo1baz2bar")]).is_none());
}

#[test]
fn wildcard_under_an_exact_parent() {
    let c = basic();
    let d = domain(&c);
    assert_eq!(
        matched(d, &[("parent", "exact"), ("path", "/api/v1")])
            .unwrap()
            .limit_name(),
        "api"
    );
    assert!(matched(d, &[("parent", "exact"), ("path", "/web")]).is_none());
    assert!(matched(d, &[("parent", "other"), ("path", "/api/v1")]).is_none());
}

#[test]
fn unknown_domain_has_no_rules() {
    assert!(basic().domain("nope").is_none());
}

#[test]
fn unlimited_rule() {
    let c = basic();
    let r = matched(domain(&c), &[("key3", "anything")]).unwrap();
    assert_eq!(r.limit, RuleLimit::Unlimited);
}

#[test]
fn owned_entries_match_too() {
    let c = basic();
    let entries = vec![("key2".to_string(), "value2".to_string())];
    assert_eq!(rpu(domain(&c).match_descriptor(&entries).unwrap()), 30);
}

#[test]
fn rules_iterate_in_file_order_with_stats_keys() {
    let c = basic();
    let keys: Vec<&str> = domain(&c).rules().map(|r| r.stats_key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "test-domain.key1_value1.subkey1",
            "test-domain.key1_value1.subkey1_subvalue1",
            "test-domain.key2",
            "test-domain.key2_value2",
            "test-domain.key2_value2.subkey",
            "test-domain.key3",
            "test-domain.wild_foo*",
            "test-domain.wild_bar*b",
            "test-domain.wild_foo*bar*baz",
            "test-domain.parent_exact.path_/api/*",
        ]
    );
}

#[test]
fn rule_fields_are_compiled() {
    let yaml = r#"
domain: edge
failure_mode: allow
descriptors:
  - key: tenant
    resource: api
    rate_limit: {unit: minute, requests_per_unit: 1000, name: tenant_rpm}
    descriptors:
      - key: api_key
        cascade: true
        failure_mode: deny
        metadata: {team: core, tier: 2}
        rate_limit: {unit: minute, requests_per_unit: 100, burst: 200, name: key_rpm}
  - key: other
    rate_limit: {unit: hour, requests_per_unit: 1}
"#;
    let c = Config::from_yaml("edge.yaml", yaml).unwrap();
    let d = c.domain("edge").unwrap();
    assert_eq!(d.failure_mode, FailureMode::Allow);
    let child = d
        .match_descriptor(&[("tenant", "acme"), ("api_key", "k1")])
        .unwrap();
    assert_eq!(child.resource, "api");
    assert_eq!(child.failure_mode, FailureMode::Deny);
    assert_eq!(child.source.as_ref(), "edge.yaml:9");
    assert_eq!(child.depth(), 2);
    assert_eq!(
        child.metadata,
        Some(serde_json::json!({"team": "core", "tier": 2}))
    );
    let parent = child.cascade_parent.as_ref().expect("cascade parent");
    assert_eq!(parent.limit_name(), "tenant_rpm");
    assert_eq!(parent.failure_mode, FailureMode::Allow);
    assert_eq!(
        parent.entity_for(&[("tenant", "acme"), ("api_key", "k1")]),
        "tenant=acme"
    );
    assert_eq!(
        child.entity_for(&[("tenant", "acme"), ("api_key", "k1")]),
        "tenant=acme/api_key=k1"
    );
    let other = d.match_descriptor(&[("other", "x")]).unwrap();
    assert_eq!(other.resource, "edge");
    assert_eq!(other.limit_name(), "rl");
    assert!(other.cascade_parent.is_none());
}

#[test]
fn failure_mode_defaults_to_deny() {
    let c = Config::from_yaml(
        "f.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    )
    .unwrap();
    let d = c.domain("d").unwrap();
    assert_eq!(d.failure_mode, FailureMode::Deny);
    assert_eq!(d.rules().next().unwrap().failure_mode, FailureMode::Deny);
}

#[test]
fn keys_joined_naively_do_not_collide() {
    let yaml = "domain: d\ndescriptors:\n  - key: a_b\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let c = Config::from_yaml("n.yaml", yaml).unwrap();
    let d = c.domain("d").unwrap();
    let e1 = [("a_b", "c")];
    let e2 = [("a", "b_c")];
    let r1 = d.match_descriptor(&e1).unwrap();
    let r2 = d.match_descriptor(&e2).unwrap();
    assert_ne!(r1.entity_for(&e1), r2.entity_for(&e2));
}

#[test]
fn share_threshold_entity_is_the_pattern() {
    let yaml = "domain: d\ndescriptors:\n  - key: path\n    value: /api/*\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    let c = Config::from_yaml("s.yaml", yaml).unwrap();
    let d = c.domain("d").unwrap();
    let a = d.match_descriptor(&[("path", "/api/a")]).unwrap();
    assert_eq!(
        a.entity_for(&[("path", "/api/a")]),
        a.entity_for(&[("path", "/api/b")])
    );
}

#[test]
fn entity_template_shares_a_bucket_across_rules() {
    let yaml = r#"
domain: llm
descriptors:
  - key: tenant
    descriptors:
      - key: model
        descriptors:
          - key: kind
            value: requests
            entity: "{tenant}/{model}"
            rate_limit: {unit: minute, requests_per_unit: 60, name: rpm}
          - key: kind
            value: tokens
            entity: "{tenant}/{model}"
            rate_limit: {unit: minute, requests_per_unit: 100000, name: tpm}
"#;
    let c = Config::from_yaml("llm.yaml", yaml).unwrap();
    let d = c.domain("llm").unwrap();
    let req = [("tenant", "acme"), ("model", "gpt/4"), ("kind", "requests")];
    let tok = [("tenant", "acme"), ("model", "gpt/4"), ("kind", "tokens")];
    let r = d.match_descriptor(&req).unwrap();
    let t = d.match_descriptor(&tok).unwrap();
    assert_eq!(r.entity_for(&req), "acme/gpt%2F4");
    assert_eq!(r.entity_for(&req), t.entity_for(&tok));
    assert_eq!((r.limit_name(), t.limit_name()), ("rpm", "tpm"));
}

#[test]
fn ten_thousand_rules() {
    let mut yaml = String::from("domain: big\ndescriptors:\n");
    for i in 0..5_000 {
        yaml.push_str(&format!(
            "  - key: tenant\n    value: t{i}\n    rate_limit: {{unit: second, requests_per_unit: {i}}}\n    descriptors:\n      - key: user\n        value: u{i}*\n        rate_limit: {{unit: minute, requests_per_unit: {i}}}\n"
        ));
    }
    let c = Config::from_yaml("big.yaml", &yaml).unwrap();
    let d = c.domain("big").unwrap();
    assert_eq!(d.rules().count(), 10_000);
    for i in (0..5_000).step_by(97) {
        let t = format!("t{i}");
        let u = format!("u{i}x");
        assert_eq!(
            rpu(d.match_descriptor(&[("tenant", t.as_str())]).unwrap()),
            i
        );
        let r = d
            .match_descriptor(&[("tenant", t.as_str()), ("user", u.as_str())])
            .unwrap();
        assert_eq!(rpu(r), i);
        assert_eq!(
            r.limit,
            RuleLimit::Limited(shardgate::config::RateLimit {
                unit_multiplier: 1,
                unit: Unit::Minute,
                requests_per_unit: i,
                burst: None,
                overdraft: false,
                lease: true,
            })
        );
    }
    assert!(d.match_descriptor(&[("tenant", "t5000")]).is_none());
}

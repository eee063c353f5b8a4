//! The stats key a hit is counted under, case by case from envoyproxy/ratelimit's own
//! tests in `test/config/config_test.go` (the function each case comes from is named
//! with it). Inputs and expected keys are upstream's; the YAML is written out from its
//! Go structs, or is its `test/config/share_threshold.yaml` fixture.

use shardgate::config::{entries_key, hit_key, Config};

/// The key a hit by `entries` on `domain` is counted under; panics if nothing matches.
fn key(config: &Config, domain: &str, entries: &[(&str, &str)]) -> String {
    let d = config.domain(domain).expect("domain");
    let rule = d
        .match_descriptor(entries)
        .unwrap_or_else(|| panic!("no rule for {entries:?}"));
    hit_key(rule, entries)
}

fn load(yaml: &str) -> Config {
    Config::from_yaml("upstream.yaml", yaml).unwrap_or_else(|e| panic!("{e}"))
}

/// `TestDetailedMetric`'s "realisticExampleConfig".
const REALISTIC: &str = r#"
domain: nested
descriptors:
  - key: key_1
    detailed_metric: true
    rate_limit: {requests_per_unit: 500, unit: minute}
  - key: key_1
    value: some-value-for-key-1
    rate_limit: {requests_per_unit: 500, unit: minute}
  - key: key_2
    detailed_metric: true
    rate_limit: {requests_per_unit: 5000, unit: minute}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {requests_per_unit: 5, unit: minute}
  - key: key_2
    value: specific-id
    detailed_metric: true
    rate_limit: {requests_per_unit: 50000, unit: minute}
    descriptors:
      - key: key_3
        detailed_metric: true
      - key: key_3
        value: requested-key3-value
        detailed_metric: true
        rate_limit: {requests_per_unit: 100, unit: minute}
"#;

/// `TestDetailedMetric`'s nested config with the flag on `key-1`, on `key-2`, or neither.
fn nested(flag_1: bool, flag_2: bool) -> Config {
    load(&format!(
        r#"
domain: nested
descriptors:
  - key: key-1
    detailed_metric: {flag_1}
    rate_limit: {{requests_per_unit: 100, unit: minute}}
    descriptors:
      - key: key-2
        detailed_metric: {flag_2}
        rate_limit: {{requests_per_unit: 5, unit: minute}}
"#
    ))
}

#[test]
fn detailed_metric() {
    // TestDetailedMetric, in upstream's order.
    let top = [("key-1", "value-1")];
    let both = [("key-1", "value-1"), ("key-2", "value-2")];
    assert_eq!(
        key(&nested(true, false), "nested", &top),
        "nested.key-1_value-1"
    );
    assert_eq!(key(&nested(false, false), "nested", &top), "nested.key-1");
    assert_eq!(
        key(&nested(true, true), "nested", &both),
        "nested.key-1_value-1.key-2_value-2"
    );
    assert_eq!(
        key(&nested(false, false), "nested", &both),
        "nested.key-1.key-2"
    );

    let c = load(REALISTIC);
    assert_eq!(
        key(&c, "nested", &[("key_1", "value-for-key-1")]),
        "nested.key_1_value-for-key-1"
    );
    assert_eq!(
        key(&c, "nested", &[("key_2", "key-2-value")]),
        "nested.key_2_key-2-value"
    );
    assert_eq!(
        key(
            &c,
            "nested",
            &[("key_2", "key-2-value"), ("key_3", "requested-key3-value")]
        ),
        "nested.key_2_key-2-value.key_3_requested-key3-value"
    );
}

/// The three-level `route / http_method / subject_id` tree of the value_to_metric tests,
/// with each level's extra YAML.
fn route_tree(route: &str, method: &str, subject: &str) -> Config {
    load(&format!(
        r#"
domain: domain
descriptors:
  - key: route
    {route}
    descriptors:
      - key: http_method
        {method}
        descriptors:
          - key: subject_id
            {subject}
            rate_limit: {{requests_per_unit: 60, unit: minute}}
"#
    ))
}

const DRAW_GET_123: [(&str, &str); 3] = [
    ("route", "draw"),
    ("http_method", "GET"),
    ("subject_id", "123"),
];

#[test]
fn value_to_metric_uses_runtime_values() {
    // TestValueToMetric_UsesRuntimeValuesInStats (README "Example 10").
    let c = route_tree("value_to_metric: true", "value_to_metric: true", "");
    assert_eq!(
        key(&c, "domain", &DRAW_GET_123),
        "domain.route_draw.http_method_GET.subject_id"
    );
}

#[test]
fn value_to_metric_on_a_level_only_changes_that_level() {
    // TestValueToMetric_DefaultKeyIncludesValueAtThatLevel.
    let c = load(
        r#"
domain: d
descriptors:
  - key: k1
    value_to_metric: true
    descriptors:
      - key: k2
        rate_limit: {requests_per_unit: 1, unit: second}
"#,
    );
    assert_eq!(key(&c, "d", &[("k1", "A"), ("k2", "foo")]), "d.k1_A.k2");

    // TestValueToMetric_MidLevelOnly.
    let c = load(
        r#"
domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        descriptors:
          - key: k3
            rate_limit: {requests_per_unit: 1, unit: second}
"#,
    );
    assert_eq!(
        key(&c, "d", &[("k1", "X"), ("k2", "Y"), ("k3", "Z")]),
        "d.k1.k2_Y.k3"
    );

    // TestValueToMetric_NoFlag_Unchanged.
    let c = load(
        r#"
domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        rate_limit: {requests_per_unit: 1, unit: second}
"#,
    );
    assert_eq!(key(&c, "d", &[("k1", "X"), ("k2", "Y")]), "d.k1.k2");
}

#[test]
fn value_to_metric_only_on_the_leaf_leaves_the_parents_alone() {
    // The issue's second example: the flag only on the leaf, (k1=A, k2=B).
    let c = load(
        r#"
domain: d
descriptors:
  - key: k1
    descriptors:
      - key: k2
        value_to_metric: true
        rate_limit: {requests_per_unit: 1, unit: second}
"#,
    );
    assert_eq!(key(&c, "d", &[("k1", "A"), ("k2", "B")]), "d.k1.k2_B");
}

#[test]
fn detailed_metric_wins_over_value_to_metric() {
    // TestValueToMetric_DoesNotOverrideDetailedMetric.
    let c = route_tree(
        "value_to_metric: true",
        "value_to_metric: true",
        "detailed_metric: true",
    );
    assert_eq!(
        key(&c, "domain", &DRAW_GET_123),
        "domain.route_draw.http_method_GET.subject_id_123"
    );
}

#[test]
fn value_to_metric_with_configured_values() {
    // TestValueToMetric_WithConfiguredValues.
    let c = load(
        r#"
domain: test-domain
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value: GET
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 60, unit: minute}
      - key: http_method
        value: POST
        value_to_metric: true
        descriptors:
          - key: subject_id
            rate_limit: {requests_per_unit: 30, unit: minute}
"#,
    );
    let get = [
        ("route", "api"),
        ("http_method", "GET"),
        ("subject_id", "user123"),
    ];
    let post = [
        ("route", "api"),
        ("http_method", "POST"),
        ("subject_id", "user456"),
    ];
    assert_eq!(
        key(&c, "test-domain", &get),
        "test-domain.route_api.http_method_GET.subject_id"
    );
    assert_eq!(
        key(&c, "test-domain", &post),
        "test-domain.route_api.http_method_POST.subject_id"
    );
}

#[test]
fn value_to_metric_with_a_wildcard() {
    // TestValueToMetric_WithWildcard.
    let c = load(
        r#"
domain: domain
descriptors:
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: "read*"
        value_to_metric: true
        descriptors:
          - key: resource
            rate_limit: {requests_per_unit: 100, unit: minute}
"#,
    );
    assert_eq!(
        key(
            &c,
            "domain",
            &[
                ("user", "alice"),
                ("action", "readfile"),
                ("resource", "documents")
            ]
        ),
        "domain.user_alice.action_readfile.resource"
    );
    assert_eq!(
        key(
            &c,
            "domain",
            &[
                ("user", "bob"),
                ("action", "readdata"),
                ("resource", "database")
            ]
        ),
        "domain.user_bob.action_readdata.resource"
    );
}

#[test]
fn value_to_metric_with_an_empty_value() {
    // TestValueToMetric_WithEmptyValue.
    let c = route_tree("value_to_metric: true", "value_to_metric: true", "");
    let cases = [
        ("", "GET", "domain.route.http_method_GET.subject_id"),
        ("draw", "", "domain.route_draw.http_method.subject_id"),
        ("", "", "domain.route.http_method.subject_id"),
    ];
    for (route, method, expected) in cases {
        let entries = [
            ("route", route),
            ("http_method", method),
            ("subject_id", "123"),
        ];
        assert_eq!(key(&c, "domain", &entries), expected, "{entries:?}");
    }
}

#[test]
fn no_flag_keeps_the_rules_own_key() {
    // TestValueToMetric_FullKeyMatchesStatsKey, case 2: no flags, the rule's key.
    let c = route_tree("", "", "");
    let rule = c
        .domain("domain")
        .unwrap()
        .match_descriptor(&DRAW_GET_123)
        .unwrap();
    assert_eq!(hit_key(rule, &DRAW_GET_123), rule.stats_key);
    assert_eq!(rule.stats_key, "domain.route.http_method.subject_id");
    assert!(!rule.stats_key_varies());
}

/// upstream's `test/config/share_threshold.yaml`, as TestShareThreshold loads it.
const SHARE_THRESHOLD: &str = r#"
domain: test-domain
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: nested
    value: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 200}
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 300}
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 80}
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        share_threshold: false
        descriptors:
          - key: type
            rate_limit: {unit: minute, requests_per_unit: 120}
  - key: user
    value: user/*
    share_threshold: true
    descriptors:
      - key: resource
        value: res/*
        share_threshold: true
        descriptors:
          - key: action
            rate_limit: {unit: minute, requests_per_unit: 150}
  - key: file
    value: test1
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: file
    value: test*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: midpath
    value: /api*v1
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: multiroute
    value: svc*ep*rpc
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: midroute
    value: /api*v2
    share_threshold: true
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 80}
  - key: tenant
    value: t*prod
    share_threshold: true
    descriptors:
      - key: resource
        value: res*v2
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 60}
"#;

#[test]
fn share_threshold_keeps_the_pattern() {
    // TestShareThreshold, each of its sub-cases.
    let c = load(SHARE_THRESHOLD);
    let k = |entries: &[(&str, &str)]| key(&c, "test-domain", entries);
    for v in ["files/a.pdf", "files/b.csv", "files/c.txt"] {
        assert_eq!(k(&[("files", v)]), "test-domain.files_files/*");
    }
    // share_threshold wins over value_to_metric, and over detailed_metric.
    assert_eq!(
        k(&[("route", "api/v1"), ("method", "GET")]),
        "test-domain.route_api/*.method"
    );
    assert_eq!(
        k(&[("service", "svc/user"), ("endpoint", "get")]),
        "test-domain.service_svc/*.endpoint_get"
    );
    assert_eq!(
        k(&[("nested", "parent"), ("files", "nested/file1.txt")]),
        "test-domain.nested_parent.files_nested/*"
    );
    assert_eq!(
        k(&[("files", "top/file1.txt"), ("files", "nested/file1.txt")]),
        "test-domain.files_top/*.files_nested/*"
    );
    assert_eq!(
        k(&[("path", "path/foo"), ("file", "file/doc1"), ("type", "pdf")]),
        "test-domain.path_path/*.file_file/*.type"
    );
    assert_eq!(
        k(&[
            ("user", "user/alice"),
            ("resource", "res/file1"),
            ("action", "read")
        ]),
        "test-domain.user_user/*.resource_res/*.action"
    );
    // An explicit value wins over the shared wildcard, with its own key.
    assert_eq!(k(&[("file", "test1")]), "test-domain.file_test1");
    for v in ["test2", "testABC", "test-xyz"] {
        assert_eq!(k(&[("file", v)]), "test-domain.file_test*");
    }
    for v in ["/api/v1", "/api-beta-v1"] {
        assert_eq!(k(&[("midpath", v)]), "test-domain.midpath_/api*v1");
    }
    for v in ["svcAepBrpc", "svc-ep-rpc"] {
        assert_eq!(k(&[("multiroute", v)]), "test-domain.multiroute_svc*ep*rpc");
    }
    for v in ["/api/v2", "/api-beta-v2"] {
        assert_eq!(k(&[("midroute", v)]), "test-domain.midroute_/api*v2");
    }
    for (t, r) in [("t1prod", "resAv2"), ("t99prod", "resBBBv2")] {
        assert_eq!(
            k(&[("tenant", t), ("resource", r)]),
            "test-domain.tenant_t*prod.resource_res*v2"
        );
    }
}

/// One `wild` rule under `test-domain` with the given flags and pattern.
fn wild(pattern: &str, flags: &str) -> Config {
    load(&format!(
        r#"
domain: test-domain
descriptors:
  - key: wild
    value: "{pattern}"
    {flags}
    rate_limit: {{requests_per_unit: 20, unit: minute}}
"#
    ))
}

#[test]
fn wildcard_stats_behaviour() {
    // TestWildcardStatsBehavior, each of its sub-cases.
    let foo1 = [("wild", "foo1")];
    let k = |c: &Config, e: &[(&str, &str)]| key(c, "test-domain", e);
    assert_eq!(k(&wild("foo*", ""), &foo1), "test-domain.wild_foo*");
    assert_eq!(
        k(&wild("foo*", "value_to_metric: true"), &foo1),
        "test-domain.wild_foo1"
    );
    assert_eq!(
        k(&wild("foo*", "share_threshold: true"), &foo1),
        "test-domain.wild_foo*"
    );
    assert_eq!(
        k(
            &wild("foo*", "share_threshold: true\n    value_to_metric: true"),
            &foo1
        ),
        "test-domain.wild_foo*"
    );
    let c = wild("foo*bar*", "");
    for v in ["foo123bar456", "fooXbarY"] {
        assert_eq!(k(&c, &[("wild", v)]), "test-domain.wild_foo*bar*");
    }
    assert_eq!(
        k(
            &wild("foo*bar*", "value_to_metric: true"),
            &[("wild", "foo123bar456")]
        ),
        "test-domain.wild_foo123bar456"
    );

    // value_to_metric only on a descriptor below the wildcard keeps the pattern.
    let c = load(
        r#"
domain: test-domain
descriptors:
  - key: wild
    value: "foo*"
    descriptors:
      - key: other
        value_to_metric: true
        descriptors:
          - key: limit
            rate_limit: {requests_per_unit: 20, unit: minute}
"#,
    );
    assert_eq!(
        k(&c, &[("wild", "foo1"), ("other", "bar"), ("limit", "X")]),
        "test-domain.wild_foo*.other_bar.limit"
    );
}

#[test]
fn a_request_limit_override_is_keyed_by_its_entries() {
    // upstream's descriptorKey: `key_value`, or the key alone for an empty value.
    assert_eq!(
        entries_key("d", &[("a", "1"), ("b", ""), ("c", "3")]),
        "d.a_1.b.c_3"
    );
}

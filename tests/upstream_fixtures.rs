//! envoyproxy/ratelimit's config fixtures (`test/config/*.yaml`) and the verdict its
//! `test/config/config_test.go` expects for each: loaded, or refused. shardgate must give
//! the same verdict, and a refusal must name what is wrong. `share_threshold.yaml` is in
//! `upstream_stats_keys.rs`; `basic_config.yaml` is also `config_matching.rs`'s BASIC.

use shardgate::config::{Config, ConfigErrors, LoadOptions};

const BASIC_CONFIG: &str = r#"
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: key2
    value: value3
  - key: key3
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: key4
    rate_limit: {name: key4_rate_limit, unit: day, requests_per_unit: 1}
  - key: key5
    value: value5
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: subkey5
        value: subvalue5
        rate_limit: {unit: day, requests_per_unit: 25}
  - key: key6
    rate_limit: {unlimited: true}
  - key: key7
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 70}
"#;

const SHADOWMODE_CONFIG: &str = r#"
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
        shadow_mode: true
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
    shadow_mode: true
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 30}
"#;

const WILDCARD: &str = r#"
domain: test-domain
descriptors:
  - key: wild
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noWild
    value: foo
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: noVal
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: midWild
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: multiWild
    value: foo*bar*baz
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: nestedWild
    value: val1
    descriptors:
      - key: wild
        value: goo*
        rate_limit: {unit: minute, requests_per_unit: 20}
"#;

const METADATA: &str = r#"
domain: test-domain
descriptors:
  - key: key1
    value: value1
    descriptors:
      - key: subkey1
        rate_limit: {unit: second, requests_per_unit: 5}
        metadata:
          name: service_1
      - key: subkey1
        value: subvalue1
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
    metadata:
      service_with_quota:
        name: service_2
"#;

const MERGE_DOMAIN_KEY1: &str = r#"
domain: test-domain
descriptors:
  - key: key1
    value: value1
    rate_limit: {unit: minute, requests_per_unit: 10}
"#;

const MERGE_DOMAIN_KEY2: &str = r#"
domain: test-domain
descriptors:
  - key: key2
    value: value2
    rate_limit: {unit: minute, requests_per_unit: 20}
"#;

fn docs(files: &[(&str, &str)]) -> Vec<(String, String)> {
    files
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect()
}

fn load(files: &[(&str, &str)], merge: bool) -> Result<Config, ConfigErrors> {
    Config::from_documents_with(
        &docs(files),
        &LoadOptions {
            merge_domains: merge,
        },
    )
}

/// Refused, with a message that names `what` (and the file it is in).
fn assert_refused(files: &[(&str, &str)], merge: bool, what: &str) {
    match load(files, merge) {
        Ok(_) => panic!("{files:?} must be refused ({what})"),
        Err(e) => {
            let text = e.to_string();
            assert!(text.contains(what), "{what:?} not in:\n{text}");
            let last = files.last().expect("a file").0;
            assert!(text.contains(last), "{last} not named in:\n{text}");
        }
    }
}

#[test]
fn fixtures_upstream_loads_load() {
    // TestBasicConfig, TestShadowModeConfig, TestWildcardConfig, TestMetadata.
    for (name, text) in [
        ("basic_config.yaml", BASIC_CONFIG),
        ("shadowmode_config.yaml", SHADOWMODE_CONFIG),
        ("wildcard.yaml", WILDCARD),
        ("metadata.yaml", METADATA),
    ] {
        load(&[(name, text)], false).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn fixtures_upstream_refuses_are_refused_by_name() {
    // TestEmptyDomain, TestEmptyKey, TestDuplicateKey, TestBadLimitUnit, TestReplacesSelf,
    // TestReplacesEmpty, TestBadYaml, TestMisspelledKey (both files), TestNonStringKey,
    // TestNonMapList, TestUnlimitedWithRateLimitUnit.
    let cases: [(&str, &str, &str); 12] = [
        ("empty_domain.yaml", "descriptors:\n", "domain"),
        (
            "empty_key.yaml",
            "domain: test-domain\ndescriptors:\n  - value: value1\n",
            "key",
        ),
        (
            "duplicate_key.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n\n  - key: key1\n    value: value1\n",
            "test-domain.key1_value1",
        ),
        (
            "bad_limit_unit.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: foo\n      requests_per_unit: 5\n",
            "foo",
        ),
        (
            "replaces_self.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name: self\n          unit: second\n          requests_per_unit: 5\n",
            "self",
        ),
        (
            "replaces_empty.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    descriptors:\n      - key: subkey1\n        rate_limit:\n          name: self\n          replaces:\n            - name:\n          unit: second\n          requests_per_unit: 5\n",
            "name",
        ),
        ("bad_yaml.yaml", "'''\n", "YAML"),
        (
            "misspelled_key.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    ratelimit:\n      unit: day\n      requests_per_unit: 5\n",
            "ratelimit",
        ),
        (
            "misspelled_key2.yaml",
            "domain: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: day\n      requestsperunit: 5\n",
            "requestsperunit",
        ),
        (
            "non_string_key.yaml",
            "0.25: test-domain\ndescriptors:\n  - key: key1\n    value: value1\n    rate_limit:\n      unit: day\n      requests_per_unit: 5\n",
            "0.25",
        ),
        (
            "non_map_list.yaml",
            "domain: test-domain\ndescriptors:\n  - a\n  - b\n  - c\n",
            "a descriptor must be a mapping",
        ),
        (
            "unlimited_with_unit.yaml",
            "domain: test-domain\ndescriptors:\n  - key: foo\n    rate_limit:\n      unlimited: true\n      unit: day\n      requests_per_unit: 25\n",
            "unlimited",
        ),
    ];
    for (name, text, what) in cases {
        assert_refused(&[(name, text)], false, what);
    }
}

#[test]
fn a_domain_in_two_files_is_refused_unless_merged() {
    // TestDuplicateDomain: basic_config.yaml with duplicate_domain.yaml.
    let duplicate = (
        "duplicate_domain.yaml",
        "domain: test-domain\ndescriptors:\n",
    );
    assert_refused(
        &[("basic_config.yaml", BASIC_CONFIG), duplicate],
        false,
        "duplicate domain 'test-domain'",
    );

    // TestDomainMerge: with merging, both files' rules answer.
    let c = load(
        &[
            ("merge_domain_key1.yaml", MERGE_DOMAIN_KEY1),
            ("merge_domain_key2.yaml", MERGE_DOMAIN_KEY2),
        ],
        true,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let d = c.domain("test-domain").expect("merged domain");
    let rpu = |entries: &[(&str, &str)]| match &d.match_descriptor(entries).expect("a rule").limit {
        shardgate::config::RuleLimit::Limited(l) => l.requests_per_unit,
        other => panic!("{other:?}"),
    };
    assert_eq!(rpu(&[("key1", "value1")]), 10);
    assert_eq!(rpu(&[("key2", "value2")]), 20);
    assert!(c.domain("foo_domain").is_none());
    assert!(d.match_descriptor::<(&str, &str)>(&[]).is_none());
    assert_eq!(c.rule_count(), 2);
    // The same pair without merging is the duplicate-domain error.
    assert_refused(
        &[
            ("merge_domain_key1.yaml", MERGE_DOMAIN_KEY1),
            ("merge_domain_key2.yaml", MERGE_DOMAIN_KEY2),
        ],
        false,
        "duplicate domain",
    );

    // TestDuplicateKeyDomainMerge: the same file twice repeats a top-level descriptor.
    assert_refused(
        &[
            ("merge_domain_key1.yaml", MERGE_DOMAIN_KEY1),
            ("again/merge_domain_key1.yaml", MERGE_DOMAIN_KEY1),
        ],
        true,
        "duplicate descriptor composite key 'test-domain.key1_value1'",
    );
}

#[test]
fn merged_files_must_agree_on_shared_buckets_and_failure_mode() {
    // shardgate's own keys across merged files: a bucket two files' rules share (one
    // entity template and resource) must mean one limit, and a top-level failure_mode set
    // in two files must be the same.
    let a = "domain: d\ndescriptors:\n  - key: a\n    entity: 'tenant'\n    rate_limit: {unit: minute, requests_per_unit: 5, name: rpm}\n";
    let b = "domain: d\ndescriptors:\n  - key: b\n    entity: 'tenant'\n    rate_limit: {unit: minute, requests_per_unit: 9, name: rpm}\n";
    assert_refused(
        &[("a.yaml", a), ("b.yaml", b)],
        true,
        "differs from the one at a.yaml:",
    );
    let allow = "domain: d\nfailure_mode: allow\ndescriptors: []\n";
    let deny = "domain: d\nfailure_mode: deny\ndescriptors: []\n";
    assert_refused(
        &[("allow.yaml", allow), ("deny.yaml", deny)],
        true,
        "failure_mode",
    );
    // Set in one file, it is the domain's.
    let c = load(&[("allow.yaml", allow), ("a.yaml", a)], true).unwrap_or_else(|e| panic!("{e}"));
    let d = c.domain("d").unwrap();
    assert_eq!(d.failure_mode, shardgate::config::FailureMode::Allow);
    let rule = d.match_descriptor(&[("a", "x")]).unwrap();
    assert_eq!(rule.failure_mode, shardgate::config::FailureMode::Allow);
}

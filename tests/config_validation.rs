//! One test per validation error: the message names the file, the line and the offending
//! key or value (docs/configuration.md, "Validation").

use shardgate::config::{Config, ConfigErrorKind};

/// Loads `yaml` as `limits.yaml`, expects failure, and returns the rendered errors.
fn errors(yaml: &str) -> String {
    match Config::from_yaml("limits.yaml", yaml) {
        Ok(_) => panic!("expected an error for:\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

/// Asserts one error line starts with `limits.yaml:<line>:` and contains every needle.
fn assert_error(yaml: &str, line: u32, needles: &[&str]) {
    let all = errors(yaml);
    let prefix = format!("limits.yaml:{line}:");
    let found = all
        .lines()
        .any(|l| l.starts_with(&prefix) && needles.iter().all(|n| l.contains(n)));
    assert!(
        found,
        "no error at line {line} containing {needles:?} in:\n{all}"
    );
}

fn with_descriptor(body: &str) -> String {
    format!("domain: d\ndescriptors:\n  - key: k\n{body}")
}

/// One rejected document: what the case is about, its text, the line the error must
/// name and what that line must say.
struct Case {
    name: &'static str,
    body: Body,
    line: u32,
    needles: &'static [&'static str],
}

enum Body {
    /// A whole document.
    Document(&'static str),
    /// The rest of a descriptor under `key: k` (see [`with_descriptor`]).
    Descriptor(&'static str),
}

use Body::{Descriptor, Document};

/// Documents refused with one error at a line, one per row.
#[rustfmt::skip]
const CASES: &[Case] = &[
    Case { name: "unknown_top_level_key", body: Document("domain: d\ndomian: x\n"), line: 2, needles: &["unknown key 'domian'", "in the document"] },
    Case { name: "unknown_descriptor_key", body: Descriptor("    rate_limt:\n      unit: second\n"), line: 4, needles: &["unknown key 'rate_limt' in descriptor"] },
    Case { name: "unknown_rate_limit_key", body: Descriptor("    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      brust: 3\n"), line: 7, needles: &["unknown key 'brust' in rate_limit"] },
    Case { name: "unknown_replaces_key", body: Descriptor("    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: a\n          nmae: b\n"), line: 9, needles: &["unknown key 'nmae' in replaces entry"] },
    Case { name: "float_where_integer_belongs", body: Descriptor("    rate_limit:\n      unit: second\n      requests_per_unit: 1.5\n"), line: 6, needles: &["'requests_per_unit' must be an integer", "float '1.5'"] },
    Case { name: "string_where_integer_belongs", body: Descriptor("    rate_limit:\n      unit: second\n      requests_per_unit: \"10\"\n"), line: 6, needles: &["'requests_per_unit' must be an integer", "string '10'"] },
    Case { name: "negative_requests_per_unit", body: Descriptor("    rate_limit:\n      unit: second\n      requests_per_unit: -1\n"), line: 6, needles: &["'requests_per_unit'", "0..=4294967295", "'-1'"] },
    Case { name: "requests_per_unit_above_u32", body: Descriptor("    rate_limit:\n      unit: second\n      requests_per_unit: 4294967296\n"), line: 6, needles: &["'requests_per_unit'", "'4294967296'"] },
    Case { name: "burst_zero_is_rejected", body: Descriptor("    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      burst: 0\n"), line: 7, needles: &["'burst'", "1..=", "'0'"] },
    Case { name: "burst_above_u64", body: Descriptor("    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      burst: 99999999999999999999\n"), line: 7, needles: &["'burst'", "'99999999999999999999'"] },
    Case { name: "boolean_expected", body: Descriptor("    shadow_mode: maybe\n"), line: 4, needles: &["'shadow_mode' must be true or false", "'maybe'"] },
    Case { name: "non_map_descriptor_entry", body: Document("domain: d\ndescriptors:\n  - just a string\n"), line: 3, needles: &["descriptor must be a mapping", "just a string"] },
    Case { name: "descriptors_not_a_list", body: Document("domain: d\ndescriptors: {key: k}\n"), line: 2, needles: &["'descriptors' must be a list"] },
    Case { name: "missing_domain", body: Document("descriptors: []\n"), line: 1, needles: &["missing 'domain'"] },
    Case { name: "empty_domain", body: Document("domain: \"\"\n"), line: 1, needles: &["'domain' must not be empty"] },
    Case { name: "empty_document", body: Document("# nothing here\n"), line: 1, needles: &["must be a mapping", "empty document"] },
    Case { name: "document_not_a_mapping", body: Document("- a\n- b\n"), line: 1, needles: &["the document must be a mapping", "a list"] },
    Case { name: "missing_key", body: Document("domain: d\ndescriptors:\n  - value: v\n"), line: 3, needles: &["missing 'key' in descriptor"] },
    Case { name: "empty_key", body: Document("domain: d\ndescriptors:\n  - key: \"\"\n"), line: 3, needles: &["'key' must not be empty"] },
    Case { name: "invalid_unit", body: Descriptor("    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n"), line: 5, needles: &["invalid unit 'fortnight'"] },
    Case { name: "unlimited_with_unit", body: Descriptor("    rate_limit:\n      unlimited: true\n      unit: second\n"), line: 6, needles: &["'unlimited: true' must not be combined with 'unit'"] },
    Case { name: "unlimited_with_burst", body: Descriptor("    rate_limit:\n      unlimited: true\n      burst: 5\n"), line: 6, needles: &["'unlimited: true' must not be combined with 'burst'"] },
    Case { name: "rate_limit_without_unit", body: Descriptor("    rate_limit:\n      requests_per_unit: 5\n"), line: 4, needles: &["rate_limit needs 'unit'"] },
    Case { name: "rate_limit_without_requests_per_unit", body: Descriptor("    rate_limit:\n      unit: second\n"), line: 4, needles: &["rate_limit needs 'requests_per_unit'"] },
    Case { name: "empty_replaces_entry", body: Descriptor("    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - {}\n"), line: 8, needles: &["'replaces' entry needs a non-empty 'name'"] },
    Case { name: "replaces_entry_not_a_map", body: Descriptor("    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - other\n"), line: 8, needles: &["'replaces' entry must be a mapping", "'other'"] },
    Case { name: "replaces_own_name", body: Descriptor("    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      name: mine\n      replaces:\n        - name: mine\n"), line: 9, needles: &["'replaces' names this rule's own name 'mine'"] },
    Case { name: "entity_key_not_on_path", body: Descriptor("    entity: \"t:{tenant}\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), line: 4, needles: &["entity template 't:{tenant}'", "'{tenant}'", "key 'tenant'"] },
    Case { name: "entity_unterminated_placeholder", body: Descriptor("    entity: \"t:{k\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), line: 4, needles: &["invalid entity template 't:{k'", "not closed"] },
    Case { name: "invalid_limit_name_characters", body: Descriptor("    rate_limit: {unit: second, requests_per_unit: 1, name: \"my limit\"}\n"), line: 4, needles: &["invalid limit name 'my limit'"] },
    Case { name: "limit_name_wcu_is_reserved", body: Descriptor("    rate_limit: {unit: second, requests_per_unit: 1, name: wcu}\n"), line: 4, needles: &["invalid limit name 'wcu'", "reserved"] },
    Case { name: "invalid_failure_mode_top_level", body: Document("domain: d\nfailure_mode: open\n"), line: 2, needles: &["invalid failure_mode 'open'"] },
    Case { name: "invalid_failure_mode_descriptor", body: Descriptor("    failure_mode: closed\n"), line: 4, needles: &["invalid failure_mode 'closed'"] },
    Case { name: "empty_resource", body: Descriptor("    resource: \"\"\n"), line: 4, needles: &["'resource' must not be empty"] },
    Case { name: "resource_with_hash", body: Descriptor("    resource: \"a#b\"\n"), line: 4, needles: &["invalid resource 'a#b'"] },
    Case { name: "metadata_not_a_map", body: Descriptor("    metadata: [1, 2]\n"), line: 4, needles: &["'metadata' must be a mapping"] },
    Case { name: "non_string_key", body: Descriptor("    1: x\n"), line: 4, needles: &["keys of descriptor must be strings", "integer '1'"] },
    Case { name: "syntax_error_names_file_and_line", body: Document("domain: d\ndescriptors: [\n"), line: 2, needles: &["YAML syntax error"] },
    Case { name: "duplicate_yaml_key_is_a_syntax_error", body: Document("domain: d\ndomain: e\n"), line: 2, needles: &["duplicate"] },
    Case { name: "unit_multiplier_zero_is_out_of_range", body: Descriptor("    rate_limit:\n      unit: minute\n      unit_multiplier: 0\n      requests_per_unit: 1\n"), line: 6, needles: &["'unit_multiplier'", "must be an integer in 1..=", "'0'"] },
    Case { name: "unit_multiplier_past_a_year_is_refused", body: Descriptor("    rate_limit:\n      unit: day\n      unit_multiplier: 400\n      requests_per_unit: 1\n"), line: 6, needles: &["'unit_multiplier: 400' makes a period of 400 days", "the longest period is a year"] },
    Case { name: "unit_multiplier_must_be_an_integer", body: Descriptor("    rate_limit:\n      unit: minute\n      unit_multiplier: five\n      requests_per_unit: 1\n"), line: 6, needles: &["'unit_multiplier' must be an integer"] },
    Case { name: "rlqs_not_a_mapping", body: Document("domain: d\nrlqs: [tenant]\n"), line: 2, needles: &["'rlqs' must be a mapping", "a list"] },
    Case { name: "rlqs_unknown_key", body: Document("domain: d\nrlqs:\n  key: [tenant]\n"), line: 3, needles: &["unknown key 'key' in rlqs"] },
    Case { name: "rlqs_without_keys", body: Document("domain: d\nrlqs: {}\n"), line: 2, needles: &["missing 'keys' in rlqs"] },
    Case { name: "rlqs_keys_empty", body: Document("domain: d\nrlqs:\n  keys: []\n"), line: 3, needles: &["'keys' must not be empty"] },
    Case { name: "rlqs_keys_not_a_list", body: Document("domain: d\nrlqs:\n  keys: tenant\n"), line: 3, needles: &["'keys' must be a list of bucket id keys"] },
    Case { name: "rlqs_key_twice", body: Document("domain: d\nrlqs:\n  keys:\n    - tenant\n    - plan\n    - tenant\n"), line: 6, needles: &["'rlqs.keys' names 'tenant' twice"] },
    Case { name: "rlqs_key_empty", body: Document("domain: d\nrlqs:\n  keys: [tenant, \"\"]\n"), line: 3, needles: &["'keys' must not be empty"] },
    Case { name: "rlqs_key_not_a_string", body: Document("domain: d\nrlqs:\n  keys: [tenant, {a: b}]\n"), line: 3, needles: &["'keys' must be a string"] },
    Case { name: "rlqs_too_many_keys", body: Document("domain: d\nrlqs:\n  keys: [a, b, c, d, e, f, g, h, i, j, k, l, m, n, o, p, q]\n"), line: 3, needles: &["'rlqs.keys' lists 17 keys, at most 16"] },
    Case { name: "unlimited_with_unit_multiplier", body: Descriptor("    rate_limit:\n      unlimited: true\n      unit_multiplier: 5\n"), line: 6, needles: &["'unlimited: true' must not be combined with 'unit_multiplier'"] },
];

#[test]
fn every_case_names_its_line_and_what_was_wrong() {
    let mut failed = Vec::new();
    for case in CASES {
        let yaml = match case.body {
            Document(y) => y.to_string(),
            Descriptor(d) => with_descriptor(d),
        };
        let all = errors(&yaml);
        let prefix = format!("limits.yaml:{}:", case.line);
        let found = all
            .lines()
            .any(|l| l.starts_with(&prefix) && case.needles.iter().all(|n| l.contains(n)));
        if !found {
            failed.push(format!(
                "{}: no error at line {} containing {:?} in:\n{all}",
                case.name, case.line, case.needles
            ));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n\n"));
}

#[test]
fn duplicate_composite_key() {
    let y = "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        value: c\n      - key: b\n        value: c\n";
    assert_error(
        y,
        7,
        &[
            "duplicate descriptor composite key 'd.a.b_c'",
            "first at line 5",
        ],
    );
}

#[test]
fn key_only_and_valued_siblings_are_not_duplicates() {
    let y = "domain: d\ndescriptors:\n  - key: a\n  - key: a\n    value: b\n  - key: a_b\n";
    assert!(Config::from_yaml("limits.yaml", y).is_ok());
}

#[test]
fn same_key_under_different_parents_is_fine() {
    let y = "domain: d\ndescriptors:\n  - key: a\n    descriptors: [{key: b}]\n  - key: c\n    descriptors: [{key: b}]\n";
    assert!(Config::from_yaml("limits.yaml", y).is_ok());
}

#[test]
fn unit_is_case_insensitive() {
    let y = with_descriptor("    rate_limit:\n      unit: Minute\n      requests_per_unit: 1\n");
    assert!(Config::from_yaml("limits.yaml", &y).is_ok());
}

#[test]
fn cascade_without_limited_ancestor() {
    let y = "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        cascade: true\n        rate_limit: {unit: second, requests_per_unit: 1}\n";
    assert_error(
        y,
        6,
        &["'cascade: true' but no ancestor descriptor has a rate_limit"],
    );
}

#[test]
fn cascade_to_unlimited_ancestor() {
    let y = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true}\n    descriptors:\n      - key: b\n        cascade: true\n        rate_limit: {unit: second, requests_per_unit: 1}\n";
    assert_error(y, 7, &["nearest ancestor rate_limit (line 4) is unlimited"]);
}

#[test]
fn cascade_without_own_limit() {
    let y = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    descriptors:\n      - key: b\n        cascade: true\n";
    assert_error(
        y,
        7,
        &["'cascade: true' on a descriptor without a limited rate_limit"],
    );
}

#[test]
fn entity_adjacent_placeholders() {
    let y = "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        entity: \"{a}{b}\"\n        rate_limit: {unit: second, requests_per_unit: 1}\n";
    assert_error(
        y,
        6,
        &["invalid entity template '{a}{b}'", "must be separated"],
    );
}

#[test]
fn limit_name_too_long() {
    let long = "a".repeat(65);
    let y = with_descriptor(&format!(
        "    rate_limit: {{unit: second, requests_per_unit: 1, name: {long}}}\n"
    ));
    assert_error(&y, 4, &["invalid limit name", "at most 64"]);
}

#[test]
fn share_threshold_without_wildcard() {
    let y = "domain: d\ndescriptors:\n  - key: k\n    value: exact\n    share_threshold: true\n";
    assert_error(
        y,
        5,
        &[
            "'share_threshold: true' needs a value with a '*'",
            "'exact'",
        ],
    );
}

#[test]
fn conflicting_limit_in_shared_bucket() {
    let y = r#"domain: d
descriptors:
  - key: tenant
    descriptors:
      - key: kind
        value: a
        entity: "{tenant}"
        rate_limit: {unit: minute, requests_per_unit: 10, name: rpm}
      - key: kind
        value: b
        entity: "{tenant}"
        rate_limit: {unit: minute, requests_per_unit: 20, name: rpm}
"#;
    assert_error(
        y,
        9,
        &["limit 'rpm' differs from the one at line 5", "'{tenant}'"],
    );
}

#[test]
fn same_limit_in_shared_bucket_is_fine() {
    let y = r#"domain: d
descriptors:
  - key: tenant
    descriptors:
      - key: kind
        value: a
        entity: "{tenant}"
        rate_limit: {unit: minute, requests_per_unit: 10, name: rpm}
      - key: kind
        value: b
        entity: "{tenant}"
        rate_limit: {unit: minute, requests_per_unit: 10, name: rpm}
      - key: kind
        value: c
        entity: "{tenant}"
        resource: other
        rate_limit: {unit: hour, requests_per_unit: 1, name: rpm}
"#;
    assert!(Config::from_yaml("limits.yaml", y).is_ok());
}

#[test]
fn every_error_is_reported() {
    let y = "domain: d\nbogus: 1\ndescriptors:\n  - key: \"\"\n  - key: k\n    rate_limit: {unit: parsec, requests_per_unit: 1}\n";
    let e = Config::from_yaml("limits.yaml", y).unwrap_err();
    assert_eq!(e.len(), 3, "{e}");
    let text = e.to_string();
    assert_eq!(text.lines().count(), 3);
    assert!(
        text.lines()
            .next()
            .unwrap()
            .starts_with("limits.yaml:2:1: unknown key 'bogus'"),
        "{text}"
    );
    assert!(e
        .iter()
        .any(|x| matches!(&x.kind, ConfigErrorKind::InvalidUnit(u) if u == "parsec")));
}

#[test]
fn duplicate_domain_names_both_files() {
    let docs = [
        ("a.yaml".to_string(), "domain: same\n".to_string()),
        ("b.yaml".to_string(), "domain: same\n".to_string()),
    ];
    let e = Config::from_documents(&docs).unwrap_err().to_string();
    assert!(e.contains("b.yaml:1"), "{e}");
    assert!(e.contains("duplicate domain 'same'"), "{e}");
    assert!(e.contains("a.yaml:1"), "{e}");
}

#[test]
fn errors_carry_columns() {
    let e = Config::from_yaml(
        "limits.yaml",
        "domain: d\ndescriptors:\n  - key: k\n    nope: 1\n",
    )
    .unwrap_err();
    let first = e.iter().next().unwrap();
    assert_eq!((first.line, first.column), (4, 5));
    assert_eq!(first.file.as_ref(), "limits.yaml");
}

#[test]
fn broken_rate_limit_is_reported_once() {
    let y = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    descriptors:\n      - key: b\n        cascade: true\n        rate_limit: {unit: bogus, requests_per_unit: 1}\n";
    let e = Config::from_yaml("limits.yaml", y).unwrap_err();
    assert_eq!(e.len(), 1, "{e}");
    assert!(e.to_string().contains("invalid unit 'bogus'"));
}

#[test]
fn broken_value_is_not_a_duplicate_key_only_node() {
    let y = "domain: d\ndescriptors:\n  - key: a\n  - key: a\n    value: [x]\n";
    let e = Config::from_yaml("limits.yaml", y).unwrap_err();
    assert_eq!(e.len(), 1, "{e}");
    assert!(e.to_string().contains("'value' must be a string"));
}

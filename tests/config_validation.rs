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

#[test]
fn unknown_top_level_key() {
    assert_error(
        "domain: d\ndomian: x\n",
        2,
        &["unknown key 'domian'", "in the document"],
    );
}

#[test]
fn unknown_descriptor_key() {
    let y = with_descriptor("    rate_limt:\n      unit: second\n");
    assert_error(&y, 4, &["unknown key 'rate_limt' in descriptor"]);
}

#[test]
fn unknown_rate_limit_key() {
    let y = with_descriptor(
        "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      brust: 3\n",
    );
    assert_error(&y, 7, &["unknown key 'brust' in rate_limit"]);
}

#[test]
fn unknown_replaces_key() {
    let y = with_descriptor(
        "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: a\n          nmae: b\n",
    );
    assert_error(&y, 9, &["unknown key 'nmae' in replaces entry"]);
}

#[test]
fn float_where_integer_belongs() {
    let y = with_descriptor("    rate_limit:\n      unit: second\n      requests_per_unit: 1.5\n");
    assert_error(
        &y,
        6,
        &["'requests_per_unit' must be an integer", "float '1.5'"],
    );
}

#[test]
fn string_where_integer_belongs() {
    let y =
        with_descriptor("    rate_limit:\n      unit: second\n      requests_per_unit: \"10\"\n");
    assert_error(
        &y,
        6,
        &["'requests_per_unit' must be an integer", "string '10'"],
    );
}

#[test]
fn negative_requests_per_unit() {
    let y = with_descriptor("    rate_limit:\n      unit: second\n      requests_per_unit: -1\n");
    assert_error(&y, 6, &["'requests_per_unit'", "0..=4294967295", "'-1'"]);
}

#[test]
fn requests_per_unit_above_u32() {
    let y = with_descriptor(
        "    rate_limit:\n      unit: second\n      requests_per_unit: 4294967296\n",
    );
    assert_error(&y, 6, &["'requests_per_unit'", "'4294967296'"]);
}

#[test]
fn burst_zero_is_rejected() {
    let y = with_descriptor(
        "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      burst: 0\n",
    );
    assert_error(&y, 7, &["'burst'", "1..=", "'0'"]);
}

#[test]
fn burst_above_u64() {
    let y = with_descriptor(
        "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      burst: 99999999999999999999\n",
    );
    assert_error(&y, 7, &["'burst'", "'99999999999999999999'"]);
}

#[test]
fn boolean_expected() {
    let y = with_descriptor("    shadow_mode: maybe\n");
    assert_error(&y, 4, &["'shadow_mode' must be true or false", "'maybe'"]);
}

#[test]
fn non_map_descriptor_entry() {
    assert_error(
        "domain: d\ndescriptors:\n  - just a string\n",
        3,
        &["descriptor must be a mapping", "just a string"],
    );
}

#[test]
fn descriptors_not_a_list() {
    assert_error(
        "domain: d\ndescriptors: {key: k}\n",
        2,
        &["'descriptors' must be a list"],
    );
}

#[test]
fn missing_domain() {
    assert_error("descriptors: []\n", 1, &["missing 'domain'"]);
}

#[test]
fn empty_domain() {
    assert_error("domain: \"\"\n", 1, &["'domain' must not be empty"]);
}

#[test]
fn empty_document() {
    assert_error(
        "# nothing here\n",
        1,
        &["must be a mapping", "empty document"],
    );
}

#[test]
fn document_not_a_mapping() {
    assert_error(
        "- a\n- b\n",
        1,
        &["the document must be a mapping", "a list"],
    );
}

#[test]
fn missing_key() {
    assert_error(
        "domain: d\ndescriptors:\n  - value: v\n",
        3,
        &["missing 'key' in descriptor"],
    );
}

#[test]
fn empty_key() {
    assert_error(
        "domain: d\ndescriptors:\n  - key: \"\"\n",
        3,
        &["'key' must not be empty"],
    );
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
fn invalid_unit() {
    let y = with_descriptor("    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n");
    assert_error(&y, 5, &["invalid unit 'fortnight'"]);
}

#[test]
fn unit_is_case_insensitive() {
    let y = with_descriptor("    rate_limit:\n      unit: Minute\n      requests_per_unit: 1\n");
    assert!(Config::from_yaml("limits.yaml", &y).is_ok());
}

#[test]
fn unlimited_with_unit() {
    let y = with_descriptor("    rate_limit:\n      unlimited: true\n      unit: second\n");
    assert_error(
        &y,
        6,
        &["'unlimited: true' must not be combined with 'unit'"],
    );
}

#[test]
fn unlimited_with_burst() {
    let y = with_descriptor("    rate_limit:\n      unlimited: true\n      burst: 5\n");
    assert_error(
        &y,
        6,
        &["'unlimited: true' must not be combined with 'burst'"],
    );
}

#[test]
fn rate_limit_without_unit() {
    let y = with_descriptor("    rate_limit:\n      requests_per_unit: 5\n");
    assert_error(&y, 4, &["rate_limit needs 'unit'"]);
}

#[test]
fn rate_limit_without_requests_per_unit() {
    let y = with_descriptor("    rate_limit:\n      unit: second\n");
    assert_error(&y, 4, &["rate_limit needs 'requests_per_unit'"]);
}

#[test]
fn empty_replaces_entry() {
    let y = with_descriptor("    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - {}\n");
    assert_error(&y, 8, &["'replaces' entry needs a non-empty 'name'"]);
}

#[test]
fn replaces_entry_not_a_map() {
    let y = with_descriptor("    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - other\n");
    assert_error(&y, 8, &["'replaces' entry must be a mapping", "'other'"]);
}

#[test]
fn replaces_own_name() {
    let y = with_descriptor(
        "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      name: mine\n      replaces:\n        - name: mine\n",
    );
    assert_error(&y, 9, &["'replaces' names this rule's own name 'mine'"]);
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
fn entity_key_not_on_path() {
    let y = with_descriptor(
        "    entity: \"t:{tenant}\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    assert_error(
        &y,
        4,
        &["entity template 't:{tenant}'", "'{tenant}'", "key 'tenant'"],
    );
}

#[test]
fn entity_unterminated_placeholder() {
    let y = with_descriptor(
        "    entity: \"t:{k\"\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    assert_error(&y, 4, &["invalid entity template 't:{k'", "not closed"]);
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
fn invalid_limit_name_characters() {
    let y = with_descriptor(
        "    rate_limit: {unit: second, requests_per_unit: 1, name: \"my limit\"}\n",
    );
    assert_error(&y, 4, &["invalid limit name 'my limit'"]);
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
fn limit_name_wcu_is_reserved() {
    let y = with_descriptor("    rate_limit: {unit: second, requests_per_unit: 1, name: wcu}\n");
    assert_error(&y, 4, &["invalid limit name 'wcu'", "reserved"]);
}

#[test]
fn invalid_failure_mode_top_level() {
    assert_error(
        "domain: d\nfailure_mode: open\n",
        2,
        &["invalid failure_mode 'open'"],
    );
}

#[test]
fn invalid_failure_mode_descriptor() {
    let y = with_descriptor("    failure_mode: closed\n");
    assert_error(&y, 4, &["invalid failure_mode 'closed'"]);
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
fn empty_resource() {
    let y = with_descriptor("    resource: \"\"\n");
    assert_error(&y, 4, &["'resource' must not be empty"]);
}

#[test]
fn resource_with_hash() {
    let y = with_descriptor("    resource: \"a#b\"\n");
    assert_error(&y, 4, &["invalid resource 'a#b'"]);
}

#[test]
fn metadata_not_a_map() {
    let y = with_descriptor("    metadata: [1, 2]\n");
    assert_error(&y, 4, &["'metadata' must be a mapping"]);
}

#[test]
fn non_string_key() {
    let y = with_descriptor("    1: x\n");
    assert_error(
        &y,
        4,
        &["keys of descriptor must be strings", "integer '1'"],
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
fn syntax_error_names_file_and_line() {
    assert_error("domain: d\ndescriptors: [\n", 2, &["YAML syntax error"]);
}

#[test]
fn duplicate_yaml_key_is_a_syntax_error() {
    assert_error("domain: d\ndomain: e\n", 2, &["duplicate"]);
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

#[test]
fn unit_multiplier_zero_is_out_of_range() {
    let y = with_descriptor(
        "    rate_limit:\n      unit: minute\n      unit_multiplier: 0\n      requests_per_unit: 1\n",
    );
    assert_error(
        &y,
        6,
        &["'unit_multiplier'", "must be an integer in 1..=", "'0'"],
    );
}

#[test]
fn unit_multiplier_past_a_year_is_refused() {
    let y = with_descriptor(
        "    rate_limit:\n      unit: day\n      unit_multiplier: 400\n      requests_per_unit: 1\n",
    );
    assert_error(
        &y,
        6,
        &[
            "'unit_multiplier: 400' makes a period of 400 days",
            "the longest period is a year",
        ],
    );
}

#[test]
fn unit_multiplier_must_be_an_integer() {
    let y = with_descriptor(
        "    rate_limit:\n      unit: minute\n      unit_multiplier: five\n      requests_per_unit: 1\n",
    );
    assert_error(&y, 6, &["'unit_multiplier' must be an integer"]);
}

#[test]
fn unlimited_with_unit_multiplier() {
    let y = with_descriptor("    rate_limit:\n      unlimited: true\n      unit_multiplier: 5\n");
    assert_error(
        &y,
        6,
        &["'unlimited: true' must not be combined with 'unit_multiplier'"],
    );
}

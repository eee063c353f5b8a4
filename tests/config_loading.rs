//! Loading files and directories (docs/configuration.md, "Where the configuration comes from"), the content hash, and an
//! envoyproxy/ratelimit config that must load unchanged.

use std::fs;
use std::path::Path;

use shardgate::config::{Config, LoadOptions, RuleLimit, Unit};

const RPS: &str =
    "descriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n";

fn write(dir: &Path, name: &str, text: &str) {
    fs::write(dir.join(name), text).unwrap();
}

#[test]
fn loads_a_single_file() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "one.yaml", &format!("domain: one\n{RPS}"));
    let c = Config::load(&dir.path().join("one.yaml")).unwrap();
    assert!(c.domain("one").is_some());
    assert_eq!(c.domains().count(), 1);
}

#[test]
fn loads_every_yaml_file_of_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", &format!("domain: a\n{RPS}"));
    write(dir.path(), "b.yml", &format!("domain: b\n{RPS}"));
    write(dir.path(), "notes.txt", "not yaml: [");
    write(dir.path(), ".hidden.yaml", "this is: [broken");
    fs::create_dir(dir.path().join("sub.yaml")).unwrap();
    let c = Config::load(dir.path()).unwrap();
    let mut names: Vec<&str> = c.domains().map(|d| d.name.as_ref()).collect();
    names.sort();
    assert_eq!(names, ["a", "b"]);
}

#[test]
fn duplicate_domain_across_files() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", "domain: same\n");
    write(dir.path(), "b.yaml", "\ndomain: same\n");
    let e = Config::load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("b.yaml:2"), "{e}");
    assert!(e.contains("duplicate domain 'same' (also in "), "{e}");
    assert!(e.contains("a.yaml:1"), "{e}");
}

#[test]
fn errors_name_the_file_inside_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "good.yaml", "domain: good\n");
    write(dir.path(), "bad.yaml", "domain: bad\nextra: 1\n");
    let e = Config::load(dir.path()).unwrap_err();
    assert_eq!(e.len(), 1);
    let first = e.iter().next().unwrap();
    assert!(first.file.ends_with("bad.yaml"), "{e}");
    assert_eq!(first.line, 2);
}

#[test]
fn missing_path_is_an_error() {
    let e = Config::load(Path::new("/nonexistent/shardgate.yaml")).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("/nonexistent/shardgate.yaml: cannot read"),
        "{e}"
    );
}

#[cfg(unix)]
#[test]
fn kubernetes_configmap_layout_loads_each_domain_once() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("..2026_01_01");
    fs::create_dir(&data).unwrap();
    write(&data, "limits.yaml", &format!("domain: k8s\n{RPS}"));
    symlink("..2026_01_01", dir.path().join("..data")).unwrap();
    symlink("..data/limits.yaml", dir.path().join("limits.yaml")).unwrap();
    let c = Config::load(dir.path()).unwrap();
    assert_eq!(c.domains().count(), 1);
    let d = c.domain("k8s").unwrap();
    assert!(d.match_descriptor(&[("k", "v")]).is_some());
}

#[cfg(unix)]
#[test]
fn symlinked_config_file_is_followed() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "real.conf", "domain: linked\n");
    symlink(dir.path().join("real.conf"), dir.path().join("link.yaml")).unwrap();
    let c = Config::load(dir.path()).unwrap();
    assert!(c.domain("linked").is_some());
}

#[test]
fn hash_is_stable_and_tracks_content() {
    let a = ("a.yaml".to_string(), "domain: a\n".to_string());
    let b = ("b.yaml".to_string(), "domain: b\n".to_string());
    let h1 = Config::from_documents(&[a.clone(), b.clone()]).unwrap();
    let h2 = Config::from_documents(&[b.clone(), a.clone()]).unwrap();
    assert_eq!(h1.hash(), h2.hash());
    assert_eq!(h1.hash().len(), 16);
    assert!(h1.hash().bytes().all(|c| c.is_ascii_hexdigit()));
    let changed = ("b.yaml".to_string(), "domain: b  \n".to_string());
    let h3 = Config::from_documents(&[a, changed]).unwrap();
    assert_ne!(h1.hash(), h3.hash());
}

#[test]
fn envoyproxy_ratelimit_config_loads_unchanged() {
    let yaml = r#"---
domain: envoy_front
descriptors:
  # Every remote address, 10/s, except the shadowed internal network.
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
    shadow_mode: true
  - key: generic_key
    value: quota
    quota_mode: true
    rate_limit:
      name: monthly
      unit: MONTH
      requests_per_unit: 100000
  - key: destination_cluster
    value: mock
    detailed_metric: true
    descriptors:
      - key: header_match
        value: "*"
        share_threshold: true
        value_to_metric: true
        rate_limit:
          unit: minute
          requests_per_unit: 50
          name: cluster_wide
      - key: path
        value: /v1/*
        metadata:
          owner: payments
          tags: [a, b]
          nested: {x: 1, y: 2.5, z: null}
        rate_limit:
          unit: hour
          requests_per_unit: 1000
          name: per_path
          replaces:
            - name: cluster_wide
  - key: client_id
    value: internal
    rate_limit:
      unlimited: true
  - key: year_key
    rate_limit: {unit: year, requests_per_unit: 1}
  - key: week_key
    rate_limit: {unit: week, requests_per_unit: 7}
  - key: day_key
    value: 200
    rate_limit: {unit: day, requests_per_unit: 0}
"#;
    let c = Config::from_yaml("config.yaml", yaml).unwrap();
    let d = c.domain("envoy_front").unwrap();
    assert_eq!(d.rules().count(), 8);

    let r = d
        .match_descriptor(&[("remote_address", "10.0.0.1")])
        .unwrap();
    assert!(r.shadow_mode);

    let r = d.match_descriptor(&[("generic_key", "quota")]).unwrap();
    assert!(r.quota_mode);
    assert_eq!(r.name.as_deref(), Some("monthly"));
    assert!(matches!(&r.limit, RuleLimit::Limited(l) if l.unit == Unit::Month));

    let shared = [
        ("destination_cluster", "mock"),
        ("header_match", "anything"),
    ];
    let r = d.match_descriptor(&shared).unwrap();
    assert!(r.levels[1].value_to_metric && !r.levels[0].value_to_metric);
    assert!(r.stats_key_varies());
    assert_eq!(r.levels[1].value.as_deref(), Some("*"));
    assert!(r.levels[1].share_threshold);
    assert_eq!(
        r.entity_for(&shared),
        r.entity_for(&[("destination_cluster", "mock"), ("header_match", "other")])
    );

    let r = d
        .match_descriptor(&[("destination_cluster", "mock"), ("path", "/v1/pay")])
        .unwrap();
    assert_eq!(r.replaces, ["cluster_wide"]);
    assert_eq!(
        r.stats_key,
        "envoy_front.destination_cluster_mock.path_/v1/*"
    );
    assert_eq!(
        r.metadata,
        Some(
            serde_json::json!({"owner": "payments", "tags": ["a", "b"], "nested": {"x": 1, "y": 2.5, "z": null}})
        )
    );

    let r = d.match_descriptor(&[("client_id", "internal")]).unwrap();
    assert_eq!(r.limit, RuleLimit::Unlimited);

    // An integer-looking value is the text as written, as envoyproxy reads it.
    let r = d.match_descriptor(&[("day_key", "200")]).unwrap();
    assert!(
        matches!(&r.limit, RuleLimit::Limited(l) if l.requests_per_unit == 0 && l.unit == Unit::Day)
    );
    assert!(d.match_descriptor(&[("year_key", "x")]).is_some());
    assert!(d.match_descriptor(&[("week_key", "x")]).is_some());
}

#[test]
fn domain_without_descriptors_is_valid() {
    let c = Config::from_yaml("empty.yaml", "domain: nothing\n").unwrap();
    assert_eq!(c.domain("nothing").unwrap().rules().count(), 0);
}

#[test]
fn empty_directory_has_no_domains() {
    let dir = tempfile::tempdir().unwrap();
    let c = Config::load(dir.path()).unwrap();
    assert_eq!(c.domains().count(), 0);
}

#[test]
fn an_rlqs_section_maps_bucket_ids_to_descriptors_and_merged_files_must_agree_on_it() {
    let pairs = |p: &[(&str, &str)]| -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let id = pairs(&[("path", "/a"), ("plan", "gold"), ("tenant", "acme")]);
    let plain = Config::from_yaml("a.yaml", "domain: d\n").unwrap();
    assert_eq!(plain.domain("d").unwrap().rlqs_descriptor(&id), id);
    let yaml = "domain: d\nrlqs:\n  keys: [tenant, plan]\n";
    let c = Config::from_yaml("a.yaml", yaml).unwrap();
    assert_eq!(
        c.domain("d").unwrap().rlqs_descriptor(&id),
        pairs(&[("tenant", "acme"), ("plan", "gold")])
    );
    let merge = LoadOptions {
        merge_domains: true,
    };
    let docs = |second: &str| {
        vec![
            ("a.yaml".to_string(), yaml.to_string()),
            ("b.yaml".to_string(), second.to_string()),
        ]
    };
    // One part sets it: it holds for the domain.
    let c = Config::from_documents_with(&docs("domain: d\n"), &merge).unwrap();
    assert!(c.domain("d").unwrap().rlqs_keys.is_some());
    let refused = Config::from_documents_with(&docs("domain: d\nrlqs: {keys: [plan]}\n"), &merge)
        .unwrap_err()
        .to_string();
    assert!(
        refused.starts_with("b.yaml:1:") && refused.contains("'rlqs' differs from a.yaml's"),
        "{refused}"
    );
}

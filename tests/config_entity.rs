//! Entities must be unambiguous: request values can never forge another bucket
//! (docs/configuration.md, "Buckets").

use proptest::prelude::*;
use shardgate::config::{encode_component, Config, DescriptorEntry, EntityTemplate, Level};

/// A rule path of key-only levels for the given entries (every value is the request's).
fn key_only_levels(entries: &[(String, String)]) -> Vec<Level> {
    entries
        .iter()
        .map(|(k, _)| Level {
            key: k.clone(),
            value: None,
            regex: false,
            share_threshold: false,
            value_to_metric: false,
        })
        .collect()
}

/// The default entity of a key-only path, computed through a real compiled rule.
fn default_entity(entries: &[(String, String)]) -> String {
    let mut yaml = String::from("domain: d\ndescriptors:\n");
    let mut indent = String::from("  ");
    for (i, (k, _)) in entries.iter().enumerate() {
        let key = serde_json::to_string(k).unwrap();
        yaml.push_str(&format!("{indent}- key: {key}\n"));
        if i + 1 == entries.len() {
            yaml.push_str(&format!(
                "{indent}  rate_limit: {{unit: second, requests_per_unit: 1}}\n"
            ));
        } else {
            yaml.push_str(&format!("{indent}  descriptors:\n"));
        }
        indent.push_str("    ");
    }
    let c = Config::from_yaml("p.yaml", &yaml).unwrap();
    let rule = c
        .domain("d")
        .unwrap()
        .match_descriptor(entries)
        .unwrap()
        .clone();
    assert_eq!(rule.levels, key_only_levels(entries));
    rule.entity_for(entries).to_string()
}

fn component() -> impl Strategy<Value = String> {
    // Separator-heavy alphabet, plus newline and non-ASCII.
    proptest::string::string_regex("[ab_/=#%*:\n\u{e9}\u{1F600}]{1,6}").unwrap()
}

fn entries() -> impl Strategy<Value = Vec<(String, String)>> {
    proptest::collection::vec((component(), component()), 1..4)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn distinct_entry_lists_have_distinct_default_entities(a in entries(), b in entries()) {
        prop_assume!(a != b);
        prop_assert_ne!(default_entity(&a), default_entity(&b));
    }

    #[test]
    fn encoded_components_contain_no_separator(s in component()) {
        let e = encode_component(&s);
        prop_assert!(!e.contains(['/', '=', '#', ':', '*', '\n']));
        prop_assert!(e.is_ascii());
    }

    #[test]
    fn template_is_injective_in_its_values(
        a in (component(), component()),
        b in (component(), component()),
    ) {
        prop_assume!(a != b);
        let t = EntityTemplate::parse("t:{x}:{y}").unwrap();
        let levels = key_only_levels(&[("x".into(), String::new()), ("y".into(), String::new())]);
        let ea = [("x", a.0.as_str()), ("y", a.1.as_str())];
        let eb = [("x", b.0.as_str()), ("y", b.1.as_str())];
        prop_assert_ne!(t.render(&levels, &ea), t.render(&levels, &eb));
    }
}

fn owned(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn underscore_joining_does_not_collide() {
    assert_ne!(
        default_entity(&owned(&[("a_b", "c")])),
        default_entity(&owned(&[("a", "b_c")]))
    );
}

#[test]
fn one_value_cannot_spell_two_entries() {
    let one = default_entity(&owned(&[("a", "b/c=d")]));
    let two = default_entity(&owned(&[("a", "b"), ("c", "d")]));
    assert_ne!(one, two);
    assert_eq!(two, "a=b/c=d");
    assert_eq!(one, "a=b%2Fc%3Dd");
}

#[test]
fn store_key_separator_is_encoded() {
    let e = default_entity(&owned(&[("k", "x#BUCKET#y")]));
    assert!(!e.contains('#'), "{e}");
}

#[test]
fn descriptor_entry_is_implemented_for_references() {
    let pair = ("k", "v");
    let refs = [&pair];
    assert_eq!(refs[0].key(), "k");
    assert_eq!(refs[0].value(), "v");
}

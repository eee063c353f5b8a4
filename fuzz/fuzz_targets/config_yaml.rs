//! Arbitrary text through the config loader: `Config::from_documents`, the path every
//! `--config` file and every reload takes (YAML parse, strict validation, tree compile).
//!
//! Invariants: no panic, no hang; a rejected input reports at least one error and every
//! error prints; an accepted one has a 16-hex-digit hash, loads again to the same hash,
//! and its matcher answers the descriptors built from its own rules with a rule of the
//! descriptor's depth (or nothing), whose entity can be computed.
//!
//! The input may hold several files separated by the line `# --- next file ---`, so that
//! cross-file checks (duplicate domains) are reached too.

#![no_main]

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use libfuzzer_sys::fuzz_target;
use shardgate::config::{Config, Domain, Rule, RuleLimit};

const FILE_SEPARATOR: &str = "\n# --- next file ---\n";

/// At most this many files per input (the rest stays in the last one).
const MAX_FILES: usize = 4;

/// Values tried in place of a rule's own value: wildcard fillers and edge cases.
const FILLERS: [&str; 4] = ["", "x", "/é/", "a*b"];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let docs: Vec<(String, String)> = text
        .splitn(MAX_FILES, FILE_SEPARATOR)
        .enumerate()
        .map(|(i, doc)| (format!("fuzz{i}.yaml"), doc.to_string()))
        .collect();
    match Config::from_documents(&docs) {
        Err(errors) => {
            assert!(!errors.is_empty(), "a rejected config reports an error");
            assert_eq!(errors.len(), errors.iter().count());
            for e in &errors {
                let shown = e.to_string();
                assert!(
                    shown.starts_with(&*e.file),
                    "message {shown:?} names its file"
                );
            }
            let _ = errors.to_string();
        }
        Ok(config) => {
            let hash = config.hash();
            assert_eq!(hash.len(), 16, "hash {hash:?}");
            assert!(hash.bytes().all(|b| b.is_ascii_hexdigit()), "hash {hash:?}");
            let again = Config::from_documents(&docs).expect("the same input loads again");
            assert_eq!(again.hash(), hash, "loading is deterministic");
            for domain in config.domains() {
                assert!(config.domain(&domain.name).is_some());
                exercise_matcher(domain);
            }
        }
    }
});

/// Builds descriptors from each rule's own path (wildcards filled in several ways) and
/// matches them.
fn exercise_matcher(domain: &Domain) {
    for rule in domain.rules() {
        assert!(rule.depth() > 0, "a rule sits below the domain root");
        for filler in FILLERS {
            let entries: Vec<Entry> = rule
                .levels
                .iter()
                .map(|level| Entry {
                    key: level.key.clone(),
                    value: match &level.value {
                        Some(v) => v.replace('*', filler),
                        None => filler.to_string(),
                    },
                })
                .collect();
            check_match(domain, &entries);
            // One entry short and one too many: a rule must sit at the descriptor's depth.
            check_match(domain, &entries[..entries.len() - 1]);
            let mut longer = entries.clone();
            longer.push(Entry {
                key: "k".into(),
                value: filler.into(),
            });
            check_match(domain, &longer);
        }
    }
}

fn check_match(domain: &Domain, entries: &[Entry]) {
    let Some(rule) = domain.match_descriptor(entries) else {
        return;
    };
    assert_eq!(
        rule.depth(),
        entries.len(),
        "rule at {} matched a descriptor of another depth",
        rule.source
    );
    exercise_rule(rule, entries);
}

fn exercise_rule(rule: &Rule, entries: &[Entry]) {
    if let RuleLimit::Limited(limit) = &rule.limit {
        assert!(limit.capacity() > 0 || limit.requests_per_unit == 0);
    }
    let _ = rule.limit_name();
    let _ = rule.entity_for(entries);
    let mut parent = rule.cascade_parent.as_deref();
    let mut hops = 0;
    while let Some(p) = parent {
        assert!(p.depth() < rule.depth(), "a cascade parent is an ancestor");
        assert!(
            matches!(p.limit, RuleLimit::Limited(_)),
            "a cascade parent is limited"
        );
        let _ = p.entity_for(entries);
        parent = p.cascade_parent.as_deref();
        hops += 1;
        assert!(hops <= entries.len(), "cascade chain longer than the path");
    }
}

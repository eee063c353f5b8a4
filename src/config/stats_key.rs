//! envoyproxy/ratelimit's stats keys, built in one place: a rule's own key
//! (`domain.key_value.key…`, the node's composite key, also what duplicate rules are
//! detected by) and the key a request's hit is counted under when the rule asks for the
//! request's values (`detailed_metric`, `value_to_metric`).
//!
//! Names only; what the keys label (metrics) is the service's.

use super::{DescriptorEntry, Rule};

/// A node's part of a composite key: `key_value`, or `key` when key-only.
pub(crate) fn composite_part(key: &str, value: Option<&str>) -> String {
    match value {
        Some(v) => format!("{key}_{v}"),
        None => key.to_string(),
    }
}

/// The composite key of a child of the node keyed `parent` (the domain at the root).
pub(crate) fn child_key(parent: &str, key: &str, value: Option<&str>) -> String {
    format!("{parent}.{}", composite_part(key, value))
}

/// The composite key of a rule for exactly these `(key, value)` entries (a request's own
/// `limit` override: every entry is a node with its value).
pub fn entries_key<E: DescriptorEntry>(domain: &str, entries: &[E]) -> String {
    entries.iter().fold(domain.to_string(), |parent, e| {
        child_key(&parent, e.key(), Some(e.value()))
    })
}

/// The key a hit on `rule` by a request with `entries` is counted under: the rule's own
/// key, or, when the rule asks for the request's values, each level's key with the
/// request's value (`detailed_metric`) or the node's literal value where it has one
/// (`value_to_metric` keeps wildcard levels' request values).
pub fn hit_key<E: DescriptorEntry>(rule: &Rule, entries: &[E]) -> String {
    if !(rule.detailed_metric || rule.value_to_metric) {
        return rule.stats_key.clone();
    }
    let mut key = rule.domain.to_string();
    for (level, e) in rule.levels.iter().zip(entries) {
        let literal = level.value.as_deref().filter(|v| !v.contains('*'));
        let value = match (rule.detailed_metric, literal) {
            (false, Some(v)) => v,
            _ => e.value(),
        };
        key = child_key(&key, e.key(), Some(value));
    }
    key
}

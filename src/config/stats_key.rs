//! envoyproxy/ratelimit's stats keys, built in one place: a rule's own key
//! (`domain.key_value.key…`, the node's composite key, also what duplicate rules are
//! detected by) and the key a request's hit is counted under when the rule asks for the
//! request's values (`detailed_metric`, `value_to_metric`, `share_threshold`), decided
//! node by node as envoyproxy/ratelimit does.
//!
//! Names only; what the keys label (metrics) is the service's.

use super::{DescriptorEntry, Level, Rule};

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

/// The stats key of a request's own `limit` override: `domain.key_value…`, a level with an
/// empty value written as its key alone (envoyproxy/ratelimit's `descriptorKey`).
pub fn entries_key<E: DescriptorEntry>(domain: &str, entries: &[E]) -> String {
    entries.iter().fold(domain.to_string(), |parent, e| {
        let value = Some(e.value()).filter(|v| !v.is_empty());
        child_key(&parent, e.key(), value)
    })
}

/// The key a hit on `rule` by a request with `entries` is counted under, as
/// envoyproxy/ratelimit builds it (its `GetLimit`):
/// - `detailed_metric` on the rule: every level as `key_value` with the request's value,
///   except a `share_threshold` level, which keeps its pattern (and then an empty value
///   leaves the level as its key alone);
/// - otherwise, level by level: a literal value is kept, a wildcard (or a `value_regex`) keeps its pattern
///   unless the node has `value_to_metric` (then the request's value; `share_threshold`
///   wins over it), and a key-only node is its key alone, or `key_value` with the
///   request's value under `value_to_metric`. An empty value adds nothing.
///
/// Without any of these flags this is the rule's own [`Rule::stats_key`].
pub fn hit_key<E: DescriptorEntry>(rule: &Rule, entries: &[E]) -> String {
    if !rule.stats_key_varies() {
        return rule.stats_key.clone();
    }
    let mut key = rule.domain.to_string();
    let shared = rule.levels.iter().any(|l| l.share_threshold);
    for (level, e) in rule.levels.iter().zip(entries) {
        let value: Option<&str> = if rule.detailed_metric && !shared {
            // Upstream writes `key_value` here even for an empty value.
            Some(e.value())
        } else {
            level_value(level, e.value(), rule.detailed_metric)
        };
        key = child_key(&key, e.key(), value);
    }
    key
}

/// What one level adds after its key (`None`: the key alone).
fn level_value<'a>(level: &'a Level, request: &'a str, detailed: bool) -> Option<&'a str> {
    let pattern = level
        .value
        .as_deref()
        .filter(|v| level.regex || v.contains('*'));
    let chosen = match (&level.value, pattern) {
        (_, Some(p)) if level.share_threshold => Some(p),
        _ if detailed => Some(request),
        (_, Some(_)) if level.value_to_metric => Some(request),
        (_, Some(p)) => Some(p),
        (Some(literal), None) => Some(literal.as_str()),
        (None, None) if level.value_to_metric => Some(request),
        (None, None) => None,
    };
    chosen.filter(|v| !v.is_empty())
}

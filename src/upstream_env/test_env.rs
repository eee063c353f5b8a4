//! The unit tests' shorthand: an environment from pairs, and what a translation sets.

use std::collections::BTreeMap;

use super::Translation;

pub(super) fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub(super) fn set(t: &Translation) -> Vec<(&str, &str)> {
    t.set.iter().map(|a| (a.ours, a.value.as_str())).collect()
}

//! What one request may carry: the bounds on its size (hostile-input protection) and the
//! checks that refuse a malformed request with a message naming the field. Nothing here
//! looks at rules or buckets.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

use super::wire::{Keep, RequestView};
use crate::config::{DescriptorEntry, Unit};

impl DescriptorEntry for Entry {
    fn key(&self) -> &str {
        &self.key
    }
    fn value(&self) -> &str {
        &self.value
    }
}

/// Bounds on what one request may carry (hostile-input protection).
#[derive(Debug, Clone)]
pub struct RequestLimits {
    pub max_descriptors: usize,
    pub max_entries: usize,
    pub max_key_bytes: usize,
    pub max_value_bytes: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits {
            max_descriptors: 64,
            max_entries: 16,
            max_key_bytes: 256,
            max_value_bytes: 1_024,
        }
    }
}

impl RequestLimits {
    /// What the wire reader keeps of a request: anything past these counts is refused
    /// by its count alone.
    pub(crate) fn keep(&self) -> Keep {
        Keep {
            descriptors: self.max_descriptors,
            entries: self.max_entries,
        }
    }
}

/// Whether `req` is well-formed and within `l`; the error names the field.
pub(super) fn validate(l: &RequestLimits, req: &RequestView<'_>) -> Result<(), String> {
    let bad = |m: String| Err(m);
    if req.domain.is_empty() {
        return bad("domain must not be empty".into());
    }
    if req.descriptors_seen() == 0 {
        return bad("descriptors must not be empty".into());
    }
    if req.descriptors_seen() > l.max_descriptors {
        return bad(format!(
            "descriptors: {} exceeds the maximum of {}",
            req.descriptors_seen(),
            l.max_descriptors
        ));
    }
    for (i, d) in req.descriptors().enumerate() {
        if d.entries_seen == 0 {
            return bad(format!("descriptors[{i}].entries must not be empty"));
        }
        if d.entries_seen > l.max_entries {
            return bad(format!(
                "descriptors[{i}].entries: {} exceeds the maximum of {}",
                d.entries_seen, l.max_entries
            ));
        }
        for (j, e) in d.entries.iter().enumerate() {
            if e.key.is_empty() {
                return bad(format!(
                    "descriptors[{i}].entries[{j}].key must not be empty"
                ));
            }
            if e.key.len() > l.max_key_bytes {
                return bad(format!(
                    "descriptors[{i}].entries[{j}].key: {} bytes exceeds the maximum of {}",
                    e.key.len(),
                    l.max_key_bytes
                ));
            }
            if e.value.len() > l.max_value_bytes {
                return bad(format!(
                    "descriptors[{i}].entries[{j}].value: {} bytes exceeds the maximum of {}",
                    e.value.len(),
                    l.max_value_bytes
                ));
            }
        }
        if let Some(limit) = d.limit {
            if Unit::from_proto(limit.unit).is_none() {
                return bad(format!(
                    "descriptors[{i}].limit.unit: unknown unit {}",
                    limit.unit
                ));
            }
        }
    }
    Ok(())
}

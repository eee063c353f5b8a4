//! Strict validation: turns one parsed YAML document into a [`DocumentModel`], reporting
//! every problem (docs/configuration.md, "Validation") with its position instead of
//! stopping at the first. Reading a mapping's keys and scalars is `fields.rs`'s.
//!
//! It checks the schema (known keys, types, ranges) and the rules that span nodes
//! (duplicate composite keys, cascade parents, template keys, limit names shared by one
//! bucket). It must not build the matcher or touch files.

use std::collections::HashMap;
use std::sync::Arc;

use super::error::{ConfigError, ConfigErrorKind as K};
use super::model::{DescriptorModel, DocumentModel, Node, NodeKind, Pos, RateLimitModel};
use super::stats_key::child_key;
use super::{
    EntityTemplate, FailureMode, RateLimit, RuleLimit, Unit, MAX_LIMITS_PER_BUCKET,
    MAX_PERIOD_SECONDS, MAX_TOKENS,
};
use crate::store::key::MAX_RESOURCE_BYTES;
use fields::{to_json, Field};

mod fields;

const TOP_KEYS: &[&str] = &["domain", "descriptors", "failure_mode"];
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "rate_limit",
    "shadow_mode",
    "quota_mode",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
    "entity",
    "resource",
    "cascade",
    "failure_mode",
    "descriptors",
];
const RATE_LIMIT_KEYS: &[&str] = &[
    "unit",
    "unit_multiplier",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "burst",
    "overdraft",
    "lease",
];
const REPLACES_KEYS: &[&str] = &["name"];

/// Longest accepted limit name (it becomes part of store attribute names).
const MAX_LIMIT_NAME: usize = 64;
/// The store's own per-item limit (docs/architecture.md, "Buckets and items").
const RESERVED_LIMIT_NAME: &str = "wcu";

/// Validates one document. The model is returned whenever the domain could be read, even
/// with errors elsewhere, so that duplicate domains are still reported.
pub(crate) fn document(
    file: &Arc<str>,
    root: &Node,
    shared: &mut SharedBuckets,
) -> (Option<DocumentModel>, Vec<ConfigError>) {
    let mut v = Validator {
        file: Arc::clone(file),
        errors: Vec::new(),
        shared,
    };
    let doc = v.top(root);
    (doc, v.errors)
}

/// What the descendants of a node need to know about its ancestors.
#[derive(Clone)]
struct Scope {
    /// Keys on the path from the root, this node's included once entered.
    keys: Vec<String>,
    /// envoyproxy/ratelimit's composite key of this node (`domain.k_v`).
    composite: String,
    resource: String,
    /// The nearest ancestor with a `rate_limit`: its line and whether it is unlimited.
    nearest_limit: Option<(u32, bool)>,
}

/// One limit of an explicitly templated rule, for the shared-bucket consistency check.
struct BucketLimit {
    params: RateLimit,
    file: Arc<str>,
    line: u32,
}

/// What the shared-bucket check remembers across every document of one load: rules of
/// different files (or domains) with the same template and resource share a bucket too.
#[derive(Default)]
pub(crate) struct SharedBuckets {
    /// (template, resource, limit name) → the first rule declaring it.
    bucket_limits: HashMap<(String, String, String), BucketLimit>,
    /// (template, resource) → how many limit names its bucket item holds.
    limits_per_bucket: HashMap<(String, String), usize>,
}

struct Validator<'a> {
    file: Arc<str>,
    errors: Vec<ConfigError>,
    shared: &'a mut SharedBuckets,
}

impl Validator<'_> {
    fn error(&mut self, pos: Pos, kind: K) {
        self.errors.push(ConfigError::new(&self.file, pos, kind));
    }

    fn top(&mut self, root: &Node) -> Option<DocumentModel> {
        if root.kind == NodeKind::Null {
            self.error(
                Pos { line: 1, column: 1 },
                K::NotAMapping {
                    what: "the document",
                    found: "an empty document".into(),
                },
            );
            return None;
        }
        let fields = self.fields(root, "the document", "the document", TOP_KEYS)?;
        let failure_mode = fields
            .get("failure_mode")
            .and_then(|f| self.failure_mode(f));
        let domain = match fields.get("domain") {
            None => {
                self.error(
                    root.pos,
                    K::MissingKey {
                        key: "domain",
                        context: "the document",
                    },
                );
                None
            }
            Some(f) => self.required_text(f).filter(|d| {
                // The domain is the default resource, part of every store key.
                let fits = d.len() <= MAX_RESOURCE_BYTES;
                if !fits {
                    self.error(
                        f.value.pos,
                        K::TooLong {
                            key: "domain",
                            bytes: d.len(),
                            max: MAX_RESOURCE_BYTES,
                        },
                    );
                }
                fits
            }),
        };
        let scope = Scope {
            keys: Vec::new(),
            composite: domain.clone().unwrap_or_default(),
            resource: domain.clone().unwrap_or_default(),
            nearest_limit: None,
        };
        let descriptors = match fields.get("descriptors") {
            Some(f) => self.descriptor_list(f, &scope),
            None => Vec::new(),
        };
        Some(DocumentModel {
            domain: domain?,
            pos: fields.get("domain").map_or(root.pos, |f| f.value.pos),
            failure_mode,
            descriptors,
        })
    }

    fn failure_mode(&mut self, f: &Field) -> Option<FailureMode> {
        let text = self.text(f)?;
        match text.to_ascii_lowercase().as_str() {
            "allow" => Some(FailureMode::Allow),
            "deny" => Some(FailureMode::Deny),
            _ => {
                self.error(f.value.pos, K::InvalidFailureMode(text));
                None
            }
        }
    }

    fn descriptor_list(&mut self, f: &Field, scope: &Scope) -> Vec<DescriptorModel> {
        let items = match &f.value.kind {
            NodeKind::Seq(items) => items,
            NodeKind::Null => return Vec::new(),
            _ => {
                self.wrong_type(f, "a list of descriptors");
                return Vec::new();
            }
        };
        let mut siblings: HashMap<(String, Option<String>), u32> = HashMap::new();
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let Some(d) = self.descriptor(item, scope) else {
                continue;
            };
            let id = (d.key.clone(), d.value.clone());
            if let Some(first_line) = siblings.get(&id) {
                let key = child_key(&scope.composite, &d.key, d.value.as_deref());
                self.error(
                    d.pos,
                    K::DuplicateCompositeKey {
                        key,
                        first_line: *first_line,
                    },
                );
                continue;
            }
            siblings.insert(id, d.pos.line);
            out.push(d);
        }
        out
    }

    fn descriptor(&mut self, node: &Node, parent: &Scope) -> Option<DescriptorModel> {
        let fields = self.fields(node, "a descriptor", "descriptor", DESCRIPTOR_KEYS)?;
        let key = match fields.get("key") {
            Some(f) => self.required_text(f),
            None => {
                self.error(
                    node.pos,
                    K::MissingKey {
                        key: "key",
                        context: "descriptor",
                    },
                );
                None
            }
        };
        let errors_before = self.errors.len();
        let value = fields
            .get("value")
            .and_then(|f| self.text(f))
            .filter(|v| !v.is_empty());
        // A value that failed to read must not make the node look key-only (that would
        // report a bogus duplicate or match the wrong requests).
        let value_failed = self.errors.len() > errors_before;
        let rate_limit = fields.get("rate_limit").and_then(|f| self.rate_limit(f));
        let shadow_mode = self.boolean(fields.get("shadow_mode"));
        let quota_mode = self.boolean(fields.get("quota_mode"));
        let detailed_metric = self.boolean(fields.get("detailed_metric"));
        let value_to_metric = self.boolean(fields.get("value_to_metric"));
        let share_threshold = self.boolean(fields.get("share_threshold"));
        let cascade = self.boolean(fields.get("cascade"));
        let failure_mode = fields
            .get("failure_mode")
            .and_then(|f| self.failure_mode(f));
        let metadata = fields.get("metadata").and_then(|f| self.metadata(f));
        let resource = fields.get("resource").and_then(|f| self.resource(f));

        if let Some(f) = fields.get("share_threshold") {
            if share_threshold && !value.as_deref().is_some_and(|v| v.contains('*')) {
                let found = value
                    .as_ref()
                    .map_or("no value".into(), |v| format!("'{v}'"));
                self.error(f.pos, K::ShareThresholdWithoutWildcard(found));
            }
        }

        let mut scope = parent.clone();
        scope.keys.extend(key.clone());
        if let Some(k) = &key {
            scope.composite = child_key(&parent.composite, k, value.as_deref());
        }
        if let Some(r) = &resource {
            scope.resource = r.clone();
        }

        // A rate_limit that failed to validate was reported already; say nothing more.
        let rate_limit_failed = rate_limit.is_none()
            && fields
                .get("rate_limit")
                .is_some_and(|f| f.value.kind != NodeKind::Null);
        if let Some(f) = fields
            .get("cascade")
            .filter(|_| cascade && !rate_limit_failed)
        {
            match (&rate_limit, parent.nearest_limit) {
                (
                    None
                    | Some(RateLimitModel {
                        limit: RuleLimit::Unlimited,
                        ..
                    }),
                    _,
                ) => self.error(f.pos, K::CascadeWithoutLimit),
                (_, None) => self.error(f.pos, K::CascadeWithoutParent),
                (_, Some((line, true))) => self.error(f.pos, K::CascadeToUnlimited(line)),
                (_, Some((_, false))) => {}
            }
        }

        let entity = fields
            .get("entity")
            .and_then(|f| self.entity(f, &scope.keys));
        if let (Some(t), Some(rl)) = (&entity, &rate_limit) {
            if let RuleLimit::Limited(params) = &rl.limit {
                let name = rl.name.clone().unwrap_or_else(|| "rl".into());
                self.check_shared_bucket(t, &scope.resource, name, params, node.pos);
            }
        }

        if let Some(rl) = &rate_limit {
            let line = fields
                .get("rate_limit")
                .map_or(node.pos.line, |f| f.pos.line);
            scope.nearest_limit = Some((line, rl.limit == RuleLimit::Unlimited));
        }
        let children = match fields.get("descriptors") {
            Some(f) => self.descriptor_list(f, &scope),
            None => Vec::new(),
        };

        if value_failed {
            return None;
        }
        Some(DescriptorModel {
            key: key?,
            value,
            pos: node.pos,
            rate_limit,
            shadow_mode,
            quota_mode,
            detailed_metric,
            value_to_metric,
            share_threshold,
            metadata,
            entity,
            resource,
            cascade,
            failure_mode,
            children,
        })
    }

    fn rate_limit(&mut self, f: &Field) -> Option<RateLimitModel> {
        if f.value.kind == NodeKind::Null {
            return None;
        }
        let fields = self.fields(f.value, "'rate_limit'", "rate_limit", RATE_LIMIT_KEYS)?;
        let unlimited = self.boolean(fields.get("unlimited"));
        let overdraft = self.boolean(fields.get("overdraft"));
        let lease = fields
            .get("lease")
            .filter(|l| l.value.kind != NodeKind::Null)
            .is_none_or(|l| self.boolean(Some(l)));
        let unit_field = fields.get("unit");
        let unit = unit_field.and_then(|u| {
            let text = self.text(u)?;
            let unit = Unit::parse(&text);
            if unit.is_none() {
                self.error(u.value.pos, K::InvalidUnit(text));
            }
            unit
        });
        let multiplier = fields.get("unit_multiplier").and_then(|m| {
            let n = self.integer(m, 1, MAX_PERIOD_SECONDS)?;
            let period = unit.map(|u| u.seconds().saturating_mul(n));
            if period.is_some_and(|p| p > MAX_PERIOD_SECONDS) {
                self.error(
                    m.value.pos,
                    K::PeriodTooLong {
                        multiplier: n,
                        unit: unit.map_or("", Unit::name),
                    },
                );
                return None;
            }
            u32::try_from(n).ok()
        });
        let rpu = fields
            .get("requests_per_unit")
            .and_then(|n| self.integer(n, 0, u64::from(u32::MAX)));
        let burst = fields
            .get("burst")
            .and_then(|n| self.integer(n, 1, MAX_TOKENS));
        let name = fields.get("name").and_then(|n| {
            let text = self.text(n)?;
            match limit_name_problem(&text) {
                Some(reason) => {
                    self.error(n.value.pos, K::InvalidLimitName { name: text, reason });
                    None
                }
                None => Some(text),
            }
        });
        let replaces = fields
            .get("replaces")
            .map(|r| self.replaces(r, name.as_deref()))
            .unwrap_or_default();

        let limit = if unlimited {
            // `overdraft: false` is harmless; the others would give an unlimited rule a bucket.
            for (key, set) in [
                ("unit", true),
                ("unit_multiplier", true),
                ("burst", true),
                ("overdraft", overdraft),
                ("lease", !lease),
            ] {
                if let Some(k) = fields.get(key).filter(|_| set) {
                    self.error(k.pos, K::UnlimitedWith(k.name));
                }
            }
            RuleLimit::Unlimited
        } else {
            if unit_field.is_none() {
                self.error(f.pos, K::MissingLimitField("unit"));
            }
            if fields.get("requests_per_unit").is_none() {
                self.error(f.pos, K::MissingLimitField("requests_per_unit"));
            }
            if fields.get("unit_multiplier").is_some() && multiplier.is_none() {
                return None;
            }
            RuleLimit::Limited(RateLimit {
                unit: unit?,
                unit_multiplier: multiplier.unwrap_or(1),
                requests_per_unit: u32::try_from(rpu?).ok()?,
                burst,
                overdraft,
                lease,
            })
        };
        Some(RateLimitModel {
            limit,
            name,
            replaces,
        })
    }

    fn replaces(&mut self, f: &Field, own_name: Option<&str>) -> Vec<String> {
        let items = match &f.value.kind {
            NodeKind::Seq(items) => items,
            NodeKind::Null => return Vec::new(),
            _ => {
                self.wrong_type(f, "a list of {name: ...} entries");
                return Vec::new();
            }
        };
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let Some(entry) =
                self.fields(item, "a 'replaces' entry", "replaces entry", REPLACES_KEYS)
            else {
                continue;
            };
            let name = entry.get("name").and_then(|n| self.text(n));
            match name {
                Some(n) if n.is_empty() => self.error(item.pos, K::ReplacesWithoutName),
                Some(n) if Some(n.as_str()) == own_name => {
                    let pos = entry.get("name").map_or(item.pos, |f| f.value.pos);
                    self.error(pos, K::ReplacesItself(n));
                }
                Some(n) => out.push(n),
                None => self.error(item.pos, K::ReplacesWithoutName),
            }
        }
        out
    }

    fn metadata(&mut self, f: &Field) -> Option<serde_json::Value> {
        match &f.value.kind {
            NodeKind::Null => None,
            NodeKind::Map(_) => Some(to_json(f.value)),
            other => {
                self.error(
                    f.value.pos,
                    K::NotAMapping {
                        what: "'metadata'",
                        found: other.describe(),
                    },
                );
                None
            }
        }
    }

    fn resource(&mut self, f: &Field) -> Option<String> {
        let resource = self.required_text(f)?;
        // Resources are part of the store key, written verbatim.
        if resource.len() > MAX_RESOURCE_BYTES {
            self.error(
                f.value.pos,
                K::TooLong {
                    key: "resource",
                    bytes: resource.len(),
                    max: MAX_RESOURCE_BYTES,
                },
            );
            return None;
        }
        let reason = if resource.contains('#') {
            Some("'#' separates the parts of a bucket key")
        } else if resource.chars().any(char::is_control) {
            Some("control characters are not allowed")
        } else {
            None
        };
        match reason {
            Some(reason) => {
                self.error(f.value.pos, K::InvalidResource { resource, reason });
                None
            }
            None => Some(resource),
        }
    }

    fn entity(&mut self, f: &Field, path_keys: &[String]) -> Option<EntityTemplate> {
        let text = self.text(f)?;
        let template = match EntityTemplate::parse(&text) {
            Ok(t) => t,
            Err(error) => {
                self.error(
                    f.value.pos,
                    K::EntityTemplate {
                        template: text,
                        error,
                    },
                );
                return None;
            }
        };
        let unknown: Vec<String> = template
            .keys()
            .filter(|k| !path_keys.iter().any(|p| p == k))
            .map(str::to_string)
            .collect();
        for key in unknown {
            self.error(
                f.value.pos,
                K::EntityUnknownKey {
                    template: text.clone(),
                    key,
                },
            );
        }
        Some(template)
    }

    /// Rules with the same template and resource share one bucket item: a limit name
    /// there must mean one set of parameters.
    fn check_shared_bucket(
        &mut self,
        template: &EntityTemplate,
        resource: &str,
        name: String,
        params: &RateLimit,
        pos: Pos,
    ) {
        let id = (template.as_str().to_string(), resource.to_string(), name);
        if !self.shared.bucket_limits.contains_key(&id) {
            let bucket = (id.0.clone(), id.1.clone());
            let count = self.shared.limits_per_bucket.entry(bucket).or_default();
            *count += 1;
            if *count == MAX_LIMITS_PER_BUCKET + 1 {
                let kind = K::TooManyLimits {
                    template: id.0.clone(),
                    resource: id.1.clone(),
                    count: *count,
                    max: MAX_LIMITS_PER_BUCKET,
                };
                self.error(pos, kind);
            }
        }
        match self.shared.bucket_limits.get(&id) {
            Some(first) if first.params != *params => {
                let other = if first.file == self.file {
                    format!("line {}", first.line)
                } else {
                    format!("{}:{}", first.file, first.line)
                };
                let kind = K::ConflictingLimit {
                    name: id.2.clone(),
                    template: id.0.clone(),
                    resource: id.1.clone(),
                    other,
                };
                self.error(pos, kind);
            }
            Some(_) => {}
            None => {
                self.shared.bucket_limits.insert(
                    id,
                    BucketLimit {
                        params: params.clone(),
                        file: Arc::clone(&self.file),
                        line: pos.line,
                    },
                );
            }
        }
    }
}

/// Why a limit name is unusable, if it is.
fn limit_name_problem(name: &str) -> Option<&'static str> {
    let mut chars = name.chars();
    if !chars.next().is_some_and(|c| c.is_ascii_alphabetic()) {
        return Some("it must start with an ASCII letter");
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        return Some("only ASCII letters, digits, '_', '.' and '-' are allowed");
    }
    if name.len() > MAX_LIMIT_NAME {
        return Some("it must be at most 64 characters long");
    }
    if name == RESERVED_LIMIT_NAME {
        return Some("'wcu' is reserved for the store's write budget");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_names() {
        assert_eq!(limit_name_problem("tpm"), None);
        assert_eq!(limit_name_problem("a.b-c_9"), None);
        assert!(limit_name_problem("9a").is_some());
        assert!(limit_name_problem("").is_some());
        assert!(limit_name_problem("a b").is_some());
        assert!(limit_name_problem("wcu").is_some());
        assert!(limit_name_problem(&"a".repeat(65)).is_some());
        assert_eq!(limit_name_problem(&"a".repeat(64)), None);
    }
}

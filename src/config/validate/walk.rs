//! The walk of one document's tree: the top level, each descriptor in turn with what
//! its ancestors set ([`Scope`]), every error gathered by one [`Validator`]. The checks
//! of a node's keys, its `rate_limit` and the rules sharing a bucket are the siblings'
//! (methods of the same `Validator`).

use std::collections::HashMap;
use std::sync::Arc;

use super::fields::{to_json, Field, Fields};
use super::shared_bucket::SharedBuckets;
use super::validator::Validator;
use crate::config::error::{ConfigError, ConfigErrorKind as K};
use crate::config::model::{DescriptorModel, DocumentModel, Node, NodeKind, Pos, RateLimitModel};
use crate::config::stats_key::child_key;
use crate::config::{EntityTemplate, FailureMode, RuleLimit, ValueRegex};
use crate::store::key::MAX_RESOURCE_BYTES;

const TOP_KEYS: &[&str] = &["domain", "descriptors", "failure_mode", "rlqs"];
const DESCRIPTOR_KEYS: &[&str] = &[
    "key",
    "value",
    "value_regex",
    "rate_limit",
    "rate_limits",
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

/// The scope of a descriptor's children: its key added, its composite key, its
/// `resource` if it sets one.
fn child_scope(
    parent: &Scope,
    key: Option<&str>,
    value: Option<&str>,
    resource: Option<&String>,
) -> Scope {
    let mut scope = parent.clone();
    scope.keys.extend(key.map(str::to_string));
    if let Some(k) = key {
        scope.composite = child_key(&parent.composite, k, value);
    }
    if let Some(r) = resource {
        scope.resource = r.clone();
    }
    scope
}

/// The field that holds a node's limits, `rate_limit` or `rate_limits`.
fn limit_field<'f, 'n>(fields: &'f Fields<'n>) -> Option<&'f Field<'n>> {
    fields
        .get("rate_limit")
        .or_else(|| fields.get("rate_limits"))
}

impl Validator<'_> {
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
        let rlqs_keys = fields.get("rlqs").and_then(|f| self.rlqs(f));
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
            rlqs_keys,
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
        // A node is its key and its value, or its key and its expression.
        let mut siblings: HashMap<(String, Option<String>, bool), u32> = HashMap::new();
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let Some(d) = self.descriptor(item, scope) else {
                continue;
            };
            let pattern = d.value_regex.as_ref().map(|r| r.as_str().to_string());
            let id = (
                d.key.clone(),
                d.value.clone().or(pattern),
                d.value_regex.is_some(),
            );
            if let Some(first_line) = siblings.get(&id) {
                let key = child_key(&scope.composite, &d.key, id.1.as_deref());
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

    /// One descriptor and its subtree; `None` when its key or its value could not be read
    /// (reported).
    fn descriptor(&mut self, node: &Node, parent: &Scope) -> Option<DescriptorModel> {
        let fields = self.fields(node, "a descriptor", "descriptor", DESCRIPTOR_KEYS)?;
        let key = self.descriptor_key(&fields, node);
        let errors_before = self.errors.len();
        let (value, value_regex) = self.node_value(&fields);
        // A value that failed to read must not make the node look key-only (that would
        // report a bogus duplicate or match the wrong requests).
        let value_failed = self.errors.len() > errors_before;
        let rate_limit = self.node_limits(&fields);
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
        let pattern = value_regex.as_ref().map(ValueRegex::as_str);
        self.check_share_threshold(&fields, share_threshold, value.as_deref(), pattern);
        let shown = value.as_deref().or(pattern);
        let mut scope = child_scope(parent, key.as_deref(), shown, resource.as_ref());
        self.check_cascade(&fields, cascade, rate_limit.as_ref(), parent.nearest_limit);
        let entity = self.descriptor_entity(&fields, &scope, rate_limit.as_ref(), node.pos);
        if let Some(rl) = &rate_limit {
            let line = limit_field(&fields).map_or(node.pos.line, |f| f.pos.line);
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
            value_regex,
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

    /// The node's limits: its `rate_limit`, or its `rate_limits` (never both).
    fn node_limits(&mut self, fields: &Fields) -> Option<RateLimitModel> {
        match (fields.get("rate_limit"), fields.get("rate_limits")) {
            (Some(_), Some(list)) => {
                self.error(list.pos, K::RateLimitAndList);
                None
            }
            (Some(f), None) => self.rate_limit(f),
            (None, Some(list)) => self.rate_limit_list(list),
            (None, None) => None,
        }
    }

    /// A descriptor's `key`, which it must have.
    fn descriptor_key(&mut self, fields: &Fields, node: &Node) -> Option<String> {
        match fields.get("key") {
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
        }
    }

    /// The node's `value` (an empty one is none), or its compiled `value_regex`; never
    /// both.
    fn node_value(&mut self, fields: &Fields) -> (Option<String>, Option<ValueRegex>) {
        let value = fields
            .get("value")
            .and_then(|f| self.text(f))
            .filter(|v| !v.is_empty());
        let Some(f) = fields.get("value_regex") else {
            return (value, None);
        };
        if value.is_some() {
            self.error(f.pos, K::ValueAndRegex);
            return (value, None);
        }
        let Some(pattern) = self.required_text(f) else {
            return (None, None);
        };
        match ValueRegex::new(&pattern) {
            Ok(regex) => (None, Some(regex)),
            Err(reason) => {
                self.error(f.value.pos, K::InvalidValueRegex { pattern, reason });
                (None, None)
            }
        }
    }

    /// `share_threshold: true` needs a wildcard value (or a `value_regex`) to share.
    fn check_share_threshold(
        &mut self,
        fields: &Fields,
        share_threshold: bool,
        value: Option<&str>,
        regex: Option<&str>,
    ) {
        if let Some(f) = fields.get("share_threshold") {
            if share_threshold && regex.is_none() && !value.is_some_and(|v| v.contains('*')) {
                let found = value.map_or("no value".into(), |v| format!("'{v}'"));
                self.error(f.pos, K::ShareThresholdWithoutWildcard(found));
            }
        }
    }

    /// `cascade: true` needs a limit of its own and a limited ancestor
    /// (`nearest_limit`).
    fn check_cascade(
        &mut self,
        fields: &Fields,
        cascade: bool,
        rate_limit: Option<&RateLimitModel>,
        nearest_limit: Option<(u32, bool)>,
    ) {
        // A rate_limit that failed to validate was reported already; say nothing more.
        let rate_limit_failed = rate_limit.is_none()
            && limit_field(fields).is_some_and(|f| f.value.kind != NodeKind::Null);
        if let Some(f) = fields
            .get("cascade")
            .filter(|_| cascade && !rate_limit_failed)
        {
            match (rate_limit, nearest_limit) {
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
    }

    /// A descriptor's `entity`, its bucket checked against the rules that share it.
    fn descriptor_entity(
        &mut self,
        fields: &Fields,
        scope: &Scope,
        rate_limit: Option<&RateLimitModel>,
        pos: Pos,
    ) -> Option<EntityTemplate> {
        let entity = fields
            .get("entity")
            .and_then(|f| self.entity(f, &scope.keys));
        if let (Some(t), Some(rl)) = (&entity, rate_limit) {
            let first = match &rl.limit {
                RuleLimit::Limited(rate) => Some((rl.name.as_deref().unwrap_or("rl"), rate)),
                RuleLimit::Unlimited => None,
            };
            let further = rl.further.iter().map(|f| (f.item_name.as_str(), &f.rate));
            for (name, params) in first.into_iter().chain(further) {
                let broken =
                    self.shared
                        .check(&self.file, t, &scope.resource, name.into(), params, pos);
                for kind in broken {
                    self.error(pos, kind);
                }
            }
        }
        entity
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
}

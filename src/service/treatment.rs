//! How each descriptor of a request is handled, decided before any bucket is touched:
//! matched against the domain's rules (or its own `limit` override), `replaces` applied
//! across the matched rules, then free (no rule, replaced, unlimited) or limited, with its
//! hits and the group it is decided in (overdraft, all or nothing, quota, shadow).

use std::ops::Deref;
use std::sync::Arc;

use smallvec::SmallVec;

use super::wire::{Descriptor, RequestView};
use crate::config::{entries_key, Domain, FailureMode, Level, RateLimit, Rule, RuleLimit, Unit};

/// Per-descriptor working state of one call: inline for the usual few descriptors.
pub(super) type PerDescriptor<T> = SmallVec<[T; 4]>;

/// How one request descriptor is handled, for the life of its call.
pub(super) enum Treatment<'a> {
    /// No rule, replaced, or unlimited: answered without the store.
    Free { unlimited: bool },
    Limited {
        rule: RuleRef<'a>,
        hits: u64,
        group: Group,
    },
}

/// A descriptor's rule: the config's, borrowed from the snapshot its call holds, or the
/// one a descriptor's own `limit` makes. Borrowed rather than an `Arc` clone: a config
/// rule's reference count would be written twice per request by every worker thread, a
/// cache line the cores pass back and forth when they answer the same rule.
pub(super) enum RuleRef<'a> {
    Config(&'a Rule),
    Override(Box<Rule>),
}

impl Deref for RuleRef<'_> {
    type Target = Rule;

    fn deref(&self) -> &Rule {
        match self {
            RuleRef::Config(rule) => rule,
            RuleRef::Override(rule) => rule,
        }
    }
}

/// The groups a request's limited descriptors are decided in, in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Group {
    /// Overdraft usage: always debited.
    Forced,
    /// The all-or-nothing group.
    Enforced,
    Quota,
    Shadow,
}

/// Whether any descriptor is limited in group `g`.
pub(super) fn any_in(treatments: &[Treatment], g: Group) -> bool {
    treatments
        .iter()
        .any(|t| matches!(t, Treatment::Limited { group, .. } if *group == g))
}

/// How each descriptor of `req` is handled in `domain`; `global_quota` puts every rule in
/// quota mode (envoyproxy/ratelimit's `QUOTA_MODE`).
pub(super) fn treatments<'a>(
    domain: &'a Domain,
    req: &RequestView<'_>,
    global_quota: bool,
) -> PerDescriptor<Treatment<'a>> {
    // Match, then apply `replaces` across the matched rules (a descriptor's own limit
    // replaces nothing).
    let matched: PerDescriptor<Option<RuleRef<'a>>> = req
        .descriptors()
        .map(|d| match d.limit {
            Some(o) => Some(RuleRef::Override(Box::new(override_rule(
                &domain.name,
                &d,
                o.requests_per_unit,
                o.unit,
            )))),
            None => domain
                .match_descriptor(d.entries)
                .map(|r| RuleRef::Config(r)),
        })
        .collect();
    let replaced: PerDescriptor<&'a str> = matched
        .iter()
        .flatten()
        .filter_map(|r| match r {
            RuleRef::Config(r) => Some(r),
            RuleRef::Override(_) => None,
        })
        .flat_map(|r| r.replaces.iter().map(String::as_str))
        .collect();
    req.descriptors()
        .zip(matched)
        .map(|(d, rule)| {
            let Some(rule) = rule else {
                return Treatment::Free { unlimited: false };
            };
            if rule.is_named_in(&replaced) {
                return Treatment::Free { unlimited: false };
            }
            let RuleLimit::Limited(limit) = &rule.limit else {
                return Treatment::Free { unlimited: true };
            };
            let hits = match d.hits_addend {
                Some(h) => h,
                None if req.hits_addend == 0 => 1,
                None => u64::from(req.hits_addend),
            };
            let group = if rule.shadow_mode {
                Group::Shadow
            } else if limit.overdraft && hits > 0 {
                Group::Forced
            } else if rule.quota_mode || global_quota {
                Group::Quota
            } else {
                Group::Enforced
            };
            Treatment::Limited { rule, hits, group }
        })
        .collect()
}

/// The rule for a descriptor that carries its own limit: it applies regardless of the
/// tree, keyed by all of the descriptor's entries.
fn override_rule(domain: &Arc<str>, d: &Descriptor<'_>, rpu: u32, unit: i32) -> Rule {
    let levels: Vec<Level> = d
        .entries
        .iter()
        .map(|e| Level {
            key: e.key.to_string(),
            value: Some(e.value.to_string()),
            regex: false,
            share_threshold: false,
            value_to_metric: false,
        })
        .collect();
    let stats_key = entries_key(domain, d.entries);
    Rule {
        index: None,
        domain: domain.clone(),
        levels,
        limit: RuleLimit::Limited(RateLimit {
            unit: Unit::from_proto(unit).unwrap_or(Unit::Second),
            unit_multiplier: 1,
            requests_per_unit: rpu,
            burst: None,
            overdraft: false,
            lease: true,
        }),
        // Answered with an empty name, as envoyproxy/ratelimit does; the bucket's limit is
        // still called `override` (Rule::limit_name).
        name: None,
        replaces: Vec::new(),
        further_limits: Vec::new(),
        shadow_mode: false,
        quota_mode: false,
        detailed_metric: false,
        metadata: None,
        entity: None,
        resource: domain.to_string(),
        cascade_parent: None,
        failure_mode: FailureMode::default(),
        stats_key,
        source: Arc::from("request limit override"),
    }
}

//! A rule's limit and switches in words, as `/rlconfig` and the operator's page show
//! them. Owns the wording only.

use crate::config::{Rule, RuleLimit};

/// `10/second`, `unlimited`, or each limit of a list with its name.
pub fn limit_text(r: &Rule) -> String {
    match &r.limit {
        RuleLimit::Unlimited => "unlimited".to_string(),
        // Several limits (`rate_limits`): each with its name in the bucket item.
        RuleLimit::Limited(_) if !r.further_limits.is_empty() => r
            .stated_limits()
            .map(|l| format!("{} [{}]", l.rate, l.item_name))
            .collect::<Vec<_>>()
            .join(" + "),
        RuleLimit::Limited(l) => l.to_string(),
    }
}

/// Shadow and quota mode, the cascade, the limit's name.
pub fn rule_flags(r: &Rule) -> Vec<String> {
    let mut flags = Vec::new();
    if r.shadow_mode {
        flags.push("shadow_mode".to_string());
    }
    if r.quota_mode {
        flags.push("quota_mode".to_string());
    }
    if let Some(p) = &r.cascade_parent {
        flags.push(format!("cascade to {}", p.stats_key));
    }
    // A list's names are in its limits' text already.
    if let Some(n) = r.name.as_ref().filter(|_| r.further_limits.is_empty()) {
        flags.push(format!("name {n}"));
    }
    flags
}

//! "Why did this request get this answer?": one descriptor explained in plain text, for
//! `shardgate explain` and `POST /explain`. The walk through the descriptor tree (the
//! config's, `config/explain.rs`), then the rule, its bucket (entity, resource, shard
//! count), each limit and its balance now, and what a request of one hit would be
//! answered — read through the engine's `peek`, which never debits.
//!
//! It decides nothing of its own: the words come from the same walk, plan and engine the
//! service answers with, so the explanation cannot drift from the behaviour.

use std::fmt::Write;
use std::sync::Arc;

use crate::config::{nearest, Rule, RuleLimit, WalkEnd};
use crate::engine::bucket::whole_tokens;
use crate::engine::plan::{BucketSlots, Plan};
use crate::engine::{BucketClaim, BucketLeases, BucketOutcome, Decision, LimitOutcome};
use crate::store::BucketStore;

use super::decision::RateLimiter;
use super::request::validate;
use super::wire::RequestView;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

impl<S: BucketStore> RateLimiter<S> {
    /// Every descriptor of `req` explained, a blank line between them; `Err` when the
    /// request breaks the port's request limits or has no descriptor (the message `/json`
    /// would give).
    pub async fn explain_request(&self, req: &RateLimitRequest) -> Result<String, String> {
        let view = RequestView::from(req);
        validate(self.request_limits(), &view)?;
        let mut parts = Vec::with_capacity(view.len());
        for d in view.descriptors() {
            let entries: Vec<(String, String)> = d
                .entries
                .iter()
                .map(|e| (e.key.to_string(), e.value.to_string()))
                .collect();
            parts.push(self.explain(view.domain, &entries).await);
        }
        Ok(parts.join("\n\n"))
    }

    /// The explanation of descriptor `entries` in `domain` (several lines, no trailing
    /// newline). Reads the store; never writes.
    pub async fn explain(&self, domain: &str, entries: &[(String, String)]) -> String {
        let config = self.config();
        let shown: Vec<String> = entries.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut out = format!("descriptor ({}) in domain '{domain}':\n", shown.join(", "));
        let Some(d) = config.domain(domain) else {
            let mut names: Vec<String> = config.domains().map(|d| d.name.to_string()).collect();
            names.sort();
            let _ = write!(out, "no rule: domain '{domain}' is not in the config");
            if let Some(n) = nearest(domain, &names) {
                let _ = write!(out, "; the nearest is '{n}'");
            }
            let _ = write!(
                out,
                " (domains: {}); every descriptor is answered OK",
                names.join(", ")
            );
            return out;
        };
        let walk = d.walk(entries);
        let _ = write!(out, "{walk}");
        if let WalkEnd::Rule(rule) = walk.end {
            out.push('\n');
            self.explain_rule(rule, entries, &mut out).await;
        }
        if let Some(line) = self.rlqs().and_then(|b| b.explain(domain, entries)) {
            let _ = write!(out, "\n{line}");
        }
        out
    }

    /// The matched rule's limits, bucket and balances, and the answer a request of one
    /// hit would get now.
    async fn explain_rule(&self, rule: &Arc<Rule>, entries: &[(String, String)], out: &mut String) {
        let _ = write!(out, "{}", rule_flags(rule));
        if rule.limit == RuleLimit::Unlimited {
            out.push_str("unlimited: answered OK with no limit, without the store");
            return;
        }
        let mut plan = Plan::new();
        let slots = match plan.add(rule, entries, 1) {
            Ok(slots) => slots,
            Err(e) => {
                let _ = write!(out, "cannot be planned: {e}");
                return;
            }
        };
        let decision = match self.engine().peek(&plan.acquire).await {
            Ok(d) => d,
            Err(e) => {
                let _ = write!(out, "store: could not read the bucket: {e}");
                return;
            }
        };
        bucket_lines(&plan, &decision, rule, &slots.own, "bucket", out);
        self.all_shards_lines(&plan, &decision, rule, &slots.own, out)
            .await;
        self.lease_line(&plan, &slots.own, out);
        if let (Some(parent), Some(ps)) = (&rule.cascade_parent, &slots.parent) {
            let what = format!("cascade parent {} ({})", parent.stats_key, parent.source);
            bucket_lines(&plan, &decision, parent, ps, &what, out);
            self.all_shards_lines(&plan, &decision, parent, ps, out)
                .await;
            self.lease_line(&plan, ps, out);
        }
        let verdict = if decision.admitted {
            "admitted".to_string()
        } else {
            refusal(&decision, rule, &slots.own, slots.parent.as_ref())
        };
        let _ = write!(
            out,
            "a request of 1 hit now: {verdict} (read only: nothing was debited)"
        );
    }
}

impl<S: BucketStore> RateLimiter<S> {
    /// A sharded bucket summed over its every shard (a decision sees one shard's share):
    /// one line per limit, or the store's error. Nothing for a bucket of one shard.
    async fn all_shards_lines(
        &self,
        plan: &Plan,
        decision: &Decision,
        rule: &Rule,
        slots: &BucketSlots,
        out: &mut String,
    ) {
        let Some((claim, outcome)) = bucket_at(plan, decision, slots) else {
            return;
        };
        if outcome.shard_count <= 1 {
            return;
        }
        let whole = match self.engine().balances(&claim.entity, &claim.resource).await {
            Ok(b) => b,
            Err(e) => {
                let _ = writeln!(out, "  all shards: could not be read: {e}");
                return;
            }
        };
        let _ = writeln!(
            out,
            "  all {} shards ({} created; a shard is created when a request first draws it):",
            whole.shard_count, whole.existing
        );
        for stated in rule.stated_limits() {
            let Some(t) = whole.limits.iter().find(|t| t.limit == stated.item_name) else {
                continue;
            };
            let _ = writeln!(
                out,
                "    {} {}: {} of {} tokens left on the created shards",
                limit_label(rule, &stated),
                stated.rate,
                whole_tokens(t.tokens),
                whole_tokens(t.ceiling),
            );
        }
    }

    /// Whether this server answers the bucket from a lease, and why, when leases are on.
    fn lease_line(&self, plan: &Plan, slots: &BucketSlots, out: &mut String) {
        let Some(claim) = plan.acquire.buckets.get(slots.bucket) else {
            return;
        };
        let Some(leases) = self.engine().leases_of(&claim.entity, &claim.resource) else {
            return;
        };
        let line = match claim.strict {
            true => "never: a strict rule's every decision is the store's".to_string(),
            false => lease_words(&leases),
        };
        let _ = writeln!(out, "  lease on this server: {line}");
    }
}

/// What the lease book holds of a bucket, in words.
fn lease_words(leases: &BucketLeases) -> String {
    let hot = leases.hot_rate;
    let Some(t) = &leases.tracked else {
        return format!(
            "none, asked for below {hot} decisions a second here (below that a lease \
             costs more writes than it saves)"
        );
    };
    let rate = t.rate;
    if !t.held.is_empty() {
        // A bucket of one limit needs no name; several are told apart by the item's.
        let first = t.held.first().map(|h| &h.limit);
        let named = t.held.iter().any(|h| Some(&h.limit) != first);
        let held: Vec<String> = t
            .held
            .iter()
            .map(|h| {
                let of = if named {
                    format!(" of {}", h.limit)
                } else {
                    String::new()
                };
                format!(
                    "{} of {} tokens{of} from shard {}, {:.2} s left",
                    whole_tokens(h.rest),
                    whole_tokens(h.granted),
                    h.shard,
                    h.expires_in_ms as f64 / 1000.0
                )
            })
            .collect();
        return format!(
            "held ({}); {rate} decisions a second here, leased from {hot}",
            held.join("; ")
        );
    }
    match (rate >= hot, t.fetching) {
        (true, true) => format!("being fetched; {rate} decisions a second here, leased from {hot}"),
        (true, false) => format!(
            "none held now; {rate} decisions a second here, leased from {hot} (the next \
             request asks for one, unless the shard had none to give lately)"
        ),
        (false, _) => format!(
            "none, {rate} decisions a second here, below the {hot} from which a lease \
             saves writes"
        ),
    }
}

/// The rule's switches that change its answer, one line, or nothing.
fn rule_flags(rule: &Rule) -> String {
    let mut flags = Vec::new();
    if rule.shadow_mode {
        flags.push("shadow_mode: counted, always answered OK".to_string());
    }
    if rule.quota_mode {
        flags.push("quota_mode: over only if every quota descriptor is".to_string());
    }
    if !rule.replaces.is_empty() {
        flags.push(format!(
            "replaces {} when both match",
            rule.replaces.join(", ")
        ));
    }
    match flags.is_empty() {
        true => String::new(),
        false => format!("{}\n", flags.join("; ")),
    }
}

/// The claim `slots` names in `plan` and the decision's outcome for it: the decision
/// answers `plan`, bucket for bucket and limit for limit.
fn bucket_at<'a>(
    plan: &'a Plan,
    decision: &'a Decision,
    slots: &BucketSlots,
) -> Option<(&'a BucketClaim, &'a BucketOutcome)> {
    Some((
        plan.acquire.buckets.get(slots.bucket)?,
        decision.buckets.get(slots.bucket)?,
    ))
}

/// "bucket: entity 'x', resource 'r', shard 0 of 1" and one line per limit.
fn bucket_lines(
    plan: &Plan,
    decision: &Decision,
    rule: &Rule,
    slots: &BucketSlots,
    what: &str,
    out: &mut String,
) {
    let Some((claim, outcome)) = bucket_at(plan, decision, slots) else {
        return;
    };
    let _ = writeln!(
        out,
        "{what}: entity '{}', resource '{}', shard {} of {}",
        claim.entity, claim.resource, outcome.shard, outcome.shard_count
    );
    for (stated, &l) in rule.stated_limits().zip(&slots.limits) {
        let Some(o) = outcome.limits.get(l) else {
            continue;
        };
        let _ = writeln!(
            out,
            "  {} {}: {} of {} tokens left on this shard",
            limit_label(rule, &stated),
            stated.rate,
            whole_tokens(o.remaining),
            whole_tokens(o.share.ceiling),
        );
    }
}

/// What a limit is called: its name, or, unnamed (upstream's rules name few), the
/// descriptor path its rule matches, as the operator wrote it (`limit of foo=bar, baz`)
/// rather than the name the bucket item keeps it under (`rl`).
fn limit_label(rule: &Rule, stated: &crate::config::StatedLimit<'_>) -> String {
    if let Some(name) = stated.name {
        return name.to_string();
    }
    let path: Vec<String> = rule
        .levels
        .iter()
        .map(|l| match &l.value {
            Some(v) => format!("{}={v}", l.key),
            None => l.key.clone(),
        })
        .collect();
    match rule.further_limits.is_empty() {
        true => format!("limit of {}", path.join(", ")),
        // Several unnamed limits of one rule: told apart by their names in the item.
        false => format!("limit of {} ({})", path.join(", "), stated.item_name),
    }
}

/// Which limit refuses, and when a request would fit.
fn refusal(
    decision: &Decision,
    rule: &Rule,
    own: &BucketSlots,
    parent: Option<&BucketSlots>,
) -> String {
    let named = |r: &Rule, s: &BucketSlots| -> Vec<(String, LimitOutcome)> {
        let Some(b) = decision.buckets.get(s.bucket) else {
            return Vec::new();
        };
        r.stated_limits()
            .zip(&s.limits)
            .filter_map(|(st, &l)| Some((limit_label(r, &st), *b.limits.get(l)?)))
            .collect()
    };
    let mut all = named(rule, own);
    if let (Some(p), Some(ps)) = (rule.cascade_parent.as_deref(), parent) {
        all.extend(named(p, ps));
    }
    let refusing: Vec<String> = all
        .iter()
        .filter(|(_, o)| !o.fits)
        .map(|(name, o)| match o.wait_ms {
            Some(ms) => format!("{name} (fits in {:.3} s)", ms as f64 / 1000.0),
            None => format!("{name} (never: larger than a shard's share, or no refill)"),
        })
        .collect();
    format!("refused by {}", refusing.join(", "))
}

//! envoyproxy/ratelimit's deny-list idiom: a rule of `requests_per_unit: 0` and no burst
//! (its README's "black list", `bar: banned` in its example) refuses every request that
//! asks for a hit. Answered here, before any bucket is planned: no store call, and no
//! per-shard-ceiling count or warning, which keep their meaning for a real
//! misconfiguration (a request larger than a shard's share of a limit that admits some).
//! Owns the test of a rule and the verdict it gets; the decision's steps call it.

use smallvec::smallvec;

use super::descriptor_status::Verdict;
use super::treatment::{Group, Treatment};
use crate::config::{Rule, RuleLimit};
use crate::engine::plan::params_of;
use crate::engine::LimitOutcome;

/// Whether `t` is a descriptor its rule can never admit: a deny rule, asked for a hit (a
/// request of zero hits only looks, and is answered by the engine as any other).
pub(super) fn never_admits(t: &Treatment<'_>) -> bool {
    match t {
        Treatment::Limited { rule, hits, .. } => *hits > 0 && is_deny_rule(rule),
        Treatment::Free { .. } => false,
    }
}

/// A rule whose only limit holds no token: `requests_per_unit: 0` with no burst (or a
/// burst of 0), not an overdraft (that debits whatever the balance), with no further
/// limit and no cascade parent (whose buckets the engine must still be asked about).
fn is_deny_rule(rule: &Rule) -> bool {
    let RuleLimit::Limited(limit) = &rule.limit else {
        return false;
    };
    limit.capacity() == 0
        && !limit.overdraft
        && rule.further_limits.is_empty()
        && rule.cascade_parent.is_none()
}

/// Fills in the refusal of every descriptor no rule can admit; returns whether one of
/// them is in the all-or-nothing group (the request is then refused whatever the others'
/// balances, so none of them is debited).
pub(super) fn refuse_denied(
    treatments: &[Treatment<'_>],
    verdicts: &mut [Option<Verdict>],
) -> bool {
    let mut enforced = false;
    for (t, v) in treatments.iter().zip(verdicts.iter_mut()) {
        let Treatment::Limited { rule, group, .. } = t else {
            continue;
        };
        if !never_admits(t) {
            continue;
        }
        let RuleLimit::Limited(limit) = &rule.limit else {
            continue;
        };
        let params = params_of(limit);
        *v = Some(Verdict {
            own: smallvec![LimitOutcome {
                fits: false,
                remaining: 0,
                share: params.share(1),
                refill_amount: params.refill_amount,
                // Never: no wait would pay off, so no reset is quoted.
                wait_ms: None,
            }],
            parent: None,
        });
        enforced |= *group == Group::Enforced;
    }
    enforced
}

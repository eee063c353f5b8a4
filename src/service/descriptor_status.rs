//! Each descriptor's status in the answer to a request (code, the limit that speaks for
//! it, what is left, how long until reset), from the engine's verdicts; `response_encoding.rs` writes
//! them out.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use smallvec::SmallVec;

use super::response_encoding::StatusLine;
use super::treatment::{Group, PerDescriptor, Treatment};
use crate::config::Rule;
use crate::engine::bucket::{self, whole_tokens};
use crate::engine::plan::LimitPosition;
use crate::engine::{Decision, LimitOutcome};

/// Outcome of one descriptor: its own limit and its cascade parent's.
pub(super) struct Verdict {
    pub own: LimitOutcome,
    pub parent: Option<LimitOutcome>,
}

impl Verdict {
    /// Both its own limit and its parent's covered the request.
    pub(super) fn fits(&self) -> bool {
        self.own.fits && self.parent.is_none_or(|p| p.fits)
    }
}

/// A descriptor of the request and where its limit sits in a plan.
#[derive(Debug, Clone, Copy)]
pub(super) struct Placed {
    pub descriptor: usize,
    pub slot: LimitPosition,
}

/// The planned descriptors of one engine call, inline for the usual few.
pub(super) type Placements = SmallVec<[Placed; 4]>;

/// Copies each placed descriptor's outcome out of a decision.
pub(super) fn record(decision: &Decision, placed: &[Placed], verdicts: &mut [Option<Verdict>]) {
    if decision.buckets.is_empty() {
        return; // failed open: no outcome to report
    }
    for p in placed {
        let own = decision.buckets[p.slot.bucket].limits[p.slot.limit];
        let parent = p.slot.parent.map(|(b, l)| decision.buckets[b].limits[l]);
        verdicts[p.descriptor] = Some(Verdict { own, parent });
    }
}

/// The statuses for a domain no config defines: OK with no limit, per descriptor.
pub(super) fn unknown_domain(descriptors: usize) -> PerDescriptor<StatusLine<'static>> {
    (0..descriptors).map(|_| StatusLine::ok(0)).collect()
}

/// Each descriptor's status from its treatment and verdict. A shadow-mode rule's
/// descriptor is reported OK; the overall code and the deployment's switches (global
/// shadow mode, metadata, headers) are the caller's and `answer_options.rs`'s.
pub(super) fn statuses<'a>(
    treatments: &'a [Treatment<'_>],
    verdicts: &[Option<Verdict>],
) -> PerDescriptor<StatusLine<'a>> {
    treatments
        .iter()
        .zip(verdicts)
        .map(|(t, v)| match (t, v) {
            (Treatment::Free { unlimited }, _) => {
                StatusLine::ok(if *unlimited { u32::MAX } else { 0 })
            }
            (Treatment::Limited { rule, group, .. }, Some(v)) => {
                let mut s = status_of(rule, v);
                if *group == Group::Shadow {
                    s.code = Code::Ok;
                }
                s
            }
            // Failed open: nothing was counted, so no limit is quoted either.
            (Treatment::Limited { .. }, None) => StatusLine::ok(0),
        })
        .collect()
}

fn remaining_tokens(l: &LimitOutcome) -> u32 {
    whole_tokens(l.remaining).clamp(0, i64::from(u32::MAX)) as u32
}

/// The status of one descriptor: the tighter of its own limit and its cascade parent's.
fn status_of<'a>(rule: &'a Rule, v: &Verdict) -> StatusLine<'a> {
    let parent_rule = rule.cascade_parent.as_deref();
    // Which limit speaks for the descriptor: one that refused, else the one with less left.
    let parent_speaks = match (&v.parent, parent_rule) {
        (Some(p), Some(_)) => {
            (!p.fits && v.own.fits) || (p.fits == v.own.fits && p.remaining < v.own.remaining)
        }
        _ => false,
    };
    let (speaker, speaker_rule) = if parent_speaks {
        (
            v.parent.as_ref().expect("checked"),
            parent_rule.expect("checked"),
        )
    } else {
        (&v.own, rule)
    };
    let fits = v.fits();
    let reset_ms = if fits {
        let full = |l: &LimitOutcome| bucket::time_to_full(l.remaining, l.share);
        Some(full(&v.own).max(v.parent.as_ref().map_or(0, full)))
    } else {
        // A refused limit that can never fit (larger than a shard's share, or one that
        // never refills) quotes no reset: no wait would pay off.
        let wait = |l: &LimitOutcome| if l.fits { Some(0) } else { l.wait_ms };
        match (wait(&v.own), v.parent.as_ref().map(wait)) {
            (Some(own), None) => Some(own),
            (Some(own), Some(Some(parent))) => Some(own.max(parent)),
            _ => None,
        }
    };
    StatusLine {
        code: if fits { Code::Ok } else { Code::OverLimit },
        limit: Some(speaker_rule),
        remaining: remaining_tokens(speaker),
        reset_ms,
    }
}

//! Each descriptor's status in the answer to a request (code, the limit that speaks for
//! it, what is left, how long until reset), from the engine's verdicts; `response_encoding.rs` writes
//! them out.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use smallvec::SmallVec;

use super::response_encoding::StatusLine;
use super::treatment::{Group, PerDescriptor, Treatment};
use crate::config::Rule;
use crate::engine::bucket::{self, whole_tokens};
use crate::engine::plan::{BucketSlots, LimitPosition};
use crate::engine::{Decision, LimitOutcome};

/// Outcome of one descriptor: each of its rule's limits, and its cascade parent's, in
/// the order the rules state them.
pub(super) struct Verdict {
    pub own: Outcomes,
    pub parent: Option<Outcomes>,
}

/// The outcomes of one rule's limits, inline for the usual one or two.
pub(super) type Outcomes = SmallVec<[LimitOutcome; 2]>;

impl Verdict {
    /// Every limit of the rule, and of its parent, covered the request.
    pub(super) fn fits(&self) -> bool {
        self.all().all(|l| l.fits)
    }

    /// Every limit's outcome, its own first.
    pub(super) fn all(&self) -> impl Iterator<Item = &LimitOutcome> {
        self.own.iter().chain(self.parent.iter().flatten())
    }
}

/// A descriptor of the request and where its limits sit in a plan.
#[derive(Debug, Clone)]
pub(super) struct Placed {
    pub descriptor: usize,
    pub slot: LimitPosition,
}

/// The planned descriptors of one engine call, inline for the usual few.
pub(super) type Placements = SmallVec<[Placed; 4]>;

/// Copies each placed descriptor's outcomes out of a decision.
pub(super) fn record(decision: &Decision, placed: &[Placed], verdicts: &mut [Option<Verdict>]) {
    if decision.buckets.is_empty() {
        return; // failed open: no outcome to report
    }
    // The decision answers the plan the slots point into, bucket for bucket and limit
    // for limit, and `verdicts` has one place per descriptor: every `get` finds its item.
    let outcomes = |slots: &BucketSlots| -> Outcomes {
        let Some(bucket) = decision.buckets.get(slots.bucket) else {
            return Outcomes::new();
        };
        let limit = |&l: &usize| bucket.limits.get(l).copied();
        slots.limits.iter().filter_map(limit).collect()
    };
    for p in placed {
        if let Some(verdict) = verdicts.get_mut(p.descriptor) {
            let own = outcomes(&p.slot.own);
            let parent = p.slot.parent.as_ref().map(outcomes);
            *verdict = Some(Verdict { own, parent });
        }
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

/// The status of one descriptor: its limits and its cascade parent's answer as one.
/// The limit that speaks for it is one that refused, else the one with least left (the
/// first stated, on a tie); the reset is when every limit is full again, or, refused,
/// when every refused one fits (none, if one never will).
#[expect(clippy::expect_used, reason = "a limited rule states a limit")]
fn status_of<'a>(rule: &'a Rule, v: &Verdict) -> StatusLine<'a> {
    let parent_limits = rule.cascade_parent.as_deref().into_iter();
    let stated = rule
        .stated_limits()
        .chain(parent_limits.flat_map(|p| p.stated_limits()));
    let speaker = stated
        .zip(v.all())
        .min_by_key(|(_, l)| (l.fits, l.remaining))
        .expect("a limited rule states a limit");
    let fits = v.fits();
    let reset_ms = if fits {
        v.all()
            .map(|l| bucket::time_to_full(l.remaining, l.share))
            .max()
    } else {
        // A refused limit that can never fit (larger than a shard's share, or one that
        // never refills) quotes no reset: no wait would pay off.
        v.all()
            .map(|l| if l.fits { Some(0) } else { l.wait_ms })
            .try_fold(0, |most, wait| Some(most.max(wait?)))
    };
    StatusLine {
        code: if fits { Code::Ok } else { Code::OverLimit },
        limit: Some(speaker.0),
        remaining: remaining_tokens(speaker.1),
        reset_ms,
    }
}

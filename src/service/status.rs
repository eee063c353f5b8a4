//! The answer to a request: each descriptor's status (code, the limit that speaks for it,
//! what is left, how long until reset) and the overall code, built from the engine's
//! verdicts.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as ProtoRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::Duration;
use smallvec::SmallVec;

use super::treatment::{Group, Treatment};
use crate::config::{Rule, RuleLimit};
use crate::engine::bucket::{self, whole_tokens};
use crate::engine::plan::Slot;
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
    pub slot: Slot,
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

/// The answer for a domain no config defines: OK with no limit, per descriptor.
pub(super) fn unknown_domain(descriptors: usize) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: Code::Ok as i32,
        statuses: (0..descriptors).map(|_| ok_status(None, None)).collect(),
        ..Default::default()
    }
}

/// The answer from each descriptor's treatment and verdict; `over` says whether the
/// request is refused. A shadow-mode rule's descriptor is reported OK; the deployment's
/// switches (global shadow mode, metadata, headers) are `answer.rs`'s.
pub(super) fn response(
    treatments: &[Treatment],
    verdicts: &[Option<Verdict>],
    over: bool,
) -> RateLimitResponse {
    let statuses: Vec<DescriptorStatus> = treatments
        .iter()
        .zip(verdicts)
        .map(|(t, v)| match (t, v) {
            (Treatment::Free { unlimited }, _) => ok_status(None, unlimited.then_some(u32::MAX)),
            (Treatment::Limited { rule, group, .. }, Some(v)) => {
                let mut s = status_of(rule, v);
                if *group == Group::Shadow {
                    s.code = Code::Ok as i32;
                }
                s
            }
            // Failed open: nothing was counted, so no limit is quoted either.
            (Treatment::Limited { .. }, None) => ok_status(None, None),
        })
        .collect();
    let overall = if over { Code::OverLimit } else { Code::Ok };
    RateLimitResponse {
        overall_code: overall as i32,
        statuses,
        ..Default::default()
    }
}

fn proto_limit(rule: &Rule) -> Option<ProtoRateLimit> {
    match &rule.limit {
        RuleLimit::Limited(l) => Some(ProtoRateLimit {
            name: rule.name.clone().unwrap_or_default(),
            requests_per_unit: l.requests_per_unit,
            unit: l.unit.proto_value(),
        }),
        RuleLimit::Unlimited => None,
    }
}

pub(super) fn ok_status(rule: Option<&Rule>, remaining: Option<u32>) -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok as i32,
        current_limit: rule.and_then(proto_limit),
        limit_remaining: remaining.unwrap_or(0),
        ..Default::default()
    }
}

fn duration_ms(ms: i64) -> Duration {
    let ms = ms.max(0);
    Duration {
        seconds: ms / 1_000,
        nanos: ((ms % 1_000) * 1_000_000) as i32,
    }
}

fn remaining_tokens(l: &LimitOutcome) -> u32 {
    whole_tokens(l.remaining).clamp(0, i64::from(u32::MAX)) as u32
}

/// The status of one descriptor: the tighter of its own limit and its cascade parent's.
fn status_of(rule: &Rule, v: &Verdict) -> DescriptorStatus {
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
    let duration = if fits {
        let full = |l: &LimitOutcome| bucket::time_to_full(l.remaining, l.share);
        full(&v.own).max(v.parent.as_ref().map_or(0, full))
    } else {
        let wait = |l: &LimitOutcome| if l.fits { 0 } else { l.wait_ms.unwrap_or(0) };
        wait(&v.own).max(v.parent.as_ref().map_or(0, wait))
    };
    DescriptorStatus {
        code: if fits { Code::Ok } else { Code::OverLimit } as i32,
        current_limit: proto_limit(speaker_rule),
        limit_remaining: remaining_tokens(speaker),
        duration_until_reset: Some(duration_ms(duration)),
        ..Default::default()
    }
}

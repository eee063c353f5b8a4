//! The answer to a request: each descriptor's status (code, the limit that speaks for it,
//! what is left, how long until reset), the overall code, and the dynamic metadata of
//! the passing descriptors' rules, built from the engine's verdicts.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit as ProtoRateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::{value::Kind, Duration, ListValue, Struct, Value};
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
/// request is refused, `global_shadow` reports every OVER_LIMIT as OK.
pub(super) fn response(
    treatments: &[Treatment],
    verdicts: &[Option<Verdict>],
    over: bool,
    global_shadow: bool,
) -> RateLimitResponse {
    let statuses: Vec<DescriptorStatus> = treatments
        .iter()
        .zip(verdicts)
        .map(|(t, v)| match (t, v) {
            (Treatment::Free { unlimited }, _) => ok_status(None, unlimited.then_some(u32::MAX)),
            (Treatment::Limited { rule, group, .. }, Some(v)) => {
                let mut s = status_of(rule, v);
                if *group == Group::Shadow || global_shadow {
                    s.code = Code::Ok as i32;
                }
                s
            }
            // Failed open: nothing was counted, so no limit is quoted either.
            (Treatment::Limited { .. }, None) => ok_status(None, None),
        })
        .collect();
    let overall = if over && !global_shadow {
        Code::OverLimit
    } else {
        Code::Ok
    };
    let dynamic_metadata = passing_metadata(treatments, &statuses);
    RateLimitResponse {
        overall_code: overall as i32,
        statuses,
        dynamic_metadata,
        ..Default::default()
    }
}

/// The `metadata` maps of the rules of passing descriptors, merged in request order
/// (a later descriptor's key wins), for Envoy's dynamic metadata.
fn passing_metadata(treatments: &[Treatment], statuses: &[DescriptorStatus]) -> Option<Struct> {
    let mut merged = Struct::default();
    for (t, s) in treatments.iter().zip(statuses) {
        if let Treatment::Limited { rule, .. } = t {
            if let (Some(serde_json::Value::Object(map)), true) =
                (&rule.metadata, s.code == Code::Ok as i32)
            {
                for (k, v) in map {
                    merged.fields.insert(k.clone(), json_to_proto(v));
                }
            }
        }
    }
    (!merged.fields.is_empty()).then_some(merged)
}

fn json_to_proto(v: &serde_json::Value) -> Value {
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(json_to_proto).collect(),
        }),
        serde_json::Value::Object(o) => Kind::StructValue(Struct {
            fields: o
                .iter()
                .map(|(k, v)| (k.clone(), json_to_proto(v)))
                .collect(),
        }),
    };
    Value { kind: Some(kind) }
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

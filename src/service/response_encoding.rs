//! The answer to a `ShouldRateLimit` call as protobuf bytes, written straight from each
//! descriptor's status while the call still borrows its rules: no `RateLimitResponse` is
//! built to be encoded and dropped (a `Vec` of statuses and a `String` copy of each
//! rule's name, per request).
//!
//! It owns the wire layout of the answer (field numbers and proto3's omission of default
//! values, as prost writes them, so the bytes are the ones prost would write for the same
//! message). It decides nothing: the statuses come from `descriptor_status.rs`, the deployment's
//! extras (headers, metadata) from `answer_options.rs`.

use bytes::BufMut;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use envoy_types::pb::google::protobuf::Struct;
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, message, WireType};
use prost::Message;
use smallvec::SmallVec;

use crate::config::StatedLimit;

/// One descriptor's status as the answer quotes it: its code, the limit that speaks for
/// it (borrowed from the call's rules), what that limit has left and how long until it
/// resets. `limit` is `None` for a descriptor with no limit to quote.
#[derive(Debug, Clone, Copy)]
pub(super) struct StatusLine<'a> {
    pub code: Code,
    pub limit: Option<StatedLimit<'a>>,
    pub remaining: u32,
    /// Milliseconds until reset; `None` leaves `duration_until_reset` out.
    pub reset_ms: Option<i64>,
}

impl StatusLine<'_> {
    /// An OK status with no limit (or `remaining` only, for an unlimited rule).
    pub(super) fn ok(remaining: u32) -> StatusLine<'static> {
        StatusLine {
            code: Code::Ok,
            limit: None,
            remaining,
            reset_ms: None,
        }
    }

    /// Whether the status quotes a limit (`current_limit` is set).
    pub(super) fn quotes_limit(&self) -> bool {
        quoted(self.limit).is_some()
    }

    /// The quoted limit's requests per unit (0 with none).
    pub(super) fn requests_per_unit(&self) -> u32 {
        quoted(self.limit).map_or(0, |(_, rpu, _)| rpu)
    }
}

/// What a deployment adds to every answer (`answer_options.rs`): `RateLimit-*` headers and
/// dynamic metadata. Both off by default.
#[derive(Debug, Default)]
pub(super) struct Extras {
    pub headers: Vec<HeaderValue>,
    pub metadata: Option<Struct>,
}

/// The encoded answer: a few tens of bytes for the usual request, kept inline.
pub struct Reply {
    overall: Code,
    bytes: SmallVec<[u8; INLINE_BYTES]>,
}

/// Room for four descriptors' statuses quoting limits with names of a few dozen bytes
/// (at most about 60 bytes each: `tests::a_usual_answer_stays_inline`).
const INLINE_BYTES: usize = 256;

// Field numbers, from envoy/service/ratelimit/v3/rls.proto.
const RESPONSE_OVERALL_CODE: u32 = 1;
const RESPONSE_STATUSES: u32 = 2;
const RESPONSE_HEADERS_TO_ADD: u32 = 3;
const RESPONSE_DYNAMIC_METADATA: u32 = 6;
const STATUS_CODE: u32 = 1;
const STATUS_CURRENT_LIMIT: u32 = 2;
const STATUS_LIMIT_REMAINING: u32 = 3;
const STATUS_DURATION_UNTIL_RESET: u32 = 4;
const LIMIT_REQUESTS_PER_UNIT: u32 = 1;
const LIMIT_UNIT: u32 = 2;
const LIMIT_NAME: u32 = 3;
const DURATION_SECONDS: u32 = 1;
const DURATION_NANOS: u32 = 2;

impl Reply {
    /// The answer `overall`, one status per request descriptor, and the extras.
    pub(super) fn new(overall: Code, statuses: &[StatusLine<'_>], extras: &Extras) -> Reply {
        // The length first, so that the bytes are written once into a buffer of their
        // size: inline for the usual answer.
        let len = varint_field_len(RESPONSE_OVERALL_CODE, code(overall))
            + statuses
                .iter()
                .map(|s| message_field_len(RESPONSE_STATUSES, status_len(s)))
                .sum::<usize>()
            + message::encoded_len_repeated(RESPONSE_HEADERS_TO_ADD, &extras.headers)
            + extras
                .metadata
                .as_ref()
                .map_or(0, |m| message::encoded_len(RESPONSE_DYNAMIC_METADATA, m));
        let mut bytes = SmallVec::from_elem(0, len);
        let mut out = Wire(&mut bytes[..]);
        out.varint_field(RESPONSE_OVERALL_CODE, code(overall));
        for s in statuses {
            out.message_field(RESPONSE_STATUSES, status_len(s), |w| w.status(s));
        }
        for h in &extras.headers {
            message::encode(RESPONSE_HEADERS_TO_ADD, h, &mut out.0);
        }
        if let Some(m) = &extras.metadata {
            message::encode(RESPONSE_DYNAMIC_METADATA, m, &mut out.0);
        }
        debug_assert!(out.0.is_empty(), "the answer's length as computed");
        Reply { overall, bytes }
    }

    /// The overall code.
    pub fn overall(&self) -> Code {
        self.overall
    }

    /// The encoded `RateLimitResponse`.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The answer as a prost message (the HTTP surface and the tests read it so).
    #[expect(clippy::expect_used, reason = "a reply decodes as it was encoded")]
    pub fn to_response(&self) -> RateLimitResponse {
        RateLimitResponse::decode(self.bytes()).expect("a reply decodes as it was encoded")
    }
}

fn code(c: Code) -> u64 {
    c as i32 as u64
}

/// The seconds and nanoseconds of a `google.protobuf.Duration` of `ms` (at least 0).
fn duration(ms: i64) -> (i64, i32) {
    let ms = ms.max(0);
    (ms / 1_000, ((ms % 1_000) * 1_000_000) as i32)
}

/// A varint field's length with its key, 0 for the default value (left out).
fn varint_field_len(tag: u32, v: u64) -> usize {
    if v == 0 {
        0
    } else {
        key_len(tag) + encoded_len_varint(v)
    }
}

fn key_len(tag: u32) -> usize {
    encoded_len_varint(u64::from(tag << 3))
}

fn message_field_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn limit_len(limit: StatedLimit<'_>, rpu: u32, unit: i32) -> usize {
    let name = limit.name.unwrap_or("");
    let name_len = if name.is_empty() {
        0
    } else {
        message_field_len(LIMIT_NAME, name.len())
    };
    varint_field_len(LIMIT_REQUESTS_PER_UNIT, u64::from(rpu))
        + varint_field_len(LIMIT_UNIT, unit as i64 as u64)
        + name_len
}

fn duration_len(ms: i64) -> usize {
    let (s, n) = duration(ms);
    varint_field_len(DURATION_SECONDS, s as u64) + varint_field_len(DURATION_NANOS, n as i64 as u64)
}

/// The quoted limit's requests per unit and unit, if there is a limit to quote.
fn quoted(limit: Option<StatedLimit<'_>>) -> Option<(StatedLimit<'_>, u32, i32)> {
    let limit = limit?;
    let (rate, unit) = limit.rate.quoted();
    Some((limit, rate, unit.proto_value()))
}

fn status_len(s: &StatusLine<'_>) -> usize {
    varint_field_len(STATUS_CODE, code(s.code))
        + quoted(s.limit).map_or(0, |(r, rpu, unit)| {
            message_field_len(STATUS_CURRENT_LIMIT, limit_len(r, rpu, unit))
        })
        + varint_field_len(STATUS_LIMIT_REMAINING, u64::from(s.remaining))
        + s.reset_ms.map_or(0, |ms| {
            message_field_len(STATUS_DURATION_UNTIL_RESET, duration_len(ms))
        })
}

/// What is left of the buffer being written (`&mut [u8]` advances as it is written to,
/// and panics past its end: the lengths computed above are exact).
struct Wire<'b>(&'b mut [u8]);

impl Wire<'_> {
    fn varint_field(&mut self, tag: u32, v: u64) {
        if v != 0 {
            encode_key(tag, WireType::Varint, &mut self.0);
            encode_varint(v, &mut self.0);
        }
    }

    /// A length-delimited field (a message, or a string's bytes) of `len` bytes.
    fn message_field(&mut self, tag: u32, len: usize, body: impl FnOnce(&mut Wire<'_>)) {
        encode_key(tag, WireType::LengthDelimited, &mut self.0);
        encode_varint(len as u64, &mut self.0);
        let room = self.0.len();
        body(self);
        debug_assert_eq!(room - self.0.len(), len, "a message's length as computed");
    }

    fn status(&mut self, s: &StatusLine<'_>) {
        self.varint_field(STATUS_CODE, code(s.code));
        if let Some((rule, rpu, unit)) = quoted(s.limit) {
            self.message_field(STATUS_CURRENT_LIMIT, limit_len(rule, rpu, unit), |w| {
                w.varint_field(LIMIT_REQUESTS_PER_UNIT, u64::from(rpu));
                w.varint_field(LIMIT_UNIT, unit as i64 as u64);
                let name = rule.name.unwrap_or("");
                if !name.is_empty() {
                    w.message_field(LIMIT_NAME, name.len(), |w| w.0.put_slice(name.as_bytes()));
                }
            });
        }
        self.varint_field(STATUS_LIMIT_REMAINING, u64::from(s.remaining));
        if let Some(ms) = s.reset_ms {
            self.message_field(STATUS_DURATION_UNTIL_RESET, duration_len(ms), |w| {
                let (secs, nanos) = duration(ms);
                w.varint_field(DURATION_SECONDS, secs as u64);
                w.varint_field(DURATION_NANOS, nanos as i64 as u64);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
        DescriptorStatus, RateLimit as ProtoRateLimit,
    };
    use envoy_types::pb::google::protobuf::{value::Kind, Duration, Value};
    use proptest::prelude::*;
    use std::sync::Arc;

    use crate::config::{Config, Rule};

    /// A named rule, an unnamed one and an unlimited one.
    fn rules() -> Vec<Arc<Rule>> {
        let yaml = r#"
domain: d
descriptors:
  - key: named
    rate_limit: {name: per_minute_for_each_tenant, unit: minute, requests_per_unit: 4000000000}
  - key: unnamed
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: unlimited
    rate_limit: {unlimited: true}
"#;
        let config = Config::from_yaml("a.yaml", yaml).unwrap();
        config.domain("d").unwrap().rules().cloned().collect()
    }

    /// The same answer built as prost's message, the way it was built before `response_encoding.rs`.
    fn as_prost(overall: Code, statuses: &[StatusLine<'_>], extras: &Extras) -> RateLimitResponse {
        RateLimitResponse {
            overall_code: overall as i32,
            statuses: statuses
                .iter()
                .map(|s| DescriptorStatus {
                    code: s.code as i32,
                    current_limit: quoted(s.limit).map(|(rule, rpu, unit)| ProtoRateLimit {
                        name: rule.name.unwrap_or_default().to_string(),
                        requests_per_unit: rpu,
                        unit,
                    }),
                    limit_remaining: s.remaining,
                    duration_until_reset: s.reset_ms.map(|ms| {
                        let (seconds, nanos) = duration(ms);
                        Duration { seconds, nanos }
                    }),
                    ..Default::default()
                })
                .collect(),
            response_headers_to_add: extras.headers.clone(),
            dynamic_metadata: extras.metadata.clone(),
            ..Default::default()
        }
    }

    fn status_line(
        rules: &[Arc<Rule>],
        pick: usize,
        over: bool,
        remaining: u32,
        reset: Option<i64>,
    ) -> StatusLine<'_> {
        StatusLine {
            code: if over { Code::OverLimit } else { Code::Ok },
            limit: rules.get(pick).and_then(|r| r.stated_limits().next()),
            remaining,
            reset_ms: reset,
        }
    }

    #[test]
    fn an_empty_answer_is_its_overall_code_alone() {
        let reply = Reply::new(Code::Ok, &[], &Extras::default());
        assert_eq!(reply.bytes(), &[0x08, 0x01][..]);
        assert_eq!(reply.to_response().overall_code, Code::Ok as i32);
    }

    #[test]
    fn a_usual_answer_stays_inline() {
        let rules = rules();
        let statuses: Vec<_> = (0..4)
            .map(|_| status_line(&rules, 0, false, u32::MAX, Some(i64::from(i32::MAX))))
            .collect();
        let reply = Reply::new(Code::Ok, &statuses, &Extras::default());
        assert!(!reply.bytes.spilled(), "{} bytes", reply.bytes().len());
    }

    proptest! {
        /// Byte for byte what prost writes for the same message: every code, limit kind,
        /// remaining count, reset (negative, sub-second, past `i32` seconds) and extra.
        #[test]
        fn the_bytes_are_prosts(
            overall in prop::bool::ANY,
            lines in prop::collection::vec(
                (0usize..4, prop::bool::ANY, any::<u32>(), prop::option::of(any::<i64>())),
                0..6,
            ),
            headers in prop::collection::vec(("[A-Za-z-]{0,12}", ".{0,20}"), 0..3),
            metadata in prop::option::of(".{0,30}"),
        ) {
            let rules = rules();
            let statuses: Vec<_> = lines
                .iter()
                .map(|&(pick, over, remaining, reset)| status_line(&rules, pick, over, remaining, reset))
                .collect();
            let extras = Extras {
                headers: headers
                    .into_iter()
                    .map(|(key, value)| HeaderValue { key, value, ..Default::default() })
                    .collect(),
                metadata: metadata.map(|text| Struct {
                    fields: [("domain".to_string(), Value { kind: Some(Kind::StringValue(text)) })]
                        .into_iter()
                        .collect(),
                }),
            };
            let overall = if overall { Code::OverLimit } else { Code::Ok };
            let reply = Reply::new(overall, &statuses, &extras);
            let expected = as_prost(overall, &statuses, &extras);
            prop_assert_eq!(reply.bytes(), &expected.encode_to_vec()[..]);
            prop_assert_eq!(reply.to_response(), expected);
            prop_assert_eq!(reply.overall(), overall);
        }
    }
}

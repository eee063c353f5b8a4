//! The reader against prost's generated decoder: the same request, or the same refusal,
//! for any message; and the field a refusal names.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use proptest::prelude::*;
use prost::Message;

use super::*;

/// The view as the message prost would have decoded (`is_negative_hits` is not kept).
fn to_proto(v: &RequestView<'_>) -> RateLimitRequest {
    RateLimitRequest {
        domain: v.domain.to_string(),
        hits_addend: v.hits_addend,
        descriptors: v
            .descriptors()
            .map(|d| RateLimitDescriptor {
                entries: d
                    .entries
                    .iter()
                    .map(|e| Entry {
                        key: e.key.to_string(),
                        value: e.value.to_string(),
                    })
                    .collect(),
                limit: d.limit.map(|l| RateLimitOverride {
                    requests_per_unit: l.requests_per_unit,
                    unit: l.unit,
                }),
                hits_addend: d.hits_addend.map(|value| UInt64Value { value }),
                is_negative_hits: false,
            })
            .collect(),
    }
}

fn prost_decoded(bytes: &[u8]) -> Result<RateLimitRequest, prost::DecodeError> {
    RateLimitRequest::decode(bytes).map(|mut r| {
        for d in &mut r.descriptors {
            d.is_negative_hits = false;
        }
        r
    })
}

fn text() -> impl Strategy<Value = String> {
    // ASCII, separators, multi-byte and empty.
    prop_oneof![
        "[a-z0-9_]{0,12}",
        "[=/|%:. ]{0,4}",
        "\\PC{0,6}",
        Just(String::new())
    ]
}

fn request() -> impl Strategy<Value = RateLimitRequest> {
    let entry = (text(), text()).prop_map(|(key, value)| Entry { key, value });
    let descriptor = (
        prop::collection::vec(entry, 0..5),
        prop::option::of((any::<u32>(), -2i32..8)),
        prop::option::of(any::<u64>()),
        any::<bool>(),
    )
        .prop_map(|(entries, limit, hits, negative)| RateLimitDescriptor {
            entries,
            limit: limit.map(|(requests_per_unit, unit)| RateLimitOverride {
                requests_per_unit,
                unit,
            }),
            hits_addend: hits.map(|value| UInt64Value { value }),
            is_negative_hits: negative,
        });
    (
        text(),
        prop::collection::vec(descriptor, 0..7),
        any::<u32>(),
    )
        .prop_map(|(domain, descriptors, hits_addend)| RateLimitRequest {
            domain,
            descriptors,
            hits_addend,
        })
}

/// A message built field by field: known and unknown tags, each with any wire type, and
/// length-delimited payloads that are messages again (so fields repeat, sub-messages
/// merge and known fields arrive with the wrong wire type), text or raw bytes.
fn raw_message(depth: u32) -> BoxedStrategy<Vec<u8>> {
    let leaf = prop_oneof![
        "\\PC{0,6}".prop_map(String::into_bytes),
        prop::collection::vec(any::<u8>(), 0..6),
    ]
    .boxed();
    let payload = if depth == 0 {
        leaf
    } else {
        prop_oneof![2 => raw_message(depth - 1), 1 => leaf].boxed()
    };
    let field = (
        prop::sample::select(vec![1u32, 2, 3, 4, 5, 19, 1000]),
        0u8..6,
        any::<u64>(),
        payload,
    )
        .prop_map(|(tag, wire, number, payload)| {
            let mut out = Vec::new();
            let wire = match wire {
                0 | 4 => 0,
                1 => 1,
                5 => 5,
                _ => 2,
            };
            prost::encoding::encode_varint(u64::from(tag << 3 | wire), &mut out);
            match wire {
                0 => prost::encoding::encode_varint(number, &mut out),
                1 => out.extend(number.to_le_bytes()),
                5 => out.extend((number as u32).to_le_bytes()),
                _ => {
                    prost::encoding::encode_varint(payload.len() as u64, &mut out);
                    out.extend(payload);
                }
            }
            out
        });
    prop::collection::vec(field, 0..6)
        .prop_map(|fields| fields.concat())
        .boxed()
}

fn same_as_prost(bytes: &[u8]) -> Result<(), TestCaseError> {
    match (RequestView::decode(bytes, Keep::ALL), prost_decoded(bytes)) {
        (Ok(view), Ok(decoded)) => prop_assert_eq!(to_proto(&view), decoded),
        (Err(_), Err(_)) => {}
        (ours, theirs) => prop_assert!(
            false,
            "ours {:?}, prost {:?}",
            ours.map(|v| to_proto(&v)),
            theirs
        ),
    };
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]
    #[test]
    fn any_message_of_any_fields_reads_as_prost_decodes_it(bytes in raw_message(3)) {
        same_as_prost(&bytes)?;
    }
}

proptest! {
    #[test]
    fn any_request_reads_as_prost_decodes_it(req in request()) {
        let bytes = req.encode_to_vec();
        let view = RequestView::decode(&bytes, Keep::ALL).unwrap();
        prop_assert_eq!(to_proto(&view), prost_decoded(&bytes).unwrap());
        prop_assert_eq!(view.descriptors_seen(), req.descriptors.len());
    }

    #[test]
    fn a_damaged_request_is_refused_exactly_when_prost_refuses_it(
        req in request(),
        cuts in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        truncate in any::<Option<prop::sample::Index>>(),
    ) {
        let mut bytes = req.encode_to_vec();
        if bytes.is_empty() {
            bytes.push(0x0a);
        }
        for (at, byte) in cuts {
            let i = at.index(bytes.len());
            bytes[i] = byte;
        }
        if let Some(t) = truncate {
            bytes.truncate(t.index(bytes.len()));
        }
        match (RequestView::decode(&bytes, Keep::ALL), prost_decoded(&bytes)) {
            (Ok(view), Ok(decoded)) => prop_assert_eq!(to_proto(&view), decoded),
            (Err(_), Err(_)) => {}
            (ours, theirs) => prop_assert!(false, "ours {:?}, prost {:?}", ours.map(|v| to_proto(&v)), theirs),
        };
    }

    #[test]
    fn arbitrary_bytes_are_refused_exactly_when_prost_refuses_them(
        bytes in prop::collection::vec(any::<u8>(), 0..64)
    ) {
        match (RequestView::decode(&bytes, Keep::ALL), prost_decoded(&bytes)) {
            (Ok(view), Ok(decoded)) => prop_assert_eq!(to_proto(&view), decoded),
            (Err(_), Err(_)) => {}
            (ours, theirs) => prop_assert!(false, "ours {:?}, prost {:?}", ours.map(|v| to_proto(&v)), theirs),
        };
    }

    #[test]
    fn a_decoded_request_views_the_same_as_its_bytes(req in request()) {
        let bytes = req.encode_to_vec();
        let decoded = prost_decoded(&bytes).unwrap();
        let from_bytes = RequestView::decode(&bytes, Keep::ALL).unwrap();
        prop_assert_eq!(to_proto(&RequestView::from(&decoded)), to_proto(&from_bytes));
    }
}

fn one(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: k.to_string(),
                value: v.to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

#[test]
fn keys_and_values_are_borrowed_from_the_message() {
    let req = RateLimitRequest {
        domain: "edge".into(),
        descriptors: vec![one(&[("tenant", "acme"), ("path", "/v1")])],
        hits_addend: 0,
    };
    let bytes = req.encode_to_vec();
    let view = RequestView::decode(&bytes, Keep::ALL).unwrap();
    let range = bytes.as_ptr_range();
    let d = view.descriptor(0).unwrap();
    for s in [view.domain, d.entries[0].key, d.entries[1].value] {
        assert!(range.contains(&s.as_ptr()), "{s} is not in the message");
    }
    assert_eq!(
        d.entries[1],
        EntryView {
            key: "path",
            value: "/v1"
        }
    );
}

#[test]
fn a_refusal_names_the_field() {
    // domain "d"; descriptors[0] = { entries[0] = {key "k", value "v"},
    // entries[1] = {key "k", value 0xff} }
    let bytes = [
        0x0a, 0x01, b'd', 0x12, 0x10, //
        0x0a, 0x06, 0x0a, 0x01, b'k', 0x12, 0x01, b'v', //
        0x0a, 0x06, 0x0a, 0x01, b'k', 0x12, 0x01, 0xff,
    ];
    let e = RequestView::decode(&bytes, Keep::ALL).unwrap_err();
    assert_eq!(
        e.to_string(),
        "descriptors[0].entries[1].value: not valid UTF-8"
    );
    assert!(RateLimitRequest::decode(&bytes[..]).is_err());

    // The domain as a varint.
    let e = RequestView::decode(&[0x08, 0x01], Keep::ALL).unwrap_err();
    assert_eq!(
        e.to_string(),
        "domain: wire type Varint where LengthDelimited is expected"
    );
    // A descriptor longer than the message.
    let e = RequestView::decode(&[0x12, 0x05, 0x0a], Keep::ALL).unwrap_err();
    assert_eq!(
        e.to_string(),
        "descriptors[0]: its length runs past the end of the message"
    );
}

#[test]
fn later_occurrences_win_or_merge_as_protobuf_says() {
    let mut bytes = Vec::new();
    RateLimitRequest {
        domain: "first".into(),
        descriptors: vec![],
        hits_addend: 7,
    }
    .encode(&mut bytes)
    .unwrap();
    // A second domain, and one descriptor whose limit comes in two parts.
    let part = |d: RateLimitDescriptor| {
        RateLimitRequest {
            descriptors: vec![d],
            ..Default::default()
        }
        .encode_to_vec()
    };
    bytes.extend(
        RateLimitRequest {
            domain: "second".into(),
            ..Default::default()
        }
        .encode_to_vec(),
    );
    let mut descriptor = RateLimitDescriptor {
        limit: Some(RateLimitOverride {
            requests_per_unit: 5,
            unit: 0,
        }),
        ..one(&[("a", "1")])
    }
    .encode_to_vec();
    descriptor.extend(
        RateLimitDescriptor {
            limit: Some(RateLimitOverride {
                requests_per_unit: 0,
                unit: 3,
            }),
            ..Default::default()
        }
        .encode_to_vec(),
    );
    let mut wrapped = vec![0x12];
    prost::encoding::encode_varint(descriptor.len() as u64, &mut wrapped);
    wrapped.extend(descriptor);
    bytes.extend(wrapped);
    bytes.extend(part(one(&[("b", "2")])));
    let view = RequestView::decode(&bytes, Keep::ALL).unwrap();
    assert_eq!(view.domain, "second");
    assert_eq!(view.hits_addend, 7);
    assert_eq!(view.len(), 2);
    assert_eq!(
        view.descriptor(0).unwrap().limit,
        Some(LimitOverride {
            requests_per_unit: 5,
            unit: 3
        })
    );
    assert_eq!(to_proto(&view), prost_decoded(&bytes).unwrap());
}

#[test]
fn past_the_bounds_only_the_counts_are_kept() {
    let req = RateLimitRequest {
        domain: "edge".into(),
        descriptors: (0..100)
            .map(|i| {
                let n = if i == 0 { 40 } else { 1 };
                let entries: Vec<(String, String)> =
                    (0..n).map(|j| (format!("k{j}"), "v".to_string())).collect();
                let refs: Vec<(&str, &str)> = entries
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                one(&refs)
            })
            .collect(),
        hits_addend: 0,
    };
    let bytes = req.encode_to_vec();
    let view = RequestView::decode(
        &bytes,
        Keep {
            descriptors: 64,
            entries: 16,
        },
    )
    .unwrap();
    assert_eq!(view.descriptors_seen(), 100);
    assert_eq!(view.len(), 64);
    assert_eq!(view.descriptor(0).unwrap().entries.len(), 16);
    assert_eq!(view.descriptor(0).unwrap().entries_seen, 40);
    assert_eq!(view.descriptor(1).unwrap().entries_seen, 1);
    // Everything past the bounds is still read: a bad byte there is refused.
    let mut bad = bytes.clone();
    let last = bad.len() - 1;
    bad[last] = 0xff;
    assert!(RequestView::decode(
        &bad,
        Keep {
            descriptors: 64,
            entries: 16
        }
    )
    .is_err());
}

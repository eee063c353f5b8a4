//! The request as it arrives: a `RateLimitRequest` read in place from the received
//! message, its domain, keys and values borrowed from the message's bytes instead of each
//! copied into a `String` of its own. It owns the wire reading of the request's messages
//! and nothing else: whether what was read is acceptable (empty, too long) is
//! `request.rs`'s to say, and nothing here knows a rule.
//!
//! Reading follows protobuf's rules as prost's generated decoder does, and a property test
//! compares the two on arbitrary messages: unknown fields are skipped, a scalar's last
//! occurrence wins, a sub-message's occurrences merge, strings must be UTF-8, and a known
//! field of the wrong wire type is an error. The primitives (varints, keys, skipping a
//! field) are prost's own `encoding` functions, the ones its derived code calls.
//!
//! A hostile message cannot make the view large: past the request limits' counts of
//! descriptors and entries, the reader still checks every field but keeps only the count,
//! which is all `request.rs` needs to refuse it.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use prost::encoding::{decode_key, decode_varint, skip_field, DecodeContext, WireType};
use smallvec::SmallVec;
use thiserror::Error;

use crate::config::DescriptorEntry;

/// One `key=value` entry of a descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryView<'a> {
    pub key: &'a str,
    pub value: &'a str,
}

impl DescriptorEntry for EntryView<'_> {
    fn key(&self) -> &str {
        self.key
    }
    fn value(&self) -> &str {
        self.value
    }
}

/// A descriptor's own limit (`RateLimitDescriptor.limit`): `unit` is the proto enum's
/// number, unchecked here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LimitOverride {
    pub requests_per_unit: u32,
    pub unit: i32,
}

/// One descriptor of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor<'v> {
    /// The entries kept: all of them, unless there are more than the reader keeps.
    pub entries: &'v [EntryView<'v>],
    /// How many entries the descriptor has (more than `entries` holds only past the
    /// reader's bound).
    pub entries_seen: usize,
    pub limit: Option<LimitOverride>,
    /// `hits_addend` (a `UInt64Value`): set, even to 0, or not.
    pub hits_addend: Option<u64>,
}

/// Where one descriptor's entries sit in the request's entry list, and its other fields.
#[derive(Debug, Clone, Copy)]
struct DescriptorSpan {
    first: u32,
    kept: u32,
    seen: u32,
    limit: Option<LimitOverride>,
    hits_addend: Option<u64>,
}

/// How many descriptors, and entries per descriptor, a reader keeps (the request limits';
/// one more of each is never needed: the count alone is refused).
#[derive(Debug, Clone, Copy)]
pub struct Keep {
    pub descriptors: usize,
    pub entries: usize,
}

impl Keep {
    /// Keeps everything (a request already decoded by other means).
    pub const ALL: Keep = Keep {
        descriptors: usize::MAX,
        entries: usize::MAX,
    };
}

/// A `RateLimitRequest` borrowed from where it is stored: the received bytes, or a decoded
/// message. Inline (no allocation) for up to 4 descriptors and 8 entries in all.
#[derive(Debug, Clone)]
pub struct RequestView<'a> {
    pub domain: &'a str,
    /// The request's `hits_addend` (0: not set).
    pub hits_addend: u32,
    slots: SmallVec<[DescriptorSpan; 4]>,
    entries: SmallVec<[EntryView<'a>; 8]>,
    descriptors_seen: usize,
}

/// Why a message is not a `RateLimitRequest`; names the field, as far as it was read.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{at}: {flaw}")]
pub struct WireError {
    /// The field being read, e.g. `descriptors[2].entries[0].value`; `message` for the
    /// request's own framing.
    at: String,
    flaw: Flaw,
}

/// What is wrong at a field.
#[derive(Debug, Error, PartialEq, Eq)]
enum Flaw {
    #[error("not valid UTF-8")]
    Utf8,
    #[error("its length runs past the end of the message")]
    Truncated,
    #[error("wire type {found:?} where {want:?} is expected")]
    WireType { found: WireType, want: WireType },
    /// A varint, key or skipped field that does not read (prost's words).
    #[error("{0}")]
    Malformed(String),
}

impl Flaw {
    fn from_prost(e: prost::DecodeError) -> Flaw {
        let text = e.to_string();
        let text = text
            .strip_prefix("failed to decode Protobuf message: ")
            .unwrap_or(&text);
        Flaw::Malformed(text.to_string())
    }
}

/// The path of the field being read, built only when there is an error to report.
#[derive(Clone, Copy)]
enum At {
    Message,
    Domain,
    HitsAddend,
    Descriptor(usize),
    Entry(usize, usize),
    Key(usize, usize),
    Value(usize, usize),
    Limit(usize),
    DescriptorHits(usize),
}

impl At {
    fn fail(self, flaw: Flaw) -> WireError {
        let at = match self {
            At::Message => "message".to_string(),
            At::Domain => "domain".to_string(),
            At::HitsAddend => "hits_addend".to_string(),
            At::Descriptor(i) => format!("descriptors[{i}]"),
            At::Entry(i, j) => format!("descriptors[{i}].entries[{j}]"),
            At::Key(i, j) => format!("descriptors[{i}].entries[{j}].key"),
            At::Value(i, j) => format!("descriptors[{i}].entries[{j}].value"),
            At::Limit(i) => format!("descriptors[{i}].limit"),
            At::DescriptorHits(i) => format!("descriptors[{i}].hits_addend"),
        };
        WireError { at, flaw }
    }
}

/// Reads the fields of one message from `buf`, calling `field` with each key; `field`
/// reads or skips the field's value.
fn fields<'a>(
    mut buf: &'a [u8],
    at: At,
    mut field: impl FnMut(u32, WireType, &mut &'a [u8]) -> Result<(), WireError>,
) -> Result<(), WireError> {
    while !buf.is_empty() {
        let (tag, wire_type) = decode_key(&mut buf).map_err(|e| at.fail(Flaw::from_prost(e)))?;
        field(tag, wire_type, &mut buf)?;
    }
    Ok(())
}

fn expect(found: WireType, want: WireType, at: At) -> Result<(), WireError> {
    if found == want {
        Ok(())
    } else {
        Err(at.fail(Flaw::WireType { found, want }))
    }
}

fn skip(tag: u32, wire_type: WireType, buf: &mut &[u8], at: At) -> Result<(), WireError> {
    skip_field(wire_type, tag, buf, DecodeContext::default())
        .map_err(|e| at.fail(Flaw::from_prost(e)))
}

fn varint(wire_type: WireType, buf: &mut &[u8], at: At) -> Result<u64, WireError> {
    expect(wire_type, WireType::Varint, at)?;
    decode_varint(buf).map_err(|e| at.fail(Flaw::from_prost(e)))
}

/// A length-delimited field's bytes, borrowed.
fn delimited<'a>(wire_type: WireType, buf: &mut &'a [u8], at: At) -> Result<&'a [u8], WireError> {
    expect(wire_type, WireType::LengthDelimited, at)?;
    let len = decode_varint(buf).map_err(|e| at.fail(Flaw::from_prost(e)))?;
    let (body, rest) = usize::try_from(len)
        .ok()
        .and_then(|len| buf.split_at_checked(len))
        .ok_or_else(|| at.fail(Flaw::Truncated))?;
    *buf = rest;
    Ok(body)
}

fn string<'a>(wire_type: WireType, buf: &mut &'a [u8], at: At) -> Result<&'a str, WireError> {
    let bytes = delimited(wire_type, buf, at)?;
    std::str::from_utf8(bytes).map_err(|_| at.fail(Flaw::Utf8))
}

impl<'a> RequestView<'a> {
    /// Reads a `RateLimitRequest` from `message` (the protobuf, without gRPC's prefix),
    /// keeping at most `keep`'s counts.
    pub fn decode(message: &'a [u8], keep: Keep) -> Result<RequestView<'a>, WireError> {
        let mut view = RequestView {
            domain: "",
            hits_addend: 0,
            slots: SmallVec::new(),
            entries: SmallVec::new(),
            descriptors_seen: 0,
        };
        fields(message, At::Message, |tag, wt, buf| match tag {
            1 => {
                view.domain = string(wt, buf, At::Domain)?;
                Ok(())
            }
            2 => {
                let body = delimited(wt, buf, At::Descriptor(view.descriptors_seen))?;
                view.read_descriptor(body, keep)
            }
            3 => {
                // uint32: the low 32 bits of the varint, as prost (and protoc) read it.
                view.hits_addend = varint(wt, buf, At::HitsAddend)? as u32;
                Ok(())
            }
            _ => skip(tag, wt, buf, At::Message),
        })?;
        Ok(view)
    }

    /// Reads one `RateLimitDescriptor` (the request's next) from `body`.
    fn read_descriptor(&mut self, body: &'a [u8], keep: Keep) -> Result<(), WireError> {
        let i = self.descriptors_seen;
        self.descriptors_seen += 1;
        let kept = i < keep.descriptors;
        let mut slot = DescriptorSpan {
            first: self.entries.len() as u32,
            kept: 0,
            seen: 0,
            limit: None,
            hits_addend: None,
        };
        fields(body, At::Descriptor(i), |tag, wt, buf| match tag {
            1 => {
                let j = slot.seen as usize;
                let entry = entry(delimited(wt, buf, At::Entry(i, j))?, i, j)?;
                slot.seen += 1;
                if kept && j < keep.entries {
                    self.entries.push(entry);
                    slot.kept += 1;
                }
                Ok(())
            }
            2 => {
                let body = delimited(wt, buf, At::Limit(i))?;
                // A sub-message's occurrences merge: the fields of a later one win.
                let limit = slot.limit.get_or_insert_with(LimitOverride::default);
                fields(body, At::Limit(i), |tag, wt, buf| match tag {
                    1 => {
                        limit.requests_per_unit = varint(wt, buf, At::Limit(i))? as u32;
                        Ok(())
                    }
                    2 => {
                        // An enum: int32, its varint's low 32 bits.
                        limit.unit = varint(wt, buf, At::Limit(i))? as i32;
                        Ok(())
                    }
                    _ => skip(tag, wt, buf, At::Limit(i)),
                })
            }
            3 => {
                let body = delimited(wt, buf, At::DescriptorHits(i))?;
                let hits = slot.hits_addend.get_or_insert(0);
                fields(body, At::DescriptorHits(i), |tag, wt, buf| match tag {
                    1 => {
                        *hits = varint(wt, buf, At::DescriptorHits(i))?;
                        Ok(())
                    }
                    _ => skip(tag, wt, buf, At::DescriptorHits(i)),
                })
            }
            4 => {
                // `is_negative_hits`: read (so a malformed one is refused, as prost
                // does) and not acted on, as envoyproxy/ratelimit does not.
                varint(wt, buf, At::Descriptor(i)).map(drop)
            }
            _ => skip(tag, wt, buf, At::Descriptor(i)),
        })?;
        if kept {
            self.slots.push(slot);
        }
        Ok(())
    }

    /// The descriptors kept, in request order.
    pub fn descriptors(&self) -> impl ExactSizeIterator<Item = Descriptor<'_>> + use<'_, 'a> {
        self.slots.iter().map(|s| self.at(s))
    }

    /// Descriptor `i` (of those kept), if there is one.
    pub fn descriptor(&self, i: usize) -> Option<Descriptor<'_>> {
        self.slots.get(i).map(|s| self.at(s))
    }

    /// How many descriptors are kept: all of them once `request.rs` has accepted the
    /// request.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the request has no descriptor kept.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// How many descriptors the request has.
    pub fn descriptors_seen(&self) -> usize {
        self.descriptors_seen
    }

    fn at(&self, s: &DescriptorSpan) -> Descriptor<'_> {
        let first = s.first as usize;
        // `read_descriptor` pushed exactly `kept` entries from `first` on: never empty
        // for want of them.
        let entries = self.entries.get(first..first + s.kept as usize);
        Descriptor {
            entries: entries.unwrap_or_default(),
            entries_seen: s.seen as usize,
            limit: s.limit,
            hits_addend: s.hits_addend,
        }
    }
}

impl PartialEq for RequestView<'_> {
    /// The same request: domain, hits and every descriptor kept (however stored).
    fn eq(&self, other: &Self) -> bool {
        self.domain == other.domain
            && self.hits_addend == other.hits_addend
            && self.descriptors_seen == other.descriptors_seen
            && self.descriptors().eq(other.descriptors())
    }
}

/// Reads one `Entry` (`key`, `value`); descriptor `i`'s entry `j`.
fn entry(body: &[u8], i: usize, j: usize) -> Result<EntryView<'_>, WireError> {
    let mut e = EntryView { key: "", value: "" };
    fields(body, At::Entry(i, j), |tag, wt, buf| match tag {
        1 => {
            e.key = string(wt, buf, At::Key(i, j))?;
            Ok(())
        }
        2 => {
            e.value = string(wt, buf, At::Value(i, j))?;
            Ok(())
        }
        _ => skip(tag, wt, buf, At::Entry(i, j)),
    })?;
    Ok(e)
}

impl<'a> From<&'a RateLimitRequest> for RequestView<'a> {
    /// The view of a request decoded by other means (the HTTP surface's JSON, a test).
    fn from(req: &'a RateLimitRequest) -> RequestView<'a> {
        let mut view = RequestView {
            domain: &req.domain,
            hits_addend: req.hits_addend,
            slots: SmallVec::with_capacity(req.descriptors.len()),
            entries: SmallVec::new(),
            descriptors_seen: req.descriptors.len(),
        };
        for d in &req.descriptors {
            let first = view.entries.len() as u32;
            view.entries.extend(d.entries.iter().map(|e| EntryView {
                key: &e.key,
                value: &e.value,
            }));
            view.slots.push(DescriptorSpan {
                first,
                kept: d.entries.len() as u32,
                seen: d.entries.len() as u32,
                limit: d.limit.as_ref().map(|l| LimitOverride {
                    requests_per_unit: l.requests_per_unit,
                    unit: l.unit,
                }),
                hits_addend: d.hits_addend.as_ref().map(|h| h.value),
            });
        }
        view
    }
}

#[cfg(test)]
mod tests;

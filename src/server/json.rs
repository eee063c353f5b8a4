//! The proto3-JSON mapping of `RateLimitRequest` and `RateLimitResponse` for `POST /json`.
//!
//! Input accepts both lowerCamelCase and the proto field names, numbers or decimal strings
//! for 64-bit values, and enum names or numbers, as proto3 JSON parsers must. Output uses
//! lowerCamelCase and writes every field. A field the message does not have is refused, as
//! proto3 JSON parsers do by default (a misspelled `valu` would otherwise be read as an
//! empty value and debit the key-only rule). Errors name the offending field.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, UInt64Value, Value as ProtoValue};
use serde_json::{json, Map, Value};

use crate::config::Unit;

fn field<'a>(obj: &'a Map<String, Value>, camel: &str, snake: &str) -> Option<&'a Value> {
    obj.get(camel)
        .or_else(|| obj.get(snake))
        .filter(|v| !v.is_null())
}

/// Refuses a field of `obj` (at `path`, `None` for the request itself) that is none of
/// `known` (lowerCamelCase names; their proto names are accepted too).
fn only_known(obj: &Map<String, Value>, path: Option<&str>, known: &[&str]) -> Result<(), String> {
    let is_known = |name: &str| {
        known
            .iter()
            .any(|k| *k == name || camel_to_snake(k) == name)
    };
    match obj.keys().find(|name| !is_known(name)) {
        None => Ok(()),
        Some(name) => {
            let name = crate::support::text::elide(name, 64);
            let at = path.map(|p| format!("{p}.")).unwrap_or_default();
            Err(format!(
                "{at}{name}: unknown field (known: {})",
                known.join(", ")
            ))
        }
    }
}

/// `hitsAddend` as `hits_addend`.
fn camel_to_snake(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push('_');
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

fn as_u64(v: &Value, path: &str) -> Result<u64, String> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| format!("{path}: expected a non-negative integer, found {n}")),
        Value::String(s) => s
            .parse::<u64>()
            .map_err(|_| format!("{path}: expected a non-negative integer, found \"{s}\"")),
        other => Err(format!(
            "{path}: expected a non-negative integer, found {other}"
        )),
    }
}

fn as_str<'a>(v: &'a Value, path: &str) -> Result<&'a str, String> {
    v.as_str()
        .ok_or_else(|| format!("{path}: expected a string, found {v}"))
}

fn as_obj<'a>(v: &'a Value, path: &str) -> Result<&'a Map<String, Value>, String> {
    v.as_object()
        .ok_or_else(|| format!("{path}: expected an object, found {v}"))
}

fn unit_value(v: &Value, path: &str) -> Result<i32, String> {
    match v {
        Value::String(s) => Unit::parse(s)
            .map(Unit::proto_value)
            .ok_or_else(|| format!("{path}: unknown unit \"{s}\"")),
        Value::Number(n) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .filter(|n| Unit::from_proto(*n).is_some())
            .ok_or_else(|| format!("{path}: unknown unit {n}")),
        other => Err(format!("{path}: expected a unit, found {other}")),
    }
}

/// Parses a proto3-JSON `RateLimitRequest`.
pub fn parse_request(body: &[u8]) -> Result<RateLimitRequest, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
    let obj = as_obj(&v, "request")?;
    only_known(obj, None, &["domain", "descriptors", "hitsAddend"])?;
    let mut req = RateLimitRequest::default();
    if let Some(d) = field(obj, "domain", "domain") {
        req.domain = as_str(d, "domain")?.to_string();
    }
    if let Some(h) = field(obj, "hitsAddend", "hits_addend") {
        req.hits_addend = u32::try_from(as_u64(h, "hitsAddend")?)
            .map_err(|_| "hitsAddend: exceeds 4294967295".to_string())?;
    }
    if let Some(ds) = field(obj, "descriptors", "descriptors") {
        let ds = ds
            .as_array()
            .ok_or_else(|| format!("descriptors: expected an array, found {ds}"))?;
        for (i, d) in ds.iter().enumerate() {
            let path = format!("descriptors[{i}]");
            let dobj = as_obj(d, &path)?;
            only_known(dobj, Some(&path), &["entries", "limit", "hitsAddend"])?;
            let mut desc = RateLimitDescriptor::default();
            if let Some(es) = field(dobj, "entries", "entries") {
                let es = es
                    .as_array()
                    .ok_or_else(|| format!("{path}.entries: expected an array, found {es}"))?;
                for (j, e) in es.iter().enumerate() {
                    let epath = format!("{path}.entries[{j}]");
                    let eobj = as_obj(e, &epath)?;
                    only_known(eobj, Some(&epath), &["key", "value"])?;
                    desc.entries.push(Entry {
                        key: field(eobj, "key", "key")
                            .map(|k| as_str(k, &format!("{epath}.key")))
                            .transpose()?
                            .unwrap_or_default()
                            .to_string(),
                        value: field(eobj, "value", "value")
                            .map(|k| as_str(k, &format!("{epath}.value")))
                            .transpose()?
                            .unwrap_or_default()
                            .to_string(),
                    });
                }
            }
            if let Some(l) = field(dobj, "limit", "limit") {
                let lpath = format!("{path}.limit");
                let lobj = as_obj(l, &lpath)?;
                only_known(lobj, Some(&lpath), &["requestsPerUnit", "unit"])?;
                let rpu = field(lobj, "requestsPerUnit", "requests_per_unit")
                    .map(|v| as_u64(v, &format!("{lpath}.requestsPerUnit")))
                    .transpose()?
                    .unwrap_or(0);
                desc.limit = Some(RateLimitOverride {
                    requests_per_unit: u32::try_from(rpu)
                        .map_err(|_| format!("{lpath}.requestsPerUnit: exceeds 4294967295"))?,
                    unit: field(lobj, "unit", "unit")
                        .map(|u| unit_value(u, &format!("{lpath}.unit")))
                        .transpose()?
                        .unwrap_or(0),
                });
            }
            if let Some(h) = field(dobj, "hitsAddend", "hits_addend") {
                // UInt64Value maps to a bare number (or string) in proto3 JSON.
                desc.hits_addend = Some(UInt64Value {
                    value: as_u64(h, &format!("{path}.hitsAddend"))?,
                });
            }
            req.descriptors.push(desc);
        }
    }
    Ok(req)
}

fn code_name(code: i32) -> &'static str {
    match Code::try_from(code) {
        Ok(Code::Ok) => "OK",
        Ok(Code::OverLimit) => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}

fn unit_name(unit: i32) -> &'static str {
    match Unit::from_proto(unit) {
        Some(Unit::Second) => "SECOND",
        Some(Unit::Minute) => "MINUTE",
        Some(Unit::Hour) => "HOUR",
        Some(Unit::Day) => "DAY",
        Some(Unit::Week) => "WEEK",
        Some(Unit::Month) => "MONTH",
        Some(Unit::Year) => "YEAR",
        None => "UNKNOWN",
    }
}

fn status_json(s: &DescriptorStatus) -> Value {
    let mut out = Map::new();
    out.insert("code".to_owned(), json!(code_name(s.code)));
    out.insert("limitRemaining".to_owned(), json!(s.limit_remaining));
    if let Some(l) = &s.current_limit {
        let limit = json!({
            "name": l.name,
            "requestsPerUnit": l.requests_per_unit,
            "unit": unit_name(l.unit),
        });
        out.insert("currentLimit".to_owned(), limit);
    }
    if let Some(d) = &s.duration_until_reset {
        let text = Value::String(duration_text(d.seconds, d.nanos));
        out.insert("durationUntilReset".to_owned(), text);
    }
    Value::Object(out)
}

/// Canonical proto3-JSON duration: seconds with 0, 3, 6 or 9 fraction digits.
fn duration_text(seconds: i64, nanos: i32) -> String {
    let nanos = nanos.unsigned_abs();
    if nanos == 0 {
        format!("{seconds}s")
    } else if nanos.is_multiple_of(1_000_000) {
        format!("{seconds}.{:03}s", nanos / 1_000_000)
    } else if nanos.is_multiple_of(1_000) {
        format!("{seconds}.{:06}s", nanos / 1_000)
    } else {
        format!("{seconds}.{nanos:09}s")
    }
}

fn struct_json(s: &Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_json(v)))
            .collect(),
    )
}

fn value_json(v: &ProtoValue) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StructValue(s)) => struct_json(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value_json).collect()),
    }
}

/// Renders a `RateLimitResponse` as proto3 JSON.
pub fn render_response(r: &RateLimitResponse) -> Value {
    let mut out = Map::new();
    out.insert("overallCode".to_owned(), json!(code_name(r.overall_code)));
    let statuses = r.statuses.iter().map(status_json).collect();
    out.insert("statuses".to_owned(), Value::Array(statuses));
    if let Some(m) = &r.dynamic_metadata {
        out.insert("dynamicMetadata".to_owned(), struct_json(m));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_camel_and_snake_case() {
        let body = br#"{"domain":"edge","hits_addend":2,"descriptors":[
            {"entries":[{"key":"tenant","value":"acme"}],"hitsAddend":"5",
             "limit":{"requests_per_unit":10,"unit":"minute"}}]}"#;
        let r = parse_request(body).unwrap();
        assert_eq!(r.domain, "edge");
        assert_eq!(r.hits_addend, 2);
        assert_eq!(r.descriptors[0].entries[0].value, "acme");
        assert_eq!(r.descriptors[0].hits_addend.as_ref().unwrap().value, 5);
        assert_eq!(
            r.descriptors[0].limit.as_ref().unwrap().unit,
            Unit::Minute.proto_value()
        );
    }

    #[test]
    fn durations_use_canonical_fraction_digits() {
        assert_eq!(duration_text(6, 1_000_000), "6.001s");
        assert_eq!(duration_text(0, 20_000_000), "0.020s");
        assert_eq!(duration_text(3, 0), "3s");
        assert_eq!(duration_text(1, 500), "1.000000500s");
        assert_eq!(duration_text(1, 5_000), "1.000005s");
    }

    #[test]
    fn errors_name_the_field() {
        let e = parse_request(br#"{"descriptors":[{"entries":[{"key":1}]}]}"#).unwrap_err();
        assert!(e.starts_with("descriptors[0].entries[0].key"), "{e}");
        let e = parse_request(br#"{"hitsAddend":-1}"#).unwrap_err();
        assert!(e.starts_with("hitsAddend"), "{e}");
        assert!(parse_request(b"not json").unwrap_err().contains("not JSON"));
    }

    #[test]
    fn unknown_fields_are_refused_by_name() {
        let e = parse_request(
            br#"{"domain":"d","descriptors":[{"entries":[{"key":"k","valu":"v"}]}]}"#,
        )
        .unwrap_err();
        assert_eq!(
            e,
            "descriptors[0].entries[0].valu: unknown field (known: key, value)"
        );
        let e = parse_request(br#"{"domain":"d","domian":"x"}"#).unwrap_err();
        assert!(e.starts_with("domian: unknown field"), "{e}");
        let e = parse_request(br#"{"descriptors":[{"limit":{"rpu":1}}]}"#).unwrap_err();
        assert!(
            e.starts_with("descriptors[0].limit.rpu: unknown field"),
            "{e}"
        );
        let e = parse_request(br#"{"descriptors":[{"hits":2}]}"#).unwrap_err();
        assert!(e.starts_with("descriptors[0].hits: unknown field"), "{e}");
        // The proto names are fields too.
        let ok = parse_request(
            br#"{"domain":"d","hits_addend":1,"descriptors":[{"hits_addend":2,"limit":{"requests_per_unit":1,"unit":"SECOND"}}]}"#,
        );
        assert!(ok.is_ok(), "{ok:?}");
    }
}

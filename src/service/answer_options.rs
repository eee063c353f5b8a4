//! What a deployment switches on around the decision, as envoyproxy/ratelimit's
//! settings do: global shadow mode (the overall code only), dynamic metadata in its
//! shape (`RESPONSE_DYNAMIC_METADATA`), and `RateLimit-*` response headers
//! (`LIMIT_RESPONSE_HEADERS_ENABLED`).
//!
//! Applied to the statuses already built from the engine's verdicts (`descriptor_status.rs`), before
//! `response_encoding.rs` writes the answer; it never changes a descriptor's status or what was
//! counted.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::google::protobuf::{value::Kind, ListValue, Struct, Value};

use super::response_encoding::{Extras, StatusLine};
use super::treatment::{Group, Treatment};
use super::wire::{Descriptor, RequestView};

/// The names of the three response headers (upstream's `LIMIT_*_HEADER` settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitHeaders {
    pub limit: String,
    pub remaining: String,
    pub reset: String,
}

impl Default for RateLimitHeaders {
    /// Upstream's defaults, the IETF draft's names.
    fn default() -> Self {
        RateLimitHeaders {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

/// The deployment's switches; all off by default, as upstream's are.
#[derive(Debug, Clone, Default)]
pub struct AnswerOptions {
    /// The overall code is OK even when a descriptor is over its limit; every descriptor
    /// keeps its own code (`--global-shadow-mode`, upstream's `SHADOW_MODE`).
    pub global_shadow: bool,
    /// Send dynamic metadata: the request's domain and descriptors, and the passing
    /// descriptors' rule `metadata` (`--response-dynamic-metadata`).
    pub dynamic_metadata: bool,
    /// Add `RateLimit-*` headers for the descriptor closest to its limit
    /// (`--rate-limit-headers`), so they reach clients without Envoy's own.
    pub headers: Option<RateLimitHeaders>,
}

/// What [`AnswerOptions::apply`] did: whether it is counted, and what the answer adds.
pub(super) struct Applied {
    /// The request was over its limits and answered OK by global shadow mode.
    pub shadowed: bool,
    pub extras: Extras,
}

impl AnswerOptions {
    /// Shapes the answer to `req`: `overall` and `statuses` (one per descriptor, from
    /// `treatments`) as decided, and what the deployment adds to them.
    pub(super) fn apply(
        &self,
        req: &RequestView<'_>,
        treatments: &[Treatment<'_>],
        statuses: &[StatusLine<'_>],
        overall: &mut Code,
    ) -> Applied {
        let mut extras = Extras::default();
        if let Some(names) = &self.headers {
            if let Some(s) = closest_to_limit(treatments, statuses) {
                extras.headers = headers(names, s);
            }
        }
        let shadowed = self.global_shadow && *overall == Code::OverLimit;
        if shadowed {
            *overall = Code::Ok;
        }
        if self.dynamic_metadata {
            extras.metadata = Some(metadata(req, treatments, statuses));
        }
        Applied { shadowed, extras }
    }
}

/// The status the headers speak for, as upstream picks it: a descriptor refused outside
/// quota mode (the last one), else the one with a limit and the least left (the first of
/// equals). Unlike upstream, a limit with 4294967295 left (a burst that large, not yet
/// drawn on) is picked too, so that any descriptor with a limit gets headers.
fn closest_to_limit<'s, 'r>(
    treatments: &[Treatment<'_>],
    statuses: &'s [StatusLine<'r>],
) -> Option<&'s StatusLine<'r>> {
    let mut chosen: Option<&StatusLine<'r>> = None;
    let mut least = u32::MAX;
    for (t, s) in treatments.iter().zip(statuses) {
        if s.quotes_limit() && (chosen.is_none() || s.remaining < least) {
            chosen = Some(s);
            least = s.remaining;
        }
        let quota = matches!(
            t,
            Treatment::Limited {
                group: Group::Quota,
                ..
            }
        );
        if s.code == Code::OverLimit && !quota {
            chosen = Some(s);
            least = 0;
        }
    }
    chosen
}

/// The three headers for `s`: its limit's requests per unit, what is left, and the whole
/// seconds until its bucket is full again (or, refused, until the request would fit).
fn headers(names: &RateLimitHeaders, s: &StatusLine<'_>) -> Vec<HeaderValue> {
    let limit = s.requests_per_unit();
    // Whole seconds, rounded up.
    let reset_s = s
        .reset_ms
        .map_or(0, |ms| (ms.max(0) as u64).div_ceil(1_000));
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_string(),
        value,
        ..Default::default()
    };
    vec![
        header(&names.limit, limit.to_string()),
        header(&names.remaining, s.remaining.to_string()),
        header(&names.reset, reset_s.to_string()),
    ]
}

/// Upstream's dynamic metadata: `domain`, `descriptors` (each `entries` as `key=value`,
/// its `limit` override and `hitsAddend` when set), the request's `hitsAddend` when not
/// zero, and `metadata`, the rule metadata of the descriptors that passed (merged in
/// request order: the first descriptor's value wins, maps merge key by key).
fn metadata(
    req: &RequestView<'_>,
    treatments: &[Treatment<'_>],
    statuses: &[StatusLine<'_>],
) -> Struct {
    let mut fields = std::collections::BTreeMap::new();
    fields.insert("domain".to_string(), string(req.domain.to_string()));
    let descriptors = req.descriptors().map(|d| descriptor(&d)).collect();
    fields.insert("descriptors".to_string(), list(descriptors));
    if req.hits_addend != 0 {
        fields.insert("hitsAddend".to_string(), number(req.hits_addend as f64));
    }
    let mut passed = Struct::default();
    for (t, s) in treatments.iter().zip(statuses) {
        if let (Treatment::Limited { rule, .. }, true) = (t, s.code == Code::Ok) {
            if let Some(serde_json::Value::Object(map)) = &rule.metadata {
                merge(&mut passed, &json_struct(map));
            }
        }
    }
    if !passed.fields.is_empty() {
        fields.insert("metadata".to_string(), struct_value(passed));
    }
    Struct {
        fields: fields.into_iter().collect(),
    }
}

fn descriptor(d: &Descriptor<'_>) -> Value {
    let mut fields = std::collections::BTreeMap::new();
    let entries = d
        .entries
        .iter()
        .map(|e| string(format!("{}={}", e.key, e.value)))
        .collect();
    fields.insert("entries".to_string(), list(entries));
    if let Some(l) = d.limit {
        let unit = ProtoUnit::try_from(l.unit).map_or("UNKNOWN", |u| u.as_str_name());
        let text = format!("requests_per_unit:{} unit:{unit}", l.requests_per_unit);
        fields.insert("limit".to_string(), string(text));
    }
    if let Some(h) = d.hits_addend {
        fields.insert("hitsAddend".to_string(), number(h as f64));
    }
    struct_value(Struct {
        fields: fields.into_iter().collect(),
    })
}

/// Adds `src` into `dest`: a key already there keeps its value, unless both are maps,
/// which merge the same way.
fn merge(dest: &mut Struct, src: &Struct) {
    for (k, v) in &src.fields {
        match (dest.fields.get_mut(k), &v.kind) {
            (None, _) => {
                dest.fields.insert(k.clone(), v.clone());
            }
            (
                Some(Value {
                    kind: Some(Kind::StructValue(d)),
                }),
                Some(Kind::StructValue(s)),
            ) => merge(d, s),
            (Some(_), _) => {}
        }
    }
}

fn json_struct(map: &serde_json::Map<String, serde_json::Value>) -> Struct {
    Struct {
        fields: map
            .iter()
            .map(|(k, v)| (k.clone(), json_value(v)))
            .collect(),
    }
}

fn json_value(v: &serde_json::Value) -> Value {
    let kind = match v {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(ListValue {
            values: a.iter().map(json_value).collect(),
        }),
        serde_json::Value::Object(o) => Kind::StructValue(json_struct(o)),
    };
    Value { kind: Some(kind) }
}

fn string(s: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(s)),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn struct_value(s: Struct) -> Value {
    Value {
        kind: Some(Kind::StructValue(s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(pairs: &[(&str, Value)]) -> Struct {
        Struct {
            fields: pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
        }
    }

    #[test]
    fn merge_keeps_the_first_value_and_merges_maps() {
        let mut dest = s(&[
            ("a", string("first".into())),
            ("m", struct_value(s(&[("x", number(1.0))]))),
        ]);
        let src = s(&[
            ("a", string("second".into())),
            ("b", number(2.0)),
            (
                "m",
                struct_value(s(&[("x", number(9.0)), ("y", number(3.0))])),
            ),
        ]);
        merge(&mut dest, &src);
        let expected = s(&[
            ("a", string("first".into())),
            ("b", number(2.0)),
            (
                "m",
                struct_value(s(&[("x", number(1.0)), ("y", number(3.0))])),
            ),
        ]);
        assert_eq!(dest, expected);
    }

    /// A rule with a limit, for statuses that quote one.
    fn limited_rule() -> std::sync::Arc<crate::config::Rule> {
        let yaml = "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 9}\n";
        let config = crate::config::Config::from_yaml("a.yaml", yaml).unwrap();
        let rule = config.domain("d").unwrap().rules().next().unwrap().clone();
        rule
    }

    #[test]
    fn the_headers_speak_for_any_descriptor_with_a_limit() {
        let rule = limited_rule();
        let limited = |remaining| StatusLine {
            limit: rule.stated_limits().next(),
            remaining,
            ..StatusLine::ok(0)
        };
        let free = Treatment::Free { unlimited: false };
        let unlimited = StatusLine::ok(u32::MAX);
        let statuses = [unlimited, limited(u32::MAX)];
        let treatments = [free, Treatment::Free { unlimited: false }];
        let chosen = closest_to_limit(&treatments, &statuses).expect("a limited status");
        assert!(chosen.quotes_limit());
        // The least left wins; the first of equals.
        let statuses = [limited(7), limited(3), limited(3)];
        let treatments = std::array::from_fn::<_, 3, _>(|_| Treatment::Free { unlimited: false });
        let chosen = closest_to_limit(&treatments, &statuses).unwrap();
        assert!(std::ptr::eq(chosen, &statuses[1]));
        assert!(closest_to_limit(&treatments[..1], &[unlimited]).is_none());
    }

    #[test]
    fn reset_header_rounds_up_to_whole_seconds() {
        let rule = limited_rule();
        let status = |reset_ms| StatusLine {
            limit: rule.stated_limits().next(),
            remaining: 3,
            reset_ms: Some(reset_ms),
            ..StatusLine::ok(0)
        };
        let reset =
            |st: &StatusLine<'_>| headers(&RateLimitHeaders::default(), st)[2].value.clone();
        assert_eq!(reset(&status(5_000)), "5");
        assert_eq!(reset(&status(5_001)), "6");
        assert_eq!(reset(&status(20)), "1");
        let h = headers(&RateLimitHeaders::default(), &status(0));
        assert_eq!(
            h.iter()
                .map(|h| (h.key.as_str(), h.value.as_str()))
                .collect::<Vec<_>>(),
            [
                ("RateLimit-Limit", "9"),
                ("RateLimit-Remaining", "3"),
                ("RateLimit-Reset", "0")
            ]
        );
    }
}

//! upstream's tracing settings (`TRACING_*`), read as our OTLP export's and the
//! OpenTelemetry SDK's own variables.

use std::collections::BTreeMap;

use super::{go_bool, Alias, Translation};

/// upstream's service name for its spans (`TRACING_SERVICE_NAME`'s default).
const UPSTREAM_TRACING_SERVICE_NAME: &str = "RateLimit";

/// Tracing as upstream does it: with `TRACING_ENABLED=true`, spans over OTLP by
/// `TRACING_EXPORTER_PROTOCOL` (`http`, upstream's default, or `grpc`) to the SDK's
/// `OTEL_EXPORTER_OTLP_ENDPOINT` (else the SDK's default collector on localhost), named
/// by `TRACING_SERVICE_NAME` (`RateLimit`), `_NAMESPACE` and `_INSTANCE_ID`, sampled at
/// `TRACING_SAMPLING_RATE` (the caller's sampled flag followed, as the SDK's parent-based
/// samplers do). Returns the upstream names read.
pub(super) fn tracing(env: &BTreeMap<String, String>, t: &mut Translation) -> Vec<&'static str> {
    let get = |k: &str| env.get(k).map(String::as_str).filter(|v| !v.is_empty());
    let alias = |t: &mut Translation, ours: &'static str, from: &'static str, value: String| {
        if !env.contains_key(ours) {
            t.set.push(Alias { ours, value, from });
        }
    };
    match get("TRACING_ENABLED").map(go_bool) {
        Some(Some(true)) => {}
        Some(None) => {
            t.refused.push("TRACING_ENABLED: not a boolean".into());
            return Vec::new();
        }
        _ => return Vec::new(),
    }
    let (protocol, from) = match get("TRACING_EXPORTER_PROTOCOL") {
        None => ("http", "TRACING_ENABLED"),
        Some(p) => match p.to_ascii_lowercase().as_str() {
            "http" => ("http", "TRACING_EXPORTER_PROTOCOL"),
            "grpc" => ("grpc", "TRACING_EXPORTER_PROTOCOL"),
            _ => {
                t.refused.push(format!(
                    "TRACING_EXPORTER_PROTOCOL={}: not http or grpc",
                    crate::support::text::elide(p, 32)
                ));
                return Vec::new();
            }
        },
    };
    alias(t, "SHARDGATE_OTLP_PROTOCOL", from, protocol.into());
    let endpoint_set = [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .into_iter()
    .any(|v| get(v).is_some());
    if !endpoint_set {
        let default = if protocol == "http" {
            "http://localhost:4318"
        } else {
            "http://localhost:4317"
        };
        alias(
            t,
            "SHARDGATE_OTLP_ENDPOINT",
            "TRACING_ENABLED",
            default.into(),
        );
    }
    let name = get("TRACING_SERVICE_NAME").unwrap_or(UPSTREAM_TRACING_SERVICE_NAME);
    alias(t, "OTEL_SERVICE_NAME", "TRACING_SERVICE_NAME", name.into());
    let attributes: Vec<String> = [
        ("TRACING_SERVICE_NAMESPACE", "service.namespace"),
        ("TRACING_SERVICE_INSTANCE_ID", "service.instance.id"),
    ]
    .into_iter()
    .filter_map(|(var, key)| get(var).map(|v| format!("{key}={}", percent_encode(v))))
    .collect();
    if !attributes.is_empty() {
        alias(
            t,
            "OTEL_RESOURCE_ATTRIBUTES",
            "TRACING_SERVICE_NAMESPACE",
            attributes.join(","),
        );
    }
    if let Some(rate) = get("TRACING_SAMPLING_RATE") {
        match rate.parse::<f64>() {
            Ok(r) if (0.0..1.0).contains(&r) => {
                alias(
                    t,
                    "OTEL_TRACES_SAMPLER",
                    "TRACING_SAMPLING_RATE",
                    "parentbased_traceidratio".into(),
                );
                alias(
                    t,
                    "OTEL_TRACES_SAMPLER_ARG",
                    "TRACING_SAMPLING_RATE",
                    r.to_string(),
                );
            }
            // Every trace: the SDK's default sampler.
            Ok(1.0) => {}
            _ => t.refused.push(format!(
                "TRACING_SAMPLING_RATE={}: not a number from 0 to 1",
                crate::support::text::elide(rate, 32)
            )),
        }
    }
    vec![
        "TRACING_ENABLED",
        "TRACING_EXPORTER_PROTOCOL",
        "TRACING_SERVICE_NAME",
        "TRACING_SERVICE_NAMESPACE",
        "TRACING_SERVICE_INSTANCE_ID",
        "TRACING_SAMPLING_RATE",
    ]
}

/// A resource attribute value as `OTEL_RESOURCE_ATTRIBUTES` carries it: `,`, `=` and `%`
/// (and anything not printable ASCII) percent-encoded.
fn percent_encode(v: &str) -> String {
    const RESERVED: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS
        .add(b',')
        .add(b'=')
        .add(b'%')
        .add(b' ');
    percent_encoding::utf8_percent_encode(v, RESERVED).to_string()
}

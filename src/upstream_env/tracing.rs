//! upstream's tracing settings (`TRACING_*`), read as our OTLP export's and the
//! OpenTelemetry SDK's own variables.

use std::collections::BTreeMap;

use super::go_values::go_bool;
use super::Translation;

/// upstream's service name for its spans (`TRACING_SERVICE_NAME`'s default).
const UPSTREAM_TRACING_SERVICE_NAME: &str = "RateLimit";

/// Tracing as upstream does it: with `TRACING_ENABLED=true`, spans over OTLP by
/// `TRACING_EXPORTER_PROTOCOL` (`http`, upstream's default, or `grpc`) to the SDK's
/// `OTEL_EXPORTER_OTLP_ENDPOINT` (else the SDK's default collector on localhost), named
/// by `TRACING_SERVICE_NAME` (`RateLimit`), `_NAMESPACE` and `_INSTANCE_ID`, sampled at
/// `TRACING_SAMPLING_RATE` (the caller's sampled flag followed, as the SDK's parent-based
/// samplers do). Returns the upstream names read.
pub(super) fn tracing(env: &BTreeMap<String, String>, t: &mut Translation) -> Vec<&'static str> {
    match non_empty(env, "TRACING_ENABLED").map(go_bool) {
        Some(Some(true)) => {}
        Some(None) => {
            t.refused.push("TRACING_ENABLED: not a boolean".into());
            return Vec::new();
        }
        _ => return Vec::new(),
    }
    let Some(protocol) = export_protocol(env, t) else {
        return Vec::new();
    };
    collector(env, t, protocol);
    service(env, t);
    sampling(env, t);
    vec![
        "TRACING_ENABLED",
        "TRACING_EXPORTER_PROTOCOL",
        "TRACING_SERVICE_NAME",
        "TRACING_SERVICE_NAMESPACE",
        "TRACING_SERVICE_INSTANCE_ID",
        "TRACING_SAMPLING_RATE",
    ]
}

/// `name`'s value, unless unset or empty (upstream reads an empty one as unset).
fn non_empty<'a>(env: &'a BTreeMap<String, String>, name: &str) -> Option<&'a str> {
    env.get(name).map(String::as_str).filter(|v| !v.is_empty())
}

/// `TRACING_EXPORTER_PROTOCOL` (`http` unless set) as the export's protocol; `None` when
/// it is neither (refused).
fn export_protocol(env: &BTreeMap<String, String>, t: &mut Translation) -> Option<&'static str> {
    let (protocol, from) = match non_empty(env, "TRACING_EXPORTER_PROTOCOL") {
        None => ("http", "TRACING_ENABLED"),
        Some(p) => match p.to_ascii_lowercase().as_str() {
            "http" => ("http", "TRACING_EXPORTER_PROTOCOL"),
            "grpc" => ("grpc", "TRACING_EXPORTER_PROTOCOL"),
            _ => {
                t.refused.push(format!(
                    "TRACING_EXPORTER_PROTOCOL={}: not http or grpc",
                    crate::support::text::elide(p, 32)
                ));
                return None;
            }
        },
    };
    t.alias(env, "SHARDGATE_OTLP_PROTOCOL", from, protocol.into());
    Some(protocol)
}

/// Without the SDK's endpoint variables, the SDK's default collector for `protocol`.
fn collector(env: &BTreeMap<String, String>, t: &mut Translation, protocol: &str) {
    let endpoint_set = [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .into_iter()
    .any(|v| non_empty(env, v).is_some());
    if !endpoint_set {
        let default = if protocol == "http" {
            "http://localhost:4318"
        } else {
            "http://localhost:4317"
        };
        t.alias(
            env,
            "SHARDGATE_OTLP_ENDPOINT",
            "TRACING_ENABLED",
            default.into(),
        );
    }
}

/// The spans' service: `TRACING_SERVICE_NAME` (upstream's name unless set), and its
/// namespace and instance as resource attributes.
fn service(env: &BTreeMap<String, String>, t: &mut Translation) {
    let name = non_empty(env, "TRACING_SERVICE_NAME").unwrap_or(UPSTREAM_TRACING_SERVICE_NAME);
    t.alias(
        env,
        "OTEL_SERVICE_NAME",
        "TRACING_SERVICE_NAME",
        name.into(),
    );
    let attributes: Vec<String> = [
        ("TRACING_SERVICE_NAMESPACE", "service.namespace"),
        ("TRACING_SERVICE_INSTANCE_ID", "service.instance.id"),
    ]
    .into_iter()
    .filter_map(|(var, key)| non_empty(env, var).map(|v| format!("{key}={}", percent_encode(v))))
    .collect();
    if !attributes.is_empty() {
        t.alias(
            env,
            "OTEL_RESOURCE_ATTRIBUTES",
            "TRACING_SERVICE_NAMESPACE",
            attributes.join(","),
        );
    }
}

/// `TRACING_SAMPLING_RATE` as the SDK's parent-based ratio sampler (1: its default).
fn sampling(env: &BTreeMap<String, String>, t: &mut Translation) {
    let Some(rate) = non_empty(env, "TRACING_SAMPLING_RATE") else {
        return;
    };
    match rate.parse::<f64>() {
        Ok(r) if (0.0..1.0).contains(&r) => {
            t.alias(
                env,
                "OTEL_TRACES_SAMPLER",
                "TRACING_SAMPLING_RATE",
                "parentbased_traceidratio".into(),
            );
            t.alias(
                env,
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

#[cfg(test)]
mod tests {
    use super::super::test_env::{env, set};
    use super::super::translate;

    #[test]
    fn tracing_is_exported_as_upstream_would_export_it() {
        // Envoy Gateway's tracing variables.
        let t = translate(&env(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
            ("TRACING_SERVICE_INSTANCE_ID", "pod 1"),
            ("TRACING_SAMPLING_RATE", "0.25"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        ]));
        assert_eq!(
            set(&t),
            vec![
                ("SHARDGATE_OTLP_PROTOCOL", "http"),
                ("OTEL_SERVICE_NAME", "envoy-ratelimit"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "service.namespace=envoy-gateway-system,service.instance.id=pod%201"
                ),
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ]
        );
        assert!(t.ignored.is_empty() && t.refused.is_empty(), "{t:?}");

        // No endpoint: the SDK's default collector for the protocol, upstream's name.
        let t = translate(&env(&[
            ("TRACING_ENABLED", "1"),
            ("TRACING_EXPORTER_PROTOCOL", "GRPC"),
            ("TRACING_SAMPLING_RATE", "1"),
        ]));
        assert_eq!(
            set(&t),
            vec![
                ("SHARDGATE_OTLP_PROTOCOL", "grpc"),
                ("SHARDGATE_OTLP_ENDPOINT", "http://localhost:4317"),
                ("OTEL_SERVICE_NAME", "RateLimit"),
            ]
        );

        // Off: the TRACING_* names are only reported as ignored.
        let t = translate(&env(&[
            ("TRACING_ENABLED", "false"),
            ("TRACING_SERVICE_NAME", "x"),
        ]));
        assert!(t.set.is_empty() && t.ignored.len() == 2, "{t:?}");

        for (bad, named) in [
            (
                ("TRACING_EXPORTER_PROTOCOL", "thrift"),
                "TRACING_EXPORTER_PROTOCOL=thrift",
            ),
            (
                ("TRACING_SAMPLING_RATE", "1.5"),
                "TRACING_SAMPLING_RATE=1.5",
            ),
            (
                ("TRACING_SAMPLING_RATE", "NaN"),
                "TRACING_SAMPLING_RATE=NaN",
            ),
        ] {
            let t = translate(&env(&[("TRACING_ENABLED", "true"), bad]));
            assert_eq!(t.refused.len(), 1, "{t:?}");
            assert!(t.refused[0].contains(named), "{named}: {:?}", t.refused);
        }
    }
}

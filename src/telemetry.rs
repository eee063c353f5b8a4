//! OpenTelemetry export of the `decision` spans (`serve --otlp-endpoint`, feature `otel`):
//! the OTLP exporter — over gRPC (on the tonic the server already runs) or over HTTP
//! (protobuf bodies, envoyproxy/ratelimit's default) — the batch span processor, the resource (`service.name`), and the `tracing` layer that hands the
//! exporter the `decision` spans and nothing else.
//!
//! It owns the tracer provider from start to the final flush. It does not decide what a
//! span carries (`service/decision/`), does not read the caller's trace context
//! (`server/trace_context.rs`), and sets up no logging: the command line composes the
//! layer with its own.
//!
//! The variables the OpenTelemetry SDK reads itself keep their meaning:
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT` (when no
//! `--otlp-endpoint` is given), `OTEL_EXPORTER_OTLP_TIMEOUT`, `_HEADERS`, `_COMPRESSION`,
//! `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`,
//! and `OTEL_EXPORTER_OTLP_PROTOCOL` (read here: the SDK leaves the transport to the code).

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::Key;
use opentelemetry_otlp::{ExporterBuildError, Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::resource::{EnvResourceDetector, ResourceDetector};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use thiserror::Error;
use tracing::{Level, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Where the `decision` spans are made: the only spans (and, inside them, the only
/// events) the export sees.
pub const DECISION_TARGET: &str = "shardgate::service::decision";

/// The `service.name` of the exported spans unless `OTEL_SERVICE_NAME` or
/// `OTEL_RESOURCE_ATTRIBUTES` names one.
pub const SERVICE_NAME: &str = "shardgate";

/// How long the exit waits for the last batch to be sent.
pub const FLUSH_PATIENCE: Duration = Duration::from_secs(5);

/// The SDK's endpoint variables, the traces' own first.
const ENDPOINT_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// The SDK's protocol variables, the traces' own first.
const PROTOCOL_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
];

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/gRPC, to a receiver's gRPC port (4317 by default).
    Grpc,
    /// OTLP/HTTP with protobuf bodies, `POST <endpoint>/v1/traces` (port 4318 by default).
    Http,
}

impl OtlpProtocol {
    /// The protocol the standard variables name (`grpc`, `http/protobuf`), the traces' own
    /// first; `None` when neither is set. `env` reads a variable.
    pub fn from_env(env: impl Fn(&str) -> Option<String>) -> Result<Option<OtlpProtocol>, String> {
        for name in PROTOCOL_VARIABLES {
            match env(name).as_deref().map(str::trim) {
                None | Some("") => continue,
                Some("grpc") => return Ok(Some(OtlpProtocol::Grpc)),
                Some("http/protobuf") => return Ok(Some(OtlpProtocol::Http)),
                Some(other) => {
                    return Err(format!(
                        "{name}={}: shardgate sends grpc or http/protobuf",
                        crate::support::text::elide(other, 32)
                    ))
                }
            }
        }
        Ok(None)
    }
}

/// The URL spans are posted to over HTTP for an endpoint given as a flag: a collector's
/// base URL (`http://collector:4318`) gets OTLP's `/v1/traces`, as the SDK's
/// `OTEL_EXPORTER_OTLP_ENDPOINT` does; a URL with a path of its own is used as it is.
pub fn http_traces_url(endpoint: &str) -> String {
    let after_scheme = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest);
    match after_scheme.find('/') {
        Some(i) if after_scheme[i..] != *"/" => endpoint.to_string(),
        _ => format!("{}/v1/traces", endpoint.trim_end_matches('/')),
    }
}

#[derive(Debug, Error)]
pub enum ExportError {
    #[error("cannot set up the OTLP span exporter: {0}")]
    Build(#[from] ExporterBuildError),
}

/// Whether spans are exported: `--otlp-endpoint` is given, or one of the SDK's endpoint
/// variables is set (as users of OpenTelemetry expect: setting the endpoint is what turns
/// an exporter on), and `OTEL_SDK_DISABLED` is not `true` (the specification's switch,
/// which the Rust SDK does not read itself). `env` reads a variable.
pub fn wanted(endpoint: Option<&str>, env: impl Fn(&str) -> Option<String>) -> bool {
    let set = |name: &str| env(name).is_some_and(|v| !v.trim().is_empty());
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
    !disabled
        && (endpoint.is_some_and(|e| !e.is_empty()) || ENDPOINT_VARIABLES.into_iter().any(set))
}

/// A running export: spans are batched and sent in the SDK's own thread.
pub struct SpanExport {
    provider: SdkTracerProvider,
}

impl SpanExport {
    /// Builds the exporter to `endpoint` (`None`: the SDK's variables, else its default
    /// `http://localhost:4317`). Must run inside a tokio runtime: the tonic channel spawns
    /// its connection task there when it is built, and that runtime must outlive the
    /// export. Nothing is sent until the first batch: an unreachable collector is not an
    /// error here, only a warning in the log each time a batch fails.
    pub fn start(
        endpoint: Option<&str>,
        protocol: OtlpProtocol,
    ) -> Result<SpanExport, ExportError> {
        let endpoint = endpoint.filter(|e| !e.is_empty());
        let exporter = match protocol {
            OtlpProtocol::Grpc => {
                let mut exporter = SpanExporter::builder().with_tonic();
                if let Some(endpoint) = endpoint {
                    exporter = exporter.with_endpoint(endpoint);
                }
                exporter.build()?
            }
            OtlpProtocol::Http => {
                let mut exporter = SpanExporter::builder()
                    .with_http()
                    .with_protocol(Protocol::HttpBinary);
                if let Some(endpoint) = endpoint {
                    exporter = exporter.with_endpoint(http_traces_url(endpoint));
                }
                exporter.build()?
            }
        };
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource())
            .build();
        Ok(SpanExport { provider })
    }

    /// The layer exporting the `decision` spans. Its filter is its own (a per-layer
    /// filter): the spans are enabled for it whatever the log level, while debug logging
    /// stays off everywhere else.
    pub fn layer<S>(&self) -> impl Layer<S> + 'static
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("shardgate"))
            // Every decision span has the same file, line and target, and the thread
            // that happened to poll it says nothing: attributes without information.
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_filter(Targets::new().with_target(DECISION_TARGET, Level::DEBUG))
    }

    /// Sends what is still batched and stops the exporter; waits for that export at most
    /// [`FLUSH_PATIENCE`] (a Collector that does not answer must not hold the exit up
    /// for long). Call it after the last call has
    /// been answered, on a thread that is not one of the runtime's workers, while the
    /// runtime still runs: the batch thread sends through the runtime's connection, and
    /// blocking a worker could leave no thread to drive it.
    pub fn shutdown(self) {
        match self.provider.shutdown_with_timeout(FLUSH_PATIENCE) {
            Ok(()) => tracing::info!("span export flushed and stopped"),
            Err(e) => tracing::warn!(error = %e, "spans not all exported at shutdown"),
        }
    }
}

/// The SDK's resource (its `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES`, the
/// `telemetry.sdk.*` attributes), named shardgate when neither variable names the
/// service: the SDK would say `unknown_service:shardgate`.
fn resource() -> Resource {
    let builder = Resource::builder();
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|s| !s.is_empty())
        || EnvResourceDetector::new()
            .detect()
            .get(&Key::from_static_str("service.name"))
            .is_some();
    if named {
        builder.build()
    } else {
        builder.with_service_name(SERVICE_NAME).build()
    }
}

#[cfg(test)]
mod tests {
    use super::{http_traces_url, wanted, OtlpProtocol};

    #[test]
    fn the_protocol_comes_from_the_sdk_variables_traces_first() {
        assert_eq!(OtlpProtocol::from_env(env(&[])), Ok(None));
        let http = [("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")];
        assert_eq!(
            OtlpProtocol::from_env(env(&http)),
            Ok(Some(OtlpProtocol::Http))
        );
        let both = [
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"),
        ];
        assert_eq!(
            OtlpProtocol::from_env(env(&both)),
            Ok(Some(OtlpProtocol::Grpc))
        );
        let json = [("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")];
        let e = OtlpProtocol::from_env(env(&json)).unwrap_err();
        assert!(e.contains("OTEL_EXPORTER_OTLP_PROTOCOL=http/json"), "{e}");
    }

    #[test]
    fn an_http_endpoint_without_a_path_gets_otlps_traces_path() {
        for (given, used) in [
            ("http://collector:4318", "http://collector:4318/v1/traces"),
            ("http://collector:4318/", "http://collector:4318/v1/traces"),
            ("http://gw/otlp/v1/traces", "http://gw/otlp/v1/traces"),
        ] {
            assert_eq!(http_traces_url(given), used);
        }
    }

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn export_is_wanted_for_the_flag_or_the_sdk_endpoint_variables() {
        let url = Some("http://127.0.0.1:4317");
        assert!(!wanted(None, env(&[])));
        assert!(!wanted(Some(""), env(&[])));
        assert!(wanted(url, env(&[])));
        for var in [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        ] {
            assert!(
                wanted(None, env(&[(var, "http://collector:4317")])),
                "{var}"
            );
            assert!(!wanted(None, env(&[(var, " ")])), "{var} blank");
        }
        assert!(!wanted(url, env(&[("OTEL_SDK_DISABLED", "TRUE")])));
        assert!(wanted(url, env(&[("OTEL_SDK_DISABLED", "false")])));
    }
}

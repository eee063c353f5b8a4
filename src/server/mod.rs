//! The transport: the listeners and the bytes on them. Envoy's gRPC rate-limit API over
//! HTTP/2 (`rls`, read by `framing`, answered in `unary_response`) with health and
//! reflection (`grpc`, held to their deadline and their connection's close in `others`),
//! every call fenced against a panic (`panics`), a request that is not gRPC refused
//! (`content_type`), TLS (`tls`), accepting connections (`accept`, `socket`) and
//! serving each in one task with its calls (`connection`),
//! the port's HTTP/2 limits (`port_limits`), the caller's trace context
//! (`trace_context`), the HTTP port (`http`, with `/json` in `json`, a rule's
//! limit in words in `rule_text`, the operator's page in `ui` with its charts in
//! `ui_chart`), and putting a
//! server together (`serve`); the statsd socket and its flush timer (`statsd`);
//! envoyproxy/ratelimit's Prometheus port (`upstream_prometheus`); the xDS stream that
//! brings rules from a control plane (`xds`); the Rate Limit Quota Service's streams
//! (`rlqs`).
//!
//! It decides nothing: every call is handed to the policy (`service/`), whose answer it
//! writes back.

mod accept;
mod connection;
mod content_type;
mod framing;
pub mod grpc;
pub mod http;
mod json;
mod others;
mod panics;
pub mod port_limits;
pub mod rlqs;
pub mod rls;
mod rule_text;
pub mod serve;
mod socket;
pub mod statsd;
pub mod tls;
#[cfg(feature = "otel")]
mod trace_context;
mod ui;
mod ui_chart;
pub mod unary_response;
pub mod upstream_prometheus;
pub mod xds;

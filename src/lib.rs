//! shardgate: an external rate-limit server for Envoy.
//!
//! The crate is laid out the way a request flows (see `docs/architecture.md`):
//! [`config`] turns YAML into an immutable, compiled snapshot and matches request
//! descriptors to rules; [`engine`] decides with pre-shard token buckets and never does
//! I/O itself; [`store`] holds bucket items behind one conditional-write contract
//! (embedded memory, DynamoDB, or Redis/Valkey); [`service`] is the rate-limit policy — what a call means
//! and what it is answered — and [`server`] the transport that carries calls to it and
//! answers back (gRPC over HTTP/2, TLS, the HTTP port).
//! `telemetry` (feature `otel`) exports the decisions' spans over OTLP.

#![forbid(unsafe_code)]

pub mod config;
pub mod engine;
pub mod server;
pub mod service;
pub mod store;
pub mod support;
#[cfg(feature = "otel")]
pub mod telemetry;
pub mod upstream_env;

//! shardgate: an external rate-limit server for Envoy.
//!
//! The crate is laid out the way a request flows (see `docs/architecture.md`):
//! [`config`] turns YAML into an immutable, compiled snapshot and matches request
//! descriptors to rules; [`engine`] decides with pre-shard token buckets and never does
//! I/O itself; [`store`] holds bucket items behind one conditional-write contract
//! (embedded memory or DynamoDB); [`service`] speaks Envoy's gRPC API and builds answers.
//! `telemetry` (feature `otel`) exports the decisions' spans over OTLP.

#![forbid(unsafe_code)]

pub mod config;
pub mod engine;
pub mod service;
pub mod store;
pub mod striped;
#[cfg(feature = "otel")]
pub mod telemetry;
pub mod text;
mod throttle;
pub mod upstream_env;

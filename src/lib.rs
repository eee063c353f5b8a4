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
// A panic on the request path ends that call (`server/panics.rs`), never the process; still
// none is written casually: an `expect` outside tests is allowed where it stands, with the
// reason it cannot fail, and `unwrap` not at all; nor an index or a slice (`v[i]`, `&s[a..]`)
// but where an `#[expect]` on the smallest item says why it is in range: the rest use
// `get`, iterators, slice patterns or checked splits. Tests unwrap and index freely.
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

pub mod config;
pub mod engine;
pub mod server;
pub mod service;
pub mod store;
pub mod support;
#[cfg(feature = "otel")]
pub mod telemetry;
pub mod upstream_env;

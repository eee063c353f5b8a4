//! The surfaces shardgate serves: Envoy's gRPC rate-limit API (with health and
//! reflection), and the answer-building rules of the envoyproxy/ratelimit contract.
//!
//! Nothing here holds bucket logic: decisions come from the engine.

mod deadline;
mod decision;
pub mod grpc;
pub mod http;
mod json;
pub mod metrics;
pub mod server;
mod socket;
pub mod tls;

pub use decision::{CallError, RateLimiter, RequestLimits};

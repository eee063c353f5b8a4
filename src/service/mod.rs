//! The surfaces shardgate serves: Envoy's gRPC rate-limit API (with health and
//! reflection), and the answer-building rules of the envoyproxy/ratelimit contract.
//!
//! Nothing here holds bucket logic: decisions come from the engine.

mod accept;
mod answer;
mod deadline;
mod decision;
mod framing;
pub mod grpc;
pub mod http;
mod json;
pub mod metrics;
pub mod port_limits;
pub mod reply;
mod request;
pub mod rls;
pub mod server;
mod socket;
mod status;
pub mod tls;
#[cfg(feature = "otel")]
mod trace_context;
mod treatment;
pub mod unary;
pub mod wire;

pub use answer::{AnswerOptions, RateLimitHeaders};
pub use decision::{CallError, RateLimiter};
pub use request::RequestLimits;

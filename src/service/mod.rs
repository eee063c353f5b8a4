//! The rate-limit policy: what one `ShouldRateLimit` call means and what it is answered,
//! as envoyproxy/ratelimit's contract has it — the request read in place
//! (`wire`) and checked (`request`), each descriptor's treatment (`treatment`),
//! the deny-list idiom answered without the store (`deny_rule`),
//! the call's deadline (`deadline`), the decision through the engine (`decision`),
//! each descriptor's status (`descriptor_status`), one descriptor explained in words (`explain`), what a deployment switches on around
//! it (`answer_options`), and the answer's protobuf bytes (`response_encoding`); and
//! the metrics a call records (`metrics`), and the values most refused and admitted per
//! rule over the last minutes (`top`).
//!
//! It owns no socket and no byte of HTTP/2: `server/` carries calls in and answers out.
//! Nothing here holds bucket logic: decisions come from the engine.

mod answer_options;
pub(crate) mod deadline;
pub(crate) mod decision;
mod deny_rule;
mod descriptor_status;
mod explain;
pub mod metrics;
mod request;
pub mod response_encoding;
pub mod rlqs;
pub mod top;
mod treatment;
pub mod wire;

pub use answer_options::{AnswerOptions, RateLimitHeaders};
pub use decision::{CallError, ConfigEvents, RateLimiter, Rejected};
pub use request::RequestLimits;

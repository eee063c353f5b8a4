//! One `ShouldRateLimit` call, end to end: validate the request (`request.rs`), decide
//! how each descriptor is handled (`treatment.rs`), hand each group's plan to the engine
//! under the call's deadline, count the hits, and build the answer (`descriptor_status.rs`). Store
//! failures are answered here, by the rules' `failure_mode`.
//!
//! This is the envoyproxy/ratelimit contract; it holds no bucket logic (that is the
//! engine's) and no transport (that is `server/`).
//!
//! `limiter.rs`: the rate limiter (its config snapshot, options, readiness) and the
//! call's entry points with its span; `call.rs`: a call's state and errors; `steps.rs`: the decision's
//! steps in call order; `events.rs`: when the rules were loaded, and the last load refused.

mod call;
mod events;
mod limiter;
mod steps;

pub use call::CallError;
pub use events::{ConfigEvents, Rejected};
pub use limiter::RateLimiter;

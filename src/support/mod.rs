//! Small tools every layer may use, with no knowledge of rate limiting: counters striped
//! per thread so the hot path never contends (`striped`), a log line at most once per
//! interval (`throttle`), text made safe and short for messages and logs (`text`), and
//! the build's version and features (`build`).
//! Nothing here uses another module of the crate.

pub mod build;
pub mod striped;
pub mod text;
pub(crate) mod throttle;

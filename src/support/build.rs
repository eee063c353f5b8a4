//! What this binary is: its version and the optional features it was built with, for the
//! start-up log line and the `shardgate_build_info` metric (an operator asks "which
//! shardgate answers here?" of both).

/// The crate's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The optional features built in, comma-separated (`none` without any).
pub const FEATURES: &str = features();

const fn features() -> &'static str {
    match (
        cfg!(feature = "dynamodb"),
        cfg!(feature = "redis"),
        cfg!(feature = "otel"),
    ) {
        (true, true, true) => "dynamodb,redis,otel",
        (true, true, false) => "dynamodb,redis",
        (true, false, true) => "dynamodb,otel",
        (true, false, false) => "dynamodb",
        (false, true, true) => "redis,otel",
        (false, true, false) => "redis",
        (false, false, true) => "otel",
        (false, false, false) => "none",
    }
}

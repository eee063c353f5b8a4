//! The errors a store reports ([`StoreError`]), which of them are the store failing (the
//! only ones a circuit breaker counts) and which are one bucket's.

use thiserror::Error;

use super::BucketKey;

use crate::support::text::quote;

/// Errors a store reports. They carry the bucket they concern where there is one (shown
/// elided: a key holds request values).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The store itself failed: a timeout, a 5xx, throttling of the whole table or account,
    /// a connection that could not be made or broke. The only kind that counts towards the
    /// circuit breaker.
    #[error("store unavailable for {}: {reason}", quote(key))]
    Unavailable { key: String, reason: String },
    /// The circuit breaker failed the call without trying the store (it failed
    /// repeatedly; a probe will try again shortly).
    #[error(
        "store unavailable for {}: circuit open after repeated failures, probing again shortly",
        quote(key)
    )]
    CircuitOpen { key: String },
    #[error("corrupt bucket item {}: {reason}", quote(key))]
    Corrupt { key: String, reason: String },
    /// The store refused this request's key or item (too long, too large, malformed): the
    /// request's own error, never the store's.
    #[error("invalid store request for {}: {reason}", quote(key))]
    Invalid { key: String, reason: String },
    /// A write kept losing to concurrent transactions on its item: the bucket is busy,
    /// the store is not failing.
    #[error(
        "contention on {}: the item is busy with concurrent transactions",
        quote(key)
    )]
    Contention { key: String },
    /// The store refused a call for the rate of requests on this item's partition (a hot
    /// bucket): the bucket's own contention, answered for that bucket alone, never an
    /// outage for every tenant. The key is the engine's, so the answer names the bucket
    /// even when the call carried several.
    #[error(
        "throttled on {}: its partition takes more requests than it absorbs",
        quote(&key.to_string())
    )]
    Throttled { key: BucketKey },
    /// The call was not sent: too many calls whose callers gave up are still running
    /// (`detached.rs`), a sign that the store answers slower than callers wait.
    #[error(
        "store call for {} not sent: {abandoned} calls whose callers gave up are still running",
        quote(key)
    )]
    Shed { key: String, abandoned: usize },
}

impl StoreError {
    /// Whether the store itself failed (what a circuit breaker counts). A refusal of one
    /// request's key, a corrupt item, contention or throttling on one bucket is not an
    /// outage; a call never sent (shed) proves nothing either way.
    pub fn is_fault(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }

    /// The error's class, as the store-call metrics label it.
    pub fn class(&self) -> &'static str {
        match self {
            StoreError::Unavailable { .. } => "error",
            StoreError::CircuitOpen { .. } => "circuit_open",
            StoreError::Corrupt { .. } => "corrupt",
            StoreError::Invalid { .. } => "invalid",
            StoreError::Contention { .. } => "contention",
            StoreError::Throttled { .. } => "throttled",
            StoreError::Shed { .. } => "shed",
        }
    }
}

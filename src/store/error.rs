//! The errors a store reports ([`StoreError`]), which of them are the store failing (the
//! only ones a circuit breaker counts) and which are one bucket's.

use std::error::Error as StdError;
use std::fmt;

use thiserror::Error;

use super::BucketKey;

use crate::support::text::{elide, quote};

/// Errors a store reports. They carry the bucket they concern where there is one (shown
/// elided: a key holds request values).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The store itself failed: a timeout, a 5xx, throttling of the whole table or account,
    /// a connection that could not be made or broke. The only kind that counts towards the
    /// circuit breaker.
    #[error("store unavailable for {}: {reason}", quote(key))]
    Unavailable {
        key: String,
        reason: String,
        /// What the client library reported, with its own causes (a connector error, the
        /// I/O error under it), for the logs: `reason` is the short text callers get.
        source: Option<Cause>,
    },
    /// The circuit breaker failed the call without trying the store (it failed
    /// repeatedly; a probe will try again shortly).
    #[error(
        "store unavailable for {}: circuit open after repeated failures, probing again shortly",
        quote(key)
    )]
    CircuitOpen { key: String },
    #[error("corrupt bucket item {}: {reason}", quote(key))]
    Corrupt {
        key: String,
        reason: String,
        source: Option<Cause>,
    },
    /// The store refused this request's key or item (too long, too large, malformed): the
    /// request's own error, never the store's.
    #[error("invalid store request for {}: {reason}", quote(key))]
    Invalid {
        key: String,
        reason: String,
        source: Option<Cause>,
    },
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

/// Most levels of a cause chain kept, and most bytes of each level's text.
const CAUSE_LEVELS: usize = 8;
const CAUSE_BYTES: usize = 256;

/// The chain of causes a client library reported, kept as text, level by level: a
/// [`StoreError`] stays `Clone` and comparable (two errors that say the same are the same)
/// while `source()` still walks to the root cause, as a logger expects. Boxed: a store
/// error is returned on every failed call and must stay small.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause(Box<Level>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Level {
    text: String,
    next: Option<Cause>,
}

impl Cause {
    /// `err` and its sources, each level's text elided, at most [`CAUSE_LEVELS`] deep.
    pub fn of(err: &(dyn StdError + 'static)) -> Cause {
        let mut texts: Vec<String> = Vec::new();
        let mut at = Some(err);
        while let Some(e) = at {
            if texts.len() == CAUSE_LEVELS {
                break;
            }
            texts.push(elide(&e.to_string(), CAUSE_BYTES).into_owned());
            at = e.source();
        }
        let mut chain: Option<Cause> = None;
        for text in texts.into_iter().rev() {
            chain = Some(Cause(Box::new(Level { text, next: chain })));
        }
        chain.unwrap_or_else(|| {
            Cause(Box::new(Level {
                text: String::new(),
                next: None,
            }))
        })
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.text)
    }
}

impl StdError for Cause {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.0.next.as_ref().map(|c| c as &(dyn StdError + 'static))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::support::text::with_causes;

    /// Each level's text, from `err` down to its root cause.
    fn chain(err: &(dyn StdError + 'static)) -> Vec<String> {
        let mut texts = Vec::new();
        let mut at = Some(err);
        while let Some(e) = at {
            texts.push(e.to_string());
            at = e.source();
        }
        texts
    }

    #[test]
    fn an_unavailable_store_keeps_the_io_error_under_its_reason() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let wrapped = std::io::Error::other(io);
        let e = StoreError::Unavailable {
            key: "k".into(),
            reason: "dispatch failure".into(),
            source: Some(Cause::of(&wrapped)),
        };
        assert_eq!(e.to_string(), "store unavailable for k: dispatch failure");
        assert_eq!(
            chain(&e).last().map(String::as_str),
            Some("connection refused")
        );
        assert_eq!(
            with_causes(&e),
            "store unavailable for k: dispatch failure: connection refused"
        );
    }

    #[test]
    fn a_cause_chain_is_bounded() {
        #[derive(Debug)]
        struct Deep(usize);
        impl fmt::Display for Deep {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "level {}", self.0)
            }
        }
        impl StdError for Deep {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                // Every level claims a source: an endless chain.
                Some(Box::leak(Box::new(Deep(self.0 + 1))))
            }
        }
        let cause = Cause::of(&Deep(0));
        assert_eq!(chain(&cause).len(), CAUSE_LEVELS);
    }
}

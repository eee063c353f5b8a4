//! A call as it goes and how it can fail: the errors a call answers with, the
//! store failure behind `failure_mode`, the call's state (deadline, first failure), its
//! span's rule list, and the debug line each decision is logged with. No decision is
//! made here.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use thiserror::Error;
use tokio::time::Instant;

use crate::engine::EngineError;
use crate::service::response_encoding::{Reply, StatusLine};
use crate::service::treatment::Treatment;
use crate::service::wire::RequestView;
use crate::store::StoreError;

/// Why a call was not answered with statuses.
#[derive(Debug, Error)]
pub enum CallError {
    /// The request is malformed; the message names the field.
    #[error("{0}")]
    InvalidArgument(String),
    /// The store failed and the rules involved fail closed.
    #[error("rate-limit store unavailable: {0}")]
    Unavailable(#[source] StoreFailure),
}

/// How the store failed a call.
#[derive(Debug, Error)]
pub enum StoreFailure {
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The store did not answer by the call's deadline (see `deadline.rs`).
    #[error("no answer from the store within the call's deadline")]
    Deadline,
}

impl StoreFailure {
    /// The metric label of the failure's cause.
    pub(super) fn cause(&self) -> &'static str {
        match self {
            StoreFailure::Engine(EngineError::Store {
                source: StoreError::CircuitOpen { .. },
                ..
            }) => "circuit_open",
            StoreFailure::Engine(EngineError::Store {
                source: StoreError::Shed { .. },
                ..
            }) => "shed",
            StoreFailure::Engine(_) => "store",
            StoreFailure::Deadline => "deadline",
        }
    }
}

/// One call as it goes: its deadline, and what its span reports at the end.
pub(super) struct CallState {
    pub(super) deadline: Instant,
    /// The cause of the first store failure (`StoreFailure::cause`), answered by
    /// `failure_mode`.
    pub(super) failure: OnceLock<&'static str>,
    pub(super) unknown_domain: AtomicBool,
}

impl CallState {
    pub(super) fn new(deadline: Instant) -> CallState {
        CallState {
            deadline,
            failure: OnceLock::new(),
            unknown_domain: AtomicBool::new(false),
        }
    }

    /// The span's `outcome`: the answer's code, or the gRPC status of a failed call.
    pub(super) fn outcome(&self, result: &Result<Reply, CallError>) -> &'static str {
        match result {
            Ok(_) if self.unknown_domain.load(Ordering::Relaxed) => "UNKNOWN_DOMAIN",
            Ok(r) if r.overall() == Code::OverLimit => "OVER_LIMIT",
            Ok(_) => "OK",
            Err(CallError::InvalidArgument(_)) => "INVALID_ARGUMENT",
            Err(CallError::Unavailable(_)) => "UNAVAILABLE",
        }
    }
}

/// The span's `rules`: each descriptor's rule stats key, in request order, `-` for one no
/// rule matched (or replaced) and `unlimited` for an unlimited rule's. Written straight
/// into the subscriber's buffer, only when the span is enabled.
pub(super) struct RuleKeys<'a>(pub(super) &'a [Treatment<'a>]);

impl std::fmt::Display for RuleKeys<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, t) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match t {
                Treatment::Limited { rule, .. } => f.write_str(&rule.stats_key)?,
                Treatment::Free { unlimited: true } => f.write_str("unlimited")?,
                Treatment::Free { unlimited: false } => f.write_str("-")?,
            }
        }
        Ok(())
    }
}

/// The longest a descriptor value is quoted in the decision's debug line.
const LOGGED_VALUE_BYTES: usize = 32;

/// Logs one decision at debug: the domain, each descriptor's entries (values cut short),
/// the rule each matched, what its limit has left and the answer — what an operator reads
/// to tell who is limited (upstream's debug log names each descriptor and its count).
/// Nothing is formatted unless debug is on for this target.
pub(super) fn log_decision(
    req: &RequestView<'_>,
    treatments: &[Treatment<'_>],
    statuses: &[StatusLine<'_>],
    answer: Code,
) {
    tracing::debug!(
        target: "shardgate::service::decision",
        domain = %crate::support::text::elide(req.domain, 64),
        descriptors = %Entries(req),
        rules = %RuleKeys(treatments),
        remaining = %Remaining(statuses),
        answer = answer.as_str_name(),
        "decision"
    );
}

/// The request's descriptors as `[key=value, …]`, values cut short.
struct Entries<'a, 'r>(&'a RequestView<'r>);

impl std::fmt::Display for Entries<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, d) in self.0.descriptors().enumerate() {
            f.write_str(if i > 0 { ", [" } else { "[" })?;
            for (j, e) in d.entries.iter().enumerate() {
                if j > 0 {
                    f.write_str(", ")?;
                }
                let key = crate::support::text::elide(e.key, LOGGED_VALUE_BYTES);
                let value = crate::support::text::elide(e.value, LOGGED_VALUE_BYTES);
                write!(f, "{key}={value}")?;
            }
            f.write_str("]")?;
        }
        Ok(())
    }
}

/// What each descriptor's limit has left, in request order: `-` for one with no limit.
struct Remaining<'a, 'l>(&'a [StatusLine<'l>]);

impl std::fmt::Display for Remaining<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match s.limit {
                Some(_) => write!(f, "{}", s.remaining)?,
                None => f.write_str("-")?,
            }
        }
        Ok(())
    }
}

//! The label sets of the metrics shardgate registers: what each family is split by.
//! Types only: `registry.rs` records into them, `collectors.rs` reads them at scrape time.

use prometheus_client::encoding::EncodeLabelSet;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct StoreLabels {
    pub(super) operation: &'static str,
    pub(super) outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OperationLabel {
    pub(super) operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct HashLabel {
    pub(super) hash: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabel {
    pub(super) reason: &'static str,
}

/// Labels of a request answered without the store: why, and how.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct FailureLabels {
    /// `store` (it failed), `deadline` (no answer in time), `circuit_open`, `shed` (not
    /// sent: too many calls whose callers gave up were still running).
    pub(super) cause: &'static str,
    /// `unavailable` (a `deny` rule: UNAVAILABLE) or `allowed` (OK, nothing counted).
    pub(super) answer: &'static str,
}

/// An HTTP/2 error code's name (`port.rs`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CodeLabel {
    pub(super) code: &'static str,
}

/// How a call that panicked was ended (`port.rs`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct EndLabel {
    pub(super) end: &'static str,
}

/// The kind of an RLQS assignment sent (`rlqs.rs`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KindLabel {
    pub(super) kind: &'static str,
}

/// What Envoy did with the requests it reported over RLQS (`rlqs.rs`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct VerdictLabel {
    pub(super) verdict: &'static str,
}

/// How an RLQS fleet draw came out (`rlqs.rs`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct DrawLabel {
    pub(super) outcome: &'static str,
}

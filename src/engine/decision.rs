//! What the engine answers: a [`Decision`] (admitted or not) with each bucket's
//! [`BucketOutcome`] and each limit's [`LimitOutcome`] — what the policy turns into
//! statuses and headers, and what a refund or a lease needs to give tokens back. Data
//! only.

use smallvec::SmallVec;

use super::ShardShare;
use crate::store::Stamp;

/// How one limit came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitOutcome {
    /// The limit covered its amount (for a forced claim: before the debit).
    pub fits: bool,
    /// Millitokens left on the shard after this request (refilled to now; not debited when
    /// the request was refused).
    pub remaining: i64,
    /// The shard's share of the limit.
    pub share: ShardShare,
    /// Undivided refill amount (the fallback rate for a share that floors to zero).
    pub refill_amount: i64,
    /// Milliseconds until the claimed amount fits (`Some(0)` if it fits, `None` if never:
    /// the per-shard request ceiling or a limit that does not refill).
    pub wait_ms: Option<i64>,
}

/// How one bucket came out: the shard that answered and its limits, in claim order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketOutcome {
    pub shard: u32,
    pub shard_count: u32,
    /// The shard's item as this request left it, for a refund (see `BucketStore::credit`).
    pub stamp: Stamp,
    pub limits: SmallVec<[LimitOutcome; 2]>,
    /// Answered from a lease of this process: a refund goes back to the lease.
    pub from_lease: bool,
}

/// The engine's answer to an [`Acquire`](super::Acquire).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// Every gated claim was debited (and nothing otherwise).
    pub admitted: bool,
    /// Per bucket, in request order.
    pub buckets: SmallVec<[BucketOutcome; 2]>,
}

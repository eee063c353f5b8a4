//! What the book holds of one bucket, read for an operator (`explain`): whether it is
//! tracked, the rate measured on it, and the leases held. Read only: it changes no entry
//! and counts no request.

use super::entry::Entry;
use crate::store::Name;

/// One bucket as this process's lease book sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketLeases {
    /// Decisions per second from which a bucket is leased (`LeaseOptions::hot_rate`).
    pub hot_rate: u32,
    /// `None`: not tracked — asked for below the hot rate's pace (counted in the book's
    /// sketch only), or not at all, on this process.
    pub tracked: Option<TrackedBucket>,
}

/// A tracked bucket: its measured rate and the leases it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackedBucket {
    /// Decisions per second over its last full demand window on this process.
    pub rate: u32,
    /// A fetch wanted or under way.
    pub fetching: bool,
    /// Leases live now, per shard and limit.
    pub held: Vec<HeldTokens>,
}

/// Tokens of one limit held in a live lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldTokens {
    pub shard: u32,
    pub limit: Name,
    /// Millitokens not used yet.
    pub rest: i64,
    /// Millitokens of the last grant.
    pub granted: i64,
    /// Until the rest goes back.
    pub expires_in_ms: i64,
}

/// What `e` holds and measures at `now`.
pub(super) fn tracked(e: &Entry, now: i64) -> TrackedBucket {
    TrackedBucket {
        rate: e.rate,
        fetching: e.fetching,
        held: e
            .leases
            .iter()
            .filter(|l| now < l.expires_ms)
            .flat_map(|l| {
                l.limits.iter().map(|h| HeldTokens {
                    shard: l.shard,
                    limit: h.limit.clone(),
                    rest: h.rest,
                    granted: h.granted,
                    expires_in_ms: l.expires_ms - now,
                })
            })
            .collect(),
    }
}

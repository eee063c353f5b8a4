//! What goes in and out of the lease book: the leases wanted ([`Want`], per limit
//! [`WantedLimit`]), the rests to give back ([`Return`]), the book's answer to a request
//! ([`Served`]) and a move under way a request may wait for ([`Landing`]). Types only;
//! the keeping is `mod.rs`.

use smallvec::SmallVec;
use tokio::sync::watch;

use super::super::size::Demand;
use crate::engine::{Decision, LimitClaim};
use crate::store::{BucketKey, LimitParams, Name};

/// One limit a lease is wanted for.
#[derive(Debug, Clone)]
pub(in crate::engine::lease) struct WantedLimit {
    /// The limit, its parameters and the amount of the last request.
    pub claim: LimitClaim,
    pub demand: Demand,
    /// What the store last said the shard holds (`None`: not known yet).
    pub available: Option<i64>,
}

/// A bucket that wants a lease: what a fetch sizes and asks for.
#[derive(Debug, Clone)]
pub(in crate::engine::lease) struct Want {
    /// The bucket (shard 0 stands for all of them).
    pub bucket: BucketKey,
    pub limits: SmallVec<[WantedLimit; 2]>,
}

/// The unused rest of a lease, to be credited back to its shard.
#[derive(Debug, Clone)]
pub(in crate::engine::lease) struct Return {
    pub key: BucketKey,
    pub shard_count: u32,
    /// Per limit: name, parameters, millitokens.
    pub rest: SmallVec<[(Name, LimitParams, i64); 2]>,
}

/// What the book answers a request.
// The decision is returned by value, as the engine returns it: boxing it would allocate
// on every request served from a lease.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(in crate::engine::lease) enum Served {
    /// Every bucket was covered: answered, nothing to do on the store.
    Answered(Decision),
    /// Not covered: these leases were short for the request and must go back to their
    /// shards before the store decides it (their tokens would otherwise be refused).
    Missed(Vec<Return>),
    /// Not covered while a lease of one of its buckets is in flight: ask again once it
    /// has landed.
    Wait(Landing),
}

/// A move of a bucket's tokens under way, which a request may wait for.
#[derive(Debug)]
pub(in crate::engine::lease) struct Landing {
    /// Changes when the move lands.
    pub landed: watch::Receiver<u64>,
    /// The store might refuse the request only because of the tokens on the move (see
    /// [`entry::Entry::tight_for`]); otherwise waiting only makes the `remaining` it reports
    /// exact.
    pub tight: bool,
}

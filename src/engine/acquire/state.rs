//! What one decision carries while it runs: the request and the engine it runs on
//! ([`Deciding`], the context every step is a method of), the shard drawn for each bucket
//! ([`Draw`]), where each bucket stands ([`Progress`]), and what a slow pass is asked to
//! plan ([`SlowTarget`]). Types only, and the one conversion every step uses (a store
//! error named for its bucket); no step lives here.

use smallvec::SmallVec;

use crate::engine::{Acquire, BucketClaim, Engine, EngineError};
use crate::store::{BucketItem, BucketStore, StoreError};

/// How long a request refused because its bucket is contended is told to wait (the
/// reference engine's contention answer).
pub const CONTENTION_RETRY_MS: i64 = 100;

/// One request being decided: the engine's parts and the request, which every step of
/// the algorithm reads. Built per call (two references), so a step's signature names only
/// what varies within the request: a bucket, a draw, an image, the time.
pub(crate) struct Deciding<'a, S: BucketStore> {
    pub(super) engine: &'a Engine<S>,
    pub(super) req: &'a Acquire,
}

impl<'a, S: BucketStore> Deciding<'a, S> {
    pub(crate) fn new(engine: &'a Engine<S>, req: &'a Acquire) -> Self {
        Deciding { engine, req }
    }
}

/// Shards of one bucket known short, not to be drawn.
pub(super) type Avoid = SmallVec<[u32; 4]>;

/// Per-bucket working state of one decision: inline for up to four buckets, as many
/// descriptors as the service keeps inline, so that a request of three or four buckets
/// does not allocate for it either.
pub(super) type PerBucket<T> = SmallVec<[T; 4]>;

/// A shard drawn for a bucket, and the shard count it was drawn under: the count its
/// balance must be sized for, whatever the count cache says later (it can be cleared).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Draw {
    pub shard: u32,
    pub count: u32,
}

/// State of one bucket while a request is being decided.
#[derive(Debug)]
pub(super) enum Progress {
    /// Not looked at yet, or its store call failed.
    Pending,
    /// Debited (by the fast path, or a retry on another shard); `image` as the debit left it.
    Applied { shard: u32, image: BucketItem },
    /// The image proves a gated claim cannot fit.
    Rejected { shard: u32, image: BucketItem },
    /// Needs the slow path on `shard`, sized for `count` shards; `seen` is the image its
    /// fast-path refusal returned (of that shard or, after a doubling, another).
    Slow {
        shard: u32,
        count: u32,
        seen: Option<(u32, BucketItem)>,
        /// The fast debit found no item on `shard`: the pass creates it without reading
        /// it first (a create racing another is refused by the store, and retried).
        absent: bool,
    },
}

/// One bucket a slow pass plans: its index in the request, the shard, the shard count
/// its plan is sized for.
#[derive(Debug, Clone, Copy)]
pub(super) struct SlowTarget<'a> {
    /// The bucket's claim in the request.
    pub claim: &'a BucketClaim,
    pub shard: u32,
    pub count: u32,
    /// Known absent (see `Progress::Slow`): not read.
    pub absent: bool,
}

/// A store error, named for the bucket whose call failed.
pub(super) fn wrap(b: &BucketClaim) -> impl Fn(StoreError) -> EngineError + '_ {
    move |source| EngineError::Store {
        entity: b.entity.to_string(),
        resource: b.resource.to_string(),
        source,
    }
}

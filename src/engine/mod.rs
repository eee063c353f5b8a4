//! The pre-shard token-bucket engine: token-bucket math, plans, and the acquire algorithm
//! (fast path, failure classification, slow path, consumption-only retry, `wcu`, shard
//! doubling, lazy shard creation, retry on another shard, cascade, rejection cache).
//!
//! The engine is written once against the [`BucketStore`](crate::store::BucketStore)
//! contract and never knows which store it runs on, nor anything about gRPC. Time comes
//! from a [`Clock`] so that tests can freeze it.
//!
//! The rooms, in the order a request meets them:
//! - what is asked and answered: `claim.rs` ([`Acquire`]), `decision.rs` ([`Decision`]),
//!   `error.rs` ([`EngineError`]); the plan that builds claims from rules, `plan.rs`;
//! - the engine and its tunables: `instance.rs` ([`Engine`]: its parts and every call
//!   it answers, the only `impl Engine`), `options.rs` ([`EngineOptions`]), `view.rs`
//!   ([`EngineView`], for metrics);
//! - the acquire algorithm, one folder read top to bottom (`acquire/mod.rs` lists it):
//!   `state.rs` holds one request's context and state, `decide.rs` drives it; its steps
//!   — `cached.rs` (the rejection cache's answer), `resolve.rs` (a refused fast debit
//!   classified: doubled, retried), `slow.rs` and `pass.rs` (read and commit),
//!   `refund.rs`, `outcome.rs` — are methods of the same context;
//! - what it keeps between requests: `shard.rs` (shard counts and draws),
//!   `rejection.rs`, `inflight.rs` (slow passes followed), `partitioned.rs` (the map
//!   they share), `lease/` (token leases), `stats.rs` (counters);
//! - the arithmetic, pure: `bucket.rs`; time: `clock.rs`.

mod acquire;
mod balances;
pub mod bucket;
mod claim;
mod clock;
mod decision;
mod error;
mod inflight;
mod instance;
mod lease;
mod options;
mod partitioned;
pub mod plan;
mod rejection;
mod shard;
mod stats;
mod view;

pub use acquire::CONTENTION_RETRY_MS;
pub use balances::{sum_shards, BucketBalances, LimitTotal};
pub use bucket::{LimitParams, ShardShare};
pub use claim::{Acquire, BucketClaim, LimitClaim};
pub use clock::{Clock, ManualClock, SystemClock};
pub use decision::{BucketOutcome, Decision, LimitOutcome};
pub use error::EngineError;
pub use instance::Engine;
pub use lease::{BucketLeases, HeldTokens, LeaseOptions, TrackedBucket};
pub use options::{
    EngineOptions, DEFAULT_PARTITION_WRITE_BUDGET, DEFAULT_REJECTION_CACHE_MS,
    UNLIMITED_PARTITION_WRITE_BUDGET,
};
pub use shard::{HotBucket, RandomDraw, ScriptedDraw, ShardDraw};
pub use stats::{Counted, EngineStats};
pub use view::EngineView;

pub use crate::store::MAX_SHARD_COUNT;

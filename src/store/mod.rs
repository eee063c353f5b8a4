//! The bucket store contract: conditional primitives shaped after DynamoDB's conditional
//! writes, so the engine's one algorithm runs unchanged on every store.
//!
//! A store keeps bucket items and applies exactly the conditions described here,
//! atomically per call — except a Redis Cluster commit whose items lie on several slots,
//! made slot by slot and undone as far as it went (`redis/spread.rs` states why no
//! interleaving admits more than the atomic commit would; `contract.rs`, `commit`). It
//! makes no limiting decision: it never refills, never chooses a
//! shard, never decides admission. This file is the table of contents: the trait is
//! `contract.rs`, what it passes `write.rs`, `credit.rs`, `error.rs` and the item format
//! `item.rs`; the stores are `memory/` (the embedded default), `dynamodb/` and `redis/`,
//! and the wrappers that keep the contract `metered.rs`, `breaker.rs`, `detached.rs`.

pub mod breaker;
pub mod calls;
mod contract;
pub mod counters;
mod credit;
pub mod detached;
#[cfg(feature = "dynamodb")]
pub mod dynamodb;
mod error;
mod inspect;
mod item;
pub mod key;
pub mod memory;
pub mod metered;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(feature = "dynamodb", feature = "redis"))]
pub(crate) mod seed;
mod write;

pub use contract::{
    check_store_timeout, BucketStore, DEFAULT_STORE_TIMEOUT, FAULT_DOMAINS, MAX_COMMIT_ITEMS,
    MAX_STORE_TIMEOUT,
};
pub use credit::{Credit, CreditGuard, Stamp};
pub use error::{Cause, StoreError};
pub use inspect::{inspect, InspectedShard};
pub use item::{
    checked_stored, stored_shard_count, validate_stored, BucketItem, BucketKey, LimitParams,
    LimitState, Limits, Name, ShardShare, MAX_SHARD_COUNT, MILLI, MIN_BALANCE, WCU_LIMIT,
};
pub use write::{
    CommitOutcome, CountChange, Debit, DebitMode, DebitOutcome, LimitWrite, Seed, Write,
};

//! The DynamoDB store: bucket items in one table, shared by a fleet of servers.
//!
//! Each contract primitive is one DynamoDB call with the condition the contract names:
//! the fast path is one `UpdateItem` (`ADD` deltas, `ReturnValuesOnConditionCheckFailure
//! = ALL_OLD`), a read is one `BatchGetItem`, a commit is one `PutItem`/`UpdateItem` or one
//! `TransactWriteItems`. Expression attribute names are positional (`#t0`, `#c0`, …) so
//! limit names may contain `.` and `-`. Every call is counted by operation and outcome,
//! with the capacity DynamoDB reports, in a [`CallLedger`]. The SDK's call futures are
//! boxed: each is several KB, and inline they made every future above them (the engine's,
//! the request's) about 30 KB, copied and allocated on every decision.
//!
//! This file holds the contract's calls; `failure.rs` what DynamoDB's errors mean,
//! `client.rs` reaching the table, `expr.rs` the expressions, `seeded.rs` the
//! debit that creates a missing item in the same call, `codec.rs` the item format
//! and keys, `ledger.rs` the call accounting. Table: `PK` (S) + `SK` (S), on-demand, TTL on `ttl`.
//! This module decides nothing about limits.

mod calls;
mod client;
mod codec;
mod expr;
mod failure;
mod ledger;
mod seeded;
mod store;

pub use client::{client, create_table, DetachedCredentials, TableCreated};
pub use ledger::CallLedger;
pub use store::{DynamoOptions, DynamoStore};

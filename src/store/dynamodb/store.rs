//! The DynamoDB store's parts ([`DynamoStore`]) and where it reaches ([`DynamoOptions`]):
//! types only, so that every file of the store can name them without using another. What
//! the store does is `calls.rs`'s (its construction and the contract's calls), with the
//! expressions in `expr.rs`, the item format in `codec.rs`, the client in `client.rs` and
//! failures in `failure.rs`.

use std::time::Duration;

use aws_credential_types::provider::SharedCredentialsProvider;
use aws_sdk_dynamodb::Client;

use super::ledger::CallLedger;

/// Where the table is and how to reach it.
#[derive(Debug, Clone)]
pub struct DynamoOptions {
    pub table: String,
    /// Prefix of every key, so several deployments can share a table.
    pub namespace: String,
    /// Endpoint override, for DynamoDB Local only; real AWS uses the standard resolution.
    pub endpoint: Option<String>,
    /// Region; else the standard AWS chain (environment, profile, instance metadata).
    pub region: Option<String>,
    /// Deadline of one store call, retries included (the SDK retries with jittered
    /// backoff inside it).
    pub timeout: Duration,
}

/// A single-item write DynamoDB refused because a transaction holds the item.
pub(super) const CONFLICT: &str = "TransactionConflictException";

/// Bucket items in a DynamoDB table.
#[derive(Debug)]
pub struct DynamoStore {
    pub(super) client: Client,
    pub(super) table: String,
    pub(super) namespace: String,
    /// The deadline of one contract call (the SDK's operation timeout, and the bound of
    /// this store's own retry loops).
    pub(super) timeout: Duration,
    /// What the client resolves credentials with (resolved ahead by [`Self::warm_up`]).
    pub(super) credentials: Option<SharedCredentialsProvider>,
    pub(super) ledger: CallLedger,
}

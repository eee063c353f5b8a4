//! What a failed DynamoDB call means, and whose failure it is: this request's (its key,
//! item or expression: [`StoreError::Invalid`]), one bucket's (its partition throttled:
//! [`StoreError::Throttled`]), or the store's (everything else: [`StoreError::Unavailable`],
//! the only kind the circuit breaker counts). The calls are `mod.rs`'s; this file only
//! reads their errors.

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::batch_get_item::BatchGetItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{CancellationReason, ThrottlingReason};

use super::codec::Item;
use super::store::{DynamoStore, CONFLICT};
use crate::store::{BucketItem, BucketKey, Cause, StoreError};
use crate::support::text::elide;

/// Most bytes of a DynamoDB error text carried into a [`StoreError`].
pub(super) const REASON_BYTES: usize = 256;

/// DynamoDB error codes that refuse one request (its key, item or expression), not the
/// store: they never count towards the circuit breaker.
const REQUEST_ERRORS: [&str; 3] = [
    "ValidationException",
    "ItemCollectionSizeLimitExceededException",
    "SerializationException",
];

/// The codes of a call DynamoDB throttled.
const THROTTLING_ERRORS: [&str; 3] = [
    "ProvisionedThroughputExceededException",
    "ThrottlingException",
    "RequestLimitExceeded",
];

/// The code with which DynamoDB refuses the rate of requests on one partition key: the
/// last part of a throttling reason (`ResourceType` + `OperationType` + limit, e.g.
/// `TableWriteKeyRangeThroughputExceeded`). Every other limit (a provisioned table's
/// capacity, the account's quota, an on-demand maximum) is the table's as a whole.
const PARTITION_LIMIT: &str = "KeyRangeThroughputExceeded";

/// A transaction item's cancellation codes for throttling (no reason comes with them).
pub(super) const TRANSACTION_THROTTLING: [&str; 2] =
    ["ThrottlingError", "ProvisionedThroughputExceeded"];

/// An operation error's throttling reasons, when it is a throttling error that has some.
pub(super) trait ThrottlingReasons {
    fn throttling_reasons(&self) -> &[ThrottlingReason];
}

macro_rules! throttling_reasons {
    ($($error:ident),+) => {$(
        impl ThrottlingReasons for $error {
            fn throttling_reasons(&self) -> &[ThrottlingReason] {
                match self {
                    $error::ProvisionedThroughputExceededException(e) => e.throttling_reasons(),
                    $error::ThrottlingException(e) => e.throttling_reasons(),
                    $error::RequestLimitExceeded(e) => e.throttling_reasons(),
                    _ => &[],
                }
            }
        }
    )+};
}

throttling_reasons!(
    UpdateItemError,
    PutItemError,
    BatchGetItemError,
    TransactWriteItemsError
);

/// Whether a throttled call (`code`, with DynamoDB's `reasons`) concerns its item's
/// partition alone. With reasons, only when each names a key range's limit: a table's,
/// index's or account's limit throttles every bucket alike, which is an outage for all of
/// them. Without reasons (DynamoDB Local, or an endpoint that sends none): the account's
/// request rate (`RequestLimitExceeded`) is the table's; the other codes are taken as the
/// partition's, which they most often are on an on-demand table.
fn partition_throttle(code: &str, reasons: &[ThrottlingReason]) -> bool {
    if reasons.is_empty() {
        return code != "RequestLimitExceeded";
    }
    reasons
        .iter()
        .all(|r| r.reason().is_some_and(|r| r.ends_with(PARTITION_LIMIT)))
}

pub(super) fn describe<E: ProvideErrorMetadata + std::fmt::Debug, R: std::fmt::Debug>(
    e: &SdkError<E, R>,
) -> String {
    match e {
        SdkError::ServiceError(s) => {
            let inner = s.err();
            format!(
                "{}: {}",
                inner.code().unwrap_or("ServiceError"),
                inner.message().unwrap_or("no message")
            )
        }
        SdkError::TimeoutError(_) => "timed out".to_string(),
        // What the connector met at the bottom (`Connection refused`, a TLS alert), not
        // its debug dump; the whole chain goes in the error's source ([`cause`]).
        SdkError::DispatchFailure(d) => match d.as_connector_error() {
            Some(c) => format!("dispatch failure: {}", root_text(c)),
            None => "dispatch failure".to_string(),
        },
        other => format!("{other:?}"),
    }
}

/// The causes under a failure that its reason only sums up: a dispatch failure's
/// connector error and what it wraps (a service error's code and message are the reason).
pub(super) fn cause<E, R>(e: &SdkError<E, R>) -> Option<Cause> {
    match e {
        SdkError::DispatchFailure(d) => d.as_connector_error().map(|c| Cause::of(c)),
        _ => None,
    }
}

/// The innermost error's text under `e`.
fn root_text(e: &(dyn std::error::Error + 'static)) -> String {
    std::iter::successors(Some(e), |e| e.source())
        .last()
        .map_or_else(String::new, ToString::to_string)
}

impl DynamoStore {
    pub(super) fn unavailable(&self, key: &BucketKey, reason: String) -> StoreError {
        self.unavailable_from(key, reason, None)
    }

    /// The store failed on `key`, for `reason`, with the client's own error chain.
    pub(super) fn unavailable_from(
        &self,
        key: &BucketKey,
        reason: String,
        source: Option<Cause>,
    ) -> StoreError {
        StoreError::Unavailable {
            key: self.pk(key),
            reason: elide(&reason, REASON_BYTES).into_owned(),
            source,
        }
    }

    /// A transaction's item refused for itself (`code`: too large, a bad expression):
    /// this request's error, with DynamoDB's message.
    pub(super) fn refused_in_transaction(
        &self,
        key: &BucketKey,
        code: &str,
        reason: &CancellationReason,
    ) -> StoreError {
        StoreError::Invalid {
            key: self.pk(key),
            reason: format!(
                "{code}: {}",
                elide(reason.message().unwrap_or("no message"), REASON_BYTES)
            ),
            source: None,
        }
    }

    /// What a failed SDK call on `key` means (see the module's doc).
    pub(super) fn failure<E, R>(&self, key: &BucketKey, err: &SdkError<E, R>) -> StoreError
    where
        E: ProvideErrorMetadata + ThrottlingReasons + std::fmt::Debug,
        R: std::fmt::Debug,
    {
        match err.code() {
            Some(code) if REQUEST_ERRORS.contains(&code) => StoreError::Invalid {
                key: self.pk(key),
                reason: elide(&describe(err), REASON_BYTES).into_owned(),
                source: None,
            },
            Some(code)
                if THROTTLING_ERRORS.contains(&code)
                    && partition_throttle(
                        code,
                        err.as_service_error()
                            .map_or(&[], ThrottlingReasons::throttling_reasons),
                    ) =>
            {
                StoreError::Throttled { key: key.clone() }
            }
            _ => self.unavailable_from(key, describe(err), cause(err)),
        }
    }

    /// Records a failed call of `operation` in the ledger, by what it means, and returns
    /// that meaning.
    pub(super) fn failed<E, R>(
        &self,
        operation: &'static str,
        key: &BucketKey,
        err: &SdkError<E, R>,
    ) -> StoreError
    where
        E: ProvideErrorMetadata + ThrottlingReasons + std::fmt::Debug,
        R: std::fmt::Debug,
    {
        let failure = self.failure(key, err);
        let outcome = match failure {
            StoreError::Throttled { .. } => "throttled",
            _ => "error",
        };
        self.ledger.record(operation, outcome, 0.0);
        failure
    }

    /// A failed single-item conditional write (`UpdateItem`, `PutItem`), read the same way
    /// for both: `Ok(Some(old))` when its condition failed (`old`: the item as it was,
    /// which the caller took from the operation's own ConditionalCheckFailed error),
    /// `Ok(None)` when a transaction held the item (try again), an error otherwise.
    pub(super) fn refused<E, R>(
        &self,
        operation: &'static str,
        key: &BucketKey,
        err: &SdkError<E, R>,
        condition_failed: Option<Option<&Item>>,
    ) -> Result<Option<Option<BucketItem>>, StoreError>
    where
        E: ProvideErrorMetadata + ThrottlingReasons + std::fmt::Debug,
        R: std::fmt::Debug,
    {
        if let Some(old) = condition_failed {
            self.ledger.record(operation, "condition_failed", 1.0);
            return Ok(Some(self.decode_opt(key, old)?));
        }
        if err.code() == Some(CONFLICT) {
            self.ledger.record(operation, "conflict", 0.0);
            return Ok(None);
        }
        Err(self.failed(operation, key, err))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(text: &str) -> ThrottlingReason {
        ThrottlingReason::builder().reason(text).build()
    }

    #[test]
    fn only_a_key_range_limit_is_one_partitions() {
        let hot = [reason("TableWriteKeyRangeThroughputExceeded")];
        assert!(partition_throttle("ThrottlingException", &hot));
        for table_wide in [
            "TableWriteProvisionedThroughputExceeded",
            "TableWriteAccountLimitExceeded",
            "TableReadMaxOnDemandThroughputExceeded",
        ] {
            let reasons = [reason(table_wide)];
            assert!(
                !partition_throttle("ProvisionedThroughputExceededException", &reasons),
                "{table_wide}"
            );
            let both = [hot[0].clone(), reason(table_wide)];
            assert!(
                !partition_throttle("ThrottlingException", &both),
                "{table_wide}"
            );
        }
    }

    #[test]
    fn without_reasons_only_the_accounts_request_rate_is_the_tables() {
        assert!(partition_throttle(
            "ProvisionedThroughputExceededException",
            &[]
        ));
        assert!(partition_throttle("ThrottlingException", &[]));
        assert!(!partition_throttle("RequestLimitExceeded", &[]));
    }
}

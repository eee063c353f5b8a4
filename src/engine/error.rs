//! How an acquisition fails: the store's failure, tagged with the bucket it concerned,
//! or an invalid request. It tells a request's own error from the store's.

use thiserror::Error;

use crate::store::StoreError;
use crate::support::text::quote;

/// Engine failures: the store failed, with the bucket it concerned (its entity shown
/// elided: it holds request values).
#[derive(Debug, Error)]
pub enum EngineError {
    #[error("bucket of entity '{}' resource '{resource}': {source}", quote(entity))]
    Store {
        entity: String,
        resource: String,
        #[source]
        source: StoreError,
    },
    #[error("invalid acquire: {0}")]
    Invalid(String),
}

impl EngineError {
    /// Whether the error is the request's own (the store refused its key or item), not
    /// the store's: the request is answered as invalid, never by `failure_mode`.
    pub fn is_request_error(&self) -> bool {
        matches!(
            self,
            EngineError::Invalid(_)
                | EngineError::Store {
                    source: StoreError::Invalid { .. },
                    ..
                }
        )
    }
}

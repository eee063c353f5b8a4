//! What one document's validation carries ([`Validator`]): its file, the errors found
//! so far, and what rules sharing a bucket across documents have said. Every check is a
//! method of it, in the file of its concern (`walk.rs`, `fields.rs`, `rate_limit.rs`).

use std::sync::Arc;

use super::shared_bucket::SharedBuckets;
use crate::config::error::{ConfigError, ConfigErrorKind as K};
use crate::config::model::Pos;

/// Every error of one document, gathered while it is walked, and what rules sharing a
/// bucket across documents have said so far.
pub(super) struct Validator<'a> {
    pub(super) file: Arc<str>,
    pub(super) errors: Vec<ConfigError>,
    pub(super) shared: &'a mut SharedBuckets,
}

impl Validator<'_> {
    /// Records an error at `pos`; validation goes on.
    pub(super) fn error(&mut self, pos: Pos, kind: K) {
        self.errors.push(ConfigError::new(&self.file, pos, kind));
    }
}

//! The shared-bucket check: rules with the same entity template and resource share one
//! bucket item, across every document of a load, so a limit name there must mean one set
//! of parameters and the item may hold at most `MAX_LIMITS_PER_BUCKET` limits.

use std::collections::HashMap;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::config::error::ConfigErrorKind as K;
use crate::config::model::Pos;
use crate::config::{EntityTemplate, RateLimit, MAX_LIMITS_PER_BUCKET};

/// One limit of an explicitly templated rule, for the shared-bucket consistency check.
struct BucketLimit {
    params: RateLimit,
    file: Arc<str>,
    line: u32,
}

/// What the shared-bucket check remembers across every document of one load: rules of
/// different files (or domains) with the same template and resource share a bucket too.
#[derive(Default)]
pub(crate) struct SharedBuckets {
    /// (template, resource, limit name) → the first rule declaring it.
    bucket_limits: HashMap<(String, String, String), BucketLimit>,
    /// (template, resource) → how many limit names its bucket item holds.
    limits_per_bucket: HashMap<(String, String), usize>,
}

impl SharedBuckets {
    /// Rules with the same template and resource share one bucket item: a limit name
    /// there must mean one set of parameters, and the item holds at most
    /// `MAX_LIMITS_PER_BUCKET` names. Remembers the rule declared in `file` at `pos`; returns
    /// what it breaks, in the order they are reported.
    pub(super) fn check(
        &mut self,
        file: &Arc<str>,
        template: &EntityTemplate,
        resource: &str,
        name: String,
        params: &RateLimit,
        pos: Pos,
    ) -> SmallVec<[K; 2]> {
        let mut broken = SmallVec::new();
        let id = (template.as_str().to_string(), resource.to_string(), name);
        if !self.bucket_limits.contains_key(&id) {
            let bucket = (id.0.clone(), id.1.clone());
            let count = self.limits_per_bucket.entry(bucket).or_default();
            *count += 1;
            if *count == MAX_LIMITS_PER_BUCKET + 1 {
                let kind = K::TooManyLimits {
                    template: id.0.clone(),
                    resource: id.1.clone(),
                    count: *count,
                    max: MAX_LIMITS_PER_BUCKET,
                };
                broken.push(kind);
            }
        }
        match self.bucket_limits.get(&id) {
            Some(first) if first.params != *params => {
                let other = if first.file == *file {
                    format!("line {}", first.line)
                } else {
                    format!("{}:{}", first.file, first.line)
                };
                let kind = K::ConflictingLimit {
                    name: id.2.clone(),
                    template: id.0.clone(),
                    resource: id.1.clone(),
                    other,
                };
                broken.push(kind);
            }
            Some(_) => {}
            None => {
                self.bucket_limits.insert(
                    id,
                    BucketLimit {
                        params: params.clone(),
                        file: Arc::clone(file),
                        line: pos.line,
                    },
                );
            }
        }
        broken
    }
}

//! What a request asks of the engine: an [`Acquire`] of one or more buckets
//! ([`BucketClaim`]), each drawing on some of its limits ([`LimitClaim`]). Built by the
//! plan (`plan.rs`) from the rules a request matched; read by the acquire algorithm.
//! Data only: it owns no decision.

use smallvec::SmallVec;

use super::{LimitParams, ShardShare};
use crate::store::Name;

/// One limit of a bucket that a request draws on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitClaim {
    /// The limit's name inside the bucket item.
    pub limit: Name,
    pub params: LimitParams,
    /// Millitokens to take; 0 checks without consuming (fails while in debt).
    pub amount: i64,
    /// Overdraft: always debited, may drive the balance negative; reported over when the
    /// balance was short.
    pub forced: bool,
}

impl LimitClaim {
    /// A gated claim larger than `share`'s ceiling: no shard of that size can ever admit
    /// it (the per-shard request ceiling).
    pub fn exceeds(&self, share: ShardShare) -> bool {
        !self.forced && self.amount > share.ceiling
    }
}

/// Everything one request takes from one (entity, resource) bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketClaim {
    pub entity: Name,
    pub resource: Name,
    /// Distinct limit names.
    pub limits: SmallVec<[LimitClaim; 2]>,
    /// This bucket is a cascading child: it never takes the child-only shard retry.
    pub cascades: bool,
    /// Never answered from a lease (a rule's `lease: false`): each request is its own
    /// store debit, so requests on several servers are decided in the store's order.
    pub strict: bool,
}

/// One all-or-nothing acquisition: every gated claim fits and is debited, or none is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Acquire {
    /// Distinct (entity, resource) pairs.
    pub buckets: SmallVec<[BucketClaim; 2]>,
}

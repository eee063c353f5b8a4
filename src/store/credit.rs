//! What a store gives back: credits of millitokens to a shard ([`Credit`]: a voided
//! debit's refund, a lease's rest), under the ceiling of its share and the guard the item
//! must meet ([`CreditGuard`]: the [`Stamp`] a debit's image showed, or a shard count).

use super::{BucketItem, LimitParams, Name};

/// What a refund requires of its item: the refill baseline `rf` and the shard count the
/// debit's image showed. A slow pass since then either moved `rf` or (in the same
/// millisecond) refilled nothing, and a doubling moved the count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stamp {
    pub refilled_at: i64,
    pub shard_count: u32,
}

impl Stamp {
    /// The stamp of `item` as it is.
    pub fn of(item: &BucketItem) -> Stamp {
        Stamp {
            refilled_at: item.refilled_at,
            shard_count: item.shard_count,
        }
    }
}

/// What a credit requires of its item besides the ceilings of its limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreditGuard {
    /// A refund of a voided debit: the item as the debit left it, neither refilled nor
    /// doubled since (`rf` and shard count as the debit's image showed). A refill since
    /// may already have given the voided tokens back through its clamp at the ceiling.
    Unrefilled(Stamp),
    /// The return of a lease's unused rest (see `engine/lease`): the tokens were taken,
    /// not voided, so a refill since changes nothing; only the shard count must be the
    /// one the lease was sized for (a doubling since shrank the share, and the ceilings).
    /// The ceiling alone keeps the shard within its share, so a return never admits more
    /// than the bucket's capacity plus its refill.
    SameCount(u32),
}

impl From<Stamp> for CreditGuard {
    fn from(stamp: Stamp) -> CreditGuard {
        CreditGuard::Unrefilled(stamp)
    }
}

impl CreditGuard {
    /// Whether an item with this refill baseline and shard count meets the guard.
    pub fn admits(&self, rf: i64, shard_count: u32) -> bool {
        match *self {
            CreditGuard::Unrefilled(stamp) => {
                stamp.refilled_at == rf && stamp.shard_count == shard_count
            }
            CreditGuard::SameCount(count) => count == shard_count,
        }
    }
}

/// Millitokens given back to a shard (a voided debit's refund, or a lease's unused rest):
/// applied only while `tk + amount <= ceiling`, so a credit can never lift a shard above
/// its share, only while the limit still has the parameters the tokens were taken under
/// (a reload that lowered the limit rewrote them, and the ceiling was computed from the
/// old ones), and only while the item meets its [`CreditGuard`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credit {
    pub limit: Name,
    pub amount: i64,
    pub ceiling: i64,
    /// The limit's parameters when the tokens were taken.
    pub params: LimitParams,
}

//! The compact form of a stored item ([`CompactItem`]): an idle bucket's footprint bounds how
//! many keys one process holds, so the limit names and parameters an item carries (which
//! config decides) are one shared, interned [`Shape`], leaving only balances, `rf`, `ttl`
//! and the shard count per item (and when it was last used, for the store's bound). It
//! converts to the contract's [`BucketItem`]; it checks no condition.

use std::hash::Hash;
use std::sync::Arc;

use hashbrown::Equivalent;
use smallvec::SmallVec;

use crate::store::{BucketItem, LimitParams, LimitState, Limits, Name};

/// `ttl` of an item that never expires (the compact form has no `Option`).
pub(super) const NO_TTL: i64 = i64::MAX;

/// Names and parameters of an item's limits, in name order: the part of an item that
/// config decides, shared by every item with the same limits.
#[derive(Debug)]
pub(super) struct Shape(pub(super) Box<[(Name, LimitParams)]>);

/// Hashes a shape's limits the same way whether they come from a [`Shape`] or from an
/// image's [`Limits`], so the interner can be searched without building a shape.
pub(super) fn hash_shape<'a, H: std::hash::Hasher>(
    len: usize,
    limits: impl Iterator<Item = (&'a str, LimitParams)>,
    h: &mut H,
) {
    h.write_usize(len);
    for (name, params) in limits {
        name.hash(h);
        params.hash(h);
    }
}

impl Shape {
    pub(super) fn limits(&self) -> impl Iterator<Item = (&str, LimitParams)> {
        self.0.iter().map(|(n, p)| (n.as_str(), *p))
    }

    pub(super) fn position(&self, limit: &str) -> Option<usize> {
        self.0.binary_search_by(|(n, _)| n.as_str().cmp(limit)).ok()
    }

    /// Whether `limits` have exactly these names and parameters.
    pub(super) fn describes(&self, limits: &Limits) -> bool {
        self.0.len() == limits.len()
            && self
                .0
                .iter()
                .zip(limits.iter())
                .all(|((n, p), (name, st))| n == name && *p == st.params())
    }
}

impl PartialEq for Shape {
    fn eq(&self, other: &Shape) -> bool {
        self.0 == other.0
    }
}

impl Eq for Shape {}

impl Hash for Shape {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        hash_shape(self.0.len(), self.limits(), h);
    }
}

/// An image's limits as a lookup key into the shape interner.
pub(super) struct ShapeOf<'a>(pub(super) &'a Limits);

impl Hash for ShapeOf<'_> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        hash_shape(
            self.0.len(),
            self.0.iter().map(|(n, st)| (n, st.params())),
            h,
        );
    }
}

impl Equivalent<Arc<Shape>> for ShapeOf<'_> {
    fn equivalent(&self, shape: &Arc<Shape>) -> bool {
        shape.describes(self.0)
    }
}

/// Balance and consumed counter of one limit, in its shape's order.
#[derive(Debug, Clone, Copy)]
pub(super) struct Balance {
    pub(super) balance: i64,
    pub(super) taken: i64,
}

/// [`CompactItem::raised_age_min`] for an item whose count was never raised.
pub(super) const NEVER_RAISED: u16 = u16::MAX;

/// The compact form of `count_raised_at` on an item refilled at `rf`: whole minutes
/// before `rf`, floored, so that the time read back is never earlier than the raise (a
/// shard created as empty since then is given no more refill than it could have had);
/// an age past what a `u16` holds (45 days) is kept as the longest one, later than the
/// raise too. The memory store commits atomically, so it reads the raise only for the
/// shards a raise without a split gave up (`engine/acquire/pass.rs`): minutes suffice.
pub(super) fn raised_age_min(rf: i64, count_raised_at: i64) -> u16 {
    if count_raised_at == 0 {
        return NEVER_RAISED;
    }
    let minutes = rf.saturating_sub(count_raised_at).max(0) / 60_000;
    u16::try_from(minutes).map_or(NEVER_RAISED - 1, |m| m.min(NEVER_RAISED - 1))
}

/// `count_raised_at` from its compact form (see [`raised_age_min`]).
pub(super) fn raised_at(rf: i64, age_min: u16) -> i64 {
    if age_min == NEVER_RAISED {
        return 0;
    }
    rf - i64::from(age_min) * 60_000
}

/// One stored item in compact form.
#[derive(Debug, Clone)]
pub(super) struct CompactItem {
    pub(super) refilled_at: i64,
    /// Epoch seconds; [`NO_TTL`] when the item does not expire.
    pub(super) ttl: i64,
    /// At most [`MAX_SHARD_COUNT`](crate::store::MAX_SHARD_COUNT) (a larger one is kept
    /// saturated, for the read's check to refuse): a `u16`, so that `raised_age_min` fits
    /// beside it in what one `u32` took.
    pub(super) shard_count: u16,
    /// Whole minutes from the count's last raise to `refilled_at` (see
    /// [`raised_age_min`]); [`NEVER_RAISED`] when it never was.
    pub(super) raised_age_min: u16,
    /// The second (epoch s, `bound.rs`) the item was last debited, credited or written:
    /// its recency for the bound. Held in what was padding after `shard_count`.
    pub(super) touched: u32,
    pub(super) shape: Arc<Shape>,
    pub(super) balances: SmallVec<[Balance; 2]>,
}

impl CompactItem {
    /// The item this slot holds, as the contract's type.
    pub(super) fn image(&self) -> BucketItem {
        BucketItem {
            refilled_at: self.refilled_at,
            shard_count: u32::from(self.shard_count),
            count_raised_at: raised_at(self.refilled_at, self.raised_age_min),
            ttl: (self.ttl != NO_TTL).then_some(self.ttl),
            limits: Limits(
                self.shape
                    .0
                    .iter()
                    .zip(&self.balances)
                    .map(|((name, params), b)| {
                        (name.clone(), LimitState::new(*params, b.balance, b.taken))
                    })
                    .collect(),
            ),
        }
    }

    pub(super) fn balance(&self, limit: &str) -> Option<(&LimitParams, &Balance)> {
        let i = self.shape.position(limit)?;
        Some((&self.shape.0[i].1, &self.balances[i]))
    }

    pub(super) fn balance_mut(&mut self, limit: &str) -> Option<&mut Balance> {
        let i = self.shape.position(limit)?;
        Some(&mut self.balances[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raise_is_read_back_never_earlier_than_it_was() {
        let rf = 1_800_000_000_000;
        assert_eq!(raised_at(rf, raised_age_min(rf, 0)), 0, "never raised");
        assert_eq!(raised_at(rf, raised_age_min(rf, rf)), rf);
        for age in [1, 59_999, 60_000, 3_599_999, 86_400_000 * 400] {
            let back = raised_at(rf, raised_age_min(rf, rf - age));
            assert!((rf - age..=rf).contains(&back), "{age}: {back}");
            assert_ne!(back, 0);
        }
    }
}

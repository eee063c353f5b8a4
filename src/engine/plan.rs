//! Plans: from matched rules to one [`Acquire`] — one bucket claim per (entity, resource),
//! several limits of one bucket folded into one item write, cascade parents added as
//! buckets of their own.
//!
//! A plan knows rules and request entries, never the store.

use smallvec::SmallVec;
use thiserror::Error;

use super::bucket::MILLI;
use super::{Acquire, BucketClaim, LimitClaim, LimitParams};
use crate::config::{DescriptorEntry, RateLimit, Rule, RuleLimit, MAX_TOKENS};
use crate::store::key::stored_entity;
use crate::store::Name;

/// Where one rule's limits sit in the plan: its bucket and the index of each of its
/// limits there, in the order the rule states them (`Rule::stated_limits`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketSlots {
    pub bucket: usize,
    pub limits: SmallVec<[usize; 2]>,
}

/// Where one descriptor's limits sit in the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitPosition {
    pub own: BucketSlots,
    /// The cascade parent's limits, if the rule cascades.
    pub parent: Option<BucketSlots>,
}

/// A request amount beyond what one descriptor may take ([`MAX_TOKENS`]), or (summed over
/// a request's descriptors) beyond the engine's integer range.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("hits {hits} for limit '{limit}' exceed the maximum of {MAX_TOKENS}")]
pub struct AmountOverflow {
    pub hits: u64,
    pub limit: String,
}

/// An acquire under construction, with the slot of every descriptor added to it.
#[derive(Debug, Default, Clone)]
pub struct Plan {
    pub acquire: Acquire,
}

/// Token-bucket parameters of a rule's limit.
pub fn params_of(limit: &RateLimit) -> LimitParams {
    LimitParams::new(
        limit.capacity(),
        u64::from(limit.requests_per_unit),
        limit.period_seconds() * 1_000,
    )
}

impl Plan {
    pub fn new() -> Plan {
        Plan::default()
    }

    pub fn is_empty(&self) -> bool {
        self.acquire.buckets.is_empty()
    }

    /// Adds a descriptor that matched `rule` (a limited rule) with `hits` tokens.
    pub fn add<E: DescriptorEntry>(
        &mut self,
        rule: &Rule,
        entries: &[E],
        hits: u64,
    ) -> Result<LimitPosition, AmountOverflow> {
        let RuleLimit::Limited(limit) = &rule.limit else {
            unreachable!("unlimited rules never reach a plan");
        };
        // Usage under an overdraft rule already happened: it is recorded on the parent too.
        let forced = limit.overdraft && hits > 0;
        let own = self.claim_rule(rule, rule.entity_for(entries), hits, forced, true)?;
        let parent = match &rule.cascade_parent {
            Some(parent) if matches!(parent.limit, RuleLimit::Limited(_)) => {
                // The parent is shallower: its entity is of the entries down to its depth.
                let entity = parent.entity_for(entries);
                Some(self.claim_rule(parent, entity, hits, forced, false)?)
            }
            _ => None,
        };
        Ok(LimitPosition { own, parent })
    }

    /// Claims `hits` of every limit `rule` states, in the bucket of `entity`; `child`:
    /// the descriptor matched this rule itself (not a cascade parent).
    #[expect(clippy::expect_used, reason = "taken only by the last limit")]
    fn claim_rule(
        &mut self,
        rule: &Rule,
        entity: Name,
        hits: u64,
        forced: bool,
        child: bool,
    ) -> Result<BucketSlots, AmountOverflow> {
        let cascades = child && rule.cascade_parent.is_some();
        let mut slots = BucketSlots {
            bucket: 0,
            limits: SmallVec::new(),
        };
        let last = rule.further_limits.len();
        let mut entity = Some(entity);
        for (i, stated) in rule.stated_limits().enumerate() {
            // Moved into the last claim: a long entity is not copied for a one-limit rule.
            let entity = if i == last {
                entity.take()
            } else {
                entity.clone()
            };
            let (bucket, idx) = self.claim(
                entity.expect("taken only by the last limit"),
                &rule.resource,
                stated.item_name,
                stated.rate,
                hits,
                forced,
                cascades,
                !stated.rate.lease,
            )?;
            slots.bucket = bucket;
            slots.limits.push(idx);
        }
        Ok(slots)
    }

    #[allow(clippy::too_many_arguments)]
    fn claim(
        &mut self,
        entity: Name,
        resource: &str,
        limit_name: &str,
        limit: &RateLimit,
        hits: u64,
        forced: bool,
        cascades: bool,
        strict: bool,
    ) -> Result<(usize, usize), AmountOverflow> {
        let overflow = || AmountOverflow {
            hits,
            limit: limit_name.to_string(),
        };
        if hits > MAX_TOKENS {
            return Err(overflow());
        }
        let amount = i64::try_from(hits)
            .ok()
            .and_then(|h| h.checked_mul(MILLI))
            .ok_or_else(overflow)?;
        // Buckets are keyed by the stored form: a long entity by its digest.
        let entity = stored_entity(entity);
        let bi = match self
            .acquire
            .buckets
            .iter()
            .position(|b| b.entity == entity && b.resource == resource)
        {
            Some(i) => i,
            None => {
                self.acquire.buckets.push(BucketClaim {
                    entity,
                    resource: Name::new(resource),
                    limits: SmallVec::new(),
                    cascades: false,
                    strict: false,
                });
                self.acquire.buckets.len() - 1
            }
        };
        #[expect(
            clippy::indexing_slicing,
            reason = "`bi` is the bucket found or the one just pushed"
        )]
        let bucket = &mut self.acquire.buckets[bi];
        bucket.cascades |= cascades;
        bucket.strict |= strict;
        let same = bucket
            .limits
            .iter_mut()
            .enumerate()
            .find(|(_, l)| l.limit == limit_name);
        if let Some((li, l)) = same {
            l.amount = l.amount.checked_add(amount).ok_or_else(overflow)?;
            l.forced |= forced;
            return Ok((bi, li));
        }
        bucket.limits.push(LimitClaim {
            limit: Name::new(limit_name),
            params: params_of(limit),
            amount,
            forced,
        });
        Ok((bi, bucket.limits.len() - 1))
    }
}

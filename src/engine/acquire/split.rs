//! A shard's count raised by splitting it: the one way a shard learns a larger shard
//! count. A shard `q` that holds count `c` owns the indices `q, q + c, q + 2c, …` below
//! 32: its balance is the bucket's tokens for all of them. Raising it to `n` hands each
//! index it gives up (`q + c·i`, `1 ≤ i < n / c`) an equal part of that balance, in the
//! same atomic commit that moves `q`'s count: the new shards are created holding their
//! part, `q` keeps its own. So a doubling moves tokens and never creates any — the
//! bucket's shards hold, at every moment, at most what one bucket of the same capacity
//! and refill would (issue 50: a doubling used to create the new shards full, each adding
//! its share on top of what the split shard still held or had lent).
//!
//! A shard found missing is created by the split of the shard that owns it (the nearest
//! existing shard whose indices include it). A shard no existing shard owns has expired
//! (full), or a raise gave it up and its create has not landed (a Redis Cluster commits
//! a split slot by slot): it is created as if empty at its ancestors' latest raise
//! (`count_raised_at`) and refilled since — full again long after the raise, never its
//! share on top of the part its split carries (`slow.rs`, `split_owner`).
//!
//! Pure planning (`plan_split`, `owner`) and the one async step that reads and commits
//! (`Deciding::split_shard`); when to split is the doubling's and the slow path's.

use smallvec::SmallVec;

use super::pass::{expiry, later_ttl, PassContext};
use super::state::{wrap, Deciding};
use crate::engine::bucket::refill;
use crate::engine::{BucketClaim, EngineError};
use crate::store::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, CountChange, LimitState, LimitWrite, Name,
    Write, WCU_LIMIT,
};

/// The indices shard `q`, holding count `held`, gives up when raised to `new`: the
/// shards a split to `new` creates.
pub(crate) fn children(q: u32, held: u32, new: u32) -> impl Iterator<Item = u32> {
    let held = held.max(1);
    (1..(new / held).max(1)).map(move |i| q + held * i)
}

/// Among the existing shards `found` (index and the count each holds), the one that owns
/// index `k`: `k ≡ q (mod count)`. At most one does while splits are atomic; the
/// smallest index wins otherwise, the earliest owner.
pub(crate) fn owner(k: u32, found: &[(u32, u32)]) -> Option<(u32, u32)> {
    found
        .iter()
        .copied()
        .filter(|&(q, count)| q != k && k % count.max(1) == q)
        .min_by_key(|&(q, _)| q)
}

/// The proper ancestors of index `k` (its index modulo each power of two up to it): the
/// shards that may own it.
pub(crate) fn ancestors(k: u32) -> SmallVec<[u32; 6]> {
    let mut out: SmallVec<[u32; 6]> = SmallVec::new();
    let mut level = 1u32;
    while level <= k {
        let a = k % level;
        if !out.contains(&a) {
            out.push(a);
        }
        level *= 2;
    }
    out
}

/// One limit's balance split into `parts` shares: what the split shard keeps (the
/// remainder of the division included) and what each new shard gets, each at most
/// `ceiling` (the new share's: a few millitokens of rounding are dropped, never added).
fn divide(owned: i64, parts: i64, ceiling: i64) -> (i64, i64) {
    let each = owned.div_euclid(parts);
    let kept = owned - each * (parts - 1);
    (kept.min(ceiling), each.min(ceiling))
}

/// The commit that splits shard `key` (read as `item`) to `new` shards: its update under
/// the `rf` lock — refilled to now at the share it held, its part kept, its count raised
/// — followed by a create of each shard it gives up that `missing` says does not exist,
/// holding its part. A part meant for a shard that exists is dropped (the bucket holds
/// less, never more). The update comes first: a store that commits item by item (a Redis
/// Cluster) applies it before any create, so no create can land while the split shard
/// still holds the whole.
pub(crate) fn plan_split(
    key: &BucketKey,
    item: &BucketItem,
    new: u32,
    missing: &[u32],
    ctx: &PassContext,
) -> Vec<Write> {
    let held = item.shard_count.max(1);
    let parts = i64::from((new / held).max(1));
    let now = ctx.now;
    let mut updates = Vec::new();
    let mut kept_horizons: SmallVec<[Option<i64>; 3]> = SmallVec::new();
    let mut child = BucketItem {
        refilled_at: now,
        shard_count: new,
        count_raised_at: 0,
        ttl: None,
        limits: Default::default(),
    };
    let mut child_horizons: SmallVec<[Option<i64>; 3]> = SmallVec::new();
    for (name, st) in item.limits.iter() {
        let wcu = name == WCU_LIMIT;
        let params = st.params();
        let (owned, _) = refill(
            st.balance,
            item.refilled_at,
            now,
            params.share(if wcu { 1 } else { held }),
        );
        // A partition's write budget is its own: never divided, full on a new shard.
        let (kept, each) = if wcu {
            (owned, params.capacity)
        } else {
            divide(owned, parts, params.share(new).ceiling)
        };
        if kept != st.balance {
            updates.push(LimitWrite::Add {
                limit: Name::new(name),
                balance_delta: kept - st.balance,
                taken_delta: 0,
                // Debits by servers still on the old count may land first: the part kept
                // must still be there, and no credit may have landed on top of the read.
                floor: (kept < st.balance).then_some(st.balance - kept),
                cap: Some(st.balance),
                claimed: 0,
            });
        }
        kept_horizons.push(params.full_again_ms(kept));
        child
            .limits
            .insert(Name::new(name), LimitState::new(params, each, 0));
        child_horizons.push(params.full_again_ms(each));
    }
    child.ttl = expiry(now, ctx.ttl_multiplier, child_horizons);
    let mut writes = vec![Write::Update {
        key: key.clone(),
        expected_refilled_at: item.refilled_at,
        refilled_at: now.max(item.refilled_at),
        ttl: later_ttl(expiry(now, ctx.ttl_multiplier, kept_horizons), item.ttl),
        shard_count: Some(CountChange {
            read: item.shard_count,
            new,
        }),
        limits: updates,
    }];
    for c in children(key.shard, held, new).filter(|c| missing.contains(c)) {
        writes.push(Write::Create {
            key: BucketKey::new(&key.entity, &key.resource, c),
            item: child.clone(),
        });
    }
    writes
}

/// What a split came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Split {
    /// This call raised the shard to the count asked for.
    Raised,
    /// The shard already holds this count (someone split it first), at least the one asked for.
    Found(u32),
    /// The shard is gone, or kept changing under us: not split this time.
    Kept,
}

impl<S: BucketStore> Deciding<'_, S> {
    /// Splits shard `shard` of bucket `b`, read as `item`, to `new` shards (see the module
    /// comment): reads which of the shards it gives up exist, then commits its update and
    /// their creates at once. Three tries, each on the image a conflict returned.
    pub(super) async fn split_shard(
        &self,
        b: &BucketClaim,
        shard: u32,
        mut item: Option<BucketItem>,
        new: u32,
    ) -> Result<Split, EngineError> {
        let key = BucketKey::new(&b.entity, &b.resource, shard);
        for _ in 0..3 {
            let Some(image) = item.as_ref() else {
                return Ok(Split::Kept);
            };
            if image.shard_count >= new {
                self.engine
                    .shards
                    .learn(&b.entity, &b.resource, image.shard_count);
                return Ok(Split::Found(image.shard_count));
            }
            let given: Vec<u32> = children(shard, image.shard_count, new).collect();
            let keys: Vec<BucketKey> = given
                .iter()
                .map(|&c| BucketKey::new(&b.entity, &b.resource, c))
                .collect();
            let found = self.engine.store.read(&keys).await.map_err(wrap(b))?;
            let missing: Vec<u32> = given
                .iter()
                .zip(&found)
                .filter(|(_, f)| f.is_none())
                .map(|(&c, _)| c)
                .collect();
            let ctx = self.pass_context(self.engine.clock.now_ms());
            let writes = plan_split(&key, image, new, &missing, &ctx);
            match self.engine.store.commit(&writes).await.map_err(wrap(b))? {
                CommitOutcome::Committed => {
                    self.engine.shards.learn(&b.entity, &b.resource, new);
                    return Ok(Split::Raised);
                }
                CommitOutcome::Conflict(failed) => {
                    // The split shard changed: plan again from what it holds now. (A new
                    // shard created meanwhile is read again on the next try.)
                    if let Some((_, now)) = failed.into_iter().find(|(i, _)| *i == 0) {
                        item = now;
                    }
                }
            }
        }
        Ok(Split::Kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::bucket::LimitParams;
    use proptest::prelude::*;

    fn ctx(now: i64) -> PassContext {
        PassContext {
            now,
            wcu: LimitParams::new(1_000, 1_000, 1_000),
            ttl_multiplier: 7,
        }
    }

    fn item(count: u32, balance: i64, params: LimitParams, rf: i64) -> BucketItem {
        let mut item = BucketItem {
            refilled_at: rf,
            shard_count: count,
            count_raised_at: 0,
            ttl: None,
            limits: Default::default(),
        };
        item.limits
            .insert(Name::new("rps"), LimitState::new(params, balance, 0));
        let wcu = LimitParams::new(1_000, 1_000, 1_000);
        item.limits
            .insert(Name::new(WCU_LIMIT), LimitState::new(wcu, 3_000, 0));
        item
    }

    #[test]
    fn the_shards_a_split_creates_are_those_the_shard_gives_up() {
        assert_eq!(children(0, 1, 2).collect::<Vec<_>>(), vec![1]);
        assert_eq!(children(1, 2, 8).collect::<Vec<_>>(), vec![3, 5, 7]);
        assert_eq!(children(3, 4, 4).count(), 0);
        assert_eq!(ancestors(0).len(), 0);
        assert_eq!(ancestors(6).to_vec(), vec![0, 2]);
        assert_eq!(ancestors(13).to_vec(), vec![0, 1, 5]);
        // Shard 1 at count 2 owns 3, 5, 7…; shard 0 at count 4 owns 0, 4, 8….
        assert_eq!(owner(7, &[(0, 4), (1, 2)]), Some((1, 2)));
        assert_eq!(owner(7, &[(0, 4), (1, 8), (3, 4)]), Some((3, 4)));
        assert_eq!(owner(7, &[(0, 4), (1, 8)]), None, "7's owner, 3, has gone");
    }

    #[test]
    fn a_split_of_an_emptied_shard_creates_nothing() {
        let params = LimitParams::new(16, 1, 3_600_000);
        let key = BucketKey::new("e", "r", 0);
        let writes = plan_split(&key, &item(1, 0, params, 0), 2, &[1], &ctx(0));
        let Write::Create { item: created, .. } = &writes[1] else {
            panic!("a create: {writes:?}");
        };
        assert_eq!(created.limits.get("rps").unwrap().balance, 0);
        assert_eq!(created.limits.get(WCU_LIMIT).unwrap().balance, 1_000_000);
        assert_eq!(created.shard_count, 2);
    }

    proptest! {
        /// What the split shard keeps and what the shards it creates get never add up to
        /// more than it held (refilled at the share it held), and each part fits the new
        /// share.
        #[test]
        fn a_split_moves_tokens_and_never_creates_any(
            held_exp in 0u32..5, up in 1u32..5, balance in -5_000_000i64..20_000_000,
            capacity in 1u64..20_000, rate in 0u64..20_000, elapsed in 0i64..10_000,
        ) {
            let held = 1u32 << held_exp;
            let new = (held << up).min(32);
            prop_assume!(new > held);
            let params = LimitParams::new(capacity, rate, 1_000);
            let balance = balance.min(params.share(held).ceiling);
            let read = item(held, balance, params, 1_000);
            let key = BucketKey::new("e", "r", 0);
            let given: Vec<u32> = children(0, held, new).collect();
            let writes = plan_split(&key, &read, new, &given, &ctx(1_000 + elapsed));
            let (owned, _) = refill(balance, 1_000, 1_000 + elapsed, params.share(held));
            let mut total = 0i64;
            for w in &writes {
                match w {
                    Write::Update { limits, shard_count, .. } => {
                        prop_assert_eq!(shard_count.unwrap().new, new);
                        let delta = limits.iter().find_map(|l| match l {
                            LimitWrite::Add { limit, balance_delta, .. } if &**limit == "rps" => Some(*balance_delta),
                            _ => None,
                        }).unwrap_or(0);
                        prop_assert!(balance + delta <= params.share(new).ceiling);
                        total += balance + delta;
                    }
                    Write::Create { item, .. } => {
                        let part = item.limits.get("rps").unwrap().balance;
                        prop_assert!(part <= params.share(new).ceiling);
                        total += part;
                    }
                    Write::Debit { .. } => prop_assert!(false, "no debit"),
                }
            }
            prop_assert_eq!(writes.len(), given.len() + 1);
            prop_assert!(total <= owned, "{} held, {} after the split", owned, total);
            prop_assert!(total >= owned - i64::from(new), "rounding loses at most a millitoken a part");
        }
    }
}

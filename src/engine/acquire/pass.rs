//! A slow pass's plan for one bucket shard, from the image just read (or its absence):
//! refill every limit to now, clamp it to the shard's share, check each claim, and write
//! the result as one conditional store write — a create, or an update under the `rf` lock
//! with additive deltas — plus the outcomes to report whether the request is admitted or
//! not. Also the consumption-only retry that follows a lost lock.
//!
//! Pure: no clock, no store, no I/O, so every rule here is tested on its own. The acquire
//! algorithm (`acquire/decide.rs`, `slow.rs`) decides when a pass runs and what to do with its plan.
//!
//! Expiry. Every write stamps `ttl = now + multiplier × (time until the shard would be
//! full again from the balance written)` ([`LimitParams::full_again_ms`]: debt included,
//! at the slowest share a later doubling can give it), or no `ttl` at all when a limit
//! never refills; so an item the store expires would be re-created exactly as it was, and
//! expiry never changes a decision. Concurrent writers are allowed for: a gated debit that
//! lands between our read and our write can only take what the shard held (it never goes
//! below zero), so a balance of ours that may go negative (an overdraft claim) is counted
//! that much lower. The fast path writes no `ttl`: it only debits a shard that covers the
//! amount, so the balance it leaves is at least zero and full again within the
//! from-empty time, which every `ttl` written already covers.

use smallvec::SmallVec;

use crate::engine::bucket::now_s;
use crate::engine::bucket::{refill, wait_for, LimitParams, ShardShare};
use crate::engine::{BucketClaim, BucketOutcome, LimitClaim, LimitOutcome};
use crate::store::{
    BucketItem, BucketKey, CountChange, Debit, LimitState, LimitWrite, Name, Stamp, Write,
    MIN_BALANCE, WCU_LIMIT,
};

/// A limit's `tc` (total consumed) is folded back by this much once it reaches it: it only
/// ever grows, and DynamoDB's numbers would outgrow what an `i64` decodes. Additive, so it
/// commutes with concurrent debits like every other delta.
pub(crate) const TC_FOLD: i64 = 1 << 62;

/// What a pass knows besides the bucket: the time and the engine's settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PassContext {
    /// Epoch milliseconds the pass refills to.
    pub now: i64,
    /// Parameters of the reserved `wcu` limit.
    pub wcu: LimitParams,
    /// Item `ttl` = this × the time until the item would be full again.
    pub ttl_multiplier: i64,
}

/// A slow-path plan for one bucket shard.
#[derive(Debug, Clone)]
pub(crate) struct BucketPlan {
    pub write: Write,
    /// Every gated claim fits (and every overdraft claim can be recorded).
    pub fits: bool,
    /// What to report once the write is committed.
    pub admitted: BucketOutcome,
    /// What to report if the request is refused (nothing written).
    pub refused: BucketOutcome,
}

/// `ttl` (epoch s) of an item whose limits are full again after these many ms (`None`
/// among them: never): the multiplier × the longest, or no expiry at all.
pub(crate) fn expiry(
    now: i64,
    multiplier: i64,
    horizons: impl IntoIterator<Item = Option<i64>>,
) -> Option<i64> {
    let mut longest = 0i64;
    for h in horizons {
        longest = longest.max(h?);
    }
    let seconds = longest.div_euclid(1_000) + i64::from(longest.rem_euclid(1_000) > 0);
    Some(now_s(now).saturating_add(multiplier.saturating_mul(seconds)))
}

/// The outcomes of a pass, built claim by claim.
#[derive(Default)]
struct Outcomes {
    fits: bool,
    admitted: SmallVec<[LimitOutcome; 2]>,
    refused: SmallVec<[LimitOutcome; 2]>,
}

impl Outcomes {
    fn new() -> Outcomes {
        Outcomes {
            fits: true,
            ..Outcomes::default()
        }
    }

    /// Takes claim `c` from `before` (the shard's balance refilled to now); returns the
    /// balance after it. A gated claim is taken when the balance covers it; an overdraft
    /// claim always, unless the debt would pass [`MIN_BALANCE`].
    fn take(&mut self, c: &LimitClaim, before: i64, share: ShardShare) -> i64 {
        let covers = before >= c.amount;
        let recordable = c.forced
            && before
                .checked_sub(c.amount)
                .is_some_and(|after| after >= MIN_BALANCE);
        self.fits &= covers || recordable;
        let after = if covers || recordable {
            before - c.amount
        } else {
            before
        };
        let wait_ms = wait_for(before, c.amount, share, c.params.refill_amount);
        self.admitted.push(LimitOutcome {
            fits: covers,
            remaining: after,
            share,
            refill_amount: c.params.refill_amount,
            wait_ms: if covers { Some(0) } else { wait_ms },
        });
        self.refused.push(LimitOutcome {
            fits: covers,
            remaining: before,
            share,
            refill_amount: c.params.refill_amount,
            wait_ms,
        });
        after
    }

    fn into_plan(self, write: Write, key: &BucketKey, count: u32, stamps: Stamps) -> BucketPlan {
        BucketPlan {
            write,
            fits: self.fits,
            admitted: BucketOutcome {
                shard: key.shard,
                shard_count: count,
                stamp: stamps.written,
                limits: self.admitted,
                from_lease: false,
            },
            refused: BucketOutcome {
                shard: key.shard,
                shard_count: count,
                stamp: stamps.read,
                limits: self.refused,
                from_lease: false,
            },
        }
    }
}

/// The item's stamp as read and as the write leaves it.
#[derive(Debug, Clone, Copy)]
struct Stamps {
    read: Stamp,
    written: Stamp,
}

/// How much of a limit's `tc` to fold back (see [`TC_FOLD`]).
fn tc_fold(taken: i64) -> i64 {
    if taken >= TC_FOLD {
        -TC_FOLD
    } else {
        0
    }
}

/// The bound an additive write to a limit carries when its delta was computed from the
/// balance read (`read`) to reach `target` rather than only to take a claim: a refill up to
/// the ceiling, or a clamp down to a smaller share (a doubling, a shard-count raise). Any
/// credit that lands between the read and the write (a lease's return, a refund) raises
/// the balance, and the delta applied on top of it would leave the shard above the share
/// the write assumed; requiring the balance to be no higher than it was read makes that
/// write conflict instead, and be planned again from what it finds. Debits that land
/// meanwhile only lower the balance, which the floor guards. A delta that only takes a
/// claim (no refill, no clamp) needs no bound: a credit before it is bounded by its own
/// ceiling, and the claim then takes from that.
fn assumed_balance(read: i64, target: i64) -> Option<i64> {
    (target != read).then_some(read)
}

/// The `ttl` an update writes: the one computed, never earlier than the one read. A
/// consumption-only retry of an overdraft may have raised the item's `ttl` to cover its
/// debt without moving `rf` (so this update's lock still holds); the store refuses an
/// update whose `ttl` is earlier than the stored one, and this keeps the pass's own `ttl`
/// from being earlier than what it read. `None` (never expires) is the latest of all.
pub(super) fn later_ttl(computed: Option<i64>, read: Option<i64>) -> Option<i64> {
    match (computed, read) {
        (Some(c), Some(r)) => Some(c.max(r)),
        _ => None,
    }
}

/// Plans the slow-path write of bucket `b` on `key` from `image`, sized for `count`
/// shards (or the image's count, if larger).
pub(crate) fn plan_bucket(
    b: &BucketClaim,
    key: &BucketKey,
    image: Option<&BucketItem>,
    count: u32,
    ctx: &PassContext,
) -> BucketPlan {
    match image {
        None => plan_create(b, key, count, None, ctx),
        Some(item) => plan_update(b, key, item, count, ctx),
    }
}

/// The item a create of `b`'s shard writes at `ctx.now`, sized for `count` shards, before
/// any claim is taken: each claimed limit at its share's ceiling, `wcu` full, and the
/// `ttl` the expiry rule gives any balance a gated claim leaves (at least zero, so the
/// time from empty: [`LimitParams::full_again_ms`] counts debt only). What the fast path
/// carries to a store that creates a missing shard and debits it in one step
/// (`BucketStore::debit_or_create`); the item a slow pass creates is this one with its
/// claims taken.
pub(crate) fn seed_item(b: &BucketClaim, count: u32, ctx: &PassContext) -> BucketItem {
    let mut item = BucketItem {
        refilled_at: ctx.now,
        shard_count: count,
        count_raised_at: 0,
        ttl: None,
        limits: Default::default(),
    };
    let mut horizons: SmallVec<[Option<i64>; 3]> = SmallVec::new();
    for c in &b.limits {
        let share = c.params.share(count);
        item.limits
            .insert(c.limit.clone(), LimitState::new(c.params, share.ceiling, 0));
        horizons.push(c.params.full_again_ms(0));
    }
    item.limits
        .insert(WCU_LIMIT, LimitState::new(ctx.wcu, ctx.wcu.capacity, 0));
    horizons.push(ctx.wcu.full_again_ms(0));
    item.ttl = expiry(ctx.now, ctx.ttl_multiplier, horizons);
    item
}

/// The plan for `b`'s missing shard `key` that a raise gave up at `given_up_at` (epoch
/// ms) and whose create may not have landed (`slow.rs`, `split_owner`): created as if
/// empty then and refilled to `ctx.now` at its share, never full on top of its part.
pub(crate) fn plan_given_up(
    b: &BucketClaim,
    key: &BucketKey,
    count: u32,
    given_up_at: i64,
    ctx: &PassContext,
) -> BucketPlan {
    plan_create(b, key, count, Some(given_up_at), ctx)
}

fn plan_create(
    b: &BucketClaim,
    key: &BucketKey,
    count: u32,
    empty_since: Option<i64>,
    ctx: &PassContext,
) -> BucketPlan {
    let mut out = Outcomes::new();
    let mut item = seed_item(b, count, ctx);
    let mut horizons: SmallVec<[Option<i64>; 3]> = SmallVec::new();
    for c in &b.limits {
        let share = c.params.share(count);
        let start = match empty_since {
            Some(t) => refill(0, t, ctx.now, share).0,
            None => share.ceiling,
        };
        let after = out.take(c, start, share);
        item.limits.insert(
            c.limit.clone(),
            LimitState::new(c.params, after, start - after),
        );
        horizons.push(c.params.full_again_ms(after));
    }
    horizons.push(ctx.wcu.full_again_ms(ctx.wcu.capacity));
    item.ttl = expiry(ctx.now, ctx.ttl_multiplier, horizons);
    let stamp = Stamp::of(&item);
    let stamps = Stamps {
        read: stamp,
        written: stamp,
    };
    let write = Write::Create {
        key: key.clone(),
        item,
    };
    out.into_plan(write, key, count, stamps)
}

fn plan_update(
    b: &BucketClaim,
    key: &BucketKey,
    item: &BucketItem,
    count: u32,
    ctx: &PassContext,
) -> BucketPlan {
    let now = ctx.now;
    let count = count.max(item.shard_count);
    let refilled_at = item.refilled_at;
    let mut out = Outcomes::new();
    let mut writes = Vec::new();
    let mut horizons: SmallVec<[Option<i64>; 3]> = SmallVec::new();
    for c in &b.limits {
        let stored = item.limit(&c.limit);
        let claimed = claimed_write(c, stored, refilled_at, count, now, &mut out);
        writes.push(claimed.write);
        horizons.push(claimed.full_again);
    }
    // Limits of this item the request does not name (and `wcu`) are refilled and
    // clamped, so the one write carries every limit's materialisation.
    for (name, st) in item.limits.iter() {
        if b.limits.iter().any(|c| c.limit == name) {
            continue;
        }
        let share = st.params().share(if name == WCU_LIMIT { 1 } else { count });
        let (now_balance, _) = refill(st.balance, refilled_at, now, share);
        let fold = tc_fold(st.taken);
        if now_balance != st.balance || fold != 0 {
            writes.push(LimitWrite::Add {
                limit: Name::new(name),
                balance_delta: now_balance - st.balance,
                taken_delta: fold,
                floor: None,
                cap: assumed_balance(st.balance, now_balance),
                claimed: 0,
            });
        }
        horizons.push(st.params().full_again_ms(now_balance));
    }
    if item.limit(WCU_LIMIT).is_none() {
        writes.push(LimitWrite::Set {
            limit: Name::const_new(WCU_LIMIT),
            state: LimitState::new(ctx.wcu, ctx.wcu.capacity, 0),
            read_tc: None,
            claimed: 0,
        });
        horizons.push(ctx.wcu.full_again_ms(ctx.wcu.capacity));
    }
    let written_refilled_at = now.max(refilled_at);
    let write = Write::Update {
        key: key.clone(),
        expected_refilled_at: refilled_at,
        refilled_at: written_refilled_at,
        ttl: later_ttl(expiry(now, ctx.ttl_multiplier, horizons), item.ttl),
        // Reached only when the split before this pass gave up (the shard kept changing
        // under three tries): the balance is clamped above and the count raised (the
        // store records when, `count_raised_at`), and the indices given up, owned by no
        // shard now, are created later as if empty since this raise (`slow.rs`,
        // `split_owner`): a raise never adds tokens.
        shard_count: (count > item.shard_count).then_some(CountChange {
            read: item.shard_count,
            new: count,
        }),
        limits: writes,
    };
    let stamps = Stamps {
        read: Stamp::of(item),
        written: Stamp {
            refilled_at: written_refilled_at,
            shard_count: count,
        },
    };
    out.into_plan(write, key, count, stamps)
}

/// What one claimed limit adds to an update: its write, and when the shard would be full
/// again after it (for the item's `ttl`).
struct ClaimedWrite {
    write: LimitWrite,
    full_again: Option<i64>,
}

/// The write of claim `c` in an update of a shard read with `stored` for its limit (last
/// refilled at `rf`), sized for `count` shards: an additive take when the limit's
/// parameters are unchanged, else the limit set anew — clamped to its new share when the
/// rule changed, full when it is new to the item.
fn claimed_write(
    c: &LimitClaim,
    stored: Option<&LimitState>,
    refilled_at: i64,
    count: u32,
    now: i64,
    out: &mut Outcomes,
) -> ClaimedWrite {
    let share = c.params.share(count);
    match stored {
        Some(st) if st.params() == c.params => {
            let (before, _) = refill(st.balance, refilled_at, now, share);
            let after = out.take(c, before, share);
            let taken = before - after;
            let tk_delta = after - st.balance;
            // The balance after the write must stay at or above the claim's floor
            // whatever concurrent debits land first: zero for a gated claim, the
            // lowest balance for an overdraft.
            let lowest = if c.forced { MIN_BALANCE } else { 0 };
            // A concurrent gated debit may take what the shard held before ours.
            let lowest_after = if c.forced {
                after.saturating_sub(st.balance.max(0))
            } else {
                after
            };
            ClaimedWrite {
                write: LimitWrite::Add {
                    limit: c.limit.clone(),
                    balance_delta: tk_delta,
                    taken_delta: taken + tc_fold(st.taken),
                    floor: (tk_delta < 0).then(|| lowest - tk_delta),
                    cap: assumed_balance(st.balance, before),
                    claimed: taken,
                },
                full_again: c.params.full_again_ms(lowest_after),
            }
        }
        Some(st) => {
            // The rule changed: keep what the shard held (refilled under the old
            // parameters), clamped to the new share.
            let (old, _) = refill(st.balance, refilled_at, now, st.params().share(count));
            let before = old.min(share.ceiling);
            let after = out.take(c, before, share);
            let taken = st
                .taken
                .saturating_add(tc_fold(st.taken))
                .saturating_add(before - after);
            ClaimedWrite {
                write: LimitWrite::Set {
                    limit: c.limit.clone(),
                    state: LimitState::new(c.params, after, taken),
                    read_tc: Some(st.taken),
                    claimed: before - after,
                },
                full_again: c.params.full_again_ms(after),
            }
        }
        None => {
            let after = out.take(c, share.ceiling, share);
            ClaimedWrite {
                write: LimitWrite::Set {
                    limit: c.limit.clone(),
                    state: LimitState::new(c.params, after, share.ceiling - after),
                    read_tc: None,
                    claimed: share.ceiling - after,
                },
                full_again: c.params.full_again_ms(after),
            }
        }
    }
}

/// The consumption-only retry of bucket `b` after its lock or create race was lost: take
/// every claim from `current` as it stands, without refill (the store checks the gated
/// amounts again). An overdraft claim moves the time the item is full again: its `ttl` is
/// raised to cover the debt (never lowered: another writer may have set it for more).
pub(crate) fn retry_debit(
    b: &BucketClaim,
    key: &BucketKey,
    current: &BucketItem,
    ctx: &PassContext,
) -> Write {
    let debits = b
        .limits
        .iter()
        .map(|c| Debit {
            limit: c.limit.clone(),
            amount: c.amount,
            gated: !c.forced,
            params: None,
        })
        .collect();
    let ttl = if b.limits.iter().any(|c| c.forced) {
        let horizons = current.limits.iter().map(|(name, st)| {
            let lowest = match b.limits.iter().find(|c| c.limit == name) {
                // Concurrent gated debits may take what it holds first.
                Some(c) if c.forced => st.balance.min(0).saturating_sub(c.amount),
                Some(c) => st.balance - c.amount,
                None => st.balance,
            };
            st.params().full_again_ms(lowest)
        });
        match (expiry(ctx.now, ctx.ttl_multiplier, horizons), current.ttl) {
            (Some(new), Some(old)) if new > old => Some(new),
            _ => None,
        }
    } else {
        None
    };
    Write::Debit {
        key: key.clone(),
        debits,
        ttl,
    }
}

#[cfg(test)]
mod tests;

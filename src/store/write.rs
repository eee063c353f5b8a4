//! What the engine asks a store to write: a debit of one item (the fast path's and the
//! consumption-only retry's, [`Debit`] in a [`DebitMode`], with the [`Seed`] of the item a
//! fast debit may create where there is none), and the writes of an atomic
//! commit (creates and locked updates, [`Write`], each limit's [`LimitWrite`]), with what
//! each comes back as. Shapes and their conditions only: each store applies them.

use super::{BucketItem, BucketKey, LimitParams, LimitState, Name};

/// One limit's part of a debit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Debit {
    pub limit: Name,
    /// Millitokens to subtract (and add to `tc`).
    pub amount: i64,
    /// When true the debit requires `tk >= amount`; when false it may drive `tk` negative,
    /// down to [`MIN_BALANCE`](super::MIN_BALANCE) (it requires `tk >= MIN_BALANCE + amount`).
    pub gated: bool,
    /// Fast path only: the stored parameters must equal these (after a config change the
    /// first request on each shard falls to the slow path, which rewrites them).
    pub params: Option<LimitParams>,
}

/// Which conditions a debit carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DebitMode {
    /// The fast path: the item exists, is not expired (`ttl > now_s`), holds exactly this
    /// shard count (its balances were sized for the count the shard was drawn under),
    /// every named limit exists with exactly the given parameters and covers its gated
    /// amount, and the `wcu` limit holds at least one token, which is debited too.
    Fast { now_s: i64, shard_count: u32 },
    /// The consumption-only retry after a lost lock or create race: the item exists and
    /// every gated amount is covered. No `wcu`, no parameter or expiry terms.
    RetryOnly,
}

/// Builds the item a debit may create where its key holds none (see
/// [`BucketStore::debit_or_create`](super::BucketStore::debit_or_create)): a closure, so a
/// store that finds the item never pays for building one.
pub type Seed<'a> = dyn Fn() -> BucketItem + Sync + 'a;

/// Result of a debit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DebitOutcome {
    /// Applied; the item as it is after the write.
    Applied(BucketItem),
    /// A condition failed; the item as it was (`None`: no such item). Nothing written.
    Refused(Option<BucketItem>),
}

/// What a slow-path commit does to one limit of an existing item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitWrite {
    /// Additive change, commutative with concurrent debits.
    Add {
        limit: Name,
        balance_delta: i64,
        taken_delta: i64,
        /// Require `balance >= floor` (the debit still fits after concurrent debits).
        floor: Option<i64>,
        /// Require `balance <= cap` (no credit landed since the read that a refill would stack on).
        cap: Option<i64>,
        /// Millitokens of `balance_delta` that the request takes (the rest refills or clamps):
        /// what a store that cannot commit several items atomically gives back, as a
        /// credit, when the commit fails on another item (a Redis Cluster, `redis/spread.rs`).
        claimed: i64,
    },
    /// Seeds a limit the item lacks, or rewrites one whose parameters changed. A server
    /// still on the old parameters may debit that limit by the fast path meanwhile, so the
    /// write requires the limit as it was read: `read_tc` is the `tc` it held (any debit
    /// since has moved it), `None` when the item had no such limit (it must still have
    /// none). Nothing is ever overwritten.
    Set {
        limit: Name,
        state: LimitState,
        read_tc: Option<i64>,
        /// Millitokens of `state.balance` the request took (see [`LimitWrite::Add`]'s).
        claimed: i64,
    },
}

impl LimitWrite {
    pub fn limit(&self) -> &str {
        match self {
            LimitWrite::Add { limit, .. } | LimitWrite::Set { limit, .. } => limit,
        }
    }
}

/// One item of an atomic commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Write {
    /// Create the item if it does not exist (`attribute_not_exists(PK)`).
    Create { key: BucketKey, item: BucketItem },
    /// Update an existing item under the optimistic lock `refilled_at == expected_refilled_at`; `ttl` is
    /// set (`None`: removed, the item never expires), on condition that the stored `ttl`
    /// is not later than it: an item's expiry only ever moves later (a consumption-only
    /// retry raises it without moving `rf`, and an update planned before must not lower
    /// it again).
    Update {
        key: BucketKey,
        expected_refilled_at: i64,
        refilled_at: i64,
        ttl: Option<i64>,
        /// Raise the item's shard count, on condition that it still holds the count read
        /// (another doubling since would otherwise be undone).
        shard_count: Option<CountChange>,
        limits: Vec<LimitWrite>,
    },
    /// A consumption-only retry debit (see [`DebitMode::RetryOnly`]); `ttl`, when set, is
    /// written too (a debit into debt moves the time the item is full again).
    Debit {
        key: BucketKey,
        debits: Vec<Debit>,
        ttl: Option<i64>,
    },
}

/// A shard count an update moves from what it read to a larger one: how a bucket doubles
/// (on shard 0, the source of truth) and how the new count reaches the other shards, in
/// the same write that clamps each balance to the new, smaller share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CountChange {
    pub read: u32,
    pub new: u32,
}

impl Write {
    pub fn key(&self) -> &BucketKey {
        match self {
            Write::Create { key, .. } | Write::Update { key, .. } | Write::Debit { key, .. } => key,
        }
    }
}

/// Result of an atomic commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitOutcome {
    /// Every write applied.
    Committed,
    /// Nothing applied: these writes' conditions failed, with each item as it is now.
    Conflict(Vec<(usize, Option<BucketItem>)>),
}

//! The bucket store contract: conditional primitives shaped after DynamoDB's conditional
//! writes, so the engine's one algorithm runs unchanged on every store.
//!
//! A store keeps bucket items and applies exactly the conditions described here,
//! atomically per call. It makes no limiting decision: it never refills, never chooses a
//! shard, never decides admission. `memory.rs` is the embedded default.

pub mod breaker;
pub mod calls;
pub mod detached;
#[cfg(feature = "dynamodb")]
pub mod dynamodb;
mod inspect;
mod item;
pub mod key;
pub mod memory;
pub mod metered;
#[cfg(feature = "redis")]
pub mod redis;

use std::future::Future;

use thiserror::Error;

pub use inspect::{inspect, InspectedShard};
pub use item::{
    BucketItem, BucketKey, LimitParams, LimitState, Limits, Name, ShardShare, MAX_SHARD_COUNT,
    MILLI, MIN_BALANCE, WCU_LIMIT,
};

use crate::support::text::quote;

/// One limit's part of a debit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Debit {
    pub limit: Name,
    /// Millitokens to subtract (and add to `tc`).
    pub amount: i64,
    /// When true the debit requires `tk >= amount`; when false it may drive `tk` negative,
    /// down to [`MIN_BALANCE`] (it requires `tk >= MIN_BALANCE + amount`).
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

/// Errors a store reports. They carry the bucket they concern where there is one (shown
/// elided: a key holds request values).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The store itself failed: a timeout, a 5xx, throttling of the whole table or account,
    /// a connection that could not be made or broke. The only kind that counts towards the
    /// circuit breaker.
    #[error("store unavailable for {}: {reason}", quote(key))]
    Unavailable { key: String, reason: String },
    /// The circuit breaker failed the call without trying the store (it failed
    /// repeatedly; a probe will try again shortly).
    #[error(
        "store unavailable for {}: circuit open after repeated failures, probing again shortly",
        quote(key)
    )]
    CircuitOpen { key: String },
    #[error("corrupt bucket item {}: {reason}", quote(key))]
    Corrupt { key: String, reason: String },
    /// The store refused this request's key or item (too long, too large, malformed): the
    /// request's own error, never the store's.
    #[error("invalid store request for {}: {reason}", quote(key))]
    Invalid { key: String, reason: String },
    /// A write kept losing to concurrent transactions on its item: the bucket is busy,
    /// the store is not failing.
    #[error(
        "contention on {}: the item is busy with concurrent transactions",
        quote(key)
    )]
    Contention { key: String },
    /// The store refused a call for the rate of requests on this item's partition (a hot
    /// bucket): the bucket's own contention, answered for that bucket alone, never an
    /// outage for every tenant. The key is the engine's, so the answer names the bucket
    /// even when the call carried several.
    #[error(
        "throttled on {}: its partition takes more requests than it absorbs",
        quote(&key.to_string())
    )]
    Throttled { key: BucketKey },
    /// The call was not sent: too many calls whose callers gave up are still running
    /// (`detached.rs`), a sign that the store answers slower than callers wait.
    #[error(
        "store call for {} not sent: {abandoned} calls whose callers gave up are still running",
        quote(key)
    )]
    Shed { key: String, abandoned: usize },
}

impl StoreError {
    /// Whether the store itself failed (what a circuit breaker counts). A refusal of one
    /// request's key, a corrupt item, contention or throttling on one bucket is not an
    /// outage; a call never sent (shed) proves nothing either way.
    pub fn is_fault(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }

    /// The error's class, as the store-call metrics label it.
    pub fn class(&self) -> &'static str {
        match self {
            StoreError::Unavailable { .. } => "error",
            StoreError::CircuitOpen { .. } => "circuit_open",
            StoreError::Corrupt { .. } => "corrupt",
            StoreError::Invalid { .. } => "invalid",
            StoreError::Contention { .. } => "contention",
            StoreError::Throttled { .. } => "throttled",
            StoreError::Shed { .. } => "shed",
        }
    }
}

/// How long one store call may take by default (`--store-timeout`), and the deadline of a
/// caller that sets none: long enough for what a cold or briefly slow store needs
/// (credentials, a first TLS connection, the SDK's retries) to finish rather than fail as
/// an outage, short enough that a hung store opens the circuit within about a second and
/// a caller without a deadline of its own waits no longer. A caller with a deadline
/// (Envoy sends one) is answered within it whatever this is.
pub const DEFAULT_STORE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// Most items one commit may carry (DynamoDB's transaction limit).
pub const MAX_COMMIT_ITEMS: usize = 100;

/// The store contract. Every method is atomic on its own; see each type for the exact
/// conditions.
pub trait BucketStore: Send + Sync + 'static {
    /// Fast path or consumption-only retry on one item.
    fn debit(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
    ) -> impl Future<Output = Result<DebitOutcome, StoreError>> + Send;

    /// Images of several items in one call (`None` for a missing item), in key order.
    fn read(
        &self,
        keys: &[BucketKey],
    ) -> impl Future<Output = Result<Vec<Option<BucketItem>>, StoreError>> + Send;

    /// Up to [`MAX_COMMIT_ITEMS`] writes, all or nothing.
    fn commit(
        &self,
        writes: &[Write],
    ) -> impl Future<Output = Result<CommitOutcome, StoreError>> + Send;

    /// Gives millitokens back (best effort; see [`Credit`]), only while the item meets
    /// `guard`. A refund of voided debits requires the stamp the debit's image showed: a
    /// slow pass since then refilled from that baseline, which may already have given the
    /// voided tokens back (the clamp at the ceiling had removed them), and a refund on
    /// top would mint them; a doubling since shrank the share the ceilings were computed
    /// for. A lease's return requires the shard count only. Returns the credits applied.
    fn credit(
        &self,
        key: &BucketKey,
        guard: CreditGuard,
        credits: &[Credit],
    ) -> impl Future<Output = Result<Vec<Credit>, StoreError>> + Send;
}

//! The bucket store contract: conditional primitives shaped after DynamoDB's conditional
//! writes, so the engine's one algorithm runs unchanged on every store.
//!
//! A store keeps bucket items and applies exactly the conditions described here,
//! atomically per call. It makes no limiting decision: it never refills, never chooses a
//! shard, never decides admission. `memory.rs` is the embedded default.

pub mod breaker;
pub mod detached;
pub mod dynamodb;
pub mod key;
pub mod memory;
pub mod metered;

use std::future::Future;

use compact_str::CompactString;
use smallvec::SmallVec;
use thiserror::Error;

use crate::engine::LimitParams;
use crate::text::quote;

/// The name of the reserved limit that measures a shard's write pressure.
pub const WCU_LIMIT: &str = "wcu";

/// A name of the request path (entity, resource, limit name): held inline up to 24 bytes,
/// so keys and items of ordinary names are copied without touching the heap.
pub type Name = CompactString;

/// Address of one bucket item: one shard of one (entity, resource).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BucketKey {
    pub entity: Name,
    pub resource: Name,
    pub shard: u32,
}

impl BucketKey {
    pub fn new(entity: impl AsRef<str>, resource: impl AsRef<str>, shard: u32) -> BucketKey {
        BucketKey {
            entity: Name::new(entity.as_ref()),
            resource: Name::new(resource.as_ref()),
            shard,
        }
    }

    /// The same bucket, another shard.
    pub fn with_shard(&self, shard: u32) -> BucketKey {
        BucketKey {
            shard,
            ..self.clone()
        }
    }
}

impl std::fmt::Display for BucketKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}#{}", self.entity, self.resource, self.shard)
    }
}

/// State of one limit on an item (`b_{limit}_*` on DynamoDB): balance and consumed
/// counter in millitokens, parameters undivided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimitState {
    pub tk: i64,
    pub cp: i64,
    pub ra: i64,
    pub rp: i64,
    pub tc: i64,
}

impl LimitState {
    /// A limit with these parameters holding `tk`, having consumed `tc`.
    pub fn new(params: LimitParams, tk: i64, tc: i64) -> LimitState {
        LimitState {
            tk,
            cp: params.cp,
            ra: params.ra,
            rp: params.rp,
            tc,
        }
    }

    pub fn params(&self) -> LimitParams {
        LimitParams {
            cp: self.cp,
            ra: self.ra,
            rp: self.rp,
        }
    }
}

/// The limits of one item by name, in name order. Two (one limit and `wcu`, the common
/// item) are held inline, so copying an image costs no allocation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Limits(SmallVec<[(Name, LimitState); 2]>);

impl Limits {
    pub fn new() -> Limits {
        Limits::default()
    }

    fn position(&self, name: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(n, _)| n.as_str().cmp(name))
    }

    pub fn get(&self, name: &str) -> Option<&LimitState> {
        self.position(name).ok().map(|i| &self.0[i].1)
    }

    pub fn get_mut(&mut self, name: &str) -> Option<&mut LimitState> {
        self.position(name).ok().map(|i| &mut self.0[i].1)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.position(name).is_ok()
    }

    /// Sets `name` to `state`; returns the state it replaces.
    pub fn insert(&mut self, name: impl AsRef<str>, state: LimitState) -> Option<LimitState> {
        let name = name.as_ref();
        match self.position(name) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, state)),
            Err(i) => {
                self.0.insert(i, (Name::new(name), state));
                None
            }
        }
    }

    /// `(name, state)` in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &LimitState)> {
        self.0.iter().map(|(n, s)| (n.as_str(), s))
    }

    pub fn values(&self) -> impl Iterator<Item = &LimitState> + '_ {
        self.0.iter().map(|(_, s)| s)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::ops::Index<&str> for Limits {
    type Output = LimitState;

    /// The named limit; panics when there is none (as a map's index does).
    fn index(&self, name: &str) -> &LimitState {
        self.get(name)
            .unwrap_or_else(|| panic!("no limit named '{name}' on this item"))
    }
}

impl<N: AsRef<str>> FromIterator<(N, LimitState)> for Limits {
    fn from_iter<I: IntoIterator<Item = (N, LimitState)>>(iter: I) -> Limits {
        let mut limits = Limits::new();
        for (n, s) in iter {
            limits.insert(n, s);
        }
        limits
    }
}

/// One bucket item: every limit of one (entity, resource) shard, the refill baseline and
/// lock `rf` (epoch ms), the shard count it knows, and its expiry `ttl` (epoch s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketItem {
    pub rf: i64,
    pub shard_count: u32,
    pub ttl: Option<i64>,
    pub limits: Limits,
}

impl BucketItem {
    pub fn limit(&self, name: &str) -> Option<&LimitState> {
        self.limits.get(name)
    }
}

/// The lowest balance a stored limit may hold (millitokens): a debit that would take it
/// lower is refused even when it may go into debt. Debts that deep never repay in any
/// useful time, and the bound keeps every balance, delta and sum inside `i64` on every
/// store alike (DynamoDB's numbers have 38 digits; ours must decode).
pub const MIN_BALANCE: i64 = -(1 << 62);

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
        tk_delta: i64,
        tc_delta: i64,
        /// Require `tk >= floor` (the debit still fits after concurrent debits).
        floor: Option<i64>,
        /// Require `tk <= cap` (no credit landed since the read that a refill would stack on).
        cap: Option<i64>,
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
    /// Update an existing item under the optimistic lock `rf == expected_rf`; `ttl` is
    /// set (`None`: removed, the item never expires).
    Update {
        key: BucketKey,
        expected_rf: i64,
        rf: i64,
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
    pub rf: i64,
    pub shard_count: u32,
}

impl Stamp {
    /// The stamp of `item` as it is.
    pub fn of(item: &BucketItem) -> Stamp {
        Stamp {
            rf: item.rf,
            shard_count: item.shard_count,
        }
    }
}

/// A refund of millitokens a voided debit took: applied only while `tk + amount <=
/// ceiling`, so a refund can never lift a shard above its share, and only while the item
/// has not been refilled or doubled since the debit (see [`BucketStore::credit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credit {
    pub limit: Name,
    pub amount: i64,
    pub ceiling: i64,
}

/// Errors a store reports. They carry the bucket they concern where there is one (shown
/// elided: a key holds request values).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum StoreError {
    /// The store itself failed: a timeout, a 5xx, throttling, a connection that could not
    /// be made or broke. The only kind that counts towards the circuit breaker.
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
}

impl StoreError {
    /// Whether the store itself failed (what a circuit breaker counts). A refusal of one
    /// request's key, a corrupt item or contention on one bucket is not an outage.
    pub fn is_fault(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
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

    /// Refund voided debits (best effort; see [`Credit`]), only while the item still
    /// bears `stamp`, the one the debit's image showed: a slow pass since then refilled
    /// from that baseline, which may already have given the voided tokens back (the clamp
    /// at the ceiling had removed them), and a refund on top would mint them; a doubling
    /// since shrank the share the ceilings were computed for. Returns the credits applied.
    fn credit(
        &self,
        key: &BucketKey,
        stamp: Stamp,
        credits: &[Credit],
    ) -> impl Future<Output = Result<Vec<Credit>, StoreError>> + Send;
}

/// Every shard of one bucket, as `(shard, image)` for shards `0..count`, where `count` is
/// the largest shard count any existing shard records (shard 0 is the source of truth,
/// but a shard created later may know more). Used by `shardgate inspect`.
pub async fn inspect<S: BucketStore>(
    store: &S,
    entity: &str,
    resource: &str,
) -> Result<Vec<(u32, Option<BucketItem>)>, StoreError> {
    let mut count = 1;
    let mut shards = Vec::new();
    let mut next = 0;
    while next < count {
        let keys: Vec<BucketKey> = (next..count)
            .map(|s| BucketKey::new(entity, resource, s))
            .collect();
        let images = store.read(&keys).await?;
        for (key, image) in keys.into_iter().zip(images) {
            if let Some(i) = &image {
                count = count.max(i.shard_count.min(crate::engine::MAX_SHARD_COUNT));
            }
            shards.push((key.shard, image));
        }
        next = shards.len() as u32;
    }
    Ok(shards)
}

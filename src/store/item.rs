//! What a store holds: bucket items, their keys and their units. The contract's calls
//! (`mod.rs`) read and write these; the engine decides with them. The format belongs
//! here, with the stores, so that no store depends on the engine: amounts are integer
//! millitokens, times epoch milliseconds (`ttl`: seconds), parameters undivided by the
//! shard count.

use compact_str::CompactString;
use smallvec::SmallVec;

/// Tokens are stored and computed in thousandths.
pub const MILLI: i64 = 1_000;

/// Most shards one bucket is spread over (and the largest count an item records that a
/// reader believes).
pub const MAX_SHARD_COUNT: u32 = 32;

/// Parameters of one limit as stored on a bucket item: capacity and refill amount in
/// millitokens (undivided by the shard count), refill period in milliseconds. The
/// token-bucket arithmetic on them is the engine's (`engine/bucket.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LimitParams {
    /// Most millitokens the bucket holds (stored `cp`).
    pub capacity: i64,
    /// Millitokens added per refill period (stored `ra`).
    pub refill_amount: i64,
    /// The refill period in milliseconds (stored `rp`).
    pub refill_period_ms: i64,
}

/// The view one shard has of a limit: its ceiling and refill rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardShare {
    /// Most millitokens this shard may hold.
    pub ceiling: i64,
    /// Millitokens added per `refill_period_ms` on this shard.
    pub refill_amount: i64,
    pub refill_period_ms: i64,
}

impl LimitParams {
    /// The share of one of `shard_count` shards: capacity and rate divided, period not.
    /// Part of the format (a shard `s` of `S` holds at most `cp / S`), so the engine's
    /// refill and the memory store's bound read one definition.
    #[inline]
    pub fn share(&self, shard_count: u32) -> ShardShare {
        if shard_count <= 1 {
            // Most buckets have one shard: spare the two divisions.
            return ShardShare {
                ceiling: self.capacity,
                refill_amount: self.refill_amount,
                refill_period_ms: self.refill_period_ms,
            };
        }
        let s = i64::from(shard_count);
        ShardShare {
            ceiling: self.capacity / s,
            refill_amount: self.refill_amount / s,
            refill_period_ms: self.refill_period_ms,
        }
    }

    /// Whether a shard of `shard_count` holding `tk` at refill baseline `rf` (epoch ms)
    /// holds its whole share at `now` (epoch ms) once the elapsed time is counted: the
    /// state in which the item is the same as no item, since the engine creates a missing
    /// shard full. Stated from the format alone (the engine's lazy refill adds
    /// `⌊elapsed × ra / rp⌋` up to the ceiling; `engine/bucket.rs` checks that both
    /// agree), so a store can tell without the engine.
    pub fn refilled_full(&self, tk: i64, rf: i64, now: i64, shard_count: u32) -> bool {
        let share = self.share(shard_count);
        if tk >= share.ceiling {
            return true;
        }
        let elapsed = now.saturating_sub(rf);
        if elapsed <= 0 || share.refill_amount <= 0 || share.refill_period_ms <= 0 {
            return false;
        }
        // ⌊elapsed × ra / rp⌋ ≥ missing  ⇔  elapsed × ra ≥ missing × rp (rp > 0).
        let missing = i128::from(share.ceiling) - i128::from(tk);
        i128::from(elapsed) * i128::from(share.refill_amount)
            >= missing * i128::from(share.refill_period_ms)
    }
}

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
    /// Millitokens held (stored `tk`); below zero only after an overdraft.
    pub balance: i64,
    /// The limit's parameters (stored `cp`, `ra`, `rp`; see [`LimitParams`]).
    pub capacity: i64,
    pub refill_amount: i64,
    pub refill_period_ms: i64,
    /// Millitokens taken since the item was created, folded back near overflow (stored
    /// `tc`): what a condition on "nothing debited since" compares.
    pub taken: i64,
}

impl LimitState {
    /// A limit with these parameters holding `tk`, having consumed `tc`.
    pub fn new(params: LimitParams, tk: i64, tc: i64) -> LimitState {
        LimitState {
            balance: tk,
            capacity: params.capacity,
            refill_amount: params.refill_amount,
            refill_period_ms: params.refill_period_ms,
            taken: tc,
        }
    }

    pub fn params(&self) -> LimitParams {
        LimitParams {
            capacity: self.capacity,
            refill_amount: self.refill_amount,
            refill_period_ms: self.refill_period_ms,
        }
    }
}

/// The limits of one item by name, in name order. Two (one limit and `wcu`, the common
/// item) are held inline, so copying an image costs no allocation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Limits(pub(super) SmallVec<[(Name, LimitState); 2]>);

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
    /// When the item's limits were last refilled, epoch ms (stored `rf`): the baseline
    /// of every refill and the slow path's optimistic lock.
    pub refilled_at: i64,
    pub shard_count: u32,
    /// When an update last raised `shard_count`, epoch ms (stored `sa`); 0: never (an
    /// item created at its count, or written before the field). A raise hands indices to
    /// shards its commit creates; on a store that commits item by item (a Redis Cluster)
    /// a reader may find such a shard missing before its create lands, and must not take
    /// it for one that expired full: it creates it as if empty at this time, refilled
    /// since (`engine/acquire/slow.rs`). A store may keep it rounded later, never
    /// earlier (the memory store: to whole minutes before `rf`).
    pub count_raised_at: i64,
    pub ttl: Option<i64>,
    pub limits: Limits,
}

impl BucketItem {
    pub fn limit(&self, name: &str) -> Option<&LimitState> {
        self.limits.get(name)
    }
}

/// A stored shard count (`field` as the store names it) as a reader takes it: within
/// 1..=[`MAX_SHARD_COUNT`], else the reason the item is corrupt. Work per request grows
/// with the count (draws, a doubling's read of every shard), so a count no bucket can
/// have is refused, never clamped: every conditional write carries the count it read, so
/// a clamped count would fail against the item for ever, silently.
pub fn stored_shard_count(field: &str, stored: i64) -> Result<u32, String> {
    u32::try_from(stored)
        .ok()
        .filter(|c| (1..=MAX_SHARD_COUNT).contains(c))
        .ok_or_else(|| format!("'{field}' is {stored}, not within 1..={MAX_SHARD_COUNT}"))
}

/// [`validate_stored`] on what a decoder found (`None`: no item): the item, or the reason
/// it is corrupt.
pub fn checked_stored(item: Option<BucketItem>) -> Result<Option<BucketItem>, String> {
    if let Some(item) = &item {
        validate_stored(item)?;
    }
    Ok(item)
}

/// The one check of a decoded item that every store's decoder makes (memory, DynamoDB,
/// Redis) before the engine sees it: a shard count within 1..=[`MAX_SHARD_COUNT`], and
/// every limit's parameters ones the engine can work with (a refill period of at least
/// 1 ms, a capacity and a refill amount not below zero). Shardgate never writes anything
/// else; another writer (a manual `HSET`, a foreign tool, corruption) may. The error is
/// the reason the item is corrupt: that bucket's error ([`StoreError::Corrupt`]), never
/// the store's, and never work that grows with a number read from the store.
///
/// [`StoreError::Corrupt`]: super::StoreError::Corrupt
pub fn validate_stored(item: &BucketItem) -> Result<(), String> {
    stored_shard_count("shard count", i64::from(item.shard_count))?;
    // Written as the `rf` of the update that raised the count, which later refills only
    // move on: a raise after `rf` would hold every shard it gave up empty for ever.
    if !(0..=item.refilled_at.max(0)).contains(&item.count_raised_at) {
        return Err(format!(
            "count raised at {} with rf {}",
            item.count_raised_at, item.refilled_at
        ));
    }
    for (name, limit) in item.limits.iter() {
        validate_stored_limit(name, &limit.params())?;
    }
    Ok(())
}

/// The part of [`validate_stored`] on one limit's parameters (the memory store checks its
/// compact items with it, without building an image).
pub fn validate_stored_limit(name: &str, params: &LimitParams) -> Result<(), String> {
    if params.refill_period_ms <= 0 {
        return Err(format!(
            "limit '{name}' has refill period {}",
            params.refill_period_ms
        ));
    }
    if params.capacity < 0 || params.refill_amount < 0 {
        return Err(format!(
            "limit '{name}' has capacity {} and refill amount {}, not both at least 0",
            params.capacity, params.refill_amount
        ));
    }
    Ok(())
}

/// The lowest balance a stored limit may hold (millitokens): a debit that would take it
/// lower is refused even when it may go into debt. Debts that deep never repay in any
/// useful time, and the bound keeps every balance, delta and sum inside `i64` on every
/// store alike (DynamoDB's numbers have 38 digits; ours must decode).
pub const MIN_BALANCE: i64 = -(1 << 62);

#[cfg(test)]
mod tests {
    use super::*;

    fn item(shard_count: u32, rp: i64, cp: i64) -> BucketItem {
        let params = LimitParams {
            capacity: cp,
            refill_amount: 1_000,
            refill_period_ms: rp,
        };
        BucketItem {
            refilled_at: 1,
            shard_count,
            count_raised_at: 0,
            ttl: None,
            limits: [("rpm", LimitState::new(params, 0, 0))]
                .into_iter()
                .collect(),
        }
    }

    #[test]
    fn a_stored_item_is_checked_once_for_every_store() {
        for ok in [1, 2, 32] {
            assert_eq!(validate_stored(&item(ok, 60_000, 5_000)), Ok(()));
        }
        for bad in [0, 33, u32::MAX] {
            assert_eq!(
                validate_stored(&item(bad, 60_000, 5_000)).unwrap_err(),
                format!("'shard count' is {bad}, not within 1..=32")
            );
        }
        assert_eq!(
            validate_stored(&item(1, 0, 5_000)).unwrap_err(),
            "limit 'rpm' has refill period 0"
        );
        assert_eq!(
            validate_stored(&item(1, -5, 5_000)).unwrap_err(),
            "limit 'rpm' has refill period -5"
        );
        assert!(validate_stored(&item(1, 60_000, -1))
            .unwrap_err()
            .contains("capacity -1"));
    }

    #[test]
    fn a_stored_shard_count_is_taken_only_within_what_a_bucket_can_have() {
        assert_eq!(stored_shard_count("sc", 1), Ok(1));
        assert_eq!(stored_shard_count("sc", 32), Ok(32));
        for bad in [0, -1, 33, 4_294_967_295, 1 << 40] {
            assert_eq!(
                stored_shard_count("sc", bad).unwrap_err(),
                format!("'sc' is {bad}, not within 1..=32")
            );
        }
    }
}

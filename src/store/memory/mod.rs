//! The embedded store: bucket items in process memory, with exactly the conditional
//! semantics of the store contract (the same conditions DynamoDB evaluates).
//!
//! Items live in a fixed number of independently locked partitions so concurrent requests
//! on different buckets do not contend; a commit locks the partitions it touches in index
//! order (no deadlock). Locks are held only for the in-memory check-and-apply, never
//! across an await. Expired items are evicted by [`MemoryStore::evict_expired`].
//!
//! Items are kept in a compact form (`slot.rs`), because an idle bucket's footprint is
//! what bounds how many keys one process can hold: each partition (`partition.rs`) maps a
//! resource to its items by (entity, shard), so the resource name is stored once per
//! partition, and the limit names and parameters an item carries (which config decides)
//! are one shared [`Shape`], leaving only balances, `rf`, `ttl` and the shard count per
//! item. Images handed to the engine are rebuilt from that form; the contract's types
//! never see it. This file holds the conditions and their application.
//!
//! It refuses what DynamoDB would refuse (`key.rs`: a key or an item too large), so a
//! test on this store sees what a fleet would.
//!
//! Bound. Nothing outside the process bounds how many buckets clients make (one per
//! client address on a rule keyed by it, and an item lives seven times its time to full:
//! a week on a `day` rule), so the store holds at most `max_bytes` of items, each charged
//! an upper bound of what it takes (`partition.rs`). Each partition enforces its 64th of
//! the bound when it writes a new item, so the bound holds at every instant, not only
//! after the periodic expiry sweep; a write that would pass it first evicts, in one pass
//! over that partition, the items ranked lowest: full ones first (the same as no item),
//! then the least recently used (`bound.rs`). Bytes, not items, because a long entity
//! (up to a kilobyte) costs several times a short one. Partitions are chosen by a seeded
//! hash, so they fill evenly and none evicts much before the store as a whole is full.
//! The pass holds the partition's lock as the expiry sweep does, and frees at least a
//! thirty-second of the partition's budget, so it runs about once per that many new items.

use std::collections::BTreeSet;
use std::hash::BuildHasher;
use std::sync::atomic::Ordering;
use std::sync::{Arc, LazyLock};

use parking_lot::{Mutex, MutexGuard};

use hashbrown::HashSet;
use thiserror::Error;

use super::key::{check_commit, check_item, check_key, check_once};
use super::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Credit, CreditGuard, Debit, DebitMode,
    DebitOutcome, Limits, Name, Seed, StoreError, Write,
};
use crate::store::item::{stored_shard_count, validate_stored_limit};

mod bound;
mod conditions;
mod partition;
mod slot;
mod table;

use bound::{Clock, Evicted, Evictions};
use conditions::{apply_debit, apply_update, debit_allowed};
use partition::Partition;
use slot::{Balance, CompactItem, Shape, ShapeOf, NO_TTL};
use table::Hasher;

const PARTITIONS: usize = 64;

/// The bound a store holds by default (`--memory-max-bytes`): what a small pod can give
/// the items besides the process itself.
pub const DEFAULT_MAX_BYTES: u64 = 256 << 20;

/// The least bound a store accepts: each partition must hold a few of the largest items
/// (an entity of a kilobyte) and what one request writes there.
pub const MIN_MAX_BYTES: u64 = 1 << 20;

/// A bound too small for the store to work with.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("a memory store bound of {max_bytes} bytes is below the least it works with, {MIN_MAX_BYTES} bytes (1 MiB)")]
pub struct BoundTooSmall {
    pub max_bytes: u64,
}

/// What the store holds and what its bound removed, since it started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStats {
    /// Items held.
    pub items: u64,
    /// Bytes they are charged against the bound.
    pub bytes: u64,
    /// The bound.
    pub max_bytes: u64,
    /// Items evicted to make room that were the same as no item (every limit full).
    pub evicted_full: u64,
    /// Items evicted to make room while still in use: each is re-created full.
    pub evicted_active: u64,
    /// Items dropped by the expiry sweep.
    pub expired: u64,
}

/// Chooses a key's partition; seeded once, independently of the partitions' own maps.
static PARTITION_HASH: LazyLock<Hasher> = LazyLock::new(Hasher::default);

/// In-process bucket store.
#[derive(Debug)]
pub struct MemoryStore {
    partitions: Vec<Mutex<Partition>>,
    /// Every shape some item holds (and, until the next eviction pass, shapes no item
    /// holds any more). Taken after a partition lock, never before one.
    shapes: Mutex<HashSet<Arc<Shape>, Hasher>>,
    /// The latest time a caller gave: what items are ranked at and marked with.
    clock: Clock,
    evictions: Evictions,
    max_bytes: u64,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

/// The check every store's decoder makes (`store::validate_stored`), on a held item
/// before any condition is evaluated on it or its image is handed out: an item placed
/// past the contract (`put`, or a create by another writer) that no bucket can have is
/// that bucket's corrupt item. Made on the compact form (a few comparisons, no image).
fn check_held(key: &BucketKey, slot: &CompactItem) -> Result<(), StoreError> {
    let corrupt = |reason| StoreError::Corrupt {
        key: key.to_string(),
        reason,
        source: None,
    };
    stored_shard_count("shard count", i64::from(slot.shard_count)).map_err(corrupt)?;
    for (name, params) in slot.shape.limits() {
        validate_stored_limit(name, &params).map_err(corrupt)?;
    }
    Ok(())
}

/// The image of a held item, checked ([`check_held`]).
fn image_of(key: &BucketKey, slot: &CompactItem) -> Result<BucketItem, StoreError> {
    check_held(key, slot)?;
    Ok(slot.image())
}

fn partition_of(key: &BucketKey) -> usize {
    (PARTITION_HASH.hash_one(key) as usize) % PARTITIONS
}

impl MemoryStore {
    /// A store under the default bound ([`DEFAULT_MAX_BYTES`]).
    #[expect(clippy::expect_used, reason = "the default bound is valid")]
    pub fn new() -> MemoryStore {
        MemoryStore::with_max_bytes(DEFAULT_MAX_BYTES).expect("the default bound is valid")
    }

    /// A store holding at most `max_bytes` of items (see the module comment).
    pub fn with_max_bytes(max_bytes: u64) -> Result<MemoryStore, BoundTooSmall> {
        if max_bytes < MIN_MAX_BYTES {
            return Err(BoundTooSmall { max_bytes });
        }
        let budget = usize::try_from(max_bytes / PARTITIONS as u64).unwrap_or(usize::MAX);
        Ok(MemoryStore {
            partitions: (0..PARTITIONS)
                .map(|_| Mutex::new(Partition::new(budget)))
                .collect(),
            shapes: Mutex::new(HashSet::default()),
            clock: Clock::default(),
            evictions: Evictions::default(),
            max_bytes,
        })
    }

    fn part(&self, key: &BucketKey) -> MutexGuard<'_, Partition> {
        self.partitions[partition_of(key)].lock()
    }

    /// The compact form of `item`, marked as used now; `like` is a shape to reuse when
    /// it fits (an update seldom changes names or parameters), sparing the interner's lock.
    fn slot(&self, item: &BucketItem, like: Option<&Arc<Shape>>) -> CompactItem {
        let shape = match like {
            Some(s) if s.describes(&item.limits) => s.clone(),
            _ => self.intern(&item.limits),
        };
        CompactItem {
            refilled_at: item.refilled_at,
            ttl: item.ttl.unwrap_or(NO_TTL),
            shard_count: u16::try_from(item.shard_count).unwrap_or(u16::MAX),
            raised_age_min: slot::raised_age_min(item.refilled_at, item.count_raised_at),
            touched: self.clock.mark(),
            shape,
            balances: item
                .limits
                .values()
                .map(|st| Balance {
                    balance: st.balance,
                    taken: st.taken,
                })
                .collect(),
        }
    }

    fn intern(&self, limits: &Limits) -> Arc<Shape> {
        let mut shapes = self.shapes.lock();
        if let Some(s) = shapes.get(&ShapeOf(limits)) {
            return s.clone();
        }
        let shape = Arc::new(Shape(
            limits
                .iter()
                .map(|(n, st)| (Name::new(n), st.params()))
                .collect(),
        ));
        shapes.insert(shape.clone());
        shape
    }

    /// The current image of one item (for tests and `inspect`).
    pub fn get(&self, key: &BucketKey) -> Option<BucketItem> {
        self.part(key).get(key).map(CompactItem::image)
    }

    /// Puts an item as-is (tests use it to set up scenarios), within the bound.
    pub fn put(&self, key: BucketKey, item: BucketItem) {
        let mut g = self.part(&key);
        let slot = self.slot(&item, None);
        let evicted = g.insert(&key, slot, self.clock.now_s());
        drop(g);
        self.evictions.record(evicted, self.max_bytes);
    }

    /// Number of items held.
    pub fn len(&self) -> usize {
        self.partitions.iter().map(|p| p.lock().len()).sum()
    }

    /// What the store holds and what its bound removed (for the metrics).
    pub fn stats(&self) -> MemoryStats {
        let (mut items, mut bytes) = (0, 0);
        for p in &self.partitions {
            let p = p.lock();
            items += p.len() as u64;
            bytes += p.charged() as u64;
        }
        MemoryStats {
            items,
            bytes,
            max_bytes: self.max_bytes,
            evicted_full: self.evictions.full.load(Ordering::Relaxed),
            evicted_active: self.evictions.active.load(Ordering::Relaxed),
            expired: self.evictions.expired.load(Ordering::Relaxed),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every item whose `ttl` (epoch s) is at or before `now_s`, as DynamoDB's TTL
    /// sweeper does; returns how many. Such an item would be full again anyway, so
    /// re-creating it from config on its next use loses nothing. Maps left mostly empty
    /// give their memory back, and shapes no item holds any more are forgotten.
    pub fn evict_expired(&self, now_s: i64) -> usize {
        self.clock.saw(now_s);
        let mut evicted = 0;
        for p in &self.partitions {
            evicted += p.lock().evict_expired(now_s);
        }
        self.shapes.lock().retain(|s| Arc::strong_count(s) > 1);
        self.evictions
            .expired
            .fetch_add(evicted as u64, Ordering::Relaxed);
        evicted
    }
}

impl MemoryStore {
    /// What `w` makes of the item `current`: `Ok(None)` when its condition fails, an
    /// error when the item it would write is larger than a store may hold.
    fn stage(
        &self,
        current: Option<&CompactItem>,
        w: &Write,
    ) -> Result<Option<CompactItem>, StoreError> {
        Ok(match w {
            Write::Create { key, item } => {
                check_item(key, item)?;
                current.is_none().then(|| self.slot(item, None))
            }
            Write::Update {
                key,
                expected_refilled_at: expected_rf,
                refilled_at: rf,
                ttl,
                shard_count,
                limits,
            } => {
                let Some(cur) = current else {
                    return Ok(None);
                };
                let image = image_of(key, cur)?;
                let Some(next) =
                    apply_update(&image, *expected_rf, *rf, *ttl, *shard_count, limits)
                else {
                    return Ok(None);
                };
                check_item(key, &next)?;
                Some(self.slot(&next, Some(&cur.shape)))
            }
            Write::Debit { debits, ttl, .. } => {
                let Some(cur) = current else {
                    return Ok(None);
                };
                if !debit_allowed(cur, debits, DebitMode::RetryOnly) {
                    return Ok(None);
                }
                let mut next = cur.clone();
                next.touched = self.clock.mark();
                apply_debit(&mut next, debits, DebitMode::RetryOnly);
                if let Some(t) = ttl {
                    next.ttl = *t;
                }
                Some(next)
            }
        })
    }
}

impl MemoryStore {
    /// A debit, and where the item is missing and `seed` is given, the seed created and
    /// debited under the partition's lock (see [`BucketStore::debit_or_create`]).
    fn debit_seeded(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
        seed: Option<&Seed<'_>>,
    ) -> Result<DebitOutcome, StoreError> {
        check_key(key)?;
        check_once(key, debits, |d| &d.limit)?;
        let mark = match mode {
            DebitMode::Fast { now_s, .. } => {
                self.clock.saw(now_s);
                bound::mark_of(now_s)
            }
            DebitMode::RetryOnly => self.clock.mark(),
        };
        let mut g = self.part(key);
        // A refused bucket is in use too: dropped, it would be re-created full.
        let Some(slot) = g.get_mut(key) else {
            let Some(seed) = seed else {
                return Ok(DebitOutcome::Refused(None));
            };
            let item = seed();
            check_item(key, &item)?;
            let mut slot = self.slot(&item, None);
            if !debit_allowed(&slot, debits, mode) {
                return Ok(DebitOutcome::Refused(None));
            }
            slot.touched = mark;
            // A create takes no `wcu` token (as a slow pass's create takes none).
            apply_debit(&mut slot, debits, DebitMode::RetryOnly);
            let image = image_of(key, &slot)?;
            let evicted = g.insert(key, slot, self.clock.now_s());
            drop(g);
            self.evictions.record(evicted, self.max_bytes);
            return Ok(DebitOutcome::Applied(image));
        };
        slot.touched = mark;
        // Checked before any condition: a corrupt item is neither debited nor shown.
        check_held(key, slot)?;
        Ok(if debit_allowed(slot, debits, mode) {
            apply_debit(slot, debits, mode);
            DebitOutcome::Applied(slot.image())
        } else {
            DebitOutcome::Refused(Some(slot.image()))
        })
    }
}

impl BucketStore for MemoryStore {
    async fn debit(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
    ) -> Result<DebitOutcome, StoreError> {
        self.debit_seeded(key, debits, mode, None)
    }

    async fn debit_or_create(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
        seed: &Seed<'_>,
    ) -> Result<DebitOutcome, StoreError> {
        self.debit_seeded(key, debits, mode, Some(seed))
    }

    async fn read(&self, keys: &[BucketKey]) -> Result<Vec<Option<BucketItem>>, StoreError> {
        for k in keys {
            check_key(k)?;
        }
        keys.iter()
            .map(|k| {
                self.part(k)
                    .get(k)
                    .map(|slot| image_of(k, slot))
                    .transpose()
            })
            .collect()
    }

    #[expect(clippy::expect_used, reason = "locked above")]
    async fn commit(&self, writes: &[Write]) -> Result<CommitOutcome, StoreError> {
        check_commit(writes, |k| k.to_string())?;
        let parts: BTreeSet<usize> = writes.iter().map(|w| partition_of(w.key())).collect();
        let mut guards: std::collections::HashMap<usize, MutexGuard<'_, Partition>> = parts
            .iter()
            .map(|&i| (i, self.partitions[i].lock()))
            .collect();
        let mut staged = Vec::with_capacity(writes.len());
        let mut failed = Vec::new();
        for (i, w) in writes.iter().enumerate() {
            let current = guards[&partition_of(w.key())].get(w.key());
            match self.stage(current, w)? {
                Some(next) => staged.push(next),
                None => failed.push((i, current.map(|slot| image_of(w.key(), slot)).transpose()?)),
            }
        }
        if !failed.is_empty() {
            return Ok(CommitOutcome::Conflict(failed));
        }
        let now_s = self.clock.now_s();
        let mut evicted = Evicted::default();
        for (w, next) in writes.iter().zip(staged) {
            evicted += guards
                .get_mut(&partition_of(w.key()))
                .expect("locked above")
                .insert(w.key(), next, now_s);
        }
        drop(guards);
        self.evictions.record(evicted, self.max_bytes);
        Ok(CommitOutcome::Committed)
    }

    async fn credit(
        &self,
        key: &BucketKey,
        guard: CreditGuard,
        credits: &[Credit],
    ) -> Result<Vec<Credit>, StoreError> {
        check_key(key)?;
        check_once(key, credits, |c| &c.limit)?;
        let mut g = self.part(key);
        let bears =
            |slot: &&mut CompactItem| guard.admits(slot.refilled_at, u32::from(slot.shard_count));
        let Some(slot) = g.get_mut(key).filter(bears) else {
            return Ok(Vec::new());
        };
        slot.touched = self.clock.mark();
        let mut applied = Vec::new();
        for c in credits {
            if slot
                .balance(&c.limit)
                .is_none_or(|(params, _)| *params != c.params)
            {
                continue;
            }
            if let Some(b) = slot.balance_mut(&c.limit) {
                if b.balance.saturating_add(c.amount) <= c.ceiling {
                    b.balance += c.amount;
                    b.taken -= c.amount;
                    applied.push(c.clone());
                }
            }
        }
        Ok(applied)
    }
}

#[cfg(test)]
mod bound_tests;

#[cfg(test)]
mod tests {
    use super::table::Address;
    use super::*;
    use crate::store::{LimitParams, LimitState};

    /// The compact form is what makes an idle bucket cheap; keep it from growing unseen.
    #[test]
    fn a_stored_item_stays_compact() {
        assert_eq!(
            std::mem::size_of::<Address>() + std::mem::size_of::<CompactItem>(),
            104
        );
    }

    #[test]
    fn items_of_the_same_limits_share_one_shape_and_unused_shapes_are_forgotten() {
        let store = MemoryStore::new();
        let params = LimitParams::new(10, 10, 1_000);
        let item = |ttl| BucketItem {
            refilled_at: 1,
            shard_count: 1,
            count_raised_at: 0,
            ttl: Some(ttl),
            limits: [("a", LimitState::new(params, 5, 0))].into_iter().collect(),
        };
        store.put(BucketKey::new("e1", "r", 0), item(10));
        store.put(BucketKey::new("e2", "r", 0), item(20));
        assert_eq!(store.shapes.lock().len(), 1);
        assert_eq!(store.get(&BucketKey::new("e2", "r", 0)), Some(item(20)));
        assert_eq!(store.evict_expired(20), 2);
        assert!(store.is_empty());
        assert_eq!(store.shapes.lock().len(), 0);
    }

    #[test]
    fn an_item_without_ttl_round_trips_and_never_expires() {
        let store = MemoryStore::new();
        let item = BucketItem {
            refilled_at: 7,
            shard_count: 4,
            count_raised_at: 0,
            ttl: None,
            limits: Limits::new(),
        };
        let key = BucketKey::new("e", "r", 3);
        store.put(key.clone(), item.clone());
        assert_eq!(store.evict_expired(i64::MAX - 1), 0);
        assert_eq!(store.get(&key), Some(item));
    }
}

//! The embedded store: bucket items in process memory, with exactly the conditional
//! semantics of the store contract (the same conditions DynamoDB evaluates).
//!
//! Items live in a fixed number of independently locked partitions so concurrent requests
//! on different buckets do not contend; a commit locks the partitions it touches in index
//! order (no deadlock). Locks are held only for the in-memory check-and-apply, never
//! across an await. Expired items are evicted by [`MemoryStore::evict_expired`].

use std::collections::{BTreeSet, HashMap};
use std::hash::BuildHasher;
use std::sync::{LazyLock, Mutex, MutexGuard};

use super::{
    BucketItem, BucketKey, BucketStore, BumpOutcome, CommitOutcome, Credit, Debit, DebitMode,
    DebitOutcome, LimitWrite, StoreError, Write, MAX_COMMIT_ITEMS, WCU_LIMIT,
};
use crate::engine::bucket::MILLI;

const PARTITIONS: usize = 64;

/// Keys hold request values, so the hash is seeded per process (foldhash's quality
/// variant, as hashbrown uses by default): fast, and not predictable from outside.
type Hasher = foldhash::quality::RandomState;

type Partition = HashMap<BucketKey, BucketItem, Hasher>;

/// Chooses a key's partition; seeded once, independently of the partitions' own maps.
static PARTITION_HASH: LazyLock<Hasher> = LazyLock::new(Hasher::default);

/// In-process bucket store.
#[derive(Debug)]
pub struct MemoryStore {
    partitions: Vec<Mutex<Partition>>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

fn partition_of(key: &BucketKey) -> usize {
    (PARTITION_HASH.hash_one(key) as usize) % PARTITIONS
}

fn lock(m: &Mutex<Partition>) -> MutexGuard<'_, Partition> {
    // A panic while holding the lock cannot leave an item half-written (every mutation
    // is computed first, then stored whole), so a poisoned lock is still consistent.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemoryStore {
    pub fn new() -> MemoryStore {
        MemoryStore {
            partitions: (0..PARTITIONS)
                .map(|_| Mutex::new(Partition::default()))
                .collect(),
        }
    }

    fn part(&self, key: &BucketKey) -> MutexGuard<'_, Partition> {
        lock(&self.partitions[partition_of(key)])
    }

    /// The current image of one item (for tests and `inspect`).
    pub fn get(&self, key: &BucketKey) -> Option<BucketItem> {
        self.part(key).get(key).cloned()
    }

    /// Puts an item as-is (tests use it to set up scenarios).
    pub fn put(&self, key: BucketKey, item: BucketItem) {
        self.part(&key).insert(key, item);
    }

    /// Number of items held.
    pub fn len(&self) -> usize {
        self.partitions.iter().map(|p| lock(p).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every item whose `ttl` (epoch s) is at or before `now_s`, as DynamoDB's TTL
    /// sweeper does; returns how many. Such an item would be full again anyway, so
    /// re-creating it from config on its next use loses nothing.
    pub fn evict_expired(&self, now_s: i64) -> usize {
        let mut evicted = 0;
        for p in &self.partitions {
            let mut g = lock(p);
            let before = g.len();
            g.retain(|_, item| item.ttl.is_none_or(|t| t > now_s));
            evicted += before - g.len();
        }
        evicted
    }
}

/// Applies `debits` to `item` if the mode's conditions hold.
/// Whether `debits` may be applied to `item` under the mode's conditions.
fn debit_allowed(item: &BucketItem, debits: &[Debit], mode: DebitMode) -> bool {
    let fast = match mode {
        DebitMode::Fast { now_s } => {
            if item.ttl.is_some_and(|t| t <= now_s) {
                return false;
            }
            if item.limit(WCU_LIMIT).is_none_or(|w| w.tk < MILLI) {
                return false;
            }
            true
        }
        DebitMode::RetryOnly => false,
    };
    debits.iter().all(|d| match item.limit(&d.limit) {
        None => false,
        Some(st) => {
            let params_match = !fast || d.params.is_none_or(|p| st.params() == p);
            let covered = !d.gated || st.tk >= d.amount;
            params_match && covered && st.tk.checked_sub(d.amount).is_some()
        }
    })
}

/// Applies allowed `debits` in place (see [`debit_allowed`]).
fn apply_debit(item: &mut BucketItem, debits: &[Debit], mode: DebitMode) {
    for d in debits {
        if let Some(st) = item.limits.get_mut(&d.limit) {
            st.tk -= d.amount;
            st.tc = st.tc.saturating_add(d.amount);
        }
    }
    if matches!(mode, DebitMode::Fast { .. }) {
        if let Some(w) = item.limits.get_mut(WCU_LIMIT) {
            w.tk -= MILLI;
            w.tc += MILLI;
        }
    }
}

fn apply_write(current: Option<&BucketItem>, w: &Write) -> Option<BucketItem> {
    match w {
        Write::Create { item, .. } => current.is_none().then(|| item.clone()),
        Write::Update {
            expected_rf,
            rf,
            ttl,
            limits,
            ..
        } => {
            let cur = current?;
            if cur.rf != *expected_rf {
                return None;
            }
            let mut next = cur.clone();
            next.rf = *rf;
            next.ttl = *ttl;
            for lw in limits {
                match lw {
                    LimitWrite::Add {
                        limit,
                        tk_delta,
                        tc_delta,
                        floor,
                        cap,
                    } => {
                        let st = next.limits.get_mut(limit)?;
                        if floor.is_some_and(|f| st.tk < f) || cap.is_some_and(|c| st.tk > c) {
                            return None;
                        }
                        st.tk = st.tk.checked_add(*tk_delta)?;
                        st.tc = st.tc.saturating_add(*tc_delta);
                    }
                    LimitWrite::Set { limit, state } => {
                        next.limits.insert(limit.clone(), *state);
                    }
                }
            }
            Some(next)
        }
        Write::Debit { debits, .. } => {
            let cur = current?;
            if !debit_allowed(cur, debits, DebitMode::RetryOnly) {
                return None;
            }
            let mut next = cur.clone();
            apply_debit(&mut next, debits, DebitMode::RetryOnly);
            Some(next)
        }
    }
}

impl BucketStore for MemoryStore {
    async fn debit(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
    ) -> Result<DebitOutcome, StoreError> {
        // Check, then change in place: one clone, for the image the caller gets back.
        let mut g = self.part(key);
        Ok(match g.get_mut(key) {
            None => DebitOutcome::Refused(None),
            Some(item) if debit_allowed(item, debits, mode) => {
                apply_debit(item, debits, mode);
                DebitOutcome::Applied(item.clone())
            }
            Some(item) => DebitOutcome::Refused(Some(item.clone())),
        })
    }

    async fn read(&self, keys: &[BucketKey]) -> Result<Vec<Option<BucketItem>>, StoreError> {
        Ok(keys.iter().map(|k| self.get(k)).collect())
    }

    async fn commit(&self, writes: &[Write]) -> Result<CommitOutcome, StoreError> {
        if writes.is_empty() || writes.len() > MAX_COMMIT_ITEMS {
            return Err(StoreError::Invalid {
                key: writes
                    .first()
                    .map(|w| w.key().to_string())
                    .unwrap_or_default(),
                reason: format!(
                    "a commit carries 1..={MAX_COMMIT_ITEMS} items, not {}",
                    writes.len()
                ),
            });
        }
        let parts: BTreeSet<usize> = writes.iter().map(|w| partition_of(w.key())).collect();
        let mut guards: HashMap<usize, MutexGuard<'_, Partition>> = parts
            .iter()
            .map(|&i| (i, lock(&self.partitions[i])))
            .collect();
        let mut staged = Vec::with_capacity(writes.len());
        let mut failed = Vec::new();
        for (i, w) in writes.iter().enumerate() {
            let g = &guards[&partition_of(w.key())];
            let current = g.get(w.key());
            match apply_write(current, w) {
                Some(next) => staged.push(next),
                None => failed.push((i, current.cloned())),
            }
        }
        if !failed.is_empty() {
            return Ok(CommitOutcome::Conflict(failed));
        }
        for (w, next) in writes.iter().zip(&staged) {
            let g = guards
                .get_mut(&partition_of(w.key()))
                .expect("locked above");
            g.insert(w.key().clone(), next.clone());
        }
        Ok(CommitOutcome::Committed)
    }

    async fn bump_shard_count(
        &self,
        entity: &str,
        resource: &str,
        old: u32,
        new: u32,
    ) -> Result<BumpOutcome, StoreError> {
        let key = BucketKey::new(entity, resource, 0);
        let mut g = self.part(&key);
        Ok(match g.get_mut(&key) {
            None => BumpOutcome::Missing,
            Some(item) if item.shard_count == old => {
                item.shard_count = new;
                BumpOutcome::Won
            }
            Some(item) => BumpOutcome::Lost(item.shard_count),
        })
    }

    async fn raise_shard_count(&self, key: &BucketKey, new: u32) -> Result<bool, StoreError> {
        let mut g = self.part(key);
        Ok(match g.get_mut(key) {
            Some(item) if item.shard_count < new => {
                item.shard_count = new;
                true
            }
            _ => false,
        })
    }

    async fn credit(&self, key: &BucketKey, credits: &[Credit]) -> Result<Vec<Credit>, StoreError> {
        let mut g = self.part(key);
        let Some(item) = g.get_mut(key) else {
            return Ok(Vec::new());
        };
        let mut applied = Vec::new();
        for c in credits {
            if let Some(st) = item.limits.get_mut(&c.limit) {
                if st.tk.saturating_add(c.amount) <= c.ceiling {
                    st.tk += c.amount;
                    st.tc -= c.amount;
                    applied.push(c.clone());
                }
            }
        }
        Ok(applied)
    }
}

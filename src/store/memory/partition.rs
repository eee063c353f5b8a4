//! One locked partition of the memory store: each resource's items in a table of its own
//! (`table.rs`), so a resource name is stored once per partition. It charges each item
//! against the partition's share of the store's bound and, before an insert would pass
//! it, evicts in the order `bound.rs` ranks. It decides nothing about limits.
//!
//! Charge. An item is charged what it costs at worst: its key and slot in a table that
//! has just doubled (a table grows at 7/8 full, so a slot costs its size and control byte
//! × 16/7 right after; `table.rs` keeps tables from growing for any other reason), plus
//! what it keeps on the heap (an entity too long to be held inline, balances of more than
//! two limits), rounded up as an allocator's size classes do. The bytes charged are an
//! upper bound on what the items take; the per-resource maps and the shared shapes (a
//! few per rule) are not charged.

use std::mem::size_of;

use hashbrown::HashMap;

use super::bound::{is_full_rank, Evicted, Histogram, Moment, Rank};
use super::slot::{Balance, CompactItem};
use super::table::{Address, Hasher, Table};
use crate::store::{BucketKey, Name};

/// What one item takes in its table at worst: key, slot and control byte, at the load
/// of a table that has just doubled (7/16).
const TABLE_BYTES: usize = (size_of::<Address>() + size_of::<CompactItem>() + 1) * 16 / 7 + 1;

/// What a heap block of `bytes` may take: a size-class allocator rounds a request up by
/// at most a quarter (and to 16 bytes).
fn heap_block(bytes: usize) -> usize {
    bytes + bytes / 4 + 16
}

/// Bytes `slot` at `address` is charged (see the module comment).
fn charge(address: &Address, slot: &CompactItem) -> usize {
    let entity = if address.entity.is_heap_allocated() {
        heap_block(address.entity.capacity())
    } else {
        0
    };
    let balances = if slot.balances.spilled() {
        heap_block(slot.balances.capacity() * size_of::<Balance>())
    } else {
        0
    };
    TABLE_BYTES + entity + balances
}

/// One locked partition: each resource's items by address, and what they are charged.
#[derive(Debug)]
pub(super) struct Partition {
    resources: HashMap<Name, Table, Hasher>,
    items: usize,
    charged: usize,
    /// This partition's share of the store's bound, in bytes.
    budget: usize,
}

impl Partition {
    pub(super) fn new(budget: usize) -> Partition {
        Partition {
            resources: HashMap::default(),
            items: 0,
            charged: 0,
            budget,
        }
    }

    pub(super) fn get(&self, key: &BucketKey) -> Option<&CompactItem> {
        self.resources.get(key.resource.as_str())?.get(key)
    }

    pub(super) fn get_mut(&mut self, key: &BucketKey) -> Option<&mut CompactItem> {
        self.resources.get_mut(key.resource.as_str())?.get_mut(key)
    }

    /// Writes `slot` at `key`, first evicting (as ranked at `now_s`) what it takes to
    /// keep the partition within its budget once it is written; returns what went.
    #[expect(clippy::expect_used, reason = "inserted above")]
    pub(super) fn insert(&mut self, key: &BucketKey, slot: CompactItem, now_s: i64) -> Evicted {
        let address = Address::of(key);
        let incoming = charge(&address, &slot);
        let mut held = self.get(key).map_or(0, |cur| charge(&address, cur));
        let mut evicted = Evicted::default();
        if self.charged - held + incoming > self.budget {
            // A pass frees a thirty-second of the budget at least, so passes over the
            // partition are rare even while every request creates an item.
            let wanted = (self.charged - held + incoming - self.budget).max(self.budget / 32);
            evicted = self.evict(wanted, now_s);
            // It may have evicted this key's own item (if it ranked among the oldest).
            held = self.get(key).map_or(0, |cur| charge(&address, cur));
        }
        self.charged = self.charged - held + incoming;
        // Two lookups when the resource is new, so a known one costs no clone of its name.
        if !self.resources.contains_key(key.resource.as_str()) {
            self.resources
                .insert(key.resource.clone(), Table::default());
        }
        let table = self
            .resources
            .get_mut(key.resource.as_str())
            .expect("inserted above");
        if table.insert(address, slot).is_none() {
            self.items += 1;
        }
        evicted
    }

    /// Removes the lowest-ranked items (`bound.rs`) holding at least `wanted` bytes.
    #[expect(clippy::expect_used, reason = "one rank per item")]
    fn evict(&mut self, wanted: usize, now_s: i64) -> Evicted {
        let moment = Moment { now_s };
        let mut histogram = Histogram::default();
        // Each item's rank, in the order the tables are walked: ranking is the pass's
        // cost, so it is done once.
        let mut ranks: Vec<Rank> = Vec::with_capacity(self.items);
        for table in self.resources.values() {
            for (address, slot) in table.iter() {
                let rank = moment.rank(address.shard, slot);
                histogram.add(rank, charge(address, slot));
                ranks.push(rank);
            }
        }
        let mut cut = histogram.cut(wanted);
        let mut ranks = ranks.into_iter();
        let mut evicted = Evicted::default();
        // `remove_where` walks the tables as `iter` does, and nothing changed since, so
        // the ranks line up.
        self.remove_where(|address, slot| {
            let rank = ranks.next().expect("one rank per item");
            if !cut.takes(rank, charge(address, slot)) {
                return false;
            }
            if is_full_rank(rank) {
                evicted.full += 1;
            } else {
                evicted.active += 1;
            }
            true
        });
        debug_assert!(ranks.next().is_none(), "every rank used");
        evicted
    }

    /// Removes every item `gone` picks (called once per item, in the tables' order);
    /// returns how many.
    fn remove_where(&mut self, mut gone: impl FnMut(&Address, &CompactItem) -> bool) -> usize {
        let mut removed = 0;
        let mut freed = 0;
        self.resources.retain(|_, table| {
            table.retain(|address, slot| {
                if !gone(address, slot) {
                    return true;
                }
                removed += 1;
                freed += charge(address, slot);
                false
            });
            !table.is_empty()
        });
        self.items -= removed;
        self.charged -= freed;
        removed
    }

    pub(super) fn len(&self) -> usize {
        self.items
    }

    /// Bytes the items are charged.
    pub(super) fn charged(&self) -> usize {
        self.charged
    }

    /// Drops the items expired at `now_s`; returns how many. Tables left mostly empty
    /// give their memory back.
    pub(super) fn evict_expired(&mut self, now_s: i64) -> usize {
        self.remove_where(|_, slot| slot.ttl <= now_s)
    }
}

#[cfg(test)]
impl Partition {
    pub(super) fn budget(&self) -> usize {
        self.budget
    }

    /// Bytes the tables' allocations take.
    pub(super) fn table_bytes(&self) -> usize {
        self.resources.values().map(Table::allocated).sum()
    }
}

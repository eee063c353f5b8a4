//! One resource's items in one partition: a map from (entity, shard) to slot that
//! borrows the key's strings for lookups, and that never doubles for the wrong reason.
//!
//! Tombstones. hashbrown leaves a tombstone where an item of a full group of slots is
//! erased, and counts it as used until the table is rehashed; when every spare slot is a
//! tombstone, the next insert doubles the table if it is more than half full. A store at
//! its bound erases as fast as it inserts, so its tables would double once more than
//! their items need, beyond what the bound charges. So the table remembers its capacity
//! with no tombstone, and an insert that would otherwise double a table its items do not
//! fill rebuilds it at the same size instead (once per so many inserts as the table has
//! spare slots). A table grows only when its items fill it.

use std::hash::Hash;

use hashbrown::{Equivalent, HashMap};

use super::slot::CompactItem;
use crate::store::{BucketKey, Name};

/// Keys hold request values, so the hash is seeded per process (foldhash's quality
/// variant, as hashbrown uses by default): fast, and not predictable from outside.
pub(super) type Hasher = foldhash::quality::RandomState;

/// Where an item sits within its resource's map.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Address {
    pub(super) entity: Name,
    pub(super) shard: u32,
}

impl Address {
    /// Where `key` sits (a copy of its entity).
    pub(super) fn of(key: &BucketKey) -> Address {
        Address {
            entity: key.entity.clone(),
            shard: key.shard,
        }
    }
}

/// An [`Address`] borrowed from a [`BucketKey`]: lookups need no copy of the entity.
#[derive(Hash)]
pub(super) struct AddressOf<'a> {
    entity: &'a str,
    shard: u32,
}

impl<'a> AddressOf<'a> {
    pub(super) fn of(key: &'a BucketKey) -> AddressOf<'a> {
        AddressOf {
            entity: &key.entity,
            shard: key.shard,
        }
    }
}

impl Hash for Address {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        AddressOf {
            entity: &self.entity,
            shard: self.shard,
        }
        .hash(h);
    }
}

impl Equivalent<Address> for AddressOf<'_> {
    fn equivalent(&self, a: &Address) -> bool {
        a.shard == self.shard && a.entity == self.entity
    }
}

type Items = HashMap<Address, CompactItem, Hasher>;

/// One resource's items.
#[derive(Debug, Default)]
pub(super) struct Table {
    items: Items,
    /// What `items.capacity()` is with no tombstone: its count of items and free slots
    /// right after it was built, grown or rehashed.
    capacity: usize,
}

impl Table {
    pub(super) fn get(&self, key: &BucketKey) -> Option<&CompactItem> {
        self.items.get(&AddressOf::of(key))
    }

    pub(super) fn get_mut(&mut self, key: &BucketKey) -> Option<&mut CompactItem> {
        self.items.get_mut(&AddressOf::of(key))
    }

    /// Writes `slot` at `address`; returns the slot it replaces.
    pub(super) fn insert(&mut self, address: Address, slot: CompactItem) -> Option<CompactItem> {
        let len = self.items.len();
        if len == self.items.capacity() && len < self.capacity {
            // No free slot but tombstones: this insert would double the table.
            self.rebuild();
        }
        let replaced = self.items.insert(address, slot);
        // A growth or an in-place rehash leaves no tombstone.
        self.capacity = self.capacity.max(self.items.capacity());
        replaced
    }

    /// The same table without tombstones, at the same size.
    fn rebuild(&mut self) {
        let mut fresh = Items::with_capacity_and_hasher(self.capacity, self.items.hasher().clone());
        fresh.extend(self.items.drain());
        self.capacity = fresh.capacity();
        self.items = fresh;
    }

    /// Keeps the items `keep` admits (called once per item, in the order of `iter`); a
    /// table left mostly empty gives its memory back.
    pub(super) fn retain(&mut self, keep: impl FnMut(&Address, &mut CompactItem) -> bool) {
        self.items.retain(keep);
        if self.items.len() < self.capacity / 4 {
            self.items.shrink_to(self.items.len() * 2);
            self.capacity = self.items.capacity();
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&Address, &CompactItem)> {
        self.items.iter()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

#[cfg(test)]
impl Table {
    /// Bytes the table's allocation takes.
    pub(super) fn allocated(&self) -> usize {
        self.items.allocation_size()
    }
}

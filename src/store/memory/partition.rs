//! One locked partition of the memory store: each resource's items by (entity, shard), so
//! a resource name is stored once per partition and a lookup borrows the key's strings
//! instead of copying them.

use std::hash::Hash;

use hashbrown::{Equivalent, HashMap};

use super::slot::Slot;
use super::Hasher;
use crate::store::{BucketKey, Name};

/// Where an item sits within its resource's map.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Address {
    entity: Name,
    shard: u32,
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

pub(super) type Items = HashMap<Address, Slot, Hasher>;

/// One locked partition: each resource's items by address.
#[derive(Debug, Default)]
pub(super) struct Partition {
    resources: HashMap<Name, Items, Hasher>,
}

impl Partition {
    pub(super) fn get(&self, key: &BucketKey) -> Option<&Slot> {
        self.resources
            .get(key.resource.as_str())?
            .get(&AddressOf::of(key))
    }

    pub(super) fn get_mut(&mut self, key: &BucketKey) -> Option<&mut Slot> {
        self.resources
            .get_mut(key.resource.as_str())?
            .get_mut(&AddressOf::of(key))
    }

    pub(super) fn insert(&mut self, key: &BucketKey, slot: Slot) {
        let address = Address {
            entity: key.entity.clone(),
            shard: key.shard,
        };
        match self.resources.get_mut(key.resource.as_str()) {
            Some(items) => {
                items.insert(address, slot);
            }
            None => {
                let mut items = Items::default();
                items.insert(address, slot);
                self.resources.insert(key.resource.clone(), items);
            }
        }
    }

    pub(super) fn len(&self) -> usize {
        self.resources.values().map(Items::len).sum()
    }

    /// Drops the items expired at `now_s`; returns how many. Maps left mostly empty
    /// give their memory back.
    pub(super) fn evict_expired(&mut self, now_s: i64) -> usize {
        let mut evicted = 0;
        self.resources.retain(|_, items| {
            let before = items.len();
            items.retain(|_, slot| slot.ttl > now_s);
            evicted += before - items.len();
            if items.len() < items.capacity() / 4 {
                items.shrink_to(items.len() * 2);
            }
            !items.is_empty()
        });
        evicted
    }
}

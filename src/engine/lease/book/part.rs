//! One partition of the lease book: the buckets admitted to it, filed by their hash and
//! looked up by reference to the request's names (no key is built to look one up), and
//! the demand sketch of those not admitted. Bounded: a bucket in demand enters a full
//! partition only in place of a cold one. Locked by the book, one partition at a time
//! (several, in order, for a request on several buckets).

use hashbrown::HashTable;

use super::super::LeaseOptions;
use super::demand::{admission_count, DemandSketch};
use super::entry::Entry;
use crate::engine::BucketClaim;

#[derive(Debug, Default)]
pub(super) struct Part {
    entries: HashTable<Entry>,
    demand: DemandSketch,
}

impl Part {
    pub(super) fn get(&self, entity: &str, resource: &str, hash: u64) -> Option<&Entry> {
        self.entries.find(hash, |e| {
            e.hash == hash && e.entity.as_str() == entity && e.resource.as_str() == resource
        })
    }

    pub(super) fn get_mut(
        &mut self,
        entity: &str,
        resource: &str,
        hash: u64,
    ) -> Option<&mut Entry> {
        self.entries.find_mut(hash, |e| {
            e.hash == hash && e.entity.as_str() == entity && e.resource.as_str() == resource
        })
    }

    /// The entry of a bucket whose lease was granted, admitted again if it was forgotten
    /// meanwhile (whatever the bound: the tokens it holds must be kept track of).
    #[expect(clippy::expect_used, reason = "present or just inserted")]
    pub(super) fn entry_for_grant(
        &mut self,
        entity: &str,
        resource: &str,
        hash: u64,
        now: i64,
    ) -> &mut Entry {
        if self.get(entity, resource, hash).is_none() {
            let e = Entry::new(entity.into(), resource.into(), hash, now);
            self.entries.insert_unique(hash, e, |e| e.hash);
        }
        self.get_mut(entity, resource, hash)
            .expect("present or just inserted")
    }

    /// Counts one request on `b`: on its entry when it is tracked; otherwise in the
    /// sketch, admitting it once its demand reaches the hot rate's share of a window
    /// and there is room (made, if need be, by forgetting the coldest entry).
    pub(super) fn observe(
        &mut self,
        b: &BucketClaim,
        hash: u64,
        now: i64,
        options: &LeaseOptions,
        capacity: usize,
    ) {
        if let Some(e) = self.get_mut(&b.entity, &b.resource, hash) {
            e.observe(b, now);
            return;
        }
        if self.demand.count(hash, now) < admission_count(options.hot_rate) {
            return;
        }
        if self.entries.len() >= capacity && !self.evict_coldest(options, now) {
            return;
        }
        let mut e = Entry::new(b.entity.clone(), b.resource.clone(), hash, now);
        e.observe(b, now);
        self.entries.insert_unique(hash, e, |e| e.hash);
    }

    /// Forgets the coldest entry that may be forgotten (the least often, then the least
    /// recently seen); whether there was one. A scan of one partition, made only when a
    /// bucket in demand finds it full.
    fn evict_coldest(&mut self, options: &LeaseOptions, now: i64) -> bool {
        // Named by its address, which stays put until the table changes: no names cloned.
        let victim = self
            .entries
            .iter()
            .filter(|e| e.cold(options, now))
            .min_by_key(|e| (e.rate, e.last_seen))
            .map(|e| (e.hash, std::ptr::from_ref(e)));
        let Some((hash, at)) = victim else {
            return false;
        };
        match self.entries.find_entry(hash, |e| std::ptr::eq(e, at)) {
            Ok(found) => {
                found.remove();
                true
            }
            Err(_) => false,
        }
    }

    /// Keeps the entries `keep` says to.
    pub(super) fn retain(&mut self, keep: impl FnMut(&mut Entry) -> bool) {
        self.entries.retain(keep);
    }

    pub(super) fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter()
    }

    pub(super) fn entries_mut(&mut self) -> impl Iterator<Item = &mut Entry> {
        self.entries.iter_mut()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }
}

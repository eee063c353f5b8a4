//! The demand every open RLQS stream of this server reports, per bucket: what the share
//! math divides a limit by. One table for the server, shared by its streams; each stream
//! writes its own entries when it reports and removes them all when it ends
//! ([`Subscription`] does it on drop, also when its stream's task unwinds).
//!
//! A bucket here is a descriptor of the rules (its rule's one limit); an entry is one
//! [`Holder`]: a bucket id of one stream. Two bucket ids of one Envoy that a domain's
//! `rlqs:` section maps to one descriptor are two holders of that limit.
//!
//! Bounded by the streams and the buckets each may hold (`stream.rs`); an entry not
//! refreshed for a while (a stream that stopped reporting a bucket without abandoning it)
//! is left out of the totals and pruned.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// A bucket of the server: the filter's domain and the descriptor its bucket ids stand
/// for (`Domain::rlqs_descriptor`).
pub type BucketKey = (Arc<str>, Vec<(String, String)>);

/// Who holds a share of a bucket: one bucket id (numbered by its stream) of one stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Holder {
    pub stream: u64,
    pub bucket_id: u64,
}

/// One stream's report for a bucket: requests per second, when, and the fraction of the
/// limit it was last assigned.
#[derive(Debug, Clone, Copy)]
struct Reported {
    per_second: f64,
    at: Instant,
    held: f64,
}

/// What a holder's report sees of a bucket: its own demand, the total over the holders
/// that reported it recently, how many they are (itself included), and the fractions the
/// others hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Totals {
    pub own: f64,
    pub total: f64,
    pub holders: usize,
    pub others_held: f64,
}

/// One bucket as the streams report it (for `/rlconfig` and `explain`).
#[derive(Debug, Clone, PartialEq)]
pub struct BucketSummary {
    pub key: BucketKey,
    /// Streams holding it (a stream may hold it under several bucket ids).
    pub streams: usize,
    /// Requests per second, over the holders.
    pub per_second: f64,
    /// The fraction of the limit each holder was last assigned.
    pub held: Vec<f64>,
}

/// Every stream's reported demand, per bucket.
#[derive(Debug, Default)]
pub struct Demands {
    buckets: Mutex<HashMap<BucketKey, HashMap<Holder, Reported>>>,
}

impl Demands {
    /// Records `holder`'s demand for `key` and returns the bucket's totals, leaving out
    /// (and removing) other holders' reports older than `stale_after`.
    pub fn report(
        &self,
        key: &BucketKey,
        holder: Holder,
        per_second: f64,
        now: Instant,
        stale_after: Duration,
    ) -> Totals {
        let mut buckets = self.buckets.lock();
        let holders = buckets.entry(key.clone()).or_default();
        let held = holders.get(&holder).map_or(0.0, |r| r.held);
        let reported = Reported {
            per_second,
            at: now,
            held,
        };
        holders.insert(holder, reported);
        holders.retain(|_, r| now.saturating_duration_since(r.at) <= stale_after);
        totals_of(holders, holder, per_second)
    }

    /// The bucket's totals as `holder` last reported it, without a new report (`None`:
    /// it has no report for `key`).
    pub fn peek(&self, key: &BucketKey, holder: Holder) -> Option<Totals> {
        let buckets = self.buckets.lock();
        let holders = buckets.get(key)?;
        let own = holders.get(&holder)?.per_second;
        Some(totals_of(holders, holder, own))
    }

    /// Records the fraction `holder` was assigned for `key` (after [`Self::report`]).
    pub fn hold(&self, key: &BucketKey, holder: Holder, fraction: f64) {
        let mut buckets = self.buckets.lock();
        if let Some(r) = buckets.get_mut(key).and_then(|s| s.get_mut(&holder)) {
            r.held = fraction;
        }
    }

    /// Removes `holder`'s report for `key` (the bucket was abandoned).
    pub fn forget(&self, key: &BucketKey, holder: Holder) {
        let mut buckets = self.buckets.lock();
        if let Some(holders) = buckets.get_mut(key) {
            holders.remove(&holder);
            if holders.is_empty() {
                buckets.remove(key);
            }
        }
    }

    /// Every bucket's total demand (requests per second) over the streams that reported
    /// it within `stale_after` of `now`: what this server's Envoys ask of it.
    pub fn totals(&self, now: Instant, stale_after: Duration) -> Vec<(BucketKey, f64)> {
        let buckets = self.buckets.lock();
        buckets
            .iter()
            .map(|(key, streams)| {
                let fresh = streams
                    .values()
                    .filter(|r| now.saturating_duration_since(r.at) <= stale_after);
                (key.clone(), fresh.map(|r| r.per_second).sum())
            })
            .collect()
    }

    /// The `most` buckets with the most demand (and how many there are): each one's
    /// streams, their total demand and the fractions they hold.
    pub fn listing(&self, most: usize) -> (usize, Vec<BucketSummary>) {
        let buckets = self.buckets.lock();
        let mut all: Vec<BucketSummary> = buckets
            .iter()
            .map(|(key, holders)| summary_of(key, holders))
            .collect();
        let total = all.len();
        all.sort_by(|a, b| {
            b.per_second
                .total_cmp(&a.per_second)
                .then(a.key.cmp(&b.key))
        });
        all.truncate(most);
        (total, all)
    }

    /// What the streams report of one bucket (`None`: none holds it).
    pub fn summary(&self, key: &BucketKey) -> Option<BucketSummary> {
        let buckets = self.buckets.lock();
        Some(summary_of(key, buckets.get(key)?))
    }

    /// Buckets with at least one stream's report.
    pub fn buckets(&self) -> usize {
        self.buckets.lock().len()
    }

    fn forget_stream(&self, stream: u64) {
        let mut buckets = self.buckets.lock();
        buckets.retain(|_, holders| {
            holders.retain(|h, _| h.stream != stream);
            !holders.is_empty()
        });
    }
}

/// A bucket's `holders` in words' numbers.
fn summary_of(key: &BucketKey, holders: &HashMap<Holder, Reported>) -> BucketSummary {
    let mut streams: Vec<u64> = holders.keys().map(|h| h.stream).collect();
    streams.sort_unstable();
    streams.dedup();
    BucketSummary {
        key: key.clone(),
        streams: streams.len(),
        per_second: holders.values().map(|r| r.per_second).sum(),
        held: holders.values().map(|r| r.held).collect(),
    }
}

/// What `holder` (demanding `own`) sees of a bucket's `holders`.
fn totals_of(holders: &HashMap<Holder, Reported>, holder: Holder, own: f64) -> Totals {
    let total = holders.values().map(|r| r.per_second).sum();
    let others_held = holders
        .iter()
        .filter(|(h, _)| **h != holder)
        .map(|(_, r)| r.held)
        .sum();
    Totals {
        own,
        total,
        holders: holders.len(),
        others_held,
    }
}

/// A stream's place in [`Demands`]: its id, its reports removed when it is dropped.
#[derive(Debug)]
pub struct Subscription {
    demands: Arc<Demands>,
    id: u64,
}

impl Subscription {
    pub fn new(demands: Arc<Demands>, id: u64) -> Subscription {
        Subscription { demands, id }
    }

    /// This stream's holder of its bucket id numbered `bucket_id`.
    pub fn holder(&self, bucket_id: u64) -> Holder {
        Holder {
            stream: self.id,
            bucket_id,
        }
    }

    pub fn demands(&self) -> &Demands {
        &self.demands
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.demands.forget_stream(self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(v: &str) -> BucketKey {
        (Arc::from("d"), vec![("tenant".into(), v.into())])
    }

    fn holder(stream: u64, bucket_id: u64) -> Holder {
        Holder { stream, bucket_id }
    }

    #[test]
    fn two_bucket_ids_of_one_stream_are_two_holders_of_one_bucket() {
        let demands = Arc::new(Demands::default());
        let (now, long) = (Instant::now(), Duration::from_secs(10));
        let a = Subscription::new(demands.clone(), 1);
        a.demands().report(&key("x"), a.holder(0), 30.0, now, long);
        a.demands().hold(&key("x"), a.holder(0), 0.6);
        let t = a.demands().report(&key("x"), a.holder(1), 20.0, now, long);
        assert_eq!(
            (t.own, t.total, t.holders, t.others_held),
            (20.0, 50.0, 2, 0.6)
        );
        let s = demands.summary(&key("x")).unwrap();
        assert_eq!((s.streams, s.held.len()), (1, 2));
        drop(a);
        assert_eq!(demands.buckets(), 0);
    }

    #[test]
    fn totals_cover_the_streams_and_a_dropped_stream_leaves() {
        let demands = Arc::new(Demands::default());
        let now = Instant::now();
        let long = Duration::from_secs(10);
        let a = Subscription::new(demands.clone(), 1);
        let b = Subscription::new(demands.clone(), 2);
        a.demands().report(&key("x"), a.holder(0), 30.0, now, long);
        a.demands().hold(&key("x"), a.holder(0), 0.7);
        let t = b.demands().report(&key("x"), b.holder(0), 10.0, now, long);
        assert_eq!(
            (t.own, t.total, t.holders, t.others_held),
            (10.0, 40.0, 2, 0.7)
        );
        drop(a);
        let t = b.demands().report(&key("x"), b.holder(0), 10.0, now, long);
        assert_eq!((t.total, t.holders), (10.0, 1));
        drop(b);
        assert_eq!(demands.buckets(), 0);
    }

    #[test]
    fn a_stale_report_is_left_out() {
        let demands = Demands::default();
        let then = Instant::now();
        let later = then + Duration::from_secs(5);
        demands.report(&key("x"), holder(1, 0), 30.0, then, Duration::from_secs(3));
        let t = demands.report(&key("x"), holder(2, 0), 10.0, later, Duration::from_secs(3));
        assert_eq!((t.total, t.holders), (10.0, 1));
        demands.forget(&key("x"), holder(2, 0));
        assert_eq!(demands.buckets(), 0);
    }
}

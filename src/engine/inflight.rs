//! Slow passes in flight in this process, by shard. A request bound for the slow path on
//! a shard that another request is already refilling waits for that pass to end and then
//! tries the fast path there again, instead of racing it for the `rf` lock: each lost
//! race costs a read, a failed commit and a retry (three store calls on DynamoDB), and a
//! hot shard whose `wcu` or limit has just run out sends every request in flight to the
//! slow path at once.
//!
//! Process-local by design: servers sharing a table still race each other, which the
//! `rf` lock makes safe. This module holds no bucket state and decides nothing; it only
//! tells a request when to look again.

use super::partitioned::Hasher;
use parking_lot::{Mutex, MutexGuard};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use smallvec::SmallVec;
use tokio::sync::watch;

use crate::store::BucketKey;

/// The shards whose slow pass some request of this process is running.
#[derive(Debug, Default)]
pub(crate) struct SlowPasses {
    /// Dropping a sender (when its pass ends, however it ends) wakes every follower.
    leaders: Mutex<HashMap<BucketKey, watch::Sender<()>, Hasher>>,
    /// How many passes are in flight: lets every request skip the lock while none is.
    active: AtomicUsize,
}

impl SlowPasses {
    fn lock(&self) -> MutexGuard<'_, HashMap<BucketKey, watch::Sender<()>, Hasher>> {
        self.leaders.lock()
    }

    /// Whether any slow pass is in flight (one atomic load).
    pub(crate) fn any(&self) -> bool {
        self.active.load(Ordering::Acquire) > 0
    }

    /// Resolves when the slow pass in flight on `key` ends; `None` when there is none.
    pub(crate) fn in_flight(&self, key: &BucketKey) -> Option<impl Future<Output = ()> + use<>> {
        if !self.any() {
            return None;
        }
        let mut done = self.lock().get(key)?.subscribe();
        Some(async move {
            // Only ever closed, never sent on: `changed` returns when the leader is gone.
            let _ = done.changed().await;
        })
    }

    /// Marks the caller as running the slow pass of every key in `keys` that nobody else
    /// is running, until the returned guard drops (also when its future is cancelled).
    pub(crate) fn lead<'a>(&'a self, keys: impl IntoIterator<Item = BucketKey>) -> Leading<'a> {
        let mut leaders = self.lock();
        let mut mine = SmallVec::new();
        for key in keys {
            if !leaders.contains_key(&key) {
                leaders.insert(key.clone(), watch::channel(()).0);
                self.active.fetch_add(1, Ordering::Release);
                mine.push(key);
            }
        }
        Leading {
            passes: self,
            keys: mine,
        }
    }
}

/// The slow passes one request runs; ends them on drop.
#[derive(Debug)]
pub(crate) struct Leading<'a> {
    passes: &'a SlowPasses,
    keys: SmallVec<[BucketKey; 2]>,
}

impl Drop for Leading<'_> {
    fn drop(&mut self) {
        if self.keys.is_empty() {
            return;
        }
        let mut leaders = self.passes.lock();
        for key in &self.keys {
            leaders.remove(key);
        }
        self.passes
            .active
            .fetch_sub(self.keys.len(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_follower_wakes_when_the_leading_pass_ends_and_only_then() {
        let passes = SlowPasses::default();
        let key = BucketKey::new("e", "r", 0);
        assert!(passes.in_flight(&key).is_none() && !passes.any());
        let leading = passes.lead([key.clone()]);
        assert!(passes.any());
        let again = passes.lead([key.clone()]);
        assert!(again.keys.is_empty(), "one leader per shard");
        let done = passes.in_flight(&key).expect("in flight");
        tokio::pin!(done);
        assert!(
            tokio::time::timeout(Duration::from_millis(20), &mut done)
                .await
                .is_err(),
            "still running"
        );
        drop(again);
        assert!(
            passes.in_flight(&key).is_some(),
            "a non-leader's drop ends nothing"
        );
        drop(leading);
        tokio::time::timeout(Duration::from_secs(5), done)
            .await
            .expect("woken when the pass ended");
        assert!(passes.in_flight(&key).is_none() && !passes.any());
    }
}

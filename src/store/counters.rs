//! Counts of what a store does beside any call's answer, which no caller sees fail: a
//! Redis Cluster spread commit's undo, or the give-back of its claim, that did not land
//! (`redis/spread.rs`). Process-wide, written by the store and read by the metrics at
//! scrape time (`shardgate_redis_spread_undo_failed_total`); nothing else.

use std::sync::atomic::{AtomicU64, Ordering};

static SPREAD_UNDO_FAILED: AtomicU64 = AtomicU64::new(0);

/// Counts one spread commit's write neither undone nor given back (its request's claim
/// stays taken until the bucket refills: an under-admission, never an over-admission).
pub fn spread_undo_failed() {
    SPREAD_UNDO_FAILED.fetch_add(1, Ordering::Relaxed);
}

/// Spread commit writes neither undone nor given back, since the process started.
pub fn spread_undos_failed() -> u64 {
    SPREAD_UNDO_FAILED.load(Ordering::Relaxed)
}

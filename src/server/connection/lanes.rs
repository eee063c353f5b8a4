//! Lanes: a busy connection's further calls handed to the runtime's idle workers
//! (`drive.rs` decides when). Owns which workers count as idle (parked since the last
//! look, tokio's per-worker park count), the split of the new calls into equal shares, one
//! task per share. It decides no call itself and knows nothing of HTTP/2.

use std::collections::VecDeque;

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use tokio::runtime::RuntimeMetrics;
use tracing::Instrument;

use super::calls::Guarded;

/// The fewest calls a lane is given: a smaller share costs its spawn and the wakes from
/// another thread for less work than they save (measured: two connections of a hot key,
/// each splitting its last few calls whenever a worker parked for a moment, cost 1.13×
/// the CPU per call of no lanes at all).
const MIN_LANE_CALLS: usize = 8;

/// The runtime's workers, when it has more than one to spread a busy connection's calls
/// over.
pub(super) struct Workers {
    metrics: RuntimeMetrics,
    /// Each worker's park/unpark count at the last look (an odd count: parked). Kept
    /// between wakes so a wake allocates nothing.
    looked: Vec<u64>,
}

impl Workers {
    pub(super) fn of_this_runtime() -> Option<Workers> {
        let handle = tokio::runtime::Handle::try_current().ok()?;
        let multi = handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::CurrentThread;
        let metrics = handle.metrics();
        let workers = metrics.num_workers();
        (multi && workers > 1).then(|| Workers {
            metrics,
            looked: vec![0; workers],
        })
    }

    /// A look: every worker's park/unpark count now.
    pub(super) fn look(&mut self) {
        for (w, count) in self.looked.iter_mut().enumerate() {
            *count = park_count(&self.metrics, w);
        }
    }

    /// The workers parked at the last look that have not moved since (idle all along,
    /// not a worker busy elsewhere caught between two tasks).
    pub(super) fn idle_since_look(&self) -> usize {
        let now = (0..self.looked.len()).map(|w| park_count(&self.metrics, w));
        stayed_parked(&self.looked, now)
    }
}

/// A worker's park/unpark count (odd while parked).
#[cfg(target_has_atomic = "64")]
fn park_count(metrics: &RuntimeMetrics, worker: usize) -> u64 {
    metrics.worker_park_unpark_count(worker)
}

/// Without 64-bit atomics tokio does not say: every worker counts as parked all along
/// (one lane each).
#[cfg(not(target_has_atomic = "64"))]
fn park_count(_: &RuntimeMetrics, _: usize) -> u64 {
    1
}

/// Of the workers whose park/unpark counts were `before` and are `now`, those parked at
/// both looks in the same park: only on those does a spawned lane run beside the
/// connection rather than after it, on a thread that was busy anyway. A worker busy with
/// other connections parks for moments between its tasks; counted idle on one look, it
/// made two busy connections split their calls back and forth (1.15× the CPU per call).
fn stayed_parked(before: &[u64], now: impl Iterator<Item = u64>) -> usize {
    before
        .iter()
        .zip(now)
        .filter(|&(&b, n)| b % 2 == 1 && b == n)
        .count()
}

/// A lane: calls handed to another worker, polled together in one task (one spawn, not
/// one per call) until each has answered.
async fn lane(calls: Vec<Guarded>) {
    let mut calls: FuturesUnordered<Guarded> = calls.into_iter().collect();
    while calls.next().await.is_some() {}
}

/// Hands `fresh` to `lanes` + 1 lanes of their own, in equal shares: one for each idle
/// worker and one for this worker, which runs it once the connection's task has written.
/// All are spawned because tokio puts a task spawned from a worker in that worker's LIFO
/// slot, which no other worker may steal, and tells the idle ones only when it pushes the
/// slot's task out to the queue: a single lane would run after the connection, on the
/// same thread, and spread nothing. Each lane spawned after the first pushes the one
/// before it out, and wakes an idle worker to steal it.
pub(super) fn spawn_lanes(fresh: &mut VecDeque<Guarded>, lanes: usize) {
    let share = fresh.len() / (lanes + 1);
    if share < MIN_LANE_CALLS {
        return;
    }
    for i in 0..=lanes {
        let take = if i == lanes { fresh.len() } else { share };
        let calls: Vec<Guarded> = fresh.drain(fresh.len() - take..).collect();
        tokio::spawn(lane(calls).in_current_span());
    }
}

#[cfg(test)]
mod tests {
    use super::stayed_parked;

    #[test]
    fn a_worker_is_idle_only_when_parked_at_both_looks_in_the_same_park() {
        // Parked (odd) at both looks, the same count: idle all along.
        assert_eq!(stayed_parked(&[7, 9], [7, 9].into_iter()), 2);
        // Busy (even) at the first look, or at the second.
        assert_eq!(stayed_parked(&[6, 9], [7, 10].into_iter()), 0);
        // Parked at both looks but woken between them (busy elsewhere, parked again).
        assert_eq!(stayed_parked(&[7, 9], [9, 9].into_iter()), 1);
    }
}

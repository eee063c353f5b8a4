//! Lanes: a busy connection's new calls shared with the runtime's idle workers (`drive.rs`
//! decides when). Owns the connection's backlog (its new calls, not polled yet), which the
//! connection's task and its lanes pull from one call at a time, and which workers count
//! as idle (parked since the last look, tokio's per-worker park count). It decides no call
//! itself and knows nothing of HTTP/2.
//!
//! Why a shared backlog rather than shares fixed at the split: the connection's task also
//! reads and writes, so it decides fewer calls than a lane; with fixed shares one of them
//! ran out first and its core waited for the other, and every answer of a burst left in
//! one write at its end, so the client's next calls arrived together while both cores
//! waited. Pulling one call at a time, both stay busy to the backlog's last call, and the
//! connection's task writes the answers of both as they come (bench/README.md, "One
//! connection, every core").

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::runtime::RuntimeMetrics;
use tracing::Instrument;

use super::calls::Guarded;

/// How long a lane decides calls before it yields its thread: the connection's task,
/// woken by a lane's answer, waits in the lane's worker's LIFO slot (no other worker may
/// steal it) until the lane yields; and the worker polls the I/O driver then (tokio runs a
/// task that yielded only after that), so the client's next calls are read.
const LANE_SLICE: Duration = Duration::from_micros(200);

/// The connection's new calls, not polled yet, shared by its task and its lanes.
#[derive(Clone, Default)]
pub(super) struct Backlog {
    calls: Arc<Mutex<VecDeque<Guarded>>>,
    /// Lanes still pulling calls: a lane spawned but not yet running counts, so that one
    /// idle worker is not given two.
    pulling: Arc<AtomicUsize>,
}

impl Backlog {
    /// The next call to poll, first come first served.
    pub(super) fn pop(&self) -> Option<Guarded> {
        self.calls.lock().pop_front()
    }

    pub(super) fn extend(&self, calls: impl Iterator<Item = Guarded>) {
        self.calls.lock().extend(calls);
    }

    pub(super) fn len(&self) -> usize {
        self.calls.lock().len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lanes pulling now.
    pub(super) fn lanes(&self) -> usize {
        self.pulling.load(SeqCst)
    }
}

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

/// A lane: calls pulled from the backlog one at a time and polled until the backlog is
/// empty, yielding every [`LANE_SLICE`]; then the calls still waiting (for a store) are
/// seen to their end. Counted as pulling until the backlog is empty. A call is polled
/// where it was first polled, by the lane or by the connection's task, until it ends.
async fn lane(backlog: Backlog) {
    let mut waiting = FuturesUnordered::<Guarded>::new();
    loop {
        let more = poll_fn(|cx| {
            let slice = Instant::now();
            loop {
                while let Poll::Ready(Some(())) = waiting.poll_next_unpin(cx) {}
                let Some(mut call) = backlog.pop() else {
                    return Poll::Ready(false);
                };
                if Pin::new(&mut call).poll(cx).is_pending() {
                    waiting.push(call);
                }
                if slice.elapsed() >= LANE_SLICE {
                    return Poll::Ready(true);
                }
            }
        })
        .await;
        if !more {
            break;
        }
        // Deferred by tokio until this worker has polled the I/O driver (see `drive`).
        tokio::task::yield_now().await;
    }
    backlog.pulling.fetch_sub(1, SeqCst);
    while waiting.next().await.is_some() {}
}

/// Starts `lanes` lanes on the backlog, for as many idle workers. A task spawned from a
/// worker goes to that worker's LIFO slot, which no other worker may steal, and the idle
/// ones are told only when a task is pushed out of it to the queue: so a no-op task is
/// spawned after the lanes, pushing the last of them out too.
pub(super) fn spawn_lanes(backlog: &Backlog, lanes: usize) {
    for _ in 0..lanes {
        backlog.pulling.fetch_add(1, SeqCst);
        tokio::spawn(lane(backlog.clone()).in_current_span());
    }
    if lanes > 0 {
        tokio::spawn(async {});
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

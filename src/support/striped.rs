//! Counters the worker threads add to without sharing a cache line: each thread adds to
//! its own stripe, and a reader (a metrics scrape) sums the stripes. Owns the stripe
//! layout; the engine's counters (`engine/stats.rs`) and the request metrics
//! (`service/metrics`, which encodes these for Prometheus) are built from it.
//!
//! Must not lock, allocate or read another thread's stripe when recording: these are
//! touched by every request, and a cache line bounced between the cores on each one
//! cost more than the rest of the metrics together.

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crossbeam_utils::CachePadded;

/// Stripes per metric: one per core this process may run on, at most 8 (each stripe is
/// a padded cache line or two, so more would only cost memory).
pub fn stripe_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, usize::from)
            .clamp(1, 8)
    })
}

/// The calling thread's stripe: threads take stripes in turn when they first record, so
/// the runtime's workers (started together) land on different ones.
pub fn stripe() -> usize {
    /// Not yet assigned.
    const UNSET: usize = usize::MAX;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        // Const-initialised: reading it is one thread-local load, with no lazy-init check.
        static STRIPE: Cell<usize> = const { Cell::new(UNSET) };
    }
    STRIPE.with(|s| match s.get() {
        UNSET => {
            let assigned = NEXT.fetch_add(1, Relaxed) % stripe_count();
            s.set(assigned);
            assigned
        }
        assigned => assigned,
    })
}

/// `N` counters kept together per stripe (the counters one event moves, so that it
/// touches one line). A clone shares the counters (a metric family hands out clones).
#[derive(Debug, Clone)]
pub struct StripedCells<const N: usize> {
    stripes: Arc<[CachePadded<[AtomicU64; N]>]>,
}

impl<const N: usize> Default for StripedCells<N> {
    fn default() -> Self {
        StripedCells {
            stripes: (0..stripe_count())
                .map(|_| CachePadded::new(std::array::from_fn(|_| AtomicU64::new(0))))
                .collect(),
        }
    }
}

impl<const N: usize> StripedCells<N> {
    /// Adds `by` to counter `cell` in this thread's stripe.
    pub fn add(&self, cell: usize, by: u64) {
        // `stripe()` is below `stripe_count()`, the stripes' number; a `cell` past `N`
        // (a caller's slip) moves nothing.
        if let Some(c) = self.stripes.get(stripe()).and_then(|s| s.get(cell)) {
            c.fetch_add(by, Relaxed);
        }
    }

    /// Counter `cell` summed over the stripes.
    pub fn get(&self, cell: usize) -> u64 {
        self.stripes
            .iter()
            .filter_map(|s| s.get(cell))
            .map(|c| c.load(Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

/// One counter, striped; a clone shares it.
#[derive(Debug, Default, Clone)]
pub struct StripedCounter(StripedCells<1>);

impl StripedCounter {
    pub fn add(&self, by: u64) {
        self.0.add(0, by);
    }

    pub fn get(&self) -> u64 {
        self.0.get(0)
    }
}

/// A gauge moved up and down by every request (`requests_in_flight`). A request may end
/// on another thread than it began on; the sum over the stripes is still exact.
#[derive(Debug, Clone)]
pub struct StripedGauge {
    stripes: Arc<[CachePadded<AtomicI64>]>,
}

impl Default for StripedGauge {
    fn default() -> Self {
        StripedGauge {
            stripes: (0..stripe_count())
                .map(|_| CachePadded::new(AtomicI64::new(0)))
                .collect(),
        }
    }
}

impl StripedGauge {
    // `stripe()` is below `stripe_count()`, the stripes' number: `get` always finds one.
    pub fn inc(&self) {
        if let Some(s) = self.stripes.get(stripe()) {
            s.fetch_add(1, Relaxed);
        }
    }

    pub fn dec(&self) {
        if let Some(s) = self.stripes.get(stripe()) {
            s.fetch_sub(1, Relaxed);
        }
    }

    pub fn get(&self) -> i64 {
        self.stripes
            .iter()
            .map(|s| s.load(Relaxed))
            .fold(0, i64::wrapping_add)
    }
}

/// Most buckets a [`StripedHistogram`] has, `+Inf` included.
const MAX_BUCKETS: usize = 24;

/// One stripe of a histogram: the count per bucket (not cumulative; their sum is the
/// count of observations, so that is not kept apart) and the sum of the observations in
/// nanoseconds (an integer, so that adding stays one atomic add).
#[derive(Debug)]
struct HistogramStripe {
    buckets: [AtomicU64; MAX_BUCKETS],
    sum_nanos: AtomicU64,
}

/// A latency histogram in seconds with fixed upper bounds, `+Inf` last.
#[derive(Debug, Clone)]
pub struct StripedHistogram {
    bounds: Arc<[f64]>,
    stripes: Arc<[CachePadded<HistogramStripe>]>,
}

impl StripedHistogram {
    /// A histogram with these upper bounds (seconds, ascending) and `+Inf`.
    ///
    /// # Panics
    /// With more than `MAX_BUCKETS - 1` bounds: a programming error.
    pub fn new(bounds: impl IntoIterator<Item = f64>) -> StripedHistogram {
        let bounds: Arc<[f64]> = bounds
            .into_iter()
            .chain(std::iter::once(f64::MAX))
            .collect();
        assert!(
            bounds.len() <= MAX_BUCKETS,
            "{} histogram bounds",
            bounds.len()
        );
        let stripes = (0..stripe_count())
            .map(|_| {
                CachePadded::new(HistogramStripe {
                    buckets: std::array::from_fn(|_| AtomicU64::new(0)),
                    sum_nanos: AtomicU64::new(0),
                })
            })
            .collect();
        StripedHistogram { bounds, stripes }
    }

    pub fn observe(&self, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        // `+Inf` is last, so some bound always holds.
        let bucket = self
            .bounds
            .iter()
            .position(|&upper| secs <= upper)
            .unwrap_or(self.bounds.len() - 1);
        // `stripe()` is below the stripes' number and `bucket` below `bounds.len()`,
        // at most `MAX_BUCKETS` (`new`): both `get`s find their item.
        let Some(s) = self.stripes.get(stripe()) else {
            return;
        };
        if let Some(b) = s.buckets.get(bucket) {
            b.fetch_add(1, Relaxed);
        }
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        s.sum_nanos.fetch_add(nanos, Relaxed);
    }

    /// Sum (seconds), count and per-bucket counts over the stripes.
    pub fn totals(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let mut buckets: Vec<(f64, u64)> = self.bounds.iter().map(|&b| (b, 0)).collect();
        let mut nanos = 0u64;
        for s in self.stripes.iter() {
            for (total, b) in buckets.iter_mut().zip(&s.buckets) {
                total.1 = total.1.wrapping_add(b.load(Relaxed));
            }
            nanos = nanos.wrapping_add(s.sum_nanos.load(Relaxed));
        }
        let count = buckets.iter().map(|b| b.1).fold(0, u64::wrapping_add);
        (nanos as f64 / 1e9, count, buckets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gauge_moved_on_several_threads_sums_exactly() {
        let gauge = StripedGauge::default();
        std::thread::scope(|scope| {
            for _ in 0..4 {
                let gauge = gauge.clone();
                scope.spawn(move || {
                    (0..1_000).for_each(|_| gauge.inc());
                    (0..999).for_each(|_| gauge.dec());
                });
            }
        });
        assert_eq!(gauge.get(), 4);
    }

    #[test]
    fn cells_sum_over_threads() {
        let cells = Arc::new(StripedCells::<3>::default());
        std::thread::scope(|scope| {
            for t in 0..4u64 {
                let cells = cells.clone();
                scope.spawn(move || (0..500).for_each(|_| cells.add(1, t + 1)));
            }
        });
        assert_eq!((cells.get(0), cells.get(1), cells.get(2)), (0, 5_000, 0));
    }
}

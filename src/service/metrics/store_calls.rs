//! Store calls by kind for the operator's page: how many of each (operation, outcome) —
//! the outcome is an error's class — and how long they took, from a histogram of their
//! own per kind (the exported `store_call_duration_seconds` is by operation alone: a
//! timeout's seconds and a success's microseconds share its buckets). Owns the series'
//! shape and the arithmetic that reads a latency out of a histogram's buckets; recording
//! is the registry's (`registry.rs`), and nothing here is exported to Prometheus.

use serde::Serialize;

use crate::support::striped::{StripedCounter, StripedHistogram};

/// One kind of store call's series: its count and latency (both exported), and its
/// latency again for this kind alone (the page's).
#[derive(Debug, Clone)]
pub(super) struct StoreCallSeries {
    pub(super) calls: StripedCounter,
    /// `store_call_duration_seconds{operation}`: shared by every outcome of the operation.
    pub(super) operation_latency: StripedHistogram,
    /// This (operation, outcome)'s alone.
    pub(super) latency: StripedHistogram,
}

impl StoreCallSeries {
    pub(super) fn record(&self, elapsed: std::time::Duration) {
        self.calls.add(1);
        self.operation_latency.observe(elapsed);
        self.latency.observe(elapsed);
    }

    pub(super) fn summary(&self, operation: &'static str, outcome: &'static str) -> StoreCalls {
        let (sum_s, count, buckets) = self.latency.totals();
        StoreCalls {
            operation,
            outcome,
            count: self.calls.get(),
            mean_ms: (count > 0).then(|| 1e3 * sum_s / count as f64),
            p99_at_most_ms: quantile_bound(&buckets, 0.99).map(|s| 1e3 * s),
        }
    }
}

/// Store calls of one (operation, outcome) since start.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StoreCalls {
    pub operation: &'static str,
    pub outcome: &'static str,
    pub count: u64,
    /// Mean latency (ms); `None` before the first call.
    pub mean_ms: Option<f64>,
    /// The upper bound of the histogram bucket holding the 99th percentile (ms): the
    /// 99th percentile is at most this. `None` before the first call, or when it lies in
    /// the last, unbounded bucket.
    pub p99_at_most_ms: Option<f64>,
}

/// The upper bound of the first bucket by which at least `q` of the observations are
/// counted: `buckets` are (upper bound, count in that bucket), ascending, the last
/// unbounded (`f64::MAX`, answered `None`).
fn quantile_bound(buckets: &[(f64, u64)], q: f64) -> Option<f64> {
    let total: u64 = buckets.iter().map(|b| b.1).sum();
    if total == 0 {
        return None;
    }
    let wanted = (q * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0u64;
    for &(bound, n) in buckets {
        seen += n;
        if seen >= wanted {
            return (bound < f64::MAX).then_some(bound);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_bound_is_the_bucket_holding_the_quantile() {
        let b = [(0.001, 90), (0.002, 9), (0.004, 1), (f64::MAX, 0)];
        assert_eq!(quantile_bound(&b, 0.5), Some(0.001));
        assert_eq!(quantile_bound(&b, 0.99), Some(0.002));
        assert_eq!(quantile_bound(&b, 1.0), Some(0.004));
        assert_eq!(quantile_bound(&[(0.001, 0), (f64::MAX, 0)], 0.99), None);
        // In the unbounded bucket: no finite bound to say.
        assert_eq!(quantile_bound(&[(0.001, 1), (f64::MAX, 99)], 0.99), None);
    }

    #[test]
    fn a_kind_reports_its_own_latency_and_the_operation_all_of_them() {
        let histogram = || StripedHistogram::new([0.001, 0.01, 0.1, 1.0]);
        let operation_latency = histogram();
        let ok = StoreCallSeries {
            calls: StripedCounter::default(),
            operation_latency: operation_latency.clone(),
            latency: histogram(),
        };
        let timeout = StoreCallSeries {
            calls: StripedCounter::default(),
            operation_latency,
            latency: histogram(),
        };
        (0..100).for_each(|_| ok.record(Duration::from_micros(500)));
        timeout.record(Duration::from_millis(600));
        let fast = ok.summary("debit", "ok");
        assert_eq!((fast.count, fast.p99_at_most_ms), (100, Some(1.0)));
        assert!((fast.mean_ms.unwrap() - 0.5).abs() < 1e-9, "{fast:?}");
        let slow = timeout.summary("debit", "timeout");
        assert_eq!((slow.count, slow.p99_at_most_ms), (1, Some(1000.0)));
        assert_eq!(ok.operation_latency.totals().1, 101);
    }
}

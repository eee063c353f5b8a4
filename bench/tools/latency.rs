//! Latency histograms of the load tools (`rls_load`, `ddb_update_loop`), included by each
//! through `#[path]`: one constructor, so every tool records microseconds over the same
//! range and precision, and one summary, so every tool prints the same keys
//! (`bench/bench.py` reads them). An HDR histogram keeps a run's memory fixed whatever its
//! length, and per-task histograms merge without loss.

use hdrhistogram::Histogram;

/// The smallest latency told apart, in µs: the tools time with µs resolution.
const LOWEST_US: u64 = 1;
/// The largest latency recorded, in µs (60 s, far past every tool's deadline); a longer
/// one is recorded as 60 s.
const HIGHEST_US: u64 = 60_000_000;
/// Every recorded value is kept within 0.1% (exact below 2048 µs).
const SIGNIFICANT_DIGITS: u8 = 3;

/// An empty histogram of microsecond latencies (1 µs … 60 s, 3 significant digits).
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(LOWEST_US, HIGHEST_US, SIGNIFICANT_DIGITS)
        .expect("constant bounds are valid")
}

/// Records one latency in µs; past 60 s it counts as 60 s rather than being lost.
pub fn record(h: &mut Histogram<u64>, us: u64) {
    h.saturating_record(us);
}

/// `{"p50", "p99", "p99.9", "max", "mean"}` of `h`, in µs; zeros when it is empty.
/// Percentiles are nearest-rank over the histogram's buckets.
pub fn summary(h: &Histogram<u64>) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    for (name, q) in [("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999)] {
        let v = if h.is_empty() {
            0
        } else {
            h.value_at_quantile(q)
        };
        m.insert(name.into(), v.into());
    }
    // max() of an empty histogram is undefined.
    m.insert("max".into(), if h.is_empty() { 0 } else { h.max() }.into());
    m.insert("mean".into(), h.mean().into());
    m
}

//! Latency summaries the load tools print (`bench/bench.py` reads them): nearest-rank
//! percentiles of per-request latencies, shared so every tool reports them alike.

/// `{"p50", "p99", "p99.9", "max"}` of `sorted` (ascending), in its unit; zeros when empty.
pub fn percentiles(sorted: &[u64]) -> serde_json::Map<String, serde_json::Value> {
    let mut m = serde_json::Map::new();
    for (name, p) in [("p50", 50.0), ("p99", 99.0), ("p99.9", 99.9)] {
        m.insert(name.into(), percentile(sorted, p).into());
    }
    m.insert("max".into(), sorted.last().copied().unwrap_or(0).into());
    m
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

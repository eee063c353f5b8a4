//! The striped counters (`crate::support::striped`) as Prometheus metrics: a scrape sums the
//! stripes and encodes them as prometheus-client's own types would.

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

use crate::support::striped::{StripedCounter, StripedGauge, StripedHistogram};

impl TypedMetric for StripedCounter {
    const TYPE: MetricType = MetricType::Counter;
}

impl EncodeMetric for StripedCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_counter::<NoLabelSet, _, u64>(&self.get(), None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

impl TypedMetric for StripedGauge {
    const TYPE: MetricType = MetricType::Gauge;
}

impl EncodeMetric for StripedGauge {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        encoder.encode_gauge(&self.get())
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

impl TypedMetric for StripedHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for StripedHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let (sum, count, buckets) = self.totals();
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
    use prometheus_client::registry::Registry;
    use std::time::Duration;

    fn render(name: &str, metric: impl prometheus_client::registry::Metric) -> String {
        let mut registry = Registry::default();
        registry.register(name, "help", metric);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    /// Recorded from several threads, the histogram encodes exactly as
    /// prometheus-client's own given the same observations.
    #[test]
    fn a_striped_histogram_encodes_as_the_locked_one() {
        let bounds = || exponential_buckets(0.000_05, 2.0, 16);
        let striped = StripedHistogram::new(bounds());
        let locked = Histogram::new(bounds());
        // Exact in both: multiples of a microsecond, sums below 2^53 nanoseconds.
        let samples: Vec<Duration> = (0..4_000u64)
            .map(|i| Duration::from_micros((i * 7_919) % 5_000_000))
            .collect();
        std::thread::scope(|scope| {
            for part in samples.chunks(1_000) {
                let striped = striped.clone();
                scope.spawn(move || part.iter().for_each(|d| striped.observe(*d)));
            }
        });
        for d in &samples {
            locked.observe(d.as_secs_f64());
        }
        let (ours, theirs) = (render("h", striped), render("h", locked));
        // The sum is added in another order, so it may differ in its last digits.
        let without_sum = |s: &str| -> Vec<String> {
            s.lines()
                .filter(|l| !l.starts_with("h_sum"))
                .map(String::from)
                .collect()
        };
        assert_eq!(without_sum(&ours), without_sum(&theirs), "{ours}");
        let sum = |s: &str| -> f64 {
            let line = s.lines().find(|l| l.starts_with("h_sum")).unwrap();
            line.split(' ').nth(1).unwrap().parse().unwrap()
        };
        assert!((sum(&ours) - sum(&theirs)).abs() < 1e-6, "{ours}\n{theirs}");
    }

    #[test]
    fn a_gauge_encodes_its_sum() {
        let gauge = StripedGauge::default();
        gauge.inc();
        gauge.inc();
        gauge.dec();
        assert!(render("g", gauge).contains("g 1\n"));
    }
}

//! The top values as Prometheus gauges, bounded (`--top-values-metric N`, off by default):
//! each rule's `N` most refused and `N` most admitted values over the window, labelled by
//! value. Owns that encoding only; the values are the board's.
//!
//! Must not export more than `N` values per rule and side: a label per request value is
//! what explodes a Prometheus's series, and the bound is what makes this one safe. A value
//! that drops out of the top `N` leaves the page (its series goes stale).

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::metrics::MetricType;

use super::board::{Table, TopBoard, MAX_LISTED};

/// Each rule's top `n` values as gauges, read from the board at every scrape.
#[derive(Debug)]
pub struct TopMetric {
    board: Arc<TopBoard>,
    n: usize,
}

impl TopMetric {
    pub fn new(board: Arc<TopBoard>, n: usize) -> TopMetric {
        TopMetric {
            board,
            n: n.clamp(1, MAX_LISTED),
        }
    }
}

/// Name and help of the two gauges.
const SERIES: [(&str, &str); 2] = [
    (
        "top_refused_hits",
        "Hits refused over the last 5 minutes for each rule's most refused descriptor values (estimates; top N only)",
    ),
    (
        "top_admitted_hits",
        "Hits admitted over the last 5 minutes for each rule's most admitted descriptor values (estimates; top N only)",
    ),
];

impl Collector for TopMetric {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let report = self.board.report(self.n, None);
        for (side, (name, help)) in SERIES.iter().enumerate() {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for rule in &report.rules {
                let table: &Table = if side == 0 {
                    &rule.refused
                } else {
                    &rule.admitted
                };
                for v in &table.top {
                    let labels = [
                        ("domain", rule.domain.as_str()),
                        ("rule", rule.rule.as_str()),
                        ("value", v.value.as_str()),
                    ];
                    family.encode_family(&labels)?.encode_gauge(&v.count)?;
                }
            }
        }
        Ok(())
    }
}

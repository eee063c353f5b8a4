//! Who is being limited now: per rule, the descriptor values most refused and most
//! admitted over the last few minutes, in fixed memory whatever the values (Space-Saving
//! summaries, `sketch.rs`; a ring of per-minute ones merged when read, `window.rs`; hits per
//! 5-second tick for the page's charts, `rates.rs`; the rules' tables, striped, and the report `/top` serves, `board.rs`; the bounded
//! Prometheus gauges of `--top-values-metric`, `metric.rs`).
//!
//! Must not cost a decision more than a few hash compares and an uncontended lock, nor
//! grow with the number of distinct values a caller sends.

mod board;
mod metric;
mod rates;
mod sketch;
mod window;

#[cfg(test)]
mod accuracy_tests;

pub use board::{
    RateReport, RuleReport, RuleTop, Table, TopBoard, TopReport, TopValue, MAX_LISTED,
};
pub use metric::TopMetric;
pub use sketch::{Sketch, CAPACITY, LABEL_BYTES};

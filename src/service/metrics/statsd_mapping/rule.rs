//! One mapping of a statsd_exporter mapping file, checked (`Rule`: how it matches, what
//! it makes of a stat), and the kinds of stat and timer export a mapping names. Types
//! only: reading is `file.rs`'s, matching `statsd_mapping.rs`'s.

use super::glob::Glob;

/// The kind of a stat, which `match_metric_type` selects on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatKind {
    Counter,
    Gauge,
    /// A timer (statsd_exporter's "observer").
    Observer,
}

/// How a timer is exported.
#[derive(Debug, Clone, PartialEq)]
pub enum Timer {
    /// A histogram with these finite upper bounds (`+Inf` implied).
    Histogram(Vec<f64>),
    Summary,
}

#[derive(Debug)]
pub(super) enum Matcher {
    Glob(Glob),
    Regex(regex::Regex),
}

/// One mapping, checked.
#[derive(Debug)]
pub(super) struct Rule {
    pub(super) matcher: Matcher,
    pub(super) metric_type: Option<StatKind>,
    /// `action: drop`.
    pub(super) drop: bool,
    /// The name template.
    pub(super) name: String,
    /// Label names and value templates, sorted by name.
    pub(super) labels: Vec<(String, String)>,
    pub(super) help: Option<String>,
    pub(super) scale: Option<f64>,
    pub(super) timer: Timer,
}

impl Rule {
    pub(super) fn admits(&self, kind: StatKind) -> bool {
        self.metric_type.is_none_or(|k| k == kind)
    }

    pub(super) fn pattern(&self) -> &str {
        match &self.matcher {
            Matcher::Glob(g) => g.text(),
            Matcher::Regex(r) => r.as_str(),
        }
    }
}

//! What envoyproxy/ratelimit's Prometheus port serves: the statsd stats in upstream's
//! names (`statsd.rs`' [`Reading`]) mapped through a statsd_exporter mapping
//! (`statsd_mapping.rs`), in Prometheus' text exposition format 0.0.4. Pure: one reading
//! in, the page out, at scrape time; the listener is `server/upstream_prometheus.rs`. It
//! must not decide which mapping applies (the mapping's) nor read a clock or a socket.
//!
//! What upstream's sink feeds statsd_exporter, it gets here too: counters are totals since
//! the start; one that never moved is not exported (upstream's stats library flushes only
//! counters that moved); stats that map to the same name and labels are summed; the
//! latency timer appears once a call was timed. Upstream times a call in whole
//! milliseconds; the mapping's `scale` applies to that unit (upstream's own mapping turns
//! it into seconds).
//!
//! Timers: a histogram is re-bucketed from the latency histogram (see [`rebucket`]); a
//! summary is written as its `_sum` and `_count` only. statsd_exporter's quantiles are
//! over the last 10 minutes of single observations, which a histogram since the start
//! cannot give, so none are made up.
//!
//! A stat whose mapped name is already a metric of another type (or the `_bucket`,
//! `_sum`, `_count` of a timer's) is left out, as statsd_exporter drops such events; the
//! first in the reading's order keeps the name.
//!
//! Written by hand, not with prometheus-client: that crate writes OpenMetrics, whose
//! counters take a `_total` suffix that upstream's names do not have.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

use super::statsd::{Reading, RESPONSE_TIME};
use super::statsd_mapping::{Mapped, StatKind, StatsdMapping, Timer};

/// The content type of [`render`]'s page.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The help of a metric whose mapping gives none.
const DEFAULT_HELP: &str = "envoyproxy/ratelimit statsd stat, as its statsd mapping names it";

/// The page for `reading` under `mapping`.
pub(crate) fn render(reading: &Reading, mapping: &StatsdMapping) -> String {
    let mut page = Page::default();
    for (name, total) in &reading.counters {
        if *total == 0 {
            continue;
        }
        if let Some(mapped) = mapping.map(name, StatKind::Counter) {
            let value = mapped.scaled(*total as f64);
            page.add(&mapped, Series::Counter(value));
        }
    }
    if let Some((mapped, series)) = latency(reading, mapping) {
        page.add(&mapped, series);
    }
    page.text()
}

/// The latency timer's series, once a call was timed and unless it is dropped.
fn latency<'m>(reading: &Reading, mapping: &'m StatsdMapping) -> Option<(Mapped<'m>, Series)> {
    let count: u64 = reading.latency.iter().map(|(_, n)| n).sum();
    if count == 0 {
        return None;
    }
    let mapped = mapping.map(RESPONSE_TIME, StatKind::Observer)?;
    let convert = |seconds: f64| mapped.scaled(seconds * 1_000.0);
    let sum = convert(reading.latency_sum);
    let series = match mapped.timer {
        Timer::Histogram(bounds) => Series::Histogram {
            cumulative: rebucket(&reading.latency, convert, bounds),
            bounds: bounds.clone(),
            count,
            sum,
        },
        Timer::Summary => Series::Summary { count, sum },
    };
    Some((mapped, series))
}

/// The cumulative count at each of `bounds` from `source`'s buckets ((upper bound in
/// seconds, count), non-cumulative, `f64::MAX` last for `+Inf`), `convert` taking a
/// bound in seconds to the target's unit.
///
/// The two sets of bounds need not align. A source bucket counts at a target bound only
/// if its whole range lies at or below it (its upper bound, converted, is at most the
/// target bound); one that straddles a target bound is counted from the next target bound
/// that holds its upper bound, or only in `+Inf`. So a target bucket may hold too few
/// calls, never too many: a call counted at a bound surely took no longer. (The
/// conversion is the same floating-point arithmetic for a bound as for a call in it, and
/// rounding keeps order, so the comparison cannot wrongly admit a bucket.)
pub(crate) fn rebucket(
    source: &[(f64, u64)],
    convert: impl Fn(f64) -> f64,
    bounds: &[f64],
) -> Vec<u64> {
    bounds
        .iter()
        .map(|&bound| {
            source
                .iter()
                .filter(|(upper, _)| *upper != f64::MAX && convert(*upper) <= bound)
                .map(|(_, n)| n)
                .sum()
        })
        .collect()
}

/// One label set's values.
#[derive(Debug, Clone, PartialEq)]
enum Series {
    Counter(f64),
    Histogram {
        bounds: Vec<f64>,
        /// The cumulative count at each bound (`+Inf` is `count`).
        cumulative: Vec<u64>,
        count: u64,
        sum: f64,
    },
    Summary {
        count: u64,
        sum: f64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Histogram,
    Summary,
}

impl Series {
    fn kind(&self) -> Kind {
        match self {
            Series::Counter(_) => Kind::Counter,
            Series::Histogram { .. } => Kind::Histogram,
            Series::Summary { .. } => Kind::Summary,
        }
    }

    /// Adds `other` (the same kind) into this series; histograms of different bounds do
    /// not add up, and the later is left out.
    fn merge(&mut self, other: Series) {
        match (self, other) {
            (Series::Counter(a), Series::Counter(b)) => *a += b,
            (Series::Summary { count, sum }, Series::Summary { count: c, sum: s }) => {
                *count += c;
                *sum += s;
            }
            (
                Series::Histogram {
                    bounds,
                    cumulative,
                    count,
                    sum,
                },
                Series::Histogram {
                    bounds: b,
                    cumulative: k,
                    count: c,
                    sum: s,
                },
            ) if *bounds == b => {
                cumulative.iter_mut().zip(k).for_each(|(a, b)| *a += b);
                *count += c;
                *sum += s;
            }
            _ => {}
        }
    }
}

impl Kind {
    fn word(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
            Kind::Summary => "summary",
        }
    }

    /// The sample names a metric of this kind writes.
    fn sample_names(self, name: &str) -> Vec<String> {
        let suffixes: &[&str] = match self {
            Kind::Counter => &[""],
            Kind::Histogram => &["", "_bucket", "_sum", "_count"],
            Kind::Summary => &["", "_sum", "_count"],
        };
        suffixes.iter().map(|s| format!("{name}{s}")).collect()
    }
}

struct Family {
    kind: Kind,
    help: String,
    series: BTreeMap<Vec<(String, String)>, Series>,
}

/// The metrics of one page, by name.
#[derive(Default)]
struct Page {
    families: BTreeMap<String, Family>,
    /// Every sample name a family writes.
    taken: HashSet<String>,
}

impl Page {
    fn add(&mut self, mapped: &Mapped<'_>, series: Series) {
        let kind = series.kind();
        if !self.claim(&mapped.name, kind) {
            return;
        }
        let family = self
            .families
            .entry(mapped.name.clone())
            .or_insert_with(|| Family {
                kind,
                help: mapped.help.unwrap_or(DEFAULT_HELP).to_string(),
                series: BTreeMap::new(),
            });
        match family.series.entry(mapped.labels.clone()) {
            Entry::Vacant(e) => {
                e.insert(series);
            }
            Entry::Occupied(mut e) => e.get_mut().merge(series),
        }
    }

    /// Whether `name` may hold a metric of `kind`: it does already, or none of the
    /// sample names it would write is taken.
    fn claim(&mut self, name: &str, kind: Kind) -> bool {
        if let Some(family) = self.families.get(name) {
            return family.kind == kind;
        }
        let names = kind.sample_names(name);
        if names.iter().any(|n| self.taken.contains(n)) {
            return false;
        }
        self.taken.extend(names);
        true
    }

    fn text(&self) -> String {
        let mut out = String::new();
        for (name, family) in &self.families {
            let _ = writeln!(out, "# HELP {name} {}", escape_help(&family.help));
            let _ = writeln!(out, "# TYPE {name} {}", family.kind.word());
            for (labels, series) in &family.series {
                write_series(&mut out, name, labels, series);
            }
        }
        out
    }
}

fn write_series(out: &mut String, name: &str, labels: &[(String, String)], series: &Series) {
    let plain = label_text(labels, None);
    match series {
        Series::Counter(value) => {
            let _ = writeln!(out, "{name}{plain} {}", number(*value));
        }
        Series::Histogram {
            bounds,
            cumulative,
            count,
            sum,
        } => {
            for (bound, n) in bounds.iter().zip(cumulative) {
                let le = label_text(labels, Some(&number(*bound)));
                let _ = writeln!(out, "{name}_bucket{le} {n}");
            }
            let _ = writeln!(
                out,
                "{name}_bucket{} {count}",
                label_text(labels, Some("+Inf"))
            );
            let _ = writeln!(out, "{name}_sum{plain} {}", number(*sum));
            let _ = writeln!(out, "{name}_count{plain} {count}");
        }
        Series::Summary { count, sum } => {
            let _ = writeln!(out, "{name}_sum{plain} {}", number(*sum));
            let _ = writeln!(out, "{name}_count{plain} {count}");
        }
    }
}

/// `{a="1",b="2"}` (with `le` last when given), or nothing for no labels.
fn label_text(labels: &[(String, String)], le: Option<&str>) -> String {
    let mut pairs: Vec<String> = labels
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape_label_value(v)))
        .collect();
    if let Some(le) = le {
        pairs.push(format!("le=\"{le}\""));
    }
    if pairs.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", pairs.join(","))
    }
}

/// A label value as the text format quotes it: `\`, `"` and newlines escaped.
fn escape_label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A help text as the text format writes it: `\` and newlines escaped.
fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A sample value or bound: plain decimals, an exponent for very large or small ones,
/// and the text format's spellings of the infinities and NaN.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else if v != 0.0 && (v.abs() >= 1e15 || v.abs() < 1e-6) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EG_MAPPING: &str = include_str!("../../../tests/fixtures/envoy-gateway/statsd_conf.yaml");

    fn eg() -> StatsdMapping {
        StatsdMapping::from_yaml(EG_MAPPING).unwrap()
    }

    fn reading(counters: &[(&str, u64)], latency: &[(f64, u64)], sum: f64) -> Reading {
        Reading {
            counters: counters.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
            latency: latency.to_vec(),
            latency_sum: sum,
        }
    }

    #[test]
    fn counters_map_to_envoy_gateways_names_and_labels() {
        let page = render(
            &reading(
                &[
                    ("ratelimit.service.rate_limit.edge.user.total_hits", 3),
                    ("ratelimit.service.rate_limit.edge.user.over_limit", 1),
                    ("ratelimit.service.rate_limit.edge.user.near_limit", 0),
                    (
                        "ratelimit.service.rate_limit.edge.tenant_a.api.total_hits",
                        2,
                    ),
                    ("ratelimit.service.config_load_success", 1),
                    ("ratelimit_server.ShouldRateLimit.total_requests", 5),
                ],
                &[],
                0.0,
            ),
            &eg(),
        );
        let help = DEFAULT_HELP;
        let expected = format!(
            "# HELP ratelimit_service_config_load_success {help}
# TYPE ratelimit_service_config_load_success counter
ratelimit_service_config_load_success 1
# HELP ratelimit_service_rate_limit_over_limit {help}
# TYPE ratelimit_service_rate_limit_over_limit counter
ratelimit_service_rate_limit_over_limit{{domain=\"edge\",key1=\"user\"}} 1
# HELP ratelimit_service_rate_limit_total_hits {help}
# TYPE ratelimit_service_rate_limit_total_hits counter
ratelimit_service_rate_limit_total_hits{{domain=\"edge\",key1=\"tenant_a\",key2=\"api\"}} 2
ratelimit_service_rate_limit_total_hits{{domain=\"edge\",key1=\"user\"}} 3
# HELP ratelimit_service_total_requests {help}
# TYPE ratelimit_service_total_requests counter
ratelimit_service_total_requests{{grpc_method=\"ShouldRateLimit\"}} 5
"
        );
        assert_eq!(page, expected);
    }

    #[test]
    fn stats_that_map_to_one_series_are_summed() {
        // The regex mapping keeps three levels of a deeper key: both of these are
        // (edge, a_1, b_2).
        let page = render(
            &reading(
                &[
                    (
                        "ratelimit.service.rate_limit.edge.a_1.b_2.c_3.total_hits",
                        4,
                    ),
                    (
                        "ratelimit.service.rate_limit.edge.a_1.b_2.c_4.total_hits",
                        5,
                    ),
                ],
                &[],
                0.0,
            ),
            &eg(),
        );
        assert!(
            page.contains(
                "ratelimit_service_rate_limit_total_hits{domain=\"edge\",key1=\"a_1\",key2=\"b_2\"} 9\n"
            ),
            "{page}"
        );
        assert_eq!(page.matches("total_hits{").count(), 1, "{page}");
    }

    #[test]
    fn the_latency_is_a_histogram_in_the_mappings_unit() {
        // 4 calls ≤ 1 ms, 2 ≤ 4 ms, 1 past the last bound; 7.8125 ms in all (a sum
        // that stays exact through the unit changes).
        let buckets = [(0.001, 4), (0.004, 2), (f64::MAX, 1)];
        let r = reading(&[], &buckets, 0.007_812_5);
        // Upstream's own mapping: seconds (scale 0.001).
        let page = render(&r, &StatsdMapping::upstream_default(false));
        let name = "ratelimit_service_response_time_seconds";
        let m = "grpc_method=\"ShouldRateLimit\"";
        for (le, n) in [("0.005", 6), ("0.01", 6), ("10", 6), ("+Inf", 7)] {
            let line = format!("{name}_bucket{{{m},le=\"{le}\"}} {n}\n");
            assert!(page.contains(&line), "{line} not in\n{page}");
        }
        assert!(
            page.contains(&format!("# TYPE {name} histogram\n")),
            "{page}"
        );
        assert!(
            page.contains(&format!("{name}_sum{{{m}}} 0.0078125\n")),
            "{page}"
        );
        assert!(page.contains(&format!("{name}_count{{{m}}} 7\n")), "{page}");
        // Envoy Gateway's: no scale, so milliseconds against the same default bounds.
        let page = render(&r, &eg());
        for (le, n) in [
            ("0.5", 0),
            ("1", 4),
            ("2.5", 4),
            ("5", 6),
            ("10", 6),
            ("+Inf", 7),
        ] {
            let line = format!("{name}_bucket{{{m},le=\"{le}\"}} {n}\n");
            assert!(page.contains(&line), "{line} not in\n{page}");
        }
        assert!(
            page.contains(&format!("{name}_sum{{{m}}} 7.8125\n")),
            "{page}"
        );
        // No call timed: no timer.
        let none = render(&reading(&[], &[(0.001, 0), (f64::MAX, 0)], 0.0), &eg());
        assert_eq!(none, "");
    }

    #[test]
    fn rebucketing_never_counts_a_call_below_a_bound_it_may_exceed() {
        let ms = |s: f64| s * 1_000.0;
        // Source bounds 0.05, 0.1, 0.2, 0.4 ms, +Inf; targets 0.1, 0.3, 1 ms.
        let source = [
            (0.000_05, 1),
            (0.000_1, 2),
            (0.000_2, 4),
            (0.000_4, 8),
            (f64::MAX, 16),
        ];
        // Aligned at 0.1; the (0.2, 0.4] bucket straddles 0.3 and waits for 1.
        assert_eq!(rebucket(&source, ms, &[0.1, 0.3, 1.0]), vec![3, 7, 15]);
        // Targets finer than the source: nothing is counted before its bucket ends.
        assert_eq!(rebucket(&source, ms, &[0.01, 0.07]), vec![0, 1]);
        // Past the last finite bound: only in +Inf.
        assert_eq!(rebucket(&source, ms, &[1e9]), vec![15]);
        assert!(rebucket(&source, ms, &[]).is_empty());
    }

    #[test]
    fn a_summary_timer_has_its_sum_and_count_only() {
        let mapping = StatsdMapping::from_yaml(
            "mappings:\n  - match: \"ratelimit_server.*.response_time\"\n    name: rt\n    timer_type: summary\n    scale: 0.001\n    help: \"Call \\\\ latency\\nin s\"\n",
        )
        .unwrap();
        let page = render(
            &reading(&[], &[(0.002, 3), (f64::MAX, 0)], 0.003_906_25),
            &mapping,
        );
        assert_eq!(
            page,
            "# HELP rt Call \\\\ latency\\nin s\n# TYPE rt summary\nrt_sum 0.00390625\nrt_count 3\n"
        );
    }

    #[test]
    fn names_taken_by_another_type_are_left_to_the_first() {
        let mapping = StatsdMapping::from_yaml(
            "defaults: {timer_type: histogram}\nmappings:\n  - match: \"a.*\"\n    name: lat_count\n  - match: \"ratelimit_server.*.response_time\"\n    name: lat\n",
        )
        .unwrap();
        let page = render(
            &reading(&[("a.b", 2)], &[(0.001, 1), (f64::MAX, 0)], 0.001),
            &mapping,
        );
        // The counter came first and holds `lat_count`: the histogram would write it too.
        assert_eq!(page.matches("# TYPE").count(), 1, "{page}");
        assert!(page.contains("lat_count 2\n"), "{page}");
    }

    #[test]
    fn label_values_and_odd_numbers_are_written_as_the_text_format_wants() {
        assert_eq!(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(
            label_text(&[("k".into(), "v".into())], Some("+Inf")),
            "{k=\"v\",le=\"+Inf\"}"
        );
        assert_eq!(label_text(&[], None), "");
        assert_eq!(number(3.0), "3");
        assert_eq!(number(0.005), "0.005");
        assert_eq!(number(f64::INFINITY), "+Inf");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(number(1e20), "1e20");
        assert_eq!(number(1.5e-9), "1.5e-9");
        // An unmapped stat keeps its name, escaped.
        let page = render(&reading(&[("odd.stat-name", 1)], &[], 0.0), &eg());
        assert!(page.contains("\nodd_stat_name 1\n"), "{page}");
    }
}

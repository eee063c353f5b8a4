//! What statsd is sent, in envoyproxy/ratelimit's stat names, for deployments whose
//! dashboards read a statsd_exporter (Envoy Gateway's earlier releases ran one beside the
//! rate-limit server): the names, the deltas between two flushes, the line format. Pure:
//! the socket and the flush timer are the transport's (`server/statsd.rs`), which asks
//! [`StatsdLines::next`] for the lines of each flush. It reads the same totals `/metrics`
//! serves; nothing here runs on a request's path.
//!
//! What is sent, every flush (upstream's names; the counters as deltas):
//! - `ratelimit.service.rate_limit.<stats key>.{total_hits,over_limit,near_limit,
//!   within_limit,shadow_mode}`, where the stats key is `<domain>.<key>_<value>…` as in
//!   `/metrics`' `key` label;
//! - `ratelimit.service.config_load_success`, `ratelimit.service.config_load_error`;
//! - `ratelimit_server.ShouldRateLimit.total_requests`, and the call latency as the timer
//!   `ratelimit_server.ShouldRateLimit.response_time` (ms). Latency is kept as a
//!   histogram, never per call: each bucket that moved is sent as one timer line at the
//!   bucket's upper bound with a sample rate of `1/count`, which a statsd_exporter
//!   observes `count` times.
//!
//! Extra tags (`EXTRA_TAGS`) are appended to the `ratelimit.` names as upstream's stats
//! library writes tags into a statsd name: `.__<tag>=<value>`, sorted by tag.

use std::collections::HashMap;

use super::Metrics;

/// One extra tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsdTag {
    pub name: String,
    pub value: String,
}

/// Parses `EXTRA_TAGS`' form, `name:value,name:value`.
pub fn parse_tags(text: &str) -> Result<Vec<StatsdTag>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once(':') {
            Some((name, value)) if !name.trim().is_empty() => Ok(StatsdTag {
                name: name.trim().to_string(),
                value: value.trim().to_string(),
            }),
            _ => Err(format!("statsd tag '{pair}' is not name:value")),
        })
        .collect()
}

/// The lines of each flush: what moved since the last flush that reached statsd. A flush
/// that fails leaves the baseline where it was, so the next one carries its deltas too:
/// counters are not lost while statsd is unreachable, and what is held meanwhile is one
/// reading (a total per name), not the lines of every missed flush.
#[derive(Debug)]
pub struct StatsdLines {
    /// The totals of the last flush statsd received.
    deltas: Deltas,
    /// The baseline once the lines last handed out are sent.
    unsent: Option<Deltas>,
    /// [`tag_suffix`] of the extra tags, written once.
    tags: String,
}

impl StatsdLines {
    pub fn new(tags: &[StatsdTag]) -> StatsdLines {
        StatsdLines {
            deltas: Deltas::default(),
            unsent: None,
            tags: tag_suffix(tags),
        }
    }

    /// The lines of what moved since the last flush marked [`StatsdLines::sent`].
    pub fn next(&mut self, metrics: &Metrics) -> Vec<String> {
        let mut after = self.deltas.clone();
        let lines = after.lines(&metrics.statsd_reading(), &self.tags);
        self.unsent = Some(after);
        lines
    }

    /// The lines [`StatsdLines::next`] last handed out reached statsd: the next ones
    /// count from there.
    pub fn sent(&mut self) {
        if let Some(after) = self.unsent.take() {
            self.deltas = after;
        }
    }
}

/// Cumulative totals read at one flush.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Reading {
    /// Counter name (upstream's, without tags) and its total since the start.
    pub(crate) counters: Vec<(String, u64)>,
    /// The call latency histogram: (upper bound in seconds, count in that bucket), the
    /// last bound `f64::MAX` (`+Inf`).
    pub(crate) latency: Vec<(f64, u64)>,
    /// The sum of the call latencies, in seconds.
    pub(crate) latency_sum: f64,
}

/// The previous flush's totals, to send deltas.
#[derive(Debug, Default, Clone)]
struct Deltas {
    counters: HashMap<String, u64>,
    latency: Vec<u64>,
}

impl Deltas {
    /// The lines for what moved since the previous reading (none for what did not).
    fn lines(&mut self, reading: &Reading, tags: &str) -> Vec<String> {
        let mut lines = Vec::new();
        for (name, total) in &reading.counters {
            let last = self.counters.insert(name.clone(), *total).unwrap_or(0);
            let delta = total.saturating_sub(last);
            if delta > 0 {
                let tags = if name.starts_with("ratelimit.") {
                    tags
                } else {
                    ""
                };
                lines.push(format!("{name}{tags}:{delta}|c"));
            }
        }
        self.latency.resize(reading.latency.len(), 0);
        let mut lower_bound = 0.0;
        for ((upper, total), last) in reading.latency.iter().zip(&mut self.latency) {
            let delta = total.saturating_sub(*last);
            *last = *total;
            // The `+Inf` bucket's calls took longer than the last finite bound.
            let at = if *upper == f64::MAX {
                lower_bound
            } else {
                *upper
            };
            lower_bound = at;
            if delta > 0 {
                let ms = at * 1_000.0;
                let line = if delta == 1 {
                    format!("{RESPONSE_TIME}:{ms}|ms")
                } else {
                    format!("{RESPONSE_TIME}:{ms}|ms|@{}", 1.0 / delta as f64)
                };
                lines.push(line);
            }
        }
        lines
    }
}

/// The call latency's timer, in milliseconds.
pub(crate) const RESPONSE_TIME: &str = "ratelimit_server.ShouldRateLimit.response_time";

/// Upstream's stats library's form of tags in a statsd name.
fn tag_suffix(tags: &[StatsdTag]) -> String {
    let mut sorted: Vec<&StatsdTag> = tags.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    sorted
        .iter()
        .map(|t| format!(".__{}={}", clean(&t.name), clean(&t.value)))
        .collect()
}

/// A name or value with the characters the statsd line format reserves replaced.
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            ':' | '|' | '@' | '\n' | '=' | ',' | '.' => '_',
            c => c,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(counters: &[(&str, u64)], latency: &[(f64, u64)]) -> Reading {
        Reading {
            counters: counters.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
            latency: latency.to_vec(),
            latency_sum: 0.0,
        }
    }

    #[test]
    fn counters_are_sent_as_deltas_and_only_when_they_moved() {
        let mut d = Deltas::default();
        let name = "ratelimit.service.rate_limit.d.user.total_hits";
        let first = d.lines(&reading(&[(name, 5)], &[]), "");
        assert_eq!(first, vec![format!("{name}:5|c")]);
        assert!(d.lines(&reading(&[(name, 5)], &[]), "").is_empty());
        let third = d.lines(&reading(&[(name, 12)], &[]), "");
        assert_eq!(third, vec![format!("{name}:7|c")]);
    }

    #[test]
    fn tags_go_on_the_ratelimit_names_in_upstreams_form_sorted() {
        let tags = parse_tags("zone:eu-1, app:rl").unwrap();
        let suffix = tag_suffix(&tags);
        assert_eq!(suffix, ".__app=rl.__zone=eu-1");
        let mut d = Deltas::default();
        let lines = d.lines(
            &reading(
                &[
                    ("ratelimit.service.config_load_success", 1),
                    ("ratelimit_server.ShouldRateLimit.total_requests", 3),
                ],
                &[],
            ),
            &suffix,
        );
        assert_eq!(
            lines,
            vec![
                "ratelimit.service.config_load_success.__app=rl.__zone=eu-1:1|c".to_string(),
                "ratelimit_server.ShouldRateLimit.total_requests:3|c".to_string(),
            ]
        );
        assert!(parse_tags("novalue").unwrap_err().contains("'novalue'"));
        assert!(parse_tags("").unwrap().is_empty());
        assert_eq!(clean("a.b:c|d"), "a_b_c_d");
    }

    #[test]
    fn latency_buckets_become_sampled_timer_lines() {
        let mut d = Deltas::default();
        let buckets = [(0.001, 4), (0.002, 1), (f64::MAX, 2)];
        let lines = d.lines(&reading(&[], &buckets), "");
        assert_eq!(
            lines,
            vec![
                format!("{RESPONSE_TIME}:1|ms|@0.25"),
                format!("{RESPONSE_TIME}:2|ms"),
                // Past the last bound: sent at the last bound, twice.
                format!("{RESPONSE_TIME}:2|ms|@0.5"),
            ]
        );
        let moved = [(0.001, 4), (0.002, 3), (f64::MAX, 2)];
        assert_eq!(
            d.lines(&reading(&[], &moved), ""),
            vec![format!("{RESPONSE_TIME}:2|ms|@0.5")]
        );
    }

    #[test]
    fn a_flush_not_sent_is_carried_by_the_next() {
        let metrics = Metrics::new();
        let mut lines = StatsdLines::new(&[]);
        let load = |lines: &mut StatsdLines| {
            lines
                .next(&metrics)
                .into_iter()
                .find(|l| l.starts_with("ratelimit.service.config_load_success:"))
        };
        metrics.config_loaded("a");
        let first = load(&mut lines);
        assert_eq!(
            first.as_deref(),
            Some("ratelimit.service.config_load_success:1|c")
        );
        // Not sent (statsd unreachable): the next flush carries it, with what moved since.
        metrics.config_loaded("b");
        assert_eq!(
            load(&mut lines).as_deref(),
            Some("ratelimit.service.config_load_success:2|c")
        );
        lines.sent();
        assert_eq!(load(&mut lines), None, "sent once, never again");
    }
}

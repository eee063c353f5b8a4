//! statsd_exporter's mapping files, the part of them envoyproxy/ratelimit's Prometheus
//! port relies on: what a statsd stat name becomes as a Prometheus metric — its name,
//! labels, help, scale and, for a timer, histogram buckets or a summary. Upstream's own
//! mapping (`statsd_mapping/upstream_default.yaml`) and Envoy Gateway's are read whole.
//!
//! Owns the rules of matching only; it must not read files or render metrics
//! (`statsd_prometheus.rs` renders, `server/upstream_prometheus.rs` reads the file).
//!
//! Which mapping applies, as statsd_exporter documents it: every `glob` mapping is tried
//! before any `regex` one, wherever they stand in the file. Among globs the first in the
//! file wins, or, with `defaults.glob_disable_ordering: true`, the most specific (compared
//! part by part from the left, a literal before `*`). Among regexes the first in the file
//! that matches anywhere in the name wins (unanchored, as Go's `FindStringSubmatch`), with
//! Rust's `regex` syntax (RE2's, as Go's, but `\d`, `\w`, `\b` are Unicode-aware). A
//! mapping with `match_metric_type` applies to that kind of stat only. A name no mapping
//! matches keeps its own name with every character but ASCII letters, digits and `_`
//! replaced by `_`, no labels, and the defaults' timer.
//!
//! Refused at load, with a message naming the mapping: a glob that an earlier one matches
//! entirely (statsd_exporter's matcher then picks either, depending on the other mappings
//! in the file), and, in unordered mode, two identical globs.

mod file;
mod glob;
mod names;
mod rule;
#[cfg(test)]
mod tests;

use names::{escape_metric_name, fill_glob_template};
use rule::{Matcher, Rule};
pub use rule::{StatKind, Timer};

/// Prometheus' default histogram buckets (client_golang's), statsd_exporter's default.
pub const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// What a stat becomes.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapped<'m> {
    /// A valid Prometheus metric name.
    pub name: String,
    /// Sorted by label name.
    pub labels: Vec<(String, String)>,
    /// The mapping's `help`, if it has one.
    pub help: Option<&'m str>,
    /// What each value is multiplied by.
    pub scale: Option<f64>,
    /// Used when the stat is a timer.
    pub timer: &'m Timer,
}

impl Mapped<'_> {
    /// `value` with the mapping's scale applied.
    pub fn scaled(&self, value: f64) -> f64 {
        self.scale.map_or(value, |s| value * s)
    }
}

/// A mapping file, read and checked.
#[derive(Debug)]
pub struct StatsdMapping {
    rules: Vec<Rule>,
    /// The timer of names no mapping matches.
    default_timer: Timer,
    /// Globs in file order (statsd_exporter's default), else the most specific first.
    glob_ordering: bool,
}

/// envoyproxy/ratelimit's built-in mapping.
const UPSTREAM_DEFAULT: &str = include_str!("statsd_mapping/upstream_default.yaml");

impl StatsdMapping {
    /// Reads a mapping file's text; the error names what is wrong and where.
    pub fn from_yaml(text: &str) -> Result<StatsdMapping, String> {
        let compiled = file::compile(text)?;
        check_globs(&compiled.rules, compiled.glob_ordering)?;
        Ok(StatsdMapping {
            rules: compiled.rules,
            default_timer: compiled.default_timer,
            glob_ordering: compiled.glob_ordering,
        })
    }

    /// The mapping envoyproxy/ratelimit uses without `PROMETHEUS_MAPPER_YAML`: the
    /// response time in seconds, or, with `response_time_ms`, its scale line removed as
    /// upstream removes it (milliseconds).
    #[expect(clippy::expect_used, reason = "the built-in mapping is valid")]
    pub fn upstream_default(response_time_ms: bool) -> StatsdMapping {
        let text = if response_time_ms {
            UPSTREAM_DEFAULT.replacen("    scale: 0.001\n", "", 1)
        } else {
            UPSTREAM_DEFAULT.to_string()
        };
        // Our own file, checked by a unit test: not input.
        StatsdMapping::from_yaml(&text).expect("the built-in mapping is valid")
    }

    /// What the stat `name` of this kind becomes; `None` if it is dropped (`action: drop`,
    /// or its name comes out empty, which statsd_exporter drops too).
    pub fn map(&self, name: &str, kind: StatKind) -> Option<Mapped<'_>> {
        let Some((rule, metric, labels)) = self
            .glob_match(name, kind)
            .or_else(|| self.regex_match(name, kind))
        else {
            return Some(Mapped {
                name: escape_metric_name(name),
                labels: Vec::new(),
                help: None,
                scale: None,
                timer: &self.default_timer,
            })
            .filter(|m| !m.name.is_empty());
        };
        if rule.drop || metric.is_empty() {
            return None;
        }
        Some(Mapped {
            name: escape_metric_name(&metric),
            labels,
            help: rule.help.as_deref(),
            scale: rule.scale,
            timer: &rule.timer,
        })
    }

    /// The glob mapping that applies, its filled name and labels.
    fn glob_match(&self, name: &str, kind: StatKind) -> Option<(&Rule, String, Labels)> {
        let mut matches = self
            .rules
            .iter()
            .filter(|r| r.admits(kind))
            .filter_map(|r| match &r.matcher {
                Matcher::Glob(g) => g.captures(name).map(|c| (r, g, c)),
                Matcher::Regex(_) => None,
            });
        let (rule, _, captures) = if self.glob_ordering {
            matches.next()?
        } else {
            // The first of the most specific.
            matches.min_by(|a, b| a.1.specificity(b.1))?
        };
        let fill = |template: &str| fill_glob_template(template, &captures);
        Some((rule, fill(&rule.name), fill_labels(rule, fill)))
    }

    /// The first regex mapping that applies, its filled name and labels.
    fn regex_match(&self, name: &str, kind: StatKind) -> Option<(&Rule, String, Labels)> {
        self.rules.iter().filter(|r| r.admits(kind)).find_map(|r| {
            let Matcher::Regex(re) = &r.matcher else {
                return None;
            };
            let captures = re.captures(name)?;
            let fill = |template: &str| {
                let mut out = String::new();
                captures.expand(template, &mut out);
                out
            };
            Some((r, fill(&r.name), fill_labels(r, fill)))
        })
    }
}

type Labels = Vec<(String, String)>;

fn fill_labels(rule: &Rule, fill: impl Fn(&str) -> String) -> Labels {
    rule.labels
        .iter()
        .map(|(name, template)| (name.clone(), fill(template)))
        .collect()
}

/// Refuses a glob that can never apply in file order (an earlier glob for the same
/// kinds of stat matches every name it does), or, unordered, one repeated.
fn check_globs(rules: &[Rule], ordering: bool) -> Result<(), String> {
    for (j, later) in rules.iter().enumerate() {
        let Matcher::Glob(g2) = &later.matcher else {
            continue;
        };
        for (i, earlier) in rules.iter().take(j).enumerate() {
            let Matcher::Glob(g1) = &earlier.matcher else {
                continue;
            };
            let kinds_meet = earlier.metric_type.is_none()
                || later.metric_type.is_none()
                || earlier.metric_type == later.metric_type;
            let hidden = if ordering { g1.covers(g2) } else { g1 == g2 };
            if kinds_meet && hidden {
                return Err(format!(
                    "mapping {} ({:?}) can never apply: mapping {} ({:?}) before it matches \
                     every name it does (statsd_exporter would pick either, depending on the \
                     other mappings); put the more specific first",
                    j + 1,
                    later.pattern(),
                    i + 1,
                    earlier.pattern(),
                ));
            }
        }
    }
    Ok(())
}

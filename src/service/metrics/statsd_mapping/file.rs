//! A statsd_exporter mapping file read: the YAML shape (serde), every value checked, and
//! the mappings compiled into the parent's [`Rule`]s. What statsd_exporter reads but
//! shardgate does not do (`ttl`, `honor_labels`, summary quantiles, native histograms) is
//! refused by name, and an unknown key by the YAML reader, so that nothing in a file is
//! silently without effect. Pure: the file's text comes in, rules or a message go out;
//! matching a name is the parent's.

use std::collections::BTreeMap;

use serde::de::IgnoredAny;
use serde::Deserialize;

use super::glob::Glob;
use super::names::{valid_label_name, valid_name_template};
use super::rule::{Matcher, Rule, StatKind, Timer};
use super::DEFAULT_BUCKETS;

/// The file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct File {
    #[serde(default)]
    defaults: Defaults,
    #[serde(default)]
    mappings: Vec<Mapping>,
}

/// `defaults:` as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Defaults {
    match_type: Option<String>,
    observer_type: Option<String>,
    timer_type: Option<String>,
    buckets: Option<Vec<f64>>,
    histogram_options: Option<HistogramOptions>,
    glob_disable_ordering: Option<bool>,
    // Read by statsd_exporter, not done here: refused when present.
    ttl: Option<IgnoredAny>,
    summary_options: Option<IgnoredAny>,
    quantiles: Option<IgnoredAny>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistogramOptions {
    buckets: Option<Vec<f64>>,
    native_histogram_bucket_factor: Option<IgnoredAny>,
    native_histogram_max_buckets: Option<IgnoredAny>,
}

/// One entry of `mappings:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Mapping {
    #[serde(rename = "match")]
    pattern: String,
    name: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    match_type: Option<String>,
    match_metric_type: Option<String>,
    observer_type: Option<String>,
    timer_type: Option<String>,
    buckets: Option<Vec<f64>>,
    histogram_options: Option<HistogramOptions>,
    scale: Option<f64>,
    action: Option<String>,
    help: Option<String>,
    ttl: Option<IgnoredAny>,
    honor_labels: Option<IgnoredAny>,
    summary_options: Option<IgnoredAny>,
    quantiles: Option<IgnoredAny>,
}

/// The compiled file: its rules in file order, the timer of unmapped names, and whether
/// globs are taken in file order.
#[derive(Debug)]
pub(super) struct Compiled {
    pub(super) rules: Vec<Rule>,
    pub(super) default_timer: Timer,
    pub(super) glob_ordering: bool,
}

/// Reads and checks a mapping file's text.
pub(super) fn compile(text: &str) -> Result<Compiled, String> {
    let file: File = if text.trim().is_empty() {
        File::default()
    } else {
        serde_saphyr::from_str(text).map_err(yaml_error)?
    };
    let defaults = compile_defaults(&file.defaults)?;
    let rules = file
        .mappings
        .iter()
        .enumerate()
        .map(|(i, m)| {
            compile_mapping(m, &defaults)
                .map_err(|e| format!("mapping {} ({:?}): {e}", i + 1, m.pattern))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Compiled {
        rules,
        default_timer: defaults.timer(None, None),
        glob_ordering: !defaults.glob_disable_ordering,
    })
}

/// The YAML reader's message, short: where, and what (an unknown key's list of the keys
/// that are known is left out).
fn yaml_error(e: serde_saphyr::Error) -> String {
    let options = serde_saphyr::render_options! { snippets: serde_saphyr::SnippetMode::Off };
    let mut message = e.render_with_options(options);
    if let Some(at) = message.find(", expected one of") {
        let position = message[at..]
            .find(" at line ")
            .map(|p| message[at + p..].to_string())
            .unwrap_or_default();
        message.truncate(at);
        message.push_str(&position);
    }
    message
}

/// `defaults:` checked.
struct CompiledDefaults {
    regex: bool,
    timer: TimerKind,
    buckets: Vec<f64>,
    glob_disable_ordering: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TimerKind {
    Histogram,
    Summary,
}

impl CompiledDefaults {
    /// The timer of a mapping with this kind and these buckets of its own (or none).
    fn timer(&self, kind: Option<TimerKind>, buckets: Option<Vec<f64>>) -> Timer {
        match kind.unwrap_or(self.timer) {
            TimerKind::Summary => Timer::Summary,
            TimerKind::Histogram => {
                Timer::Histogram(buckets.unwrap_or_else(|| self.buckets.clone()))
            }
        }
    }
}

fn compile_defaults(d: &Defaults) -> Result<CompiledDefaults, String> {
    let refuse = |key: &str| Err(format!("defaults: `{key}` is not supported by shardgate"));
    if d.ttl.is_some() {
        return refuse("ttl");
    }
    if d.summary_options.is_some() {
        return refuse("summary_options");
    }
    if d.quantiles.is_some() {
        return refuse("quantiles");
    }
    let in_defaults = |e: String| format!("defaults: {e}");
    let options = histogram_buckets(d.histogram_options.as_ref()).map_err(in_defaults)?;
    let legacy = maybe_buckets(d.buckets.as_deref()).map_err(in_defaults)?;
    Ok(CompiledDefaults {
        regex: match_type(d.match_type.as_deref())
            .map_err(in_defaults)?
            .unwrap_or(false),
        timer: timer_kind(d.observer_type.as_deref().or(d.timer_type.as_deref()))
            .map_err(in_defaults)?
            .unwrap_or(TimerKind::Summary),
        // statsd_exporter: `histogram_options.buckets` over the older `buckets`, over
        // Prometheus' default buckets.
        buckets: options
            .or(legacy)
            .unwrap_or_else(|| DEFAULT_BUCKETS.to_vec()),
        glob_disable_ordering: d.glob_disable_ordering.unwrap_or(false),
    })
}

fn compile_mapping(m: &Mapping, defaults: &CompiledDefaults) -> Result<Rule, String> {
    refuse_unsupported(m)?;
    let name = m.name.clone().unwrap_or_default();
    if !valid_name_template(&name) {
        return Err(format!(
            "name {name:?}: not a metric name (letters, digits, `_`, `$N` references; not starting with a digit)"
        ));
    }
    let labels = labels(&m.labels)?;
    let regex = match_type(m.match_type.as_deref())?.unwrap_or(defaults.regex);
    let matcher = if regex {
        Matcher::Regex(regex::Regex::new(&m.pattern).map_err(regex_error)?)
    } else {
        Matcher::Glob(Glob::parse(&m.pattern)?)
    };
    let metric_type = m.match_metric_type.as_deref().map(stat_kind).transpose()?;
    let timer = mapping_timer(m, defaults)?;
    if matches!(timer, Timer::Histogram(_))
        && metric_type.is_none_or(|k| k == StatKind::Observer)
        && m.labels.contains_key("le")
    {
        return Err("label `le` is the histogram's own".into());
    }
    Ok(Rule {
        matcher,
        metric_type,
        drop: action_is_drop(m.action.as_deref())?,
        name,
        labels,
        help: m.help.clone(),
        scale: m.scale.map(scale).transpose()?,
        timer,
    })
}

/// The keys statsd_exporter reads that shardgate does not do.
fn refuse_unsupported(m: &Mapping) -> Result<(), String> {
    let present = [
        ("ttl", m.ttl.is_some()),
        ("honor_labels", m.honor_labels.is_some()),
        ("summary_options", m.summary_options.is_some()),
        ("quantiles", m.quantiles.is_some()),
    ];
    match present.iter().find(|(_, is)| *is) {
        Some((key, _)) => Err(format!("`{key}` is not supported by shardgate")),
        None => Ok(()),
    }
}

/// A mapping's timer: its `observer_type` (else `timer_type`, else the defaults'), with
/// its own buckets (else the defaults').
fn mapping_timer(m: &Mapping, defaults: &CompiledDefaults) -> Result<Timer, String> {
    let kind = timer_kind(m.observer_type.as_deref().or(m.timer_type.as_deref()))?;
    let options = histogram_buckets(m.histogram_options.as_ref())?;
    let legacy = maybe_buckets(m.buckets.as_deref())?;
    if options.is_some() && legacy.is_some() {
        return Err("`buckets` and `histogram_options.buckets` both set".into());
    }
    let own = options.or(legacy);
    let given = m.histogram_options.is_some() || m.buckets.is_some();
    match defaults.timer(kind, own) {
        Timer::Summary if given => Err("histogram buckets on a summary timer".into()),
        timer => Ok(timer),
    }
}

fn histogram_buckets(options: Option<&HistogramOptions>) -> Result<Option<Vec<f64>>, String> {
    let Some(options) = options else {
        return Ok(None);
    };
    if options.native_histogram_bucket_factor.is_some() {
        return Err(
            "`histogram_options.native_histogram_bucket_factor` is not supported by shardgate"
                .into(),
        );
    }
    if options.native_histogram_max_buckets.is_some() {
        return Err(
            "`histogram_options.native_histogram_max_buckets` is not supported by shardgate".into(),
        );
    }
    maybe_buckets(options.buckets.as_deref())
}

fn maybe_buckets(bounds: Option<&[f64]>) -> Result<Option<Vec<f64>>, String> {
    bounds.map_or(Ok(None), buckets)
}

/// Histogram bounds: finite, strictly increasing (a trailing `+Inf` is dropped: every
/// histogram has it); none given is `None` (the defaults' apply).
fn buckets(bounds: &[f64]) -> Result<Option<Vec<f64>>, String> {
    let bounds = match bounds.split_last() {
        Some((last, rest)) if *last == f64::INFINITY => rest,
        _ => bounds,
    };
    if bounds.iter().any(|b| !b.is_finite()) {
        return Err(format!("buckets {bounds:?}: not all finite numbers"));
    }
    if bounds
        .iter()
        .zip(bounds.iter().skip(1))
        .any(|(a, b)| a >= b)
    {
        return Err(format!("buckets {bounds:?}: not in increasing order"));
    }
    Ok((!bounds.is_empty()).then(|| bounds.to_vec()))
}

/// The regex library's message on one line: its last, which says what is wrong (the
/// lines before it draw the pattern with a caret under the place).
fn regex_error(e: regex::Error) -> String {
    let text = e.to_string();
    let last = text.lines().last().unwrap_or_default().trim();
    format!(
        "not a regular expression: {}",
        last.strip_prefix("error: ").unwrap_or(last)
    )
}

/// `match_type`: `Some(true)` for regex; `""` is glob, as statsd_exporter reads it.
fn match_type(value: Option<&str>) -> Result<Option<bool>, String> {
    match value {
        None => Ok(None),
        Some("glob" | "") => Ok(Some(false)),
        Some("regex") => Ok(Some(true)),
        Some(other) => Err(format!("match_type {other:?}: not glob or regex")),
    }
}

/// `observer_type`/`timer_type`; `""` is a summary, as statsd_exporter reads it.
fn timer_kind(value: Option<&str>) -> Result<Option<TimerKind>, String> {
    match value {
        None => Ok(None),
        Some("histogram") => Ok(Some(TimerKind::Histogram)),
        Some("summary" | "") => Ok(Some(TimerKind::Summary)),
        Some(other) => Err(format!("timer_type {other:?}: not histogram or summary")),
    }
}

fn stat_kind(value: &str) -> Result<StatKind, String> {
    match value {
        "counter" => Ok(StatKind::Counter),
        "gauge" => Ok(StatKind::Gauge),
        "observer" => Ok(StatKind::Observer),
        other => Err(format!(
            "match_metric_type {other:?}: not counter, gauge or observer"
        )),
    }
}

fn action_is_drop(value: Option<&str>) -> Result<bool, String> {
    match value {
        None | Some("map" | "") => Ok(false),
        Some("drop") => Ok(true),
        Some(other) => Err(format!("action {other:?}: not map or drop")),
    }
}

/// A scale: a positive finite number (a histogram's buckets are filled by converting
/// bucket bounds, which needs a conversion that keeps their order).
fn scale(value: f64) -> Result<f64, String> {
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(format!("scale {value}: not a positive number"))
    }
}

fn labels(labels: &BTreeMap<String, String>) -> Result<Vec<(String, String)>, String> {
    match labels.keys().find(|k| !valid_label_name(k)) {
        Some(bad) => Err(format!(
            "label {bad:?}: not a label name (a letter or `_`, then letters, digits, `_`; two characters at least)"
        )),
        None => Ok(labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()),
    }
}

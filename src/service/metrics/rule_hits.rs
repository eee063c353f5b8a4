//! Per-rule hit counters in envoyproxy/ratelimit's terms: `rate_limit_total_hits`,
//! `_over_limit`, `_near_limit`, `_within_limit` and `_shadow_mode`, labelled by domain
//! and stats key. Owns the counters of every key seen, the cap on keys that carry request
//! values, and their encoding at scrape time.
//!
//! A config rule's counters are looked up once per config load and striped per thread
//! (`support/striped.rs`), so counting its hits is two or three atomic adds on one line this
//! thread owns. Keys built from request values are looked up per request and kept
//! unstriped: there can be `MAX_RULE_KEYS` of them. No lock anywhere: see [`RuleHits`].

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use arc_swap::ArcSwap;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet};
use prometheus_client::metrics::MetricType;

use crate::config::{hit_key, DescriptorEntry, Rule};
use crate::support::striped::StripedCells;

/// Most distinct rule keys carrying request values; further keys are counted under
/// `_overflow_`.
pub const MAX_RULE_KEYS: usize = 10_000;

/// How one limited descriptor came out, for its rule's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HitOutcome {
    Within {
        near: bool,
    },
    Over,
    /// Over, but the rule (or the server) is in shadow mode.
    ShadowOver,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct RuleLabels {
    domain: String,
    key: String,
}

/// The five counters, in the order of [`SERIES`].
const TOTAL: usize = 0;
const OVER: usize = 1;
const NEAR: usize = 2;
const WITHIN: usize = 3;
const SHADOW: usize = 4;

/// Name and help of each counter, indexed as the cells.
const SERIES: [(&str, &str); 5] = [
    (
        "rate_limit_total_hits",
        "Hits of a rule (descriptors × hits)",
    ),
    ("rate_limit_over_limit", "Hits refused by a rule"),
    (
        "rate_limit_near_limit",
        "Hits admitted with 80% or more of the rule's capacity used",
    ),
    ("rate_limit_within_limit", "Hits admitted by a rule"),
    (
        "rate_limit_shadow_mode",
        "Hits over a rule's limit that shadow mode let through",
    ),
];

/// The counters of one stats key.
#[derive(Debug)]
enum HitCells {
    /// A config rule's key: every thread counts on its own stripe; all five series are
    /// exported from the config load on, zero or not.
    Striped(StripedCells<5>),
    /// A key built from request values: one shared set; a series is exported once it
    /// has moved (`total` always).
    Shared([AtomicU64; 5]),
}

impl HitCells {
    fn add(&self, cell: usize, by: u64) {
        match self {
            HitCells::Striped(cells) => cells.add(cell, by),
            HitCells::Shared(cells) => {
                if let Some(c) = cells.get(cell) {
                    c.fetch_add(by, Relaxed);
                }
            }
        }
    }

    fn get(&self, cell: usize) -> u64 {
        match self {
            HitCells::Striped(cells) => cells.get(cell),
            HitCells::Shared(cells) => cells.get(cell).map_or(0, |c| c.load(Relaxed)),
        }
    }

    fn exported(&self, cell: usize) -> bool {
        match self {
            HitCells::Striped(_) => true,
            HitCells::Shared(_) => cell == TOTAL || self.get(cell) > 0,
        }
    }

    fn count(&self, hits: u64, outcome: HitOutcome) {
        self.add(TOTAL, hits);
        match outcome {
            HitOutcome::Within { near } => {
                self.add(WITHIN, hits);
                if near {
                    self.add(NEAR, hits);
                }
            }
            HitOutcome::Over => self.add(OVER, hits),
            HitOutcome::ShadowOver => {
                self.add(OVER, hits);
                self.add(SHADOW, hits);
            }
        }
    }
}

/// The counters of one rule's own stats key, looked up once per config load.
#[derive(Debug, Clone)]
pub struct RuleCounters(Arc<HitCells>);

impl RuleCounters {
    pub fn count(&self, hits: u64, outcome: HitOutcome) {
        self.0.count(hits, outcome);
    }
}

/// Every stats key's counters, in [`SHARDS`] maps each replaced whole when a key is
/// added (copy on write, `arc-swap`): a lookup is a lock-free load, a scrape reads the
/// maps as they are, so the request path never waits for a scrape or for another
/// request adding a key. A new key copies one shard (a 64th of at most
/// [`MAX_RULE_KEYS`] and the config's own keys); once the cap is reached an unseen value
/// is counted under `_overflow_`, found by the same lock-free lookup.
#[derive(Debug)]
pub struct RuleHits {
    shards: [ArcSwap<KeyMap>; SHARDS],
    /// Chooses a key's shard; seeded once.
    hasher: foldhash::fast::RandomState,
    /// Keys carrying request values held (capped at `MAX_RULE_KEYS`; `_overflow_` keys
    /// are not counted).
    from_requests: AtomicUsize,
}

/// Maps the counters are spread over (a power of two).
const SHARDS: usize = 64;

type KeyMap = HashMap<RuleLabels, Arc<HitCells>, foldhash::fast::RandomState>;

impl Default for RuleHits {
    fn default() -> Self {
        RuleHits {
            shards: std::array::from_fn(|_| ArcSwap::from_pointee(KeyMap::default())),
            hasher: foldhash::fast::RandomState::default(),
            from_requests: AtomicUsize::new(0),
        }
    }
}

impl RuleHits {
    #[expect(
        clippy::indexing_slicing,
        reason = "reduced modulo SHARDS, the array's length"
    )]
    fn shard(&self, labels: &RuleLabels) -> &ArcSwap<KeyMap> {
        &self.shards[(self.hasher.hash_one(labels) as usize) % SHARDS]
    }

    fn get(&self, labels: &RuleLabels) -> Option<Arc<HitCells>> {
        self.shard(labels).load().get(labels).cloned()
    }

    /// The counters of `labels` and whether this call added them (made by `make`);
    /// `None` when they are missing and `admit` refuses to add them. Another request
    /// adding a key to the same shard at the same time makes one of them copy again,
    /// never wait.
    fn get_or_add(
        &self,
        labels: &RuleLabels,
        make: impl Fn() -> HitCells,
        mut admit: impl FnMut() -> bool,
    ) -> Option<(Arc<HitCells>, bool)> {
        let shard = self.shard(labels);
        let mut current = shard.load_full();
        loop {
            if let Some(cells) = current.get(labels) {
                return Some((cells.clone(), false));
            }
            if !admit() {
                return None;
            }
            let cells = Arc::new(make());
            let mut next = KeyMap::clone(&current);
            next.insert(labels.clone(), cells.clone());
            let previous = shard.compare_and_swap(&current, Arc::new(next));
            if Arc::ptr_eq(&previous, &current) {
                return Some((cells, true));
            }
            current = arc_swap::Guard::into_inner(previous);
        }
    }

    /// Every key's counters, sorted by labels (what a scrape encodes): read from the
    /// maps as they are, taking no lock.
    fn sorted(&self) -> Vec<(RuleLabels, Arc<HitCells>)> {
        let mut all: Vec<(RuleLabels, Arc<HitCells>)> = Vec::new();
        for shard in &self.shards {
            let map = shard.load();
            all.extend(map.iter().map(|(l, c)| (l.clone(), c.clone())));
        }
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// The counters of a config rule's own key (created, striped, on first sight; a
    /// reload finds the same ones).
    #[expect(clippy::expect_used, reason = "a config rule's key is always admitted")]
    pub fn for_rule(&self, rule: &Rule) -> RuleCounters {
        let labels = RuleLabels {
            domain: rule.domain.to_string(),
            key: rule.stats_key.clone(),
        };
        let (cells, _) = self
            .get_or_add(
                &labels,
                || HitCells::Striped(StripedCells::default()),
                || true,
            )
            .expect("a config rule's key is always admitted");
        RuleCounters(cells)
    }

    /// Counts `hits` for a rule whose key carries the values of these entries.
    #[expect(clippy::expect_used, reason = "an overflow key is always admitted")]
    pub fn count_from_request<E: DescriptorEntry>(
        &self,
        rule: &Rule,
        entries: &[E],
        hits: u64,
        outcome: HitOutcome,
    ) {
        let labels = RuleLabels {
            domain: rule.domain.to_string(),
            key: hit_key(rule, entries),
        };
        if let Some(cells) = self.get(&labels) {
            return cells.count(hits, outcome);
        }
        let shared = || HitCells::Shared(Default::default());
        // A place under the cap, reserved (once) before the key is added, and given back
        // if another request added the same key first.
        let mut reserved = false;
        let admit = || {
            if !reserved {
                if self.from_requests.fetch_add(1, Relaxed) >= MAX_RULE_KEYS {
                    self.from_requests.fetch_sub(1, Relaxed);
                    return false;
                }
                reserved = true;
            }
            true
        };
        let cells = match self.get_or_add(&labels, shared, admit) {
            Some((cells, added)) => {
                if reserved && !added {
                    self.from_requests.fetch_sub(1, Relaxed);
                }
                cells
            }
            None => {
                let overflow = RuleLabels {
                    domain: labels.domain,
                    key: "_overflow_".to_string(),
                };
                let (cells, _) = self
                    .get_or_add(&overflow, shared, || true)
                    .expect("an overflow key is always admitted");
                cells
            }
        };
        cells.count(hits, outcome);
    }
}

/// The statsd names of the five counters (upstream's), indexed as the cells.
const STATSD_SUFFIXES: [&str; 5] = [
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
];

impl RuleHits {
    /// Every key's counters under upstream's statsd names,
    /// `ratelimit.service.rate_limit.<key>.<counter>`, with their totals.
    pub(super) fn statsd_totals(&self, into: &mut Vec<(String, u64)>) {
        for (labels, cells) in &self.sorted() {
            for (cell, suffix) in STATSD_SUFFIXES.iter().enumerate() {
                into.push((
                    format!("ratelimit.service.rate_limit.{}.{suffix}", labels.key),
                    cells.get(cell),
                ));
            }
        }
    }
}

impl Collector for RuleHits {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let keys = self.sorted();
        for (cell, (name, help)) in SERIES.iter().enumerate() {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (labels, cells) in &keys {
                if cells.exported(cell) {
                    family
                        .encode_family(labels)?
                        .encode_counter::<NoLabelSet, _, u64>(&cells.get(cell), None)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use prometheus_client::registry::Registry;

    const YAML: &str = "
domain: d
descriptors:
  - key: fixed
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: user
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 10}
";

    fn rule<'a>(config: &'a Config, key: &str) -> &'a Rule {
        config
            .domain("d")
            .unwrap()
            .rules()
            .find(|r| r.levels[0].key == key)
            .unwrap()
    }

    fn render(hits: &Arc<RuleHits>) -> String {
        let mut registry = Registry::with_prefix("shardgate");
        registry.register_collector(Box::new(hits.clone()));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn a_config_rule_exports_all_five_series_from_its_load_and_counts_per_thread() {
        let config = Config::from_yaml("a.yaml", YAML).unwrap();
        let hits = Arc::new(RuleHits::default());
        let counters = hits.for_rule(rule(&config, "fixed"));
        let out = render(&hits);
        for name in [
            "total_hits",
            "over_limit",
            "near_limit",
            "within_limit",
            "shadow_mode",
        ] {
            let series =
                format!("shardgate_rate_limit_{name}_total{{domain=\"d\",key=\"d.fixed\"}} 0\n");
            assert!(out.contains(&series), "{series} missing from\n{out}");
        }
        std::thread::scope(|scope| {
            for _ in 0..4 {
                let counters = counters.clone();
                scope.spawn(move || {
                    for _ in 0..100 {
                        counters.count(2, HitOutcome::Within { near: true });
                        counters.count(1, HitOutcome::ShadowOver);
                    }
                });
            }
        });
        // A reload finds the same counters.
        hits.for_rule(rule(&config, "fixed"))
            .count(1, HitOutcome::Over);
        let out = render(&hits);
        for (name, value) in [
            ("total_hits", 1_201),
            ("within_limit", 800),
            ("near_limit", 800),
            ("over_limit", 401),
            ("shadow_mode", 400),
        ] {
            let series = format!(
                "shardgate_rate_limit_{name}_total{{domain=\"d\",key=\"d.fixed\"}} {value}\n"
            );
            assert!(out.contains(&series), "{series} missing from\n{out}");
        }
    }

    #[test]
    fn request_keys_export_what_moved_and_are_capped() {
        let config = Config::from_yaml("a.yaml", YAML).unwrap();
        let user = rule(&config, "user");
        let hits = Arc::new(RuleHits::default());
        hits.count_from_request(user, &[("user", "alice")], 3, HitOutcome::Over);
        let out = render(&hits);
        assert!(
            out.contains(
                "shardgate_rate_limit_total_hits_total{domain=\"d\",key=\"d.user_alice\"} 3\n"
            ),
            "{out}"
        );
        assert!(
            out.contains(
                "shardgate_rate_limit_over_limit_total{domain=\"d\",key=\"d.user_alice\"} 3\n"
            ),
            "{out}"
        );
        assert!(
            !out.contains("within_limit_total{domain=\"d\",key=\"d.user_alice\"}"),
            "{out}"
        );
        for i in 1..MAX_RULE_KEYS + 5 {
            let value = format!("u{i}");
            let within = HitOutcome::Within { near: false };
            hits.count_from_request(user, &[("user", value.as_str())], 1, within);
        }
        // A key seen before the cap keeps its own series.
        hits.count_from_request(user, &[("user", "alice")], 1, HitOutcome::Over);
        let out = render(&hits);
        let keys = out
            .lines()
            .filter(|l| l.starts_with("shardgate_rate_limit_total_hits_total{"))
            .count();
        assert_eq!(keys, MAX_RULE_KEYS + 1, "the cap and _overflow_");
        assert!(
            out.contains(
                "shardgate_rate_limit_total_hits_total{domain=\"d\",key=\"_overflow_\"} 5\n"
            ),
            "overflow"
        );
        assert!(out.contains(
            "shardgate_rate_limit_total_hits_total{domain=\"d\",key=\"d.user_alice\"} 4\n"
        ));
    }
}

//! The board of every rule's top values: one [`RuleTop`] per (domain, stats key), kept
//! across reloads while the rule exists, fed by the decision path and read by `/top` and
//! the page. Owns the stripes, their locks and the report's shape.
//!
//! Must not make a decision wait on another: each thread records into its own stripe's
//! ring under a lock it almost always finds free (`try_lock`; a busy stripe sends it to
//! the next one, and only when every stripe is busy does it wait), so no lock is shared
//! by the whole process on the hot path.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use crossbeam_utils::CachePadded;
use parking_lot::Mutex;
use serde::Serialize;

use super::rates::{Rates, TICKS, TICK_SECONDS};
use super::window::{Merged, Ring, Side, SLOTS};
use crate::config::{Config, DescriptorEntry, Rule};
use crate::support::striped::{stripe, stripe_count};

/// The length of one slot of the window.
const MINUTE: Duration = Duration::from_secs(60);

/// The most stripes a rule's tables have: each is a full set of summaries, so memory
/// grows with them, and past a few a busy stripe is rare enough (a thread that finds its
/// own busy tries the next).
const MAX_STRIPES: usize = 4;

/// The most values a table lists.
pub const MAX_LISTED: usize = super::sketch::CAPACITY;

/// One rule's top values, striped.
#[derive(Debug)]
pub struct RuleTop {
    domain: Arc<str>,
    rule: String,
    source: Arc<str>,
    stripes: Box<[CachePadded<Mutex<Stripe>>]>,
}

/// What one thread records into: the values' ring and the hits per tick.
#[derive(Debug, Default)]
struct Stripe {
    ring: Ring,
    rates: Rates,
}

impl Stripe {
    fn record(
        &mut self,
        at: Seconds,
        side: Side,
        hash: u64,
        weight: u64,
        label: impl FnOnce(&mut String),
    ) {
        self.ring.record(at.minute(), side, hash, weight, label);
        self.rates.record(at.tick(), side == Side::Refused, weight);
    }
}

/// Seconds since the board started.
#[derive(Debug, Clone, Copy)]
struct Seconds(u64);

impl Seconds {
    fn minute(self) -> u64 {
        self.0 / MINUTE.as_secs()
    }

    fn tick(self) -> u64 {
        self.0 / TICK_SECONDS
    }
}

impl RuleTop {
    fn new(rule: &Rule) -> RuleTop {
        RuleTop {
            domain: rule.domain.clone(),
            rule: rule.stats_key.clone(),
            source: rule.source.clone(),
            stripes: (0..stripe_count().min(MAX_STRIPES))
                .map(|_| CachePadded::new(Mutex::new(Stripe::default())))
                .collect(),
        }
    }

    #[expect(
        clippy::indexing_slicing,
        reason = "indices modulo the stripes' length, which `new` makes at least one"
    )]
    fn record<E: DescriptorEntry>(&self, at: Seconds, side: Side, entries: &[E], weight: u64) {
        let hash = hash_entries(entries);
        let label = |out: &mut String| write_label(out, entries);
        let n = self.stripes.len();
        let home = stripe() % n;
        for k in 0..n {
            if let Some(mut stripe) = self.stripes[(home + k) % n].try_lock() {
                return stripe.record(at, side, hash, weight, label);
            }
        }
        self.stripes[home]
            .lock()
            .record(at, side, hash, weight, label);
    }

    fn table(&self, now: u64, side: Side, n: usize) -> Table {
        let mut merged = Merged::default();
        for s in self.stripes.iter() {
            s.lock().ring.read(now, side, &mut merged);
        }
        let total = merged.total();
        let top = merged
            .top(n)
            .into_iter()
            .map(|e| TopValue {
                share: if total == 0 {
                    0.0
                } else {
                    e.count as f64 / total as f64
                },
                value: e.label,
                count: e.count,
                error: e.error,
            })
            .collect();
        Table { total, top }
    }

    fn heap_bytes(&self) -> usize {
        self.stripes
            .iter()
            .map(|s| {
                let s = s.lock();
                s.ring.heap_bytes() + s.rates.heap_bytes()
            })
            .sum()
    }

    /// Hits per tick, `(admitted, refused)`, oldest first, ending at tick `now`.
    fn series(&self, now: u64) -> Vec<(u64, u64)> {
        let mut series = vec![(0, 0); TICKS as usize];
        for s in self.stripes.iter() {
            s.lock().rates.read(now, &mut series);
        }
        series
    }
}

/// A descriptor's identity: its keys and values, hashed with a fixed seed (the same
/// descriptor on any stripe lands on the same counter when merged).
fn hash_entries<E: DescriptorEntry>(entries: &[E]) -> u64 {
    let mut h = foldhash::fast::FixedState::with_seed(0x5eed).build_hasher();
    for e in entries {
        h.write(e.key().as_bytes());
        h.write_u8(0xff);
        h.write(e.value().as_bytes());
        h.write_u8(0xfe);
    }
    h.finish()
}

/// `key=value, key=value`, for people.
fn write_label<E: DescriptorEntry>(out: &mut String, entries: &[E]) {
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(e.key());
        out.push('=');
        out.push_str(e.value());
    }
}

/// A rule's identity across reloads: its domain and stats key.
type RuleId = (Arc<str>, String);

/// Every rule's top values, and the rules of the config in force.
#[derive(Debug)]
pub struct TopBoard {
    started: Instant,
    enabled: bool,
    known: Mutex<HashMap<RuleId, Arc<RuleTop>>>,
    current: ArcSwap<Vec<Arc<RuleTop>>>,
}

impl TopBoard {
    /// A board; a disabled one hands out no tables, so nothing is recorded.
    pub fn new(enabled: bool) -> TopBoard {
        TopBoard {
            started: Instant::now(),
            enabled,
            known: Mutex::default(),
            current: ArcSwap::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The tables of `config`'s rules, indexed by [`Rule::index`]; a rule kept across a
    /// reload (same domain and stats key) keeps its table, a rule gone loses it. Called
    /// at each config load, off the request path.
    pub fn for_config(&self, config: &Config) -> Vec<Option<Arc<RuleTop>>> {
        if !self.enabled {
            return Vec::new();
        }
        let mut tables = vec![None; config.rule_count()];
        let mut known = self.known.lock();
        let mut kept = HashMap::new();
        for rule in config.domains().flat_map(|d| d.rules()) {
            let key = (rule.domain.clone(), rule.stats_key.clone());
            let top = kept
                .entry(key.clone())
                .or_insert_with(|| {
                    known
                        .remove(&key)
                        .unwrap_or_else(|| Arc::new(RuleTop::new(rule)))
                })
                .clone();
            if let Some(slot) = rule.index.and_then(|i| tables.get_mut(i)) {
                *slot = Some(top);
            }
        }
        let mut current: Vec<_> = kept.values().cloned().collect();
        current.sort_by(|a, b| (&a.domain, &a.rule).cmp(&(&b.domain, &b.rule)));
        *known = kept;
        self.current.store(Arc::new(current));
        tables
    }

    /// Counts one descriptor's decision: `refused` or admitted, `weight` its hits.
    pub fn record<E: DescriptorEntry>(
        &self,
        tables: &[Option<Arc<RuleTop>>],
        rule: &Rule,
        entries: &[E],
        weight: u64,
        refused: bool,
    ) {
        let Some(top) = rule
            .index
            .and_then(|i| tables.get(i))
            .and_then(Option::as_ref)
        else {
            return;
        };
        let side = if refused {
            Side::Refused
        } else {
            Side::Admitted
        };
        top.record(self.now(), side, entries, weight);
    }

    fn now(&self) -> Seconds {
        Seconds(self.started.elapsed().as_secs())
    }

    /// Each rule's hits per tick over the last 15 minutes (see [`RateReport`]).
    pub fn rates(&self, domain: Option<&str>, rule: Option<&str>) -> Vec<RateReport> {
        let now = self.now();
        self.current
            .load()
            .iter()
            .filter(|t| domain.is_none_or(|d| *t.domain == *d))
            .filter(|t| rule.is_none_or(|r| t.rule == r))
            .map(|t| RateReport {
                domain: t.domain.to_string(),
                rule: t.rule.clone(),
                tick_seconds: TICK_SECONDS,
                current_tick_seconds: now.0 % TICK_SECONDS + 1,
                ticks: t.series(now.tick()),
            })
            .collect()
    }

    /// The `n` heaviest values of each rule of the config in force, refused and admitted,
    /// over the window; only the rules of `domain` when given.
    pub fn report(&self, n: usize, domain: Option<&str>) -> TopReport {
        let now = self.now().minute();
        let n = n.clamp(1, MAX_LISTED);
        let rules = self
            .current
            .load()
            .iter()
            .filter(|t| domain.is_none_or(|d| *t.domain == *d))
            .map(|t| RuleReport {
                domain: t.domain.to_string(),
                rule: t.rule.clone(),
                source: t.source.to_string(),
                refused: t.table(now, Side::Refused, n),
                admitted: t.table(now, Side::Admitted, n),
            })
            .collect();
        TopReport {
            enabled: self.enabled,
            window_seconds: SLOTS * MINUTE.as_secs(),
            rules,
        }
    }

    /// Bytes the tables hold on the heap.
    pub fn heap_bytes(&self) -> usize {
        self.current.load().iter().map(|t| t.heap_bytes()).sum()
    }
}

/// What `/top` answers.
#[derive(Debug, Serialize)]
pub struct TopReport {
    pub enabled: bool,
    /// The longest span a table covers: the current minute and the ones before it.
    pub window_seconds: u64,
    pub rules: Vec<RuleReport>,
}

#[derive(Debug, Serialize)]
pub struct RuleReport {
    pub domain: String,
    /// The rule's stats key.
    pub rule: String,
    /// Where the rule is written (file:line, or the xDS resource).
    pub source: String,
    pub refused: Table,
    pub admitted: Table,
}

#[derive(Debug, Serialize)]
pub struct Table {
    /// Every hit counted in the window, exact.
    pub total: u64,
    pub top: Vec<TopValue>,
}

#[derive(Debug, Serialize)]
pub struct TopValue {
    /// The descriptor, `key=value, ...`.
    pub value: String,
    /// Its hits in the window, estimated: the true count is within `error` of it.
    pub count: u64,
    pub error: u64,
    /// `count / total`.
    pub share: f64,
}

/// One rule's hits per tick, for the page's charts.
#[derive(Debug, Serialize)]
pub struct RateReport {
    pub domain: String,
    pub rule: String,
    pub tick_seconds: u64,
    /// Seconds of the last tick elapsed so far (its counts cover only those).
    pub current_tick_seconds: u64,
    /// `(admitted, refused)` hits per tick, oldest first; the last is the current tick.
    pub ticks: Vec<(u64, u64)>,
}

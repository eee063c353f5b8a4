//! Rate-limit rules: the YAML model, strict validation with file:line errors, the
//! compiled descriptor matcher and the mapping from a matched descriptor to its bucket.
//!
//! A [`Config`] is an immutable snapshot: it is built once (at start-up or on reload),
//! then shared read-only by every request. Nothing here does I/O on the request path and
//! nothing here knows about token buckets beyond the parameters a rule declares.

mod entity;
mod error;
mod load;
mod matcher;
mod model;
pub mod reload;
mod stats_key;
mod validate;

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

pub use entity::{encode_component, EntityTemplate, TemplateError};
pub use error::{ConfigError, ConfigErrorKind, ConfigErrors};
pub use matcher::DescriptorEntry;
pub use stats_key::{entries_key, hit_key};

/// Time unit of a rule, as in envoyproxy/ratelimit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unit {
    Second,
    Minute,
    Hour,
    Day,
    Week,
    Month,
    Year,
}

impl Unit {
    /// Length of the unit in seconds (month = 30 days, year = 365 days).
    pub const fn seconds(self) -> u64 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 604_800,
            Unit::Month => 2_592_000,
            Unit::Year => 31_536_000,
        }
    }

    /// Parses a unit name case-insensitively (`minute`, `MINUTE`, ...).
    pub fn parse(s: &str) -> Option<Unit> {
        Some(match s.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }

    /// Envoy's `RateLimitResponse.RateLimit.Unit` number for this unit.
    pub const fn proto_value(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The unit for an Envoy `RateLimitResponse.RateLimit.Unit` number (`None` for UNKNOWN).
    pub const fn from_proto(v: i32) -> Option<Unit> {
        Some(match v {
            1 => Unit::Second,
            2 => Unit::Minute,
            3 => Unit::Hour,
            4 => Unit::Day,
            5 => Unit::Month,
            6 => Unit::Year,
            7 => Unit::Week,
            _ => return None,
        })
    }
}

/// How a store failure is answered for a domain or rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailureMode {
    /// Answer OK (fail open).
    Allow,
    /// Answer gRPC UNAVAILABLE (fail closed); Envoy's `failure_mode_deny` then decides.
    #[default]
    Deny,
}

/// Most tokens a limit's `burst` may be, and one descriptor's hits (`hits_addend`): with
/// millitokens in an `i64`, a bucket's balance, its debt and every sum of them stay far
/// inside range on every store. (`requests_per_unit` is a `u32`, well below it.)
pub const MAX_TOKENS: u64 = 1_000_000_000_000;

/// Most limits one bucket item may hold (rules sharing an `entity:` template and a
/// resource): each adds terms to the store's conditional writes, which DynamoDB bounds.
pub const MAX_LIMITS_PER_BUCKET: usize = 16;

/// The limit a rule declares: a token bucket of `burst` (default `requests_per_unit`)
/// tokens refilled continuously at `requests_per_unit` per `unit`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimit {
    pub unit: Unit,
    pub requests_per_unit: u32,
    pub burst: Option<u64>,
    /// Debit even when the balance is short (post-hoc usage); see docs/configuration.md, "Overdraft".
    pub overdraft: bool,
    /// May be answered from a token lease (`lease: false` opts out); see
    /// docs/configuration.md, "Token leases".
    pub lease: bool,
}

impl RateLimit {
    /// Bucket capacity in tokens.
    pub fn capacity(&self) -> u64 {
        self.burst.unwrap_or(self.requests_per_unit as u64)
    }
}

/// What a matched rule does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleLimit {
    /// Never limited, never touches the store.
    Unlimited,
    Limited(RateLimit),
}

/// One level of the descriptor path that leads to a rule, as written in the YAML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Level {
    pub key: String,
    /// The `value` of that node (`None` for a key-only node); may contain `*`.
    pub value: Option<String>,
    /// `share_threshold` on that node: the pattern stands in for the value in the entity
    /// (and in the stats key).
    pub share_threshold: bool,
    /// `value_to_metric` on that node: the stats key carries the request's value at this
    /// level (envoyproxy/ratelimit decides it node by node, not from the leaf).
    pub value_to_metric: bool,
}

/// A node of the descriptor tree that carries a `rate_limit`, with everything the engine
/// and the service need to decide and answer for a descriptor that matches it.
#[derive(Debug, Clone)]
pub struct Rule {
    /// Position of the rule among every rule of its config (`0..Config::rule_count()`),
    /// for per-rule state kept outside the config; `None` for a rule a request carried.
    pub index: Option<usize>,
    pub domain: Arc<str>,
    /// The path from the domain root to this node; `levels.len()` is the number of
    /// request entries a descriptor has when it matches this rule.
    pub levels: Vec<Level>,
    pub limit: RuleLimit,
    /// `rate_limit.name`, reported in `current_limit.name` and the target of `replaces`.
    pub name: Option<String>,
    /// Names of rules this rule replaces.
    pub replaces: Vec<String>,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    /// `detailed_metric` on this (the leaf) node: the stats key carries every request value.
    pub detailed_metric: bool,
    /// `metadata` of the node, as JSON (returned for passing descriptors).
    pub metadata: Option<serde_json::Value>,
    /// `entity:` template, or `None` for the default canonical encoding of the path.
    pub entity: Option<EntityTemplate>,
    /// Bucket resource: the node's `resource`, inherited from ancestors, default the domain.
    pub resource: String,
    /// With `cascade: true`, the nearest ancestor rule that has a `rate_limit`.
    pub cascade_parent: Option<Arc<Rule>>,
    /// The node's `failure_mode`, else the domain's.
    pub failure_mode: FailureMode,
    /// envoyproxy/ratelimit's stats key for this rule: `domain.key_value.key...`.
    pub stats_key: String,
    /// File and line of the node, for messages.
    pub source: Arc<str>,
}

impl Rule {
    /// The name of this rule's limit inside its bucket item: `rate_limit.name`, else `rl`
    /// (`override` for a limit a request carried, which is answered without a name as
    /// envoyproxy/ratelimit does, yet must not share a config rule's `rl` limit).
    pub fn limit_name(&self) -> &str {
        match (&self.name, self.index) {
            (Some(name), _) => name,
            (None, Some(_)) => "rl",
            (None, None) => "override",
        }
    }

    /// Whether the stats key a hit is counted under depends on the request's values
    /// (`detailed_metric` here, or `value_to_metric` on any level of the path).
    pub fn stats_key_varies(&self) -> bool {
        self.detailed_metric || self.levels.iter().any(|l| l.value_to_metric)
    }

    /// Number of request entries this rule matches.
    pub fn depth(&self) -> usize {
        self.levels.len()
    }

    /// The bucket entity of a request descriptor that matched this rule (or, for a cascade
    /// parent, whose leading entries lead to it). `entries` must have at least
    /// `self.depth()` entries; only the first `depth()` are used.
    pub fn entity_for<E: DescriptorEntry>(&self, entries: &[E]) -> compact_str::CompactString {
        entity::entity_for(self, entries)
    }
}

/// One domain: its compiled descriptor tree.
#[derive(Debug)]
pub struct Domain {
    pub name: Arc<str>,
    pub failure_mode: FailureMode,
    tree: matcher::Tree,
}

impl Domain {
    /// The rule for a request descriptor, per docs/configuration.md, "Matching" (exact, then wildcards in file
    /// order, then key-only; no backtracking; the rule must sit at the descriptor's depth).
    /// The walk allocates nothing.
    pub fn match_descriptor<E: DescriptorEntry>(&self, entries: &[E]) -> Option<&Arc<Rule>> {
        self.tree.lookup(entries)
    }

    /// Every rule of the domain, in file order (for listings and metrics).
    pub fn rules(&self) -> impl Iterator<Item = &Arc<Rule>> {
        self.tree.rules()
    }
}

/// How a load combines its documents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Documents naming the same domain are merged into one tree, as
    /// envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG` does, instead of being an error; two
    /// top-level descriptors with the same key and value across them still are.
    pub merge_domains: bool,
}

/// An immutable, validated configuration snapshot: every domain of every file.
#[derive(Debug, Default)]
pub struct Config {
    domains: HashMap<String, Domain, foldhash::fast::RandomState>,
    rule_count: usize,
    /// FNV-1a 64 content hash of the sources (16 hex digits), for `/rlconfig` and metrics.
    hash: String,
}

impl Config {
    /// Loads `path`, a YAML file or a directory of `*.yaml`/`*.yml` files (docs/configuration.md, "Where the configuration comes from").
    /// Every problem is reported, each naming file, line and the offending key or value.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        Self::load_with(path, &LoadOptions::default())
    }

    /// [`Config::load`] with `options` (how documents of one domain combine).
    pub fn load_with(path: &Path, options: &LoadOptions) -> Result<Config, ConfigErrors> {
        load::load_path(path, options)
    }

    /// Builds a config from in-memory documents `(file name, YAML text)`; used by tests
    /// and by `load`.
    pub fn from_documents(docs: &[(String, String)]) -> Result<Config, ConfigErrors> {
        Self::from_documents_with(docs, &LoadOptions::default())
    }

    /// [`Config::from_documents`] with `options`.
    pub fn from_documents_with(
        docs: &[(String, String)],
        options: &LoadOptions,
    ) -> Result<Config, ConfigErrors> {
        load::from_documents(docs, options)
    }

    /// Convenience for one document.
    pub fn from_yaml(name: &str, yaml: &str) -> Result<Config, ConfigErrors> {
        Self::from_documents(&[(name.to_string(), yaml.to_string())])
    }

    pub fn domain(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    pub fn domains(&self) -> impl Iterator<Item = &Domain> {
        self.domains.values()
    }

    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// Number of rules in every domain; each rule's `index` is below it.
    pub fn rule_count(&self) -> usize {
        self.rule_count
    }
}

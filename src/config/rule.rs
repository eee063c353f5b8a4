//! A compiled rule: the limit a node of the descriptor tree declares ([`RateLimit`],
//! [`RuleLimit`]), the path that leads to it ([`Level`]), how a store failure is answered
//! ([`FailureMode`]), and everything the engine and the policy need to decide for a
//! descriptor that matches it ([`Rule`]). Built by the matcher at load; read-only after.

use std::fmt;
use std::sync::Arc;

use super::{entity, DescriptorEntry, EntityTemplate, Unit};

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
    /// The period is this many units (`unit_multiplier`, an extension: "100 per 5
    /// minutes"); 1 in upstream's format.
    pub unit_multiplier: u32,
    pub requests_per_unit: u32,
    pub burst: Option<u64>,
    /// Debit even when the balance is short (post-hoc usage); see docs/configuration.md, "Overdraft".
    pub overdraft: bool,
    /// May be answered from a token lease (`lease: false` opts out); see
    /// docs/configuration.md, "Token leases".
    pub lease: bool,
}

/// The longest period a limit may have (`unit` × `unit_multiplier`): a year, the
/// longest unit, so that every limit can be quoted per some unit (see
/// [`RateLimit::quoted`]).
pub const MAX_PERIOD_SECONDS: u64 = Unit::Year.seconds();

impl RateLimit {
    /// Bucket capacity in tokens.
    pub fn capacity(&self) -> u64 {
        self.burst.unwrap_or(self.requests_per_unit as u64)
    }

    /// The period `requests_per_unit` refill over, in seconds.
    pub fn period_seconds(&self) -> u64 {
        self.unit.seconds() * u64::from(self.unit_multiplier.max(1))
    }

    /// The rate as Envoy's answer can say it (`current_limit` names one unit): with no
    /// multiplier, as written. With one, the same rate in the smallest unit, from the
    /// rule's own up, in which it is a whole number ("100 per 5 minutes" is 20 per
    /// minute; "1000 per 7 days" is 1000 per week; "7 per 5 minutes" is 84 per hour);
    /// when none is, per year, rounded down, so the quote never promises more than the
    /// limit gives.
    pub fn quoted(&self) -> (u32, Unit) {
        if self.unit_multiplier <= 1 {
            return (self.requests_per_unit, self.unit);
        }
        let period = self.period_seconds();
        let rpu = u64::from(self.requests_per_unit);
        let exact = Unit::ALL
            .into_iter()
            .filter(|u| u.seconds() >= self.unit.seconds())
            .find_map(|u| {
                let scaled = rpu * u.seconds();
                let whole = scaled % period == 0;
                let rate = u32::try_from(scaled / period).ok()?;
                whole.then_some((rate, u))
            });
        exact.unwrap_or_else(|| {
            let per_year = rpu * Unit::Year.seconds() / period;
            (u32::try_from(per_year).unwrap_or(u32::MAX), Unit::Year)
        })
    }
}

/// "100/minute", "100/5 minutes burst 20 overdraft": as `/rlconfig` and `explain` list it.
impl fmt::Display for RateLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = self.unit.name();
        match self.unit_multiplier {
            0 | 1 => write!(f, "{}/{unit}", self.requests_per_unit)?,
            m => write!(f, "{}/{m} {unit}s", self.requests_per_unit)?,
        }
        if let Some(b) = self.burst {
            write!(f, " burst {b}")?;
        }
        if self.overdraft {
            f.write_str(" overdraft")?;
        }
        Ok(())
    }
}

/// A limit of a node beyond its first (`rate_limits:`, an extension): another limit of
/// the same bucket item, debited in the same write as the first, all or nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FurtherLimit {
    /// Its entry's `name`: what the answer quotes when it speaks, and what `replaces`
    /// may name.
    pub name: Option<String>,
    /// Its name inside the bucket item: `name`, else `rl` and its place in the list
    /// (`rl2`, `rl3`, ...), so two unnamed limits of one node never share a balance.
    pub item_name: String,
    pub rate: RateLimit,
}

/// One limit a rule states, as the plan and the answer read it: the node's first
/// (`rate_limit`, or the first entry of `rate_limits`) or a further one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatedLimit<'a> {
    /// What `current_limit.name` says (upstream answers an unnamed limit with none).
    pub name: Option<&'a str>,
    /// The limit's name inside its bucket item.
    pub item_name: &'a str,
    pub rate: &'a RateLimit,
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
    /// The `value` of that node (`None` for a key-only node); may contain `*`. For a
    /// `value_regex` node, the expression as written.
    pub value: Option<String>,
    /// `value` is a `value_regex` expression (an extension), a pattern like a wildcard.
    pub regex: bool,
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
    /// `rate_limits:` beyond its first entry, in the order written; empty for
    /// `rate_limit:`. See [`Rule::stated_limits`].
    pub further_limits: Vec<FurtherLimit>,
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

    /// Every limit the rule states, its first one first; none for an unlimited rule.
    pub fn stated_limits(&self) -> impl Iterator<Item = StatedLimit<'_>> {
        let first = match &self.limit {
            RuleLimit::Limited(rate) => Some(StatedLimit {
                name: self.name.as_deref(),
                item_name: self.limit_name(),
                rate,
            }),
            RuleLimit::Unlimited => None,
        };
        first
            .into_iter()
            .chain(self.further_limits.iter().map(|f| StatedLimit {
                name: f.name.as_deref(),
                item_name: &f.item_name,
                rate: &f.rate,
            }))
    }

    /// Whether any of the rule's names (its first limit's and its further limits') is in
    /// `names`: a rule `replaces` names is dropped whole.
    pub fn is_named_in(&self, names: &[&str]) -> bool {
        self.stated_limits()
            .filter_map(|l| l.name)
            .any(|n| names.contains(&n))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(rpu: u32, unit: Unit, multiplier: u32) -> RateLimit {
        RateLimit {
            unit,
            unit_multiplier: multiplier,
            requests_per_unit: rpu,
            burst: None,
            overdraft: false,
            lease: true,
        }
    }

    #[test]
    fn a_multiplied_period_is_quoted_as_a_whole_rate_of_one_unit() {
        for (rpu, unit, m, quoted) in [
            // Upstream's format: as written.
            (7, Unit::Minute, 1, (7, Unit::Minute)),
            (100, Unit::Minute, 5, (20, Unit::Minute)),
            (1000, Unit::Day, 7, (1000, Unit::Week)),
            (7, Unit::Minute, 5, (84, Unit::Hour)),
            (3, Unit::Hour, 2, (36, Unit::Day)),
            // 10 per 90 days is a whole rate per no unit: per year, rounded down (40.5).
            (10, Unit::Day, 90, (40, Unit::Year)),
            (0, Unit::Second, 10, (0, Unit::Second)),
        ] {
            assert_eq!(
                limit(rpu, unit, m).quoted(),
                quoted,
                "{rpu} per {m} {unit:?}"
            );
        }
        assert_eq!(limit(1, Unit::Day, 7).period_seconds(), 604_800);
        assert_eq!(limit(1, Unit::Day, 1).period_seconds(), 86_400);
    }
}

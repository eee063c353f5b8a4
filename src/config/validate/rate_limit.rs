//! A node's `rate_limit`, or its `rate_limits` list (an extension: several limits of one
//! bucket item): keys, numbers and names checked (units, periods, burst, overdraft,
//! lease, `replaces`), turned into the rule's limits. Knows nothing of the tree around
//! the node; the rules that span nodes are `walk.rs`'s and `shared_bucket.rs`'s.

use super::fields::{Field, Fields};
use super::validator::Validator;
use crate::config::error::ConfigErrorKind as K;
use crate::config::model::{NodeKind, Pos, RateLimitModel};
use crate::config::{
    FurtherLimit, RateLimit, RuleLimit, Unit, MAX_LIMITS_PER_BUCKET, MAX_PERIOD_SECONDS, MAX_TOKENS,
};

const RATE_LIMIT_KEYS: &[&str] = &[
    "unit",
    "unit_multiplier",
    "requests_per_unit",
    "unlimited",
    "name",
    "replaces",
    "burst",
    "overdraft",
    "lease",
];
const REPLACES_KEYS: &[&str] = &["name"];

/// Longest accepted limit name (it becomes part of store attribute names).
const MAX_LIMIT_NAME: usize = 64;
/// The store's own per-item limit (docs/architecture.md, "Buckets and items").
const RESERVED_LIMIT_NAME: &str = "wcu";

impl Validator<'_> {
    pub(super) fn rate_limit(&mut self, f: &Field) -> Option<RateLimitModel> {
        if f.value.kind == NodeKind::Null {
            return None;
        }
        let fields = self.fields(f.value, "'rate_limit'", "rate_limit", RATE_LIMIT_KEYS)?;
        let unlimited = self.boolean(fields.get("unlimited"));
        let overdraft = self.boolean(fields.get("overdraft"));
        let lease = fields
            .get("lease")
            .filter(|l| l.value.kind != NodeKind::Null)
            .is_none_or(|l| self.boolean(Some(l)));
        let unit_field = fields.get("unit");
        let unit = unit_field.and_then(|u| self.unit(u));
        let multiplier = fields
            .get("unit_multiplier")
            .and_then(|m| self.unit_multiplier(m, unit));
        let rpu = fields
            .get("requests_per_unit")
            .and_then(|n| self.integer(n, 0, u64::from(u32::MAX)));
        let burst = fields
            .get("burst")
            .and_then(|n| self.integer(n, 1, MAX_TOKENS));
        let name = fields.get("name").and_then(|n| self.limit_name(n));
        let replaces = fields
            .get("replaces")
            .map(|r| self.replaces(r, name.as_deref()))
            .unwrap_or_default();

        let limit = if unlimited {
            self.check_unlimited(&fields, overdraft, lease);
            RuleLimit::Unlimited
        } else {
            if unit_field.is_none() {
                self.error(f.pos, K::MissingLimitField("unit"));
            }
            if fields.get("requests_per_unit").is_none() {
                self.error(f.pos, K::MissingLimitField("requests_per_unit"));
            }
            if fields.get("unit_multiplier").is_some() && multiplier.is_none() {
                return None;
            }
            RuleLimit::Limited(RateLimit {
                unit: unit?,
                unit_multiplier: multiplier.unwrap_or(1),
                requests_per_unit: u32::try_from(rpu?).ok()?,
                burst,
                overdraft,
                lease,
            })
        };
        Some(RateLimitModel {
            limit,
            name,
            replaces,
            further: Vec::new(),
        })
    }

    /// `rate_limits`: a list of what `rate_limit` holds, every one a limit of the node's
    /// bucket item (none unlimited, all with the same `overdraft`, names distinct).
    /// `None` when the list or any entry is wrong (reported).
    pub(super) fn rate_limit_list(&mut self, f: &Field) -> Option<RateLimitModel> {
        let items = match &f.value.kind {
            NodeKind::Seq(items) if items.is_empty() => {
                self.error(f.value.pos, K::Empty { key: "rate_limits" });
                return None;
            }
            NodeKind::Seq(items) => items,
            _ => {
                self.wrong_type(f, "a list of limits (each what 'rate_limit' holds)");
                return None;
            }
        };
        if items.len() > MAX_LIMITS_PER_BUCKET {
            let kind = K::TooManyListed {
                count: items.len(),
                max: MAX_LIMITS_PER_BUCKET,
            };
            self.error(f.value.pos, kind);
        }
        let entries: Vec<_> = items
            .iter()
            .map(|item| {
                let entry = Field {
                    name: f.name,
                    pos: item.pos,
                    value: item,
                };
                let model = self.rate_limit(&entry)?;
                if model.limit == RuleLimit::Unlimited {
                    self.error(item.pos, K::UnlimitedInList);
                    return None;
                }
                Some((item.pos, model))
            })
            .collect();
        let entries: Vec<_> = entries.into_iter().collect::<Option<_>>()?;
        self.joined(entries)
    }

    /// The entries of a valid `rate_limits` list as one model: the first entry's limit
    /// and name, the others as further limits, every `replaces` together.
    fn joined(&mut self, entries: Vec<(Pos, RateLimitModel)>) -> Option<RateLimitModel> {
        let overdraft = |m: &RateLimitModel| match &m.limit {
            RuleLimit::Limited(l) => l.overdraft,
            RuleLimit::Unlimited => false,
        };
        let mut item_names: Vec<String> = Vec::with_capacity(entries.len());
        let mut ok = true;
        let first_overdraft = entries.first().map(|(_, m)| overdraft(m));
        for (i, (pos, m)) in entries.iter().enumerate() {
            let item_name = m.name.clone().unwrap_or_else(|| match i {
                0 => "rl".to_string(),
                _ => format!("rl{}", i + 1),
            });
            if item_names.contains(&item_name) {
                self.error(*pos, K::DuplicateLimitName(item_name.clone()));
                ok = false;
            }
            if Some(overdraft(m)) != first_overdraft {
                self.error(*pos, K::OverdraftDiffers);
                ok = false;
            }
            item_names.push(item_name);
        }
        if !ok {
            return None;
        }
        let mut entries = entries.into_iter().map(|(_, m)| m);
        let mut first = entries.next()?;
        for (m, item_name) in entries.zip(item_names.into_iter().skip(1)) {
            first.replaces.extend(m.replaces);
            let RuleLimit::Limited(rate) = m.limit else {
                continue;
            };
            first.further.push(FurtherLimit {
                name: m.name,
                item_name,
                rate,
            });
        }
        Some(first)
    }

    /// `unit`, one of the units' names.
    fn unit(&mut self, u: &Field) -> Option<Unit> {
        let text = self.text(u)?;
        let unit = Unit::parse(&text);
        if unit.is_none() {
            self.error(u.value.pos, K::InvalidUnit(text));
        }
        unit
    }

    /// `unit_multiplier`, whose period (with `unit`) must not pass the longest one.
    fn unit_multiplier(&mut self, m: &Field, unit: Option<Unit>) -> Option<u32> {
        let n = self.integer(m, 1, MAX_PERIOD_SECONDS)?;
        let period = unit.map(|u| u.seconds().saturating_mul(n));
        if period.is_some_and(|p| p > MAX_PERIOD_SECONDS) {
            self.error(
                m.value.pos,
                K::PeriodTooLong {
                    multiplier: n,
                    unit: unit.map_or("", Unit::name),
                },
            );
            return None;
        }
        u32::try_from(n).ok()
    }

    /// The limit's `name` (see [`limit_name_problem`]).
    fn limit_name(&mut self, n: &Field) -> Option<String> {
        let text = self.text(n)?;
        match limit_name_problem(&text) {
            Some(reason) => {
                self.error(n.value.pos, K::InvalidLimitName { name: text, reason });
                None
            }
            None => Some(text),
        }
    }

    /// An unlimited rule must not set what would give it a bucket.
    fn check_unlimited(&mut self, fields: &Fields, overdraft: bool, lease: bool) {
        // `overdraft: false` is harmless; the others would give an unlimited rule a bucket.
        for (key, set) in [
            ("unit", true),
            ("unit_multiplier", true),
            ("burst", true),
            ("overdraft", overdraft),
            ("lease", !lease),
        ] {
            if let Some(k) = fields.get(key).filter(|_| set) {
                self.error(k.pos, K::UnlimitedWith(k.name));
            }
        }
    }

    fn replaces(&mut self, f: &Field, own_name: Option<&str>) -> Vec<String> {
        let items = match &f.value.kind {
            NodeKind::Seq(items) => items,
            NodeKind::Null => return Vec::new(),
            _ => {
                self.wrong_type(f, "a list of {name: ...} entries");
                return Vec::new();
            }
        };
        let mut out = Vec::with_capacity(items.len());
        for item in items {
            let Some(entry) =
                self.fields(item, "a 'replaces' entry", "replaces entry", REPLACES_KEYS)
            else {
                continue;
            };
            let name = entry.get("name").and_then(|n| self.text(n));
            match name {
                Some(n) if n.is_empty() => self.error(item.pos, K::ReplacesWithoutName),
                Some(n) if Some(n.as_str()) == own_name => {
                    let pos = entry.get("name").map_or(item.pos, |f| f.value.pos);
                    self.error(pos, K::ReplacesItself(n));
                }
                Some(n) => out.push(n),
                None => self.error(item.pos, K::ReplacesWithoutName),
            }
        }
        out
    }
}

/// Why a limit name is unusable, if it is.
fn limit_name_problem(name: &str) -> Option<&'static str> {
    let mut chars = name.chars();
    if !chars.next().is_some_and(|c| c.is_ascii_alphabetic()) {
        return Some("it must start with an ASCII letter");
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
        return Some("only ASCII letters, digits, '_', '.' and '-' are allowed");
    }
    if name.len() > MAX_LIMIT_NAME {
        return Some("it must be at most 64 characters long");
    }
    if name == RESERVED_LIMIT_NAME {
        return Some("'wcu' is reserved for the store's write budget");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_names() {
        assert_eq!(limit_name_problem("tpm"), None);
        assert_eq!(limit_name_problem("a.b-c_9"), None);
        assert!(limit_name_problem("9a").is_some());
        assert!(limit_name_problem("").is_some());
        assert!(limit_name_problem("a b").is_some());
        assert!(limit_name_problem("wcu").is_some());
        assert!(limit_name_problem(&"a".repeat(65)).is_some());
        assert_eq!(limit_name_problem(&"a".repeat(64)), None);
    }
}

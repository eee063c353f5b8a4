//! The errors every stage of a config load reports with: what is wrong
//! ([`ConfigErrorKind`]), where ([`ConfigError`]: file, line, column), and all of them at
//! once ([`ConfigErrors`]). Types only: loading, parsing and validation produce them.

use std::fmt;
use std::sync::Arc;

use super::entity::TemplateError;
use super::model::Pos;

/// What is wrong, without the where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigErrorKind {
    #[error("cannot read: {0}")]
    Io(String),
    /// Loading panicked (a bug): the load is refused as any other failure would be.
    #[error("loading failed unexpectedly: {0}")]
    Panicked(String),
    #[error("YAML syntax error: {0}")]
    Syntax(String),
    #[error("{what} must be a mapping, found {found}")]
    NotAMapping { what: &'static str, found: String },
    #[error("keys of {context} must be strings, found {found}")]
    NonStringKey {
        context: &'static str,
        found: String,
    },
    #[error("unknown key '{key}' in {context}")]
    UnknownKey { key: String, context: &'static str },
    #[error("missing '{key}' in {context}")]
    MissingKey {
        key: &'static str,
        context: &'static str,
    },
    #[error("'{key}' must not be empty")]
    Empty { key: &'static str },
    #[error("'{key}' must be {expected}, found {found}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
        found: String,
    },
    #[error("'{key}' must be an integer in {min}..={max}, found '{found}'")]
    OutOfRange {
        key: &'static str,
        found: String,
        min: u64,
        max: u64,
    },
    #[error("invalid unit '{0}' (expected second, minute, hour, day, week, month or year)")]
    InvalidUnit(String),
    #[error("'unit_multiplier: {multiplier}' makes a period of {multiplier} {unit}s; the longest period is a year")]
    PeriodTooLong { multiplier: u64, unit: &'static str },
    #[error("invalid failure_mode '{0}' (expected allow or deny)")]
    InvalidFailureMode(String),
    #[error("'unlimited: true' must not be combined with '{0}'")]
    UnlimitedWith(&'static str),
    #[error("rate_limit needs '{0}' unless it is 'unlimited: true'")]
    MissingLimitField(&'static str),
    #[error("a descriptor has 'rate_limit' and 'rate_limits': use one ('rate_limits' lists every limit)")]
    RateLimitAndList,
    #[error("'rate_limits' lists {count} limits, at most {max} (they share one bucket item)")]
    TooManyListed { count: usize, max: usize },
    #[error("a 'rate_limits' entry cannot be 'unlimited: true'; an unlimited node is 'rate_limit: {{unlimited: true}}'")]
    UnlimitedInList,
    #[error("'rate_limits' names limit '{0}' twice (each limit of a bucket needs its own name; an unnamed entry is called 'rl', 'rl2', ... by its place)")]
    DuplicateLimitName(String),
    #[error("'overdraft' must be the same on every entry of 'rate_limits' (its limits are debited together)")]
    OverdraftDiffers,
    #[error("'replaces' entry needs a non-empty 'name'")]
    ReplacesWithoutName,
    #[error("'replaces' names this rule's own name '{0}'")]
    ReplacesItself(String),
    #[error("invalid limit name '{name}': {reason}")]
    InvalidLimitName { name: String, reason: &'static str },
    #[error("invalid resource '{resource}': {reason}")]
    InvalidResource {
        resource: String,
        reason: &'static str,
    },
    #[error("a descriptor has 'value' and 'value_regex': use one")]
    ValueAndRegex,
    #[error("invalid value_regex '{pattern}': {reason}")]
    InvalidValueRegex { pattern: String, reason: String },
    #[error(
        "'share_threshold: true' needs a value with a '*' wildcard or a 'value_regex', found {0}"
    )]
    ShareThresholdWithoutWildcard(String),
    #[error("'cascade: true' on a descriptor without a limited rate_limit")]
    CascadeWithoutLimit,
    #[error("'cascade: true' but no ancestor descriptor has a rate_limit")]
    CascadeWithoutParent,
    #[error("'cascade: true' but the nearest ancestor rate_limit (line {0}) is unlimited")]
    CascadeToUnlimited(u32),
    #[error("invalid entity template '{template}': {error}")]
    EntityTemplate {
        template: String,
        error: TemplateError,
    },
    #[error("entity template '{template}' uses '{{{key}}}' but no descriptor on this path has key '{key}'")]
    EntityUnknownKey { template: String, key: String },
    #[error("duplicate descriptor composite key '{key}' (first at line {first_line})")]
    DuplicateCompositeKey { key: String, first_line: u32 },
    #[error("limit '{name}' differs from the one at {other}: both rules use entity template '{template}' and resource '{resource}', so they share one bucket and must agree on unit, requests_per_unit, burst and overdraft")]
    ConflictingLimit {
        name: String,
        template: String,
        resource: String,
        /// `line N` in the same file, else `file:line`.
        other: String,
    },
    #[error("duplicate domain '{domain}' (also in {other}; --merge-domain-config merges them)")]
    DuplicateDomain { domain: String, other: String },
    #[error("duplicate descriptor composite key '{key}' (also in {other}) in a merged domain")]
    DuplicateAcrossFiles { key: String, other: String },
    #[error("top-level 'failure_mode' differs from {other}'s in a merged domain")]
    MergedFailureModeDiffers { other: String },
    #[error("'rlqs' differs from {other}'s in a merged domain")]
    MergedRlqsDiffers { other: String },
    #[error("'rlqs.keys' names '{0}' twice")]
    RlqsKeyTwice(String),
    #[error(
        "'rlqs.keys' lists {count} keys, at most {max} (as many entries as a bucket id may carry)"
    )]
    RlqsTooManyKeys { count: usize, max: usize },
    #[error("'{key}' is {bytes} bytes long, at most {max} (it is part of every store key)")]
    TooLong {
        key: &'static str,
        bytes: usize,
        max: usize,
    },
    #[error("entity template '{template}' and resource '{resource}' would put {count} limits in one bucket item, at most {max}")]
    TooManyLimits {
        template: String,
        resource: String,
        count: usize,
        max: usize,
    },
}

/// One problem, located: `file:line:column: message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigError {
    /// The file name as given to [`Config::load`] or [`Config::from_documents`].
    pub file: Arc<str>,
    /// 1-based; 0 when the problem concerns the whole file (e.g. it cannot be read).
    pub line: u32,
    /// 1-based; 0 when unknown.
    pub column: u32,
    pub kind: ConfigErrorKind,
}

impl ConfigError {
    pub(crate) fn new(file: &Arc<str>, pos: Pos, kind: ConfigErrorKind) -> ConfigError {
        ConfigError {
            file: Arc::clone(file),
            line: pos.line,
            column: pos.column,
            kind,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (0, _) => write!(f, "{}: {}", self.file, self.kind),
            (line, 0) => write!(f, "{}:{line}: {}", self.file, self.kind),
            (line, column) => write!(f, "{}:{line}:{column}: {}", self.file, self.kind),
        }
    }
}

/// Every problem found in a load (never empty); `Display` prints one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(Vec<ConfigError>);

impl ConfigErrors {
    /// The errors of a load; `errors` must not be empty.
    pub(crate) fn from_vec(errors: Vec<ConfigError>) -> ConfigErrors {
        debug_assert!(!errors.is_empty());
        ConfigErrors(errors)
    }

    pub fn iter(&self) -> impl Iterator<Item = &ConfigError> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: a `ConfigErrors` holds at least one error.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn into_vec(self) -> Vec<ConfigError> {
        self.0
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

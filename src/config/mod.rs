//! Rate-limit rules: the YAML model, strict validation with file:line errors, the
//! compiled descriptor matcher and the mapping from a matched descriptor to its bucket.
//!
//! A [`Config`] is an immutable snapshot: it is built once (at start-up or on reload),
//! then shared read-only by every request. Nothing here does I/O on the request path and
//! nothing here knows about token buckets beyond the parameters a rule declares.
//!
//! The rooms: what a config holds — `snapshot.rs` ([`Config`], [`Domain`]), `rule.rs`
//! ([`Rule`] and the limit it declares), `unit.rs` ([`Unit`]); how one is built — `load.rs`
//! (files and directories), `model.rs` (the YAML with its positions), `validate/` (every
//! check, every error at once), `error.rs` (errors with file:line), `matcher.rs` (the
//! compiled tree and the walk), `entity.rs` (`entity:` templates), `stats_key.rs`
//! (upstream's stats keys), `explain.rs` (the walk told step by step), `value_regex.rs` (regular-expression values), `xds.rs` (rules pushed over xDS, written as the documents they
//! stand for); and how one is replaced while serving — `reload.rs`.

mod entity;
mod error;
mod explain;
mod load;
mod matcher;
mod model;
pub mod reload;
mod rlqs;
mod rule;
mod snapshot;
mod stats_key;
mod unit;
mod validate;
mod value_regex;
pub mod xds;

pub use entity::{encode_component, EntityTemplate, TemplateError};
pub use error::{ConfigError, ConfigErrorKind, ConfigErrors};
pub use explain::{nearest, End as WalkEnd, How, Step, Walk};
pub use matcher::DescriptorEntry;
pub use rlqs::{descriptor_of as rlqs_descriptor_of, MAX_RLQS_KEYS};
pub use rule::{
    FailureMode, FurtherLimit, Level, RateLimit, Rule, RuleLimit, StatedLimit,
    MAX_LIMITS_PER_BUCKET, MAX_PERIOD_SECONDS, MAX_TOKENS,
};
pub use snapshot::{Config, Domain, LoadOptions};
pub use stats_key::{entries_key, hit_key};
pub use unit::Unit;
pub use value_regex::{ValueRegex, MAX_REGEX_BYTES};

//! The configuration snapshot: every [`Domain`] of every file, immutable once built
//! ([`Config`]), and how a load combines its documents ([`LoadOptions`]). Building one is
//! `load.rs`'s (files) and `validate/`'s (checks); this file only holds the result and
//! answers lookups.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use super::{load, matcher, ConfigErrors, DescriptorEntry, FailureMode, Rule};

/// One domain: its compiled descriptor tree.
#[derive(Debug)]
pub struct Domain {
    pub name: Arc<str>,
    pub failure_mode: FailureMode,
    /// The `rlqs:` section's keys: which entries of an RLQS bucket id make its descriptor,
    /// in what order (`None`: all of them, sorted by key).
    pub rlqs_keys: Option<Arc<[String]>>,
    pub(super) tree: matcher::Tree,
}

impl Domain {
    /// The rule for a request descriptor, per docs/configuration.md, "Matching" (exact, then wildcards in file
    /// order, then key-only; no backtracking; the rule must sit at the descriptor's depth).
    /// The walk allocates nothing.
    pub fn match_descriptor<E: DescriptorEntry>(&self, entries: &[E]) -> Option<&Arc<Rule>> {
        self.tree.lookup(entries)
    }

    /// The descriptor an RLQS bucket id's `entries` stand for (`config/rlqs.rs`).
    pub fn rlqs_descriptor(&self, entries: &[(String, String)]) -> Vec<(String, String)> {
        super::rlqs::descriptor_of(self.rlqs_keys.as_deref(), entries)
    }

    /// The same walk as [`Domain::match_descriptor`], told step by step (`explain`).
    pub fn walk<E: DescriptorEntry>(&self, entries: &[E]) -> crate::config::Walk<'_> {
        self.tree.walk(entries)
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
    pub(super) domains: HashMap<String, Domain, foldhash::fast::RandomState>,
    pub(super) rule_count: usize,
    /// FNV-1a 64 content hash of the sources (16 hex digits), for `/rlconfig` and metrics.
    pub(super) hash: String,
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

//! What the translation comes to ([`Translation`]): the `SHARDGATE_*` variables (and
//! `RUST_LOG`) implied, each as an [`Alias`] naming the upstream variable it came from,
//! the names ignored and the ones refused. The reading is `reader.rs`'s and the
//! translators', the applying `main`'s.

use std::collections::BTreeMap;

/// What the environment implies.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Translation {
    /// Variables to set, in a stable order: `(our name, value, the upstream names it
    /// came from)`.
    pub set: Vec<Alias>,
    /// Upstream variables present that have no meaning here (logged once).
    pub ignored: Vec<String>,
    /// Upstream settings present that shardgate cannot follow; the server must not start.
    pub refused: Vec<String>,
    /// Upstream variables present that were read: honoured (as aliases or by what they
    /// say), or refused. Every upstream variable of a Deployment is here or in `ignored`:
    /// none passes unnoticed.
    pub read: Vec<String>,
}

/// One of our variables, set from upstream's.
#[derive(Debug, PartialEq, Eq)]
pub struct Alias {
    pub ours: &'static str,
    pub value: String,
    pub from: &'static str,
}

impl Translation {
    /// Sets `ours` from upstream's `from`, unless `env` sets `ours` already (ours win).
    pub(super) fn alias(
        &mut self,
        env: &BTreeMap<String, String>,
        ours: &'static str,
        from: &'static str,
        value: String,
    ) {
        if !env.contains_key(ours) {
            self.set.push(Alias { ours, value, from });
        }
    }
}

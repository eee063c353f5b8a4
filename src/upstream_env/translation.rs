//! What the translation comes to ([`Translation`]): the `SHARDGATE_*` variables (and
//! `RUST_LOG`) implied, each as an [`Alias`] naming the upstream variable it came from,
//! the names ignored and the ones refused, and where one of ours set beside an upstream
//! variable says otherwise ([`Overridden`]). The reading is `reader.rs`'s and the
//! translators', the applying `main`'s, the start-up report `report.rs`'s.

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
    /// Upstream settings that one of ours, set too, contradicts: ours win, and the start-up
    /// log says so once (an image or a Deployment setting both would otherwise follow one
    /// of them silently).
    pub overridden: Vec<Overridden>,
}

/// One of our variables, set from upstream's.
#[derive(Debug, PartialEq, Eq)]
pub struct Alias {
    pub ours: &'static str,
    pub value: String,
    /// The upstream variable it came from; when that variable is unset, the value is
    /// upstream's default for it (`BACKEND_TYPE` unset with `REDIS_URL` set: Redis).
    pub from: &'static str,
    /// Whether `from` is set in the environment (else its default was used).
    pub from_set: bool,
}

/// An upstream setting that one of ours, also set, contradicts (ours wins).
#[derive(Debug, PartialEq, Eq)]
pub struct Overridden {
    pub ours: &'static str,
    pub ours_value: String,
    pub from: &'static str,
    /// What upstream's variable would have set `ours` to.
    pub upstream_value: String,
}

impl Translation {
    /// Sets `ours` from upstream's `from`, unless `env` sets `ours` already (ours win; a
    /// different value is remembered as [`Overridden`]).
    pub(super) fn alias(
        &mut self,
        env: &BTreeMap<String, String>,
        ours: &'static str,
        from: &'static str,
        value: String,
    ) {
        match env.get(ours) {
            None => self.set.push(Alias {
                ours,
                value,
                from,
                from_set: env.contains_key(from),
            }),
            Some(set) if *set != value => self.overridden.push(Overridden {
                ours,
                ours_value: set.clone(),
                from,
                upstream_value: value,
            }),
            Some(_) => {}
        }
    }
}

//! The environment being read by the translators: each lookup remembered, so that what
//! no reader looked at can be named as ignored at the end. Owns no upstream names of its
//! own (those are the translators' and `ignored.rs`'s).

use std::collections::{BTreeMap, BTreeSet};

use super::ignored::is_ignored;
use super::Translation;

/// The environment being read: what was looked up (each variable found is `read`
/// unless it ends up ignored), and the translation so far.
pub(super) struct Reader<'a> {
    pub(super) env: &'a BTreeMap<String, String>,
    looked: BTreeSet<String>,
    pub(super) t: Translation,
}

impl<'a> Reader<'a> {
    /// A reader of `env` that has looked at nothing yet.
    pub(super) fn new(env: &'a BTreeMap<String, String>) -> Self {
        Reader {
            env,
            looked: BTreeSet::new(),
            t: Translation::default(),
        }
    }

    /// The value of `name`, if set; remembered as looked at.
    pub(super) fn get(&mut self, name: &str) -> Option<&'a str> {
        let value = self.env.get(name).map(String::as_str);
        if value.is_some() {
            self.looked.insert(name.to_string());
        }
        value
    }

    /// Sets `ours` from upstream's `from`, unless `ours` is set already (ours win).
    pub(super) fn alias(&mut self, ours: &'static str, from: &'static str, value: String) {
        self.t.alias(self.env, ours, from, value);
    }

    /// Names a setting shardgate cannot follow: the server will not start.
    pub(super) fn refuse(&mut self, why: String) {
        self.t.refused.push(why);
    }

    /// The variables no rule read that upstream has, named as ignored; `read` completed
    /// with what `consumed` names.
    pub(super) fn finish(mut self, consumed: &[&str]) -> Translation {
        for name in self.env.keys() {
            let ignored = is_ignored(name)
                && !consumed.contains(&name.as_str())
                && !self.looked.contains(name);
            if ignored {
                self.t.ignored.push(name.clone());
            }
        }
        let env = self.env;
        self.looked.extend(
            consumed
                .iter()
                .filter(|name| env.contains_key(**name))
                .map(|name| name.to_string()),
        );
        let ignored = &self.t.ignored;
        let read = self
            .looked
            .into_iter()
            .filter(|name| {
                !ignored
                    .iter()
                    .any(|i| i == name || i.starts_with(&format!("{name} ")))
            })
            .collect();
        self.t.read = read;
        self.t
    }

    /// Names each of `settings` that is set as ignored, with why (settings of upstream's
    /// clients that have no counterpart here).
    pub(super) fn ignore_with_reasons(&mut self, settings: &[(&str, &str)]) {
        for (name, why) in settings {
            if self.get(name).is_some() {
                self.t.ignored.push(format!("{name} ({why})"));
            }
        }
    }
}

//! The compiled descriptor tree of one domain and the walk that matches a request
//! descriptor to its rule (docs/configuration.md, "Matching"): exact child, else the
//! first matching wildcard or `value_regex` in file order, else the key-only child; no
//! backtracking.
//!
//! Compiling builds the [`Rule`]s (inherited resource, cascade parent, stats key); the
//! walk is O(depth) and must not allocate, since it runs for every request descriptor.

use std::collections::HashMap;

/// Config maps are built from the operator's files and only looked up with request
/// values, so a fast seeded hash is safe here (nothing a request sends is inserted).
type FastMap<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
use std::sync::Arc;

use super::model::{DescriptorModel, DomainPart};
use super::stats_key::child_key;
use super::{FailureMode, Level, Rule, ValueRegex};

/// One entry of a request descriptor. The service implements it for Envoy's proto entry.
pub trait DescriptorEntry {
    fn key(&self) -> &str;
    fn value(&self) -> &str;
}

impl DescriptorEntry for (&str, &str) {
    fn key(&self) -> &str {
        self.0
    }
    fn value(&self) -> &str {
        self.1
    }
}

impl DescriptorEntry for (String, String) {
    fn key(&self) -> &str {
        &self.0
    }
    fn value(&self) -> &str {
        &self.1
    }
}

impl<T: DescriptorEntry + ?Sized> DescriptorEntry for &T {
    fn key(&self) -> &str {
        (**self).key()
    }
    fn value(&self) -> &str {
        (**self).value()
    }
}

/// Index of a node in [`Tree::nodes`].
pub(super) type NodeId = u32;

/// A child's value that matches more than one request value.
#[derive(Debug)]
pub(super) enum Pattern {
    /// A `value` containing `*`.
    Glob(Box<str>),
    /// A `value_regex` (an extension), matched against the whole value.
    Regex(ValueRegex),
}

impl Pattern {
    pub(super) fn matches(&self, value: &str) -> bool {
        match self {
            Pattern::Glob(glob) => glob_match(glob, value),
            Pattern::Regex(regex) => regex.matches(value),
        }
    }
}

/// The children of one node that share a key.
#[derive(Debug, Default)]
pub(super) struct KeyChildren {
    pub(super) exact: FastMap<Box<str>, NodeId>,
    /// Wildcards and regular expressions together, in file order: the first that matches
    /// wins, so a file's meaning does not depend on which kind a node is.
    pub(super) patterns: Vec<(Pattern, NodeId)>,
    pub(super) key_only: Option<NodeId>,
}

impl KeyChildren {
    fn find(&self, value: &str) -> Option<NodeId> {
        self.exact
            .get(value)
            .copied()
            .or_else(|| {
                self.patterns
                    .iter()
                    .find(|(pattern, _)| pattern.matches(value))
                    .map(|(_, id)| *id)
            })
            .or(self.key_only)
    }
}

#[derive(Debug, Default)]
pub(super) struct TreeNode {
    pub(super) rule: Option<Arc<Rule>>,
    pub(super) children: FastMap<Box<str>, KeyChildren>,
    /// `file:line` of the node (none for the root), for `explain`.
    pub(super) source: Option<Arc<str>>,
}

/// A domain's descriptor tree; node 0 is the root.
#[derive(Debug)]
pub(crate) struct Tree {
    pub(super) nodes: Vec<TreeNode>,
    /// Every rule, in file order.
    rules: Vec<Arc<Rule>>,
}

/// What compiling a node inherits from its ancestors.
struct Inherited<'a> {
    levels: Vec<Level>,
    stats_key: String,
    resource: &'a str,
    /// The nearest ancestor rule (the cascade parent of a `cascade: true` child).
    nearest_rule: Option<Arc<Rule>>,
}

struct Compiler<'a> {
    domain: &'a Arc<str>,
    /// The next rule's index in the whole config.
    next_rule: &'a mut usize,
    file: &'a str,
    failure_mode: FailureMode,
    tree: Tree,
}

impl Tree {
    /// Builds the tree of a domain from its validated documents (one, or several merged
    /// with `--merge-domain-config`, whose top-level descriptors validation and the merge
    /// check keep distinct, so nothing is overwritten here). A top-level `failure_mode`
    /// set in any of them applies to all. Rules are numbered from `*next_rule` on, which
    /// is advanced past them.
    pub(crate) fn compile(domain: &Arc<str>, parts: &[DomainPart], next_rule: &mut usize) -> Tree {
        let failure_mode = parts
            .iter()
            .find_map(|p| p.doc.failure_mode)
            .unwrap_or_default();
        let mut tree = Tree {
            nodes: vec![TreeNode::default()],
            rules: Vec::new(),
        };
        for DomainPart { file, doc } in parts {
            let mut c = Compiler {
                domain,
                next_rule: &mut *next_rule,
                file: file.as_ref(),
                failure_mode,
                tree,
            };
            let root = Inherited {
                levels: Vec::new(),
                stats_key: domain.to_string(),
                resource: domain,
                nearest_rule: None,
            };
            c.add_children(0, &doc.descriptors, &root);
            tree = c.tree;
        }
        tree
    }

    pub(crate) fn lookup<E: DescriptorEntry>(&self, entries: &[E]) -> Option<&Arc<Rule>> {
        let last = entries.len().checked_sub(1)?;
        // The root is node 0 and every child id names a node: `get` finds each one.
        let mut node = self.nodes.first()?;
        for (i, entry) in entries.iter().enumerate() {
            let id = node.children.get(entry.key())?.find(entry.value())?;
            node = self.nodes.get(id as usize)?;
            if i == last {
                return node.rule.as_ref();
            }
        }
        None
    }

    pub(crate) fn rules(&self) -> impl Iterator<Item = &Arc<Rule>> {
        self.rules.iter()
    }

    /// The children keyed `key` of node `parent`, while compiling.
    #[expect(
        clippy::indexing_slicing,
        reason = "`parent` is the root (0) or a node pushed before its children"
    )]
    fn children_under(&mut self, parent: usize, key: &str) -> &mut KeyChildren {
        self.nodes[parent].children.entry(key.into()).or_default()
    }
}

impl Compiler<'_> {
    #[expect(clippy::expect_used, reason = "fewer than 2^32 descriptors")]
    fn add_children(&mut self, parent: usize, descriptors: &[DescriptorModel], up: &Inherited) {
        for d in descriptors {
            let mut levels = up.levels.clone();
            let regex = d.value_regex.as_ref().map(ValueRegex::as_str);
            let value = d.value.as_deref().or(regex);
            levels.push(Level {
                key: d.key.clone(),
                value: value.map(str::to_string),
                regex: regex.is_some(),
                share_threshold: d.share_threshold,
                value_to_metric: d.value_to_metric,
            });
            let stats_key = child_key(&up.stats_key, &d.key, value);
            let resource = d.resource.as_deref().unwrap_or(up.resource);
            let source: Arc<str> = format!("{}:{}", self.file, d.pos.line).into();
            let rule = d.rate_limit.as_ref().map(|rl| {
                let index = *self.next_rule;
                *self.next_rule += 1;
                Arc::new(Rule {
                    index: Some(index),
                    domain: Arc::clone(self.domain),
                    levels: levels.clone(),
                    limit: rl.limit.clone(),
                    name: rl.name.clone(),
                    replaces: rl.replaces.clone(),
                    further_limits: rl.further.clone(),
                    shadow_mode: d.shadow_mode,
                    quota_mode: d.quota_mode,
                    detailed_metric: d.detailed_metric,
                    metadata: d.metadata.clone(),
                    entity: d.entity.clone(),
                    resource: resource.to_string(),
                    cascade_parent: if d.cascade {
                        up.nearest_rule.clone()
                    } else {
                        None
                    },
                    failure_mode: d.failure_mode.unwrap_or(self.failure_mode),
                    stats_key: stats_key.clone(),
                    source: Arc::clone(&source),
                })
            });

            let id = NodeId::try_from(self.tree.nodes.len()).expect("fewer than 2^32 descriptors");
            self.tree.nodes.push(TreeNode {
                rule: rule.clone(),
                children: FastMap::default(),
                source: Some(source),
            });
            let siblings = self.tree.children_under(parent, &d.key);
            // Validation rejected duplicate siblings, so nothing is overwritten here.
            match (&d.value, &d.value_regex) {
                (None, Some(regex)) => siblings.patterns.push((Pattern::Regex(regex.clone()), id)),
                (None, None) => siblings.key_only = Some(id),
                (Some(v), _) if v.contains('*') => siblings
                    .patterns
                    .push((Pattern::Glob(v.as_str().into()), id)),
                (Some(v), _) => {
                    siblings.exact.insert(v.as_str().into(), id);
                }
            }
            if let Some(r) = &rule {
                self.tree.rules.push(Arc::clone(r));
            }

            let below = Inherited {
                levels,
                stats_key,
                resource,
                nearest_rule: rule.or_else(|| up.nearest_rule.clone()),
            };
            self.add_children(id as usize, &d.children, &below);
        }
    }
}

/// Whether `value` matches `pattern`, where each `*` matches any run of characters
/// (also empty). Greedy with backtracking to the last `*`: O(len²) worst case, no
/// allocation. Byte-wise is exact for UTF-8, since literal runs start on char boundaries.
pub(crate) fn glob_match(pattern: &str, value: &str) -> bool {
    let (p, v) = (pattern.as_bytes(), value.as_bytes());
    let (mut pi, mut vi) = (0, 0);
    // Position after the last `*` seen, and where in `value` it started matching.
    let mut star: Option<(usize, usize)> = None;
    while let Some(&vb) = v.get(vi) {
        let pb = p.get(pi).copied();
        if pb == Some(b'*') {
            star = Some((pi + 1, vi));
            pi += 1;
        } else if pb == Some(vb) {
            pi += 1;
            vi += 1;
        } else if let Some((after_star, start)) = star {
            // Let the last `*` swallow one more byte and retry.
            pi = after_star;
            vi = start + 1;
            star = Some((after_star, start + 1));
        } else {
            return false;
        }
    }
    p.iter().skip(pi).all(|&b| b == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The obvious recursive definition, to check the iterative matcher against.
    fn reference(p: &[u8], v: &[u8]) -> bool {
        match p.split_first() {
            None => v.is_empty(),
            Some((b'*', rest)) => (0..=v.len()).any(|i| reference(rest, &v[i..])),
            Some((c, rest)) => v.first() == Some(c) && reference(rest, &v[1..]),
        }
    }

    #[test]
    fn glob_examples() {
        assert!(glob_match("foo*", "foo"));
        assert!(glob_match("foo*", "foo1"));
        assert!(glob_match("bar*b", "barb"));
        assert!(glob_match("bar*b", "bar123b"));
        assert!(!glob_match("bar*b", "bara"));
        assert!(!glob_match("bar*b", "xbarb"));
        assert!(glob_match("foo*bar*baz", "foo1bar2baz"));
        assert!(glob_match("foo*bar*baz", "foobarbaz"));
        assert!(!glob_match("foo*bar*baz", "foobazbar"));
        assert!(glob_match("*", ""));
        assert!(glob_match("**a**", "a"));
        assert!(glob_match("é*ü", "éàü"));
    }

    proptest! {
        #[test]
        fn glob_agrees_with_reference(p in "[ab*]{0,8}", v in "[ab]{0,10}") {
            prop_assert_eq!(glob_match(&p, &v), reference(p.as_bytes(), v.as_bytes()));
        }

        #[test]
        fn glob_agrees_on_any_text(p in "(\\*|[a-c]|é){0,6}", v in "([a-c]|é|\\*){0,8}") {
            prop_assert_eq!(glob_match(&p, &v), reference(p.as_bytes(), v.as_bytes()));
        }
    }
}

//! The descriptor walk told step by step, for `shardgate explain` and `POST /explain`:
//! at each depth which node matched and how (exact value, wildcard, `value_regex`,
//! key-only default), which patterns were passed over, and, when nothing matched, why
//! and what was nearest. It walks exactly as `matcher.rs`'s lookup does and reads only
//! the compiled tree; buckets and balances are the service's to add.

use std::fmt;
use std::sync::Arc;

use super::matcher::{KeyChildren, NodeId, Pattern, Tree, TreeNode};
use super::{DescriptorEntry, Rule};

/// How an entry found its node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum How {
    Exact,
    Wildcard(String),
    Regex(String),
    KeyOnly,
}

/// One entry of the descriptor that matched a node.
#[derive(Debug, Clone)]
pub struct Step {
    /// 1-based, as people count levels.
    pub depth: usize,
    pub key: String,
    pub value: String,
    pub how: How,
    pub source: Arc<str>,
    /// Wildcards and expressions tried, in file order, before the one that matched (or
    /// before falling back to the key-only node).
    pub passed_over: Vec<String>,
}

/// How the walk ended.
#[derive(Debug, Clone)]
pub enum End<'a> {
    /// The last entry's node has this rule.
    Rule(&'a Arc<Rule>),
    /// The last entry's node has no `rate_limit`.
    NoRule { source: Arc<str> },
    /// No node at `depth` has this key.
    NoKey {
        depth: usize,
        key: String,
        /// The keys nodes at that depth have, in name order.
        keys: Vec<String>,
    },
    /// Nodes at `depth` have the key, but none takes the value.
    NoValue {
        depth: usize,
        key: String,
        value: String,
        values: Vec<String>,
        passed_over: Vec<String>,
    },
    /// The descriptor has no entries.
    Empty,
}

/// The whole walk of one descriptor.
#[derive(Debug, Clone)]
pub struct Walk<'a> {
    pub steps: Vec<Step>,
    pub end: End<'a>,
    /// Rules on the path shallower than the descriptor: they apply only to descriptors
    /// of exactly their depth, a common surprise.
    pub shallower: Vec<(usize, Arc<str>)>,
}

impl Tree {
    /// Walks `entries` as [`Tree::lookup`] does, keeping what happened at each depth.
    pub(crate) fn walk<E: DescriptorEntry>(&self, entries: &[E]) -> Walk<'_> {
        let mut walk = Walk {
            steps: Vec::new(),
            end: End::Empty,
            shallower: Vec::new(),
        };
        // The root is node 0 and every child id names a node (`Tree::lookup`).
        let Some(mut node) = self.nodes.first() else {
            return walk;
        };
        for (i, entry) in entries.iter().enumerate() {
            let (depth, key, value) = (i + 1, entry.key(), entry.value());
            let Some(children) = node.children.get(key) else {
                let mut keys: Vec<String> = node.children.keys().map(|k| k.to_string()).collect();
                keys.sort();
                walk.end = End::NoKey {
                    depth,
                    key: key.to_string(),
                    keys,
                };
                return walk;
            };
            let Some((id, how, passed_over)) = self.choose(children, value) else {
                walk.end = End::NoValue {
                    depth,
                    key: key.to_string(),
                    value: value.to_string(),
                    values: sorted_values(children),
                    passed_over: self.describe_all(children),
                };
                return walk;
            };
            let Some(next) = self.nodes.get(id as usize) else {
                return walk;
            };
            node = next;
            let source = node.source.clone().unwrap_or_else(|| Arc::from("?"));
            walk.steps.push(Step {
                depth,
                key: key.to_string(),
                value: value.to_string(),
                how,
                source: source.clone(),
                passed_over,
            });
            if i + 1 < entries.len() {
                if node.rule.is_some() {
                    walk.shallower.push((depth, source));
                }
            } else {
                walk.end = match &node.rule {
                    Some(rule) => End::Rule(rule),
                    None => End::NoRule { source },
                };
            }
        }
        walk
    }

    /// The child `value` leads to among `children`, how, and the patterns passed over.
    fn choose(&self, children: &KeyChildren, value: &str) -> Option<(NodeId, How, Vec<String>)> {
        if let Some(id) = children.exact.get(value) {
            return Some((*id, How::Exact, Vec::new()));
        }
        let mut passed_over = Vec::new();
        for (pattern, id) in &children.patterns {
            if pattern.matches(value) {
                let how = match pattern {
                    Pattern::Glob(g) => How::Wildcard(g.to_string()),
                    Pattern::Regex(r) => How::Regex(r.as_str().to_string()),
                };
                return Some((*id, how, passed_over));
            }
            passed_over.push(self.describe(pattern, *id));
        }
        children.key_only.map(|id| (id, How::KeyOnly, passed_over))
    }

    fn describe_all(&self, children: &KeyChildren) -> Vec<String> {
        let patterns = children.patterns.iter();
        patterns.map(|(p, id)| self.describe(p, *id)).collect()
    }

    /// "wildcard '/admin/*' (file:line)".
    fn describe(&self, pattern: &Pattern, id: NodeId) -> String {
        let (kind, text) = match pattern {
            Pattern::Glob(g) => ("wildcard", g.as_ref()),
            Pattern::Regex(r) => ("value_regex", r.as_str()),
        };
        let source = self.nodes.get(id as usize).map_or("?", source_of);
        format!("{kind} '{text}' ({source})")
    }
}

fn source_of(node: &TreeNode) -> &str {
    node.source.as_deref().unwrap_or("?")
}

fn sorted_values(children: &KeyChildren) -> Vec<String> {
    let mut values: Vec<String> = children.exact.keys().map(|v| v.to_string()).collect();
    values.sort();
    values
}

/// The candidate closest to `wanted` by edit distance, if it is close enough to be a
/// likely typo (at most a third of the longer name, and at least one edit allowed).
pub fn nearest<'c>(wanted: &str, candidates: &'c [String]) -> Option<&'c str> {
    candidates
        .iter()
        .map(|c| (strsim::damerau_levenshtein(wanted, c), c))
        .filter(|(d, c)| *d > 0 && *d <= (wanted.len().max(c.len()) / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.as_str())
}

fn list(items: &[String]) -> String {
    match items.len() {
        0 => "none".to_string(),
        _ => items.join(", "),
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (key, value, at) = (&self.key, &self.value, &self.source);
        match &self.how {
            How::Exact => write!(f, "depth {}: {key}={value} matched value '{value}' ({at})", self.depth)?,
            How::Wildcard(p) => write!(f, "depth {}: {key}={value} matched wildcard '{p}' ({at})", self.depth)?,
            How::Regex(p) => write!(f, "depth {}: {key}={value} matched value_regex '{p}' ({at})", self.depth)?,
            How::KeyOnly => write!(f, "depth {}: {key}={value} matched the key-only node '{key}' ({at}): no node has value '{value}'", self.depth)?,
        }
        for p in &self.passed_over {
            write!(f, "\n  passed over {p}: does not match '{value}'")?;
        }
        Ok(())
    }
}

impl fmt::Display for End<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::Rule(rule) => write!(f, "rule: {} ({})", rule.stats_key, rule.source),
            End::NoRule { source } => write!(
                f,
                "no rule: the node at {source} has no rate_limit, so this descriptor is not limited"
            ),
            End::NoKey { depth, key, keys } => {
                write!(f, "no rule: no descriptor at depth {depth} has key '{key}'")?;
                if let Some(n) = nearest(key, keys) {
                    write!(f, "; the nearest is '{n}'")?;
                }
                write!(f, " (keys at depth {depth}: {})", list(keys))
            }
            End::NoValue {
                depth,
                key,
                value,
                values,
                passed_over,
            } => {
                write!(
                    f,
                    "no rule: at depth {depth}, no node with key '{key}' takes value '{value}'"
                )?;
                if let Some(n) = nearest(value, values) {
                    write!(f, "; the nearest value is '{n}'")?;
                }
                write!(f, " (values: {}; ", list(values))?;
                write!(
                    f,
                    "patterns tried: {}; no key-only '{key}' node)",
                    list(passed_over)
                )
            }
            End::Empty => write!(f, "no rule: the descriptor has no entries"),
        }
    }
}

impl fmt::Display for Walk<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for step in &self.steps {
            writeln!(f, "{step}")?;
        }
        write!(f, "{}", self.end)?;
        // Only worth saying when the descriptor found no rule of its own.
        let unmatched = !matches!(self.end, End::Rule(_));
        for (depth, source) in self.shallower.iter().filter(|_| unmatched) {
            write!(
                f,
                "\nnote: the rule at depth {depth} ({source}) applies only to descriptors of {depth} entr{}",
                if *depth == 1 { "y" } else { "ies" }
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_is_a_likely_typo_or_nothing() {
        let keys = [
            "api_key".to_string(),
            "model".to_string(),
            "tenant".to_string(),
        ];
        assert_eq!(nearest("apikey", &keys), Some("api_key"));
        assert_eq!(nearest("modle", &keys), Some("model"));
        assert_eq!(nearest("region", &keys), None);
        assert_eq!(nearest("api_key", &keys), None, "not a typo of itself");
        assert_eq!(nearest("x", &[]), None);
    }
}

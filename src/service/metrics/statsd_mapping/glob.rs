//! A glob `match` of a statsd_exporter mapping: its form, whether a statsd name matches it
//! and what each `*` captured, how specific it is, and whether one glob matches every
//! name another does. Pure; which glob wins among several is the parent's rule, and what
//! a match is turned into is not this file's business either.

use std::cmp::Ordering;

/// One dot-separated part of a glob.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    /// `*`: any one component, empty included; captured.
    Any,
    Literal(String),
}

/// A glob such as `ratelimit.service.rate_limit.*.*.total_hits`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Glob {
    text: String,
    parts: Vec<Part>,
}

impl Glob {
    /// Reads a glob as statsd_exporter accepts one: dot-separated components, each `*` or
    /// a literal of ASCII letters, digits, `_` and `-` (the first component not starting
    /// with a digit or `-`, the others not with `-`). A `*` inside a component (`a*b`) is
    /// refused, as statsd_exporter refuses it.
    pub(super) fn parse(text: &str) -> Result<Glob, String> {
        let parts = text
            .split('.')
            .enumerate()
            .map(|(i, part)| match part {
                "*" => Ok(Part::Any),
                literal if valid_literal(literal, i == 0) => Ok(Part::Literal(literal.into())),
                _ => Err(format!(
                    "match {text:?}: not a glob (dot-separated parts, each `*` or letters, digits, `_`, `-`)"
                )),
            })
            .collect::<Result<_, _>>()?;
        Ok(Glob {
            text: text.to_string(),
            parts,
        })
    }

    /// The glob as written.
    pub(super) fn text(&self) -> &str {
        &self.text
    }

    /// What each `*` matched, in order, if `name` matches: as many dot-separated
    /// components as the glob has parts, each literal equal.
    pub(super) fn captures<'n>(&self, name: &'n str) -> Option<Vec<&'n str>> {
        let mut captures = Vec::new();
        let mut components = name.split('.');
        for part in &self.parts {
            let component = components.next()?;
            match part {
                Part::Any => captures.push(component),
                Part::Literal(l) if l == component => {}
                Part::Literal(_) => return None,
            }
        }
        components.next().is_none().then_some(captures)
    }

    /// statsd_exporter's unordered rule ("at each level the most specific match wins"):
    /// compared part by part from the left, a literal before a `*`. `Less` is more
    /// specific. Only globs that matched the same name are compared, so their lengths are
    /// equal.
    pub(super) fn specificity(&self, other: &Glob) -> Ordering {
        let rank = |p: &Part| matches!(p, Part::Any);
        self.parts
            .iter()
            .map(rank)
            .cmp(other.parts.iter().map(rank))
    }

    /// Whether every name `other` matches, this glob matches too.
    pub(super) fn covers(&self, other: &Glob) -> bool {
        self.parts.len() == other.parts.len()
            && self.parts.iter().zip(&other.parts).all(|pair| match pair {
                (Part::Any, _) => true,
                (Part::Literal(a), Part::Literal(b)) => a == b,
                (Part::Literal(_), Part::Any) => false,
            })
    }
}

fn valid_literal(literal: &str, first: bool) -> bool {
    let mut chars = literal.chars();
    let lead_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (!first && c.is_ascii_digit()));
    lead_ok && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn glob(text: &str) -> Glob {
        Glob::parse(text).unwrap()
    }

    #[test]
    fn globs_are_read_as_statsd_exporter_reads_them() {
        for good in [
            "ratelimit.service.rate_limit.*.*.total_hits",
            "*",
            "*.x",
            "a-b.1c.*",
            "_x.y_z",
        ] {
            assert!(Glob::parse(good).is_ok(), "{good}");
        }
        for bad in [
            "", "a..b", "a.b*", "1a.b", "-a", "a.-b", "a.b.", "a b", "a.(x)",
        ] {
            let e = Glob::parse(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
    }

    #[test]
    fn a_star_matches_one_component_empty_included() {
        let g = glob("ratelimit.service.rate_limit.*.*.total_hits");
        assert_eq!(
            g.captures("ratelimit.service.rate_limit.edge.user.total_hits"),
            Some(vec!["edge", "user"])
        );
        assert_eq!(
            g.captures("ratelimit.service.rate_limit.edge..total_hits"),
            Some(vec!["edge", ""])
        );
        // One component more or less, or a literal that differs: no match.
        assert_eq!(
            g.captures("ratelimit.service.rate_limit.edge.a.b.total_hits"),
            None
        );
        assert_eq!(
            g.captures("ratelimit.service.rate_limit.edge.total_hits"),
            None
        );
        assert_eq!(
            g.captures("ratelimit.service.rate_limit.edge.user.over_limit"),
            None
        );
    }

    #[test]
    fn specificity_and_cover_compare_part_by_part() {
        assert_eq!(glob("a.b.*").specificity(&glob("a.*.c")), Ordering::Less);
        assert_eq!(glob("a.*.*").specificity(&glob("a.*.c")), Ordering::Greater);
        assert_eq!(glob("a.*").specificity(&glob("a.*")), Ordering::Equal);
        assert!(glob("a.*").covers(&glob("a.b")));
        assert!(glob("a.*").covers(&glob("a.*")));
        assert!(!glob("a.b").covers(&glob("a.*")));
        assert!(!glob("a.*.c").covers(&glob("a.b.*")));
        assert!(!glob("a.*").covers(&glob("a.b.c")));
    }
}

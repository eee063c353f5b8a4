//! The YAML model: a generic tree of YAML nodes that remembers where every node sits in
//! its file, the one function that turns text into that tree, and the typed, validated
//! shape of a document that `validate` produces from it.
//!
//! Only [`parse`] knows the YAML library (serde-saphyr), so it can be swapped. This module
//! must not decide what is valid; it only describes.

use std::fmt;
use std::sync::Arc;

use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;

use super::{EntityTemplate, FailureMode, FurtherLimit, RuleLimit, ValueRegex};

/// A 1-based line and column in a source file (0 when unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) struct Pos {
    pub line: u32,
    pub column: u32,
}

/// One YAML node with its position.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Node {
    pub kind: NodeKind,
    pub pos: Pos,
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum NodeKind {
    Null,
    /// A non-string scalar (bool, int, float) keeps its source text, because
    /// envoyproxy/ratelimit reads `value: 200` into a string field as the text "200".
    Bool(bool, String),
    Int(i128, String),
    Float(f64, String),
    Str(String),
    Seq(Vec<Node>),
    /// Entries in file order (the parser already rejects duplicate keys).
    Map(Vec<(Node, Node)>),
}

impl NodeKind {
    /// How the node is called in messages ("a string", "a mapping", ...).
    pub fn describe(&self) -> String {
        match self {
            NodeKind::Null => "null".to_string(),
            NodeKind::Bool(_, raw) => format!("boolean '{raw}'"),
            NodeKind::Int(_, raw) => format!("integer '{raw}'"),
            NodeKind::Float(_, raw) => format!("float '{raw}'"),
            NodeKind::Str(s) => format!("string '{s}'"),
            NodeKind::Seq(_) => "a list".to_string(),
            NodeKind::Map(_) => "a mapping".to_string(),
        }
    }

    /// The text of a scalar as a YAML string field would read it; `None` for null and
    /// collections.
    pub fn scalar_text(&self) -> Option<&str> {
        match self {
            NodeKind::Str(s) => Some(s),
            NodeKind::Bool(_, raw) | NodeKind::Int(_, raw) | NodeKind::Float(_, raw) => Some(raw),
            NodeKind::Null | NodeKind::Seq(_) | NodeKind::Map(_) => None,
        }
    }
}

/// A YAML syntax error with its position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParseError {
    pub message: String,
    pub pos: Pos,
}

/// Parses one YAML document into a [`Node`] tree. An empty document is [`NodeKind::Null`].
pub(crate) fn parse(text: &str) -> Result<Node, ParseError> {
    match serde_saphyr::from_str::<Spanned<RawKind>>(text) {
        Ok(root) => Ok(convert(root, text)),
        Err(err) => {
            let pos = err.location().map(|l| pos_of(&l)).unwrap_or_default();
            let opts = serde_saphyr::render_options! { snippets: serde_saphyr::SnippetMode::Off };
            let mut message = err.render_with_options(opts);
            // The plain rendering appends the position, which our own prefix already carries.
            let suffix = format!(" at line {}, column {}", pos.line, pos.column);
            if let Some(stripped) = message.strip_suffix(&suffix) {
                message.truncate(stripped.len());
            }
            // Advice aimed at the library's callers, not at whoever edits the file.
            if let Some(at) = message.find(", set DuplicateKeyPolicy") {
                message.truncate(at);
            }
            Err(ParseError { message, pos })
        }
    }
}

fn pos_of(l: &serde_saphyr::Location) -> Pos {
    Pos {
        line: u32::try_from(l.line()).unwrap_or(u32::MAX),
        column: u32::try_from(l.column()).unwrap_or(u32::MAX),
    }
}

/// The source text of a scalar at `defined` (where an alias's target is written).
fn raw_text<'a>(defined: &serde_saphyr::Location, text: &'a str) -> &'a str {
    let span = defined.span();
    let range = span
        .byte_offset()
        .zip(span.byte_len())
        .and_then(|(off, len)| Some(usize::try_from(off).ok()?..usize::try_from(off + len).ok()?));
    range.and_then(|r| text.get(r)).unwrap_or("").trim()
}

fn convert(s: Spanned<RawKind>, text: &str) -> Node {
    let Spanned {
        value,
        referenced,
        defined,
    } = s;
    let raw = |fallback: String| match raw_text(&defined, text) {
        "" => fallback,
        r => r.to_string(),
    };
    let kind = match value {
        RawKind::Null => NodeKind::Null,
        RawKind::Bool(b) => NodeKind::Bool(b, raw(b.to_string())),
        RawKind::Int(i) => NodeKind::Int(i, raw(i.to_string())),
        RawKind::Float(f) => NodeKind::Float(f, raw(f.to_string())),
        RawKind::Str(v) => NodeKind::Str(v),
        RawKind::Seq(items) => NodeKind::Seq(items.into_iter().map(|i| convert(i, text)).collect()),
        RawKind::Map(entries) => NodeKind::Map(
            entries
                .into_iter()
                .map(|(k, v)| (convert(k, text), convert(v, text)))
                .collect(),
        ),
    };
    Node {
        kind,
        pos: pos_of(&referenced),
    }
}

/// What serde-saphyr hands us: any YAML value, children wrapped in `Spanned`.
enum RawKind {
    Null,
    Bool(bool),
    Int(i128),
    Float(f64),
    Str(String),
    Seq(Vec<Spanned<RawKind>>),
    Map(Vec<(Spanned<RawKind>, Spanned<RawKind>)>),
}

impl<'de> Deserialize<'de> for RawKind {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct AnyVisitor;
        impl<'de> Visitor<'de> for AnyVisitor {
            type Value = RawKind;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_unit<E>(self) -> Result<RawKind, E> {
                Ok(RawKind::Null)
            }
            fn visit_none<E>(self) -> Result<RawKind, E> {
                Ok(RawKind::Null)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<RawKind, D::Error> {
                RawKind::deserialize(d)
            }
            fn visit_bool<E>(self, v: bool) -> Result<RawKind, E> {
                Ok(RawKind::Bool(v))
            }
            fn visit_i64<E>(self, v: i64) -> Result<RawKind, E> {
                Ok(RawKind::Int(v.into()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<RawKind, E> {
                Ok(RawKind::Int(v.into()))
            }
            fn visit_i128<E>(self, v: i128) -> Result<RawKind, E> {
                Ok(RawKind::Int(v))
            }
            fn visit_u128<E>(self, v: u128) -> Result<RawKind, E> {
                Ok(RawKind::Int(i128::try_from(v).unwrap_or(i128::MAX)))
            }
            fn visit_f64<E>(self, v: f64) -> Result<RawKind, E> {
                Ok(RawKind::Float(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<RawKind, E> {
                Ok(RawKind::Str(v.to_string()))
            }
            fn visit_string<E>(self, v: String) -> Result<RawKind, E> {
                Ok(RawKind::Str(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<RawKind, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = a.next_element()? {
                    items.push(item);
                }
                Ok(RawKind::Seq(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<RawKind, A::Error> {
                let mut entries = Vec::new();
                while let Some(k) = a.next_key()? {
                    entries.push((k, a.next_value()?));
                }
                Ok(RawKind::Map(entries))
            }
        }
        d.deserialize_any(AnyVisitor)
    }
}

/// A validated document: one domain.
#[derive(Debug, Clone)]
pub(crate) struct DocumentModel {
    pub domain: String,
    pub pos: Pos,
    pub failure_mode: Option<FailureMode>,
    /// The `rlqs:` section's `keys` (config/rlqs.rs).
    pub rlqs_keys: Option<Vec<String>>,
    pub descriptors: Vec<DescriptorModel>,
}

/// One document of a domain and the file it came from (a domain has several when its
/// files are merged).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DomainPart<'a> {
    pub file: &'a Arc<str>,
    pub doc: &'a DocumentModel,
}

/// A validated descriptor node.
#[derive(Debug, Clone)]
pub(crate) struct DescriptorModel {
    pub key: String,
    /// `None` for a key-only node (an empty `value` means the same, as in envoyproxy).
    pub value: Option<String>,
    /// `value_regex` (an extension), instead of `value`.
    pub value_regex: Option<ValueRegex>,
    pub pos: Pos,
    pub rate_limit: Option<RateLimitModel>,
    pub shadow_mode: bool,
    pub quota_mode: bool,
    pub detailed_metric: bool,
    pub value_to_metric: bool,
    pub share_threshold: bool,
    pub metadata: Option<serde_json::Value>,
    pub entity: Option<EntityTemplate>,
    pub resource: Option<String>,
    pub cascade: bool,
    pub failure_mode: Option<FailureMode>,
    pub children: Vec<DescriptorModel>,
}

/// A validated `rate_limit` (or `rate_limits`: its first entry here, the others in
/// `further`, the `replaces` of all of them together).
#[derive(Debug, Clone)]
pub(crate) struct RateLimitModel {
    pub limit: RuleLimit,
    pub name: Option<String>,
    pub replaces: Vec<String>,
    pub further: Vec<FurtherLimit>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_keep_their_text_and_position() {
        let n = parse("a: 0x10\nb: \"5\"\nc: 5.0\nd: yes\n").unwrap();
        let NodeKind::Map(entries) = n.kind else {
            panic!("not a map")
        };
        assert_eq!(entries[0].1.kind, NodeKind::Int(16, "0x10".into()));
        assert_eq!(entries[0].1.pos, Pos { line: 1, column: 4 });
        assert_eq!(entries[1].1.kind, NodeKind::Str("5".into()));
        assert_eq!(entries[2].1.kind, NodeKind::Float(5.0, "5.0".into()));
        assert_eq!(entries[3].0.pos, Pos { line: 4, column: 1 });
    }

    #[test]
    fn empty_document_is_null() {
        assert_eq!(parse("# nothing\n").unwrap().kind, NodeKind::Null);
    }

    #[test]
    fn syntax_error_has_position_and_plain_message() {
        let e = parse("a: 1\nb: [1, 2\n").unwrap_err();
        assert_eq!(e.pos.line, 2);
        assert!(!e.message.contains("at line"), "{}", e.message);
    }

    #[test]
    fn aliases_resolve() {
        let n = parse("a: &x 7\nb: *x\n").unwrap();
        let NodeKind::Map(entries) = n.kind else {
            panic!("not a map")
        };
        assert_eq!(entries[1].1.kind, NodeKind::Int(7, "7".into()));
        assert_eq!(entries[1].1.pos.line, 2);
    }
}

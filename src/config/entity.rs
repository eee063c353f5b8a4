//! Bucket entities: the canonical, unambiguous encoding of a matched request descriptor
//! and the `entity:` templates that pick values by key.
//!
//! Request values are attacker-controlled; this module guarantees they cannot forge
//! another bucket's key (docs/architecture.md, "Buckets and items"): every component is
//! percent-encoded for the separators used here and in the store key. It must not know about stores or limits.

use std::borrow::Cow;
use std::fmt;

use compact_str::CompactString;
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

use super::{DescriptorEntry, Level, Rule};

/// Bytes encoded in every request-derived component: the separators of the default
/// entity (`/`, `=`), of templates (`:`), of the store key (`#`), the escape itself (`%`)
/// and `*`, so that a request value can never look like a `share_threshold` pattern.
/// Non-ASCII bytes are always encoded by `utf8_percent_encode`.
const COMPONENT: &AsciiSet = &CONTROLS
    .add(b'%')
    .add(b'/')
    .add(b'=')
    .add(b'#')
    .add(b':')
    .add(b'*');

/// Characters that separate two placeholders unambiguously: request values never contain
/// them unencoded.
const SEPARATORS: [char; 3] = ['/', '=', ':'];

/// Percent-encodes one key or value for use in an entity (borrowed when nothing changes).
pub fn encode_component(s: &str) -> Cow<'_, str> {
    utf8_percent_encode(s, COMPONENT).into()
}

fn push_encoded(out: &mut CompactString, s: &str) {
    out.extend(utf8_percent_encode(s, COMPONENT));
}

/// A `share_threshold` pattern: encoded, except its `*`, which marks it as a pattern.
fn push_pattern(out: &mut CompactString, pattern: &str) {
    for (i, part) in pattern.split('*').enumerate() {
        if i > 0 {
            out.push('*');
        }
        push_encoded(out, part);
    }
}

/// A shared `value_regex`: `%RE` then the expression, encoded. Percent-encoding writes
/// `%` only before two hex digits, so no request value and no wildcard pattern (whose
/// parts are encoded) can read `%R`.
fn push_regex_pattern(out: &mut CompactString, pattern: &str) {
    out.push_str("%RE");
    push_encoded(out, pattern);
}

/// The value a level contributes: the request's, or the pattern under `share_threshold`.
fn push_level_value(out: &mut CompactString, level: Option<&Level>, value: &str) {
    match level {
        Some(Level {
            value: Some(pattern),
            share_threshold: true,
            regex,
            ..
        }) => match regex {
            true => push_regex_pattern(out, pattern),
            false => push_pattern(out, pattern),
        },
        _ => push_encoded(out, value),
    }
}

/// `key=value/key=value...` over the entries (the caller truncates them to the rule's
/// depth); `levels[i]` decides whether entry `i` shares its pattern.
pub(crate) fn default_entity<E: DescriptorEntry>(levels: &[Level], entries: &[E]) -> CompactString {
    let mut out = CompactString::with_capacity(
        entries
            .iter()
            .map(|e| e.key().len() + e.value().len() + 2)
            .sum(),
    );
    for (i, e) in entries.iter().enumerate() {
        if i > 0 {
            out.push('/');
        }
        push_encoded(&mut out, e.key());
        out.push('=');
        push_level_value(&mut out, levels.get(i), e.value());
    }
    out
}

pub(crate) fn entity_for<E: DescriptorEntry>(rule: &Rule, entries: &[E]) -> CompactString {
    let entries = entries.get(..rule.depth()).unwrap_or(entries);
    match &rule.entity {
        Some(template) => template.render(&rule.levels, entries),
        None => default_entity(&rule.levels, entries),
    }
}

/// Why an `entity:` template does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("the template is empty")]
    Empty,
    #[error("'{{' is not closed (write '{{{{' for a literal '{{')")]
    Unterminated,
    #[error("'}}' without '{{' (write '}}}}' for a literal '}}')")]
    UnmatchedClose,
    #[error("empty placeholder '{{}}'")]
    EmptyPlaceholder,
    #[error("'{{' inside a placeholder")]
    NestedOpen,
    #[error("'{{{first}}}' and '{{{second}}}' must be separated by text containing '/', '=' or ':', or different values could render the same entity")]
    Adjacent { first: String, second: String },
    #[error(
        "character {0:?} is not allowed in template text ('#' separates the parts of a bucket key)"
    )]
    ForbiddenChar(char),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Key(String),
}

/// A parsed `entity:` template such as `tenant:{tenant}/{model}`: literal text and
/// `{key}` placeholders (`{{` and `}}` stand for literal braces).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityTemplate {
    text: String,
    parts: Vec<Part>,
}

impl EntityTemplate {
    pub fn parse(text: &str) -> Result<EntityTemplate, TemplateError> {
        if text.is_empty() {
            return Err(TemplateError::Empty);
        }
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut chars = text.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    literal.push('}');
                }
                '}' => return Err(TemplateError::UnmatchedClose),
                '{' => {
                    let mut key = String::new();
                    loop {
                        match chars.next() {
                            None => return Err(TemplateError::Unterminated),
                            Some('{') => return Err(TemplateError::NestedOpen),
                            Some('}') => break,
                            Some(k) => key.push(k),
                        }
                    }
                    if key.is_empty() {
                        return Err(TemplateError::EmptyPlaceholder);
                    }
                    if let Some(Part::Key(prev)) = parts.last() {
                        if !literal.contains(SEPARATORS) {
                            return Err(TemplateError::Adjacent {
                                first: prev.clone(),
                                second: key,
                            });
                        }
                    }
                    if !literal.is_empty() {
                        parts.push(Part::Literal(std::mem::take(&mut literal)));
                    }
                    parts.push(Part::Key(key));
                }
                '#' => return Err(TemplateError::ForbiddenChar(c)),
                c if c.is_control() => return Err(TemplateError::ForbiddenChar(c)),
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(EntityTemplate {
            text: text.to_string(),
            parts,
        })
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The keys of the placeholders, in template order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.parts.iter().filter_map(|p| match p {
            Part::Key(k) => Some(k.as_str()),
            Part::Literal(_) => None,
        })
    }

    /// Renders the template for the first `levels.len()` entries: each placeholder becomes
    /// the encoded value of the first entry with that key (the level's pattern when that
    /// level has `share_threshold`); a key absent from those entries renders as nothing.
    pub fn render<E: DescriptorEntry>(&self, levels: &[Level], entries: &[E]) -> CompactString {
        let entries = entries.get(..levels.len()).unwrap_or(entries);
        // No pre-sizing: a capacity above 24 bytes would force a heap buffer even for the
        // short entities that fit inline.
        let mut out = CompactString::default();
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::Key(k) => {
                    if let Some((i, e)) = entries.iter().enumerate().find(|(_, e)| e.key() == k) {
                        push_level_value(&mut out, levels.get(i), e.value());
                    }
                }
            }
        }
        out
    }
}

impl fmt::Display for EntityTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(key: &str, value: Option<&str>, share: bool) -> Level {
        Level {
            key: key.into(),
            value: value.map(str::to_string),
            regex: false,
            share_threshold: share,
            value_to_metric: false,
        }
    }

    #[test]
    fn encodes_separators_and_non_ascii() {
        assert_eq!(encode_component("plain-text_1.2 ok"), "plain-text_1.2 ok");
        assert!(matches!(encode_component("plain"), Cow::Borrowed(_)));
        assert_eq!(
            encode_component("a/b=c#d%e:f*g"),
            "a%2Fb%3Dc%23d%25e%3Af%2Ag"
        );
        assert_eq!(encode_component("\n\u{7f}é"), "%0A%7F%C3%A9");
    }

    #[test]
    fn default_entity_joins_levels() {
        let levels = [level("tenant", None, false), level("user", None, false)];
        let e = default_entity(&levels, &[("tenant", "acme"), ("user", "b/o=b")]);
        assert_eq!(e, "tenant=acme/user=b%2Fo%3Db");
    }

    #[test]
    fn share_threshold_uses_the_pattern() {
        let levels = [level("path", Some("/api/*"), true)];
        assert_eq!(
            default_entity(&levels, &[("path", "/api/x")]),
            "path=%2Fapi%2F*"
        );
        // A request value that spells the pattern is still a value, not the pattern.
        assert_eq!(
            default_entity(&[level("path", None, false)], &[("path", "/api/*")]),
            "path=%2Fapi%2F%2A"
        );
    }

    #[test]
    fn template_parses_and_renders() {
        let t = EntityTemplate::parse("t:{tenant}/{model}{{x}}").unwrap();
        assert_eq!(t.keys().collect::<Vec<_>>(), ["tenant", "model"]);
        let levels = [
            level("tenant", None, false),
            level("model", None, false),
            level("kind", Some("tokens"), false),
        ];
        let entries = [("tenant", "ac/me"), ("model", "gpt"), ("kind", "tokens")];
        assert_eq!(t.render(&levels, &entries), "t:ac%2Fme/gpt{x}");
    }

    #[test]
    fn template_uses_first_entry_and_depth() {
        let t = EntityTemplate::parse("{k}").unwrap();
        let levels = [level("k", None, false), level("k", None, false)];
        assert_eq!(t.render(&levels, &[("k", "1"), ("k", "2")]), "1");
        assert_eq!(t.render(&levels[..0], &[("k", "1")]), "");
    }

    #[test]
    fn template_with_share_threshold() {
        let t = EntityTemplate::parse("p:{path}").unwrap();
        let levels = [level("path", Some("a*"), true)];
        assert_eq!(t.render(&levels, &[("path", "abc")]), "p:a*");
    }

    #[test]
    fn template_errors() {
        use TemplateError::*;
        assert_eq!(EntityTemplate::parse(""), Err(Empty));
        assert_eq!(EntityTemplate::parse("a{b"), Err(Unterminated));
        assert_eq!(EntityTemplate::parse("a}b"), Err(UnmatchedClose));
        assert_eq!(EntityTemplate::parse("a{}"), Err(EmptyPlaceholder));
        assert_eq!(EntityTemplate::parse("{a{b}}"), Err(NestedOpen));
        assert_eq!(EntityTemplate::parse("a#{b}"), Err(ForbiddenChar('#')));
        assert!(matches!(
            EntityTemplate::parse("{a}{b}"),
            Err(Adjacent { .. })
        ));
        assert!(matches!(
            EntityTemplate::parse("{a}-{b}"),
            Err(Adjacent { .. })
        ));
        assert!(EntityTemplate::parse("{a}-/{b}").is_ok());
        assert!(EntityTemplate::parse("global").is_ok());
    }
}

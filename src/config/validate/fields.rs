//! Reading one mapping's known keys and its scalar values (strings, booleans, bounded
//! integers), each problem reported at its position. The rules that give the values
//! meaning are `mod.rs`'s.

use super::super::error::ConfigErrorKind as K;
use super::super::model::{Node, NodeKind, Pos};
use super::validator::Validator;

/// A known key of a mapping: where the key is written, and its value.
pub(super) struct Field<'n> {
    pub(super) name: &'static str,
    pub(super) pos: Pos,
    pub(super) value: &'n Node,
}

pub(super) struct Fields<'n>(Vec<Field<'n>>);

impl<'n> Fields<'n> {
    pub(super) fn get(&self, name: &str) -> Option<&Field<'n>> {
        self.0.iter().find(|f| f.name == name)
    }
}

impl Validator<'_> {
    /// The known keys of a mapping; unknown and non-string keys are reported.
    pub(super) fn fields<'n>(
        &mut self,
        node: &'n Node,
        what: &'static str,
        context: &'static str,
        known: &[&'static str],
    ) -> Option<Fields<'n>> {
        let NodeKind::Map(entries) = &node.kind else {
            self.error(
                node.pos,
                K::NotAMapping {
                    what,
                    found: node.kind.describe(),
                },
            );
            return None;
        };
        let mut fields = Vec::with_capacity(entries.len());
        for (k, value) in entries {
            let NodeKind::Str(key) = &k.kind else {
                self.error(
                    k.pos,
                    K::NonStringKey {
                        context,
                        found: k.kind.describe(),
                    },
                );
                continue;
            };
            match known.iter().find(|n| **n == key) {
                Some(name) => fields.push(Field {
                    name,
                    pos: k.pos,
                    value,
                }),
                None => self.error(
                    k.pos,
                    K::UnknownKey {
                        key: key.clone(),
                        context,
                    },
                ),
            }
        }
        Some(Fields(fields))
    }

    /// A string field; other scalars read as their source text, as envoyproxy's YAML
    /// library does. `None` for null (treated as absent) and on error.
    pub(super) fn text(&mut self, f: &Field) -> Option<String> {
        match &f.value.kind {
            NodeKind::Null => None,
            kind => match kind.scalar_text() {
                Some(s) => Some(s.to_string()),
                None => {
                    self.wrong_type(f, "a string");
                    None
                }
            },
        }
    }

    /// A string field that must be present and non-empty.
    pub(super) fn required_text(&mut self, f: &Field) -> Option<String> {
        match self.text(f) {
            Some(s) if !s.is_empty() => Some(s),
            Some(_) => {
                self.error(f.value.pos, K::Empty { key: f.name });
                None
            }
            None => {
                if f.value.kind == NodeKind::Null {
                    self.error(f.value.pos, K::Empty { key: f.name });
                }
                None
            }
        }
    }

    pub(super) fn boolean(&mut self, f: Option<&Field>) -> bool {
        let Some(f) = f else { return false };
        match f.value.kind {
            NodeKind::Bool(b, _) => b,
            NodeKind::Null => false,
            _ => {
                self.wrong_type(f, "true or false");
                false
            }
        }
    }

    pub(super) fn integer(&mut self, f: &Field, min: u64, max: u64) -> Option<u64> {
        let out_of_range = |found: &str| K::OutOfRange {
            key: f.name,
            found: found.to_string(),
            min,
            max,
        };
        match &f.value.kind {
            NodeKind::Null => None,
            NodeKind::Int(i, raw) => match u64::try_from(*i) {
                Ok(n) if (min..=max).contains(&n) => Some(n),
                _ => {
                    self.error(f.value.pos, out_of_range(raw));
                    None
                }
            },
            // The parser turns integers too large for 64 bits into floats.
            NodeKind::Float(_, raw) if is_integer_text(raw) => {
                self.error(f.value.pos, out_of_range(raw));
                None
            }
            _ => {
                self.wrong_type(f, "an integer");
                None
            }
        }
    }

    pub(super) fn wrong_type(&mut self, f: &Field, expected: &'static str) {
        self.error(
            f.value.pos,
            K::WrongType {
                key: f.name,
                expected,
                found: f.value.kind.describe(),
            },
        );
    }
}

fn is_integer_text(raw: &str) -> bool {
    let digits = raw.strip_prefix(['-', '+']).unwrap_or(raw);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

pub(super) fn to_json(node: &Node) -> serde_json::Value {
    use serde_json::Value;
    match &node.kind {
        NodeKind::Null => Value::Null,
        NodeKind::Bool(b, _) => Value::Bool(*b),
        NodeKind::Int(i, raw) => i64::try_from(*i)
            .map(Value::from)
            .or_else(|_| u64::try_from(*i).map(Value::from))
            .unwrap_or_else(|_| Value::String(raw.clone())),
        NodeKind::Float(f, raw) => serde_json::Number::from_f64(*f)
            .map_or_else(|| Value::String(raw.clone()), Value::Number),
        NodeKind::Str(s) => Value::String(s.clone()),
        NodeKind::Seq(items) => Value::Array(items.iter().map(to_json).collect()),
        NodeKind::Map(entries) => Value::Object(
            entries
                .iter()
                .map(|(k, v)| {
                    let key = k.kind.scalar_text().unwrap_or_default().to_string();
                    (key, to_json(v))
                })
                .collect(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_text() {
        assert!(is_integer_text("99999999999999999999"));
        assert!(is_integer_text("-1"));
        assert!(!is_integer_text("1.0"));
        assert!(!is_integer_text("1e3"));
    }
}

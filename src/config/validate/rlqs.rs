//! The `rlqs:` section of a document (config/rlqs.rs says what it means): a mapping whose
//! one key, `keys`, lists the bucket id keys that make a descriptor, each a non-empty
//! string named once, at most [`MAX_RLQS_KEYS`].

use super::super::error::ConfigErrorKind as K;
use super::super::model::NodeKind;
use super::super::rlqs::MAX_RLQS_KEYS;
use super::fields::Field;
use super::validator::Validator;

const RLQS_KEYS: &[&str] = &["keys"];

impl Validator<'_> {
    /// The section's keys; `None` when it is absent (null) or wrong (reported).
    pub(super) fn rlqs(&mut self, f: &Field) -> Option<Vec<String>> {
        if f.value.kind == NodeKind::Null {
            return None;
        }
        let fields = self.fields(f.value, "'rlqs'", "rlqs", RLQS_KEYS)?;
        let Some(keys) = fields.get("keys") else {
            self.error(
                f.value.pos,
                K::MissingKey {
                    key: "keys",
                    context: "rlqs",
                },
            );
            return None;
        };
        let items = match &keys.value.kind {
            NodeKind::Seq(items) if !items.is_empty() => items,
            NodeKind::Seq(_) | NodeKind::Null => {
                self.error(keys.value.pos, K::Empty { key: "keys" });
                return None;
            }
            _ => {
                self.wrong_type(keys, "a list of bucket id keys");
                return None;
            }
        };
        if items.len() > MAX_RLQS_KEYS {
            let kind = K::RlqsTooManyKeys {
                count: items.len(),
                max: MAX_RLQS_KEYS,
            };
            self.error(keys.value.pos, kind);
            return None;
        }
        let mut out: Vec<String> = Vec::with_capacity(items.len());
        let mut fine = true;
        for item in items {
            let entry = Field {
                name: "keys",
                pos: item.pos,
                value: item,
            };
            match self.required_text(&entry) {
                Some(k) if out.contains(&k) => {
                    self.error(item.pos, K::RlqsKeyTwice(k));
                    fine = false;
                }
                Some(k) => out.push(k),
                None => fine = false,
            }
        }
        fine.then_some(out)
    }
}

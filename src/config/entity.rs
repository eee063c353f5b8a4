//! placeholder until the config module lands
use super::{DescriptorEntry, Rule};
use std::borrow::Cow;
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntityTemplate(pub String);
pub fn encode_component(s: &str) -> Cow<'_, str> { Cow::Borrowed(s) }
pub fn entity_for<E: DescriptorEntry>(rule: &Rule, entries: &[E]) -> String {
    rule.levels.iter().zip(entries).map(|(_, e)| format!("{}={}", e.key(), e.value())).collect::<Vec<_>>().join("/")
}

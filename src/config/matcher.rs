//! placeholder until the config module lands
use super::Rule;
use std::sync::Arc;
pub trait DescriptorEntry { fn key(&self) -> &str; fn value(&self) -> &str; }
impl DescriptorEntry for (&str, &str) { fn key(&self) -> &str { self.0 } fn value(&self) -> &str { self.1 } }
#[derive(Debug, Default)]
pub struct Tree { rules: Vec<Arc<Rule>> }
impl Tree {
    pub fn lookup<E: DescriptorEntry>(&self, _e: &[E]) -> Option<&Arc<Rule>> { None }
    pub fn rules(&self) -> impl Iterator<Item = &Arc<Rule>> { self.rules.iter() }
}

//! placeholder until the config module lands
use super::Config;
use std::path::Path;
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);
#[derive(Debug, thiserror::Error)]
#[error("config errors")]
pub struct ConfigErrors(pub Vec<ConfigError>);
pub fn load_path(_p: &Path) -> Result<Config, ConfigErrors> { Err(ConfigErrors(vec![])) }
pub fn from_documents(_d: &[(String, String)]) -> Result<Config, ConfigErrors> { Err(ConfigErrors(vec![])) }

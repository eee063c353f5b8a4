//! Where the rules are read from, one argument for every command that reads them
//! (`serve`, `check-config`, `explain`): `--config` (or `SHARDGATE_CONFIG`, which
//! envoyproxy/ratelimit's `RUNTIME_ROOT`/`RUNTIME_SUBDIRECTORY` set), else the default
//! directory the image ships its example in. The default lives here, in the code, not in
//! the image's environment: an image variable would shadow upstream's (issue 48).

use std::path::{Path, PathBuf};

use clap::Args;

/// The rules read when nothing names any: the directory the image copies its example
/// into, and where a ConfigMap is mounted to replace it.
pub(crate) const DEFAULT_RULES: &str = "/etc/shardgate/limits";

/// `--config`.
#[derive(Args)]
pub(crate) struct RulesArg {
    /// Rate-limit rules: a YAML file or a directory of YAML files [default:
    /// /etc/shardgate/limits; envoyproxy/ratelimit's RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config
    /// when those are set].
    #[arg(long, env = "SHARDGATE_CONFIG", value_name = "PATH")]
    pub(crate) config: Option<PathBuf>,
}

impl RulesArg {
    /// The path to read: the one given, else [`DEFAULT_RULES`] if it exists; an error
    /// saying how to name one otherwise.
    pub(crate) fn path(&self) -> Result<PathBuf, String> {
        resolve(self.config.as_deref(), Path::new(DEFAULT_RULES))
    }
}

/// `given`, else `default` if it exists.
pub(crate) fn resolve(given: Option<&Path>, default: &Path) -> Result<PathBuf, String> {
    match given {
        Some(path) => Ok(path.to_path_buf()),
        None if default.exists() => Ok(default.to_path_buf()),
        None => Err(format!(
            "no rules given: --config PATH (or SHARDGATE_CONFIG, or envoyproxy/ratelimit's \
             RUNTIME_ROOT and RUNTIME_SUBDIRECTORY); the default {} does not exist",
            default.display()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_given_path_else_the_default_if_it_exists() {
        let dir = tempfile::tempdir().unwrap();
        let given = Path::new("/given.yaml");
        assert_eq!(resolve(Some(given), dir.path()).unwrap(), given);
        assert_eq!(resolve(None, dir.path()).unwrap(), dir.path());
        let missing = dir.path().join("missing");
        let e = resolve(None, &missing).unwrap_err();
        assert!(
            e.contains("--config") && e.contains("RUNTIME_ROOT") && e.contains("missing"),
            "{e}"
        );
    }
}

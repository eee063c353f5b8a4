//! When the rules in force were loaded, and the last load refused with its error: what
//! the page shows beside the rules. Owns that record only; loading is `config/reload.rs`'s
//! and the xDS client's.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::support::text::elide;

/// The longest error kept (bytes): a rejected file's errors can be many.
const ERROR_BYTES: usize = 4096;

/// The config's history, as the page shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigEvents {
    /// Unix seconds of the load of the rules in force.
    pub loaded_at: f64,
    /// Where they came from: the config path, or the xDS server and the version it
    /// pushed (`None` until said).
    pub source: Option<String>,
    /// Loads since start, the first included.
    pub loads: u64,
    /// The last load refused (the previous rules stayed in force), if any.
    pub rejected: Option<Rejected>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Rejected {
    /// Unix seconds.
    pub at: f64,
    /// What was refused: the config path, or the xDS push's version.
    pub source: String,
    pub error: String,
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl ConfigEvents {
    pub(super) fn new() -> ConfigEvents {
        ConfigEvents {
            loaded_at: unix_now(),
            source: None,
            loads: 1,
            rejected: None,
        }
    }

    /// Names where the rules in force came from (the first load's source, said once the
    /// server knows it).
    pub(super) fn came_from(&mut self, source: &str) {
        self.source = Some(source.to_string());
    }

    pub(super) fn loaded(&mut self, source: &str) {
        self.loaded_at = unix_now();
        self.loads += 1;
        self.came_from(source);
    }

    pub(super) fn rejected(&mut self, source: &str, error: &str) {
        self.rejected = Some(Rejected {
            at: unix_now(),
            source: source.to_string(),
            error: elide(error, ERROR_BYTES).into_owned(),
        });
    }
}

//! Hot reload: watch the config path and load a new snapshot when it changes, off the
//! request path.
//!
//! The watch covers in-place writes, atomic renames (`mv tmp limits.yaml`), new and
//! deleted files, and Kubernetes ConfigMap updates (the `..data` symlink swap): a file is
//! watched through its directory, a directory directly. Events are debounced; a slow
//! poll backs the watch up (events can be lost, e.g. when a mount is replaced). A snapshot
//! whose content hash equals the one in force is not reported again, nor is a failure
//! identical to the last one; but content back to good after a failure is (logged "config
//! OK again" and reported as a load), so that the failure's alert and log have an end.
//! What to do with a result is the caller's business.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use super::{load, Config, ConfigError, ConfigErrorKind, ConfigErrors, LoadOptions};

/// How changes are picked up.
#[derive(Debug, Clone, Copy)]
pub struct ReloadTiming {
    /// Quiet time after the last file event before loading.
    pub debounce: Duration,
    /// Re-check even without events this often.
    pub poll: Duration,
}

impl Default for ReloadTiming {
    fn default() -> Self {
        ReloadTiming {
            debounce: Duration::from_millis(100),
            poll: Duration::from_secs(2),
        }
    }
}

/// The most debounce intervals a burst of events may extend the wait before a load (a
/// second, at the default 100 ms).
const MAX_SETTLE: usize = 10;

/// Keeps the watch alive; dropping it stops watching.
pub struct ConfigWatch {
    _watcher: notify::RecommendedWatcher,
    task: tokio::task::JoinHandle<()>,
}

impl ConfigWatch {
    /// Whether the watch's task has ended (it runs until dropped; an end is a failure the
    /// server's supervision reports).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl Drop for ConfigWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The directory to watch for `path`.
fn watch_target(path: &Path) -> PathBuf {
    if path.is_dir() {
        path.to_path_buf()
    } else {
        match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        }
    }
}

/// The config at `path` if its content hash is not `seen` (or `recovering` from a
/// failure), loaded on a blocking thread (off the runtime's workers): `Ok(None)` when
/// unchanged. Read and hashed first: the poll finds the same content almost every time,
/// and only changed content is worth parsing. A panic while loading is that load's
/// refusal (logged and counted by the caller as a rejected config), the rules in force
/// kept and the watch going on.
async fn load_if_changed(
    path: &Path,
    options: &LoadOptions,
    seen: &str,
    recovering: bool,
) -> Result<Option<Config>, ConfigErrors> {
    let (p, options, seen) = (path.to_path_buf(), options.clone(), seen.to_string());
    tokio::task::spawn_blocking(move || {
        let docs = load::read_documents(&p)?;
        if load::content_hash(&docs) == seen && !recovering {
            return Ok(None);
        }
        load::from_documents(&docs, &options).map(Some)
    })
    .await
    .unwrap_or_else(|e| {
        Err(ConfigErrors::from_vec(vec![ConfigError {
            file: Arc::from(path.display().to_string()),
            line: 0,
            column: 0,
            kind: ConfigErrorKind::Panicked(e.to_string()),
        }]))
    })
}

/// Watches `path`; `current_hash` is the hash of the config already in force. Calls
/// `on_change` with each new valid config and each new failure. Must run inside a tokio
/// runtime.
pub fn watch(
    path: PathBuf,
    options: LoadOptions,
    current_hash: String,
    timing: ReloadTiming,
    on_change: impl Fn(Result<Arc<Config>, ConfigErrors>) + Send + Sync + 'static,
) -> notify::Result<ConfigWatch> {
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Reads change nothing: a file of the watched directory read often (a log file
        // beside the rules, read by a tail) would otherwise keep the debounce below from
        // ever settling, and the reload would wait forever.
        if event.is_ok_and(|e| !e.kind.is_access()) {
            // A full channel already holds a wake-up; dropping this one loses nothing.
            let _ = tx.try_send(());
        }
    })?;
    let target = watch_target(&path);
    watcher.watch(&target, RecursiveMode::NonRecursive)?;
    // A config file that is a symlink into another directory: watch where it points too
    // (in-place edits of the target happen there). Later re-pointing is caught by the poll.
    if let Ok(resolved) = std::fs::canonicalize(&path) {
        let resolved_dir = watch_target(&resolved);
        if resolved.is_file() && std::fs::canonicalize(&target).ok().as_ref() != Some(&resolved_dir)
        {
            watcher.watch(&resolved_dir, RecursiveMode::NonRecursive)?;
        }
    }
    let task = tokio::spawn(async move {
        let mut last_hash = current_hash;
        let mut last_error: Option<String> = None;
        loop {
            tokio::select! {
                got = rx.recv() => if got.is_none() { return },
                _ = tokio::time::sleep(timing.poll) => {}
            }
            // Let a burst of events (write, rename, symlink swap) settle, for at most
            // MAX_SETTLE debounces: a directory that never goes quiet still reloads.
            for _ in 0..MAX_SETTLE {
                match tokio::time::timeout(timing.debounce, rx.recv()).await {
                    Ok(Some(())) => {}
                    _ => break,
                }
            }
            // After a failure, good content is reported even if it is the content in
            // force (a bad edit reverted): the failure is over.
            let recovering = last_error.is_some();
            let loaded = load_if_changed(&path, &options, &last_hash, recovering).await;
            match loaded {
                Ok(None) => last_error = None,
                Ok(Some(config)) => {
                    if recovering {
                        tracing::info!(
                            path = %path.display(),
                            hash = config.hash(),
                            "config OK again: the rules load without errors"
                        );
                    }
                    last_error = None;
                    last_hash = config.hash().to_string();
                    on_change(Ok(Arc::new(config)));
                }
                Err(errors) => {
                    let text = errors.to_string();
                    if last_error.as_deref() != Some(text.as_str()) {
                        last_error = Some(text);
                        on_change(Err(errors));
                    }
                }
            }
        }
    });
    Ok(ConfigWatch {
        _watcher: watcher,
        task,
    })
}

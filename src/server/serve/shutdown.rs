//! The stop of a server after a shutdown signal: the tasks beside the ports aborted,
//! the calls in flight drained within the grace period, upstream's Prometheus port
//! closed, statsd's last flush, the leases given back, each waited for at most its
//! patience. Stopping only: what runs is `serving.rs`'s and `tasks.rs`'s.

use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::ServeError;
use crate::config::reload::ConfigWatch;

/// How long the shutdown waits for the last statsd flush.
const STATSD_LAST_FLUSH_PATIENCE: Duration = Duration::from_secs(3);

/// How long the shutdown waits for the leases to go back after the calls finished.
const LEASE_RETURN_PATIENCE: Duration = Duration::from_secs(5);

/// A serving server's handles, in the order they are stopped.
pub(super) struct Running {
    /// Kept until the stop is done: dropping it stops watching the rule directory.
    pub(super) _config_watch: Option<ConfigWatch>,
    pub(super) rules_task: Option<JoinHandle<()>>,
    pub(super) health_task: JoinHandle<()>,
    pub(super) prune_task: JoinHandle<()>,
    /// Tells the ports to stop accepting.
    pub(super) stop_tx: watch::Sender<bool>,
    pub(super) grpc_task: JoinHandle<()>,
    pub(super) http_task: JoinHandle<Result<(), std::io::Error>>,
    /// How long the calls in flight may take to finish.
    pub(super) grace: Duration,
    pub(super) upstream_prometheus_task: Option<JoinHandle<()>>,
    /// Asks statsd for its last flush.
    pub(super) statsd_stop_tx: oneshot::Sender<()>,
    pub(super) statsd_task: Option<JoinHandle<()>>,
    /// Asks the lease task to give back what it holds.
    pub(super) lease_stop_tx: oneshot::Sender<()>,
    pub(super) lease_task: JoinHandle<()>,
}

impl Running {
    /// Stops everything in order; the ports' failure, if one failed.
    pub(super) async fn stop(self) -> Result<(), ServeError> {
        if let Some(task) = self.rules_task {
            task.abort();
        }
        self.health_task.abort();
        self.prune_task.abort();
        let _ = self.stop_tx.send(true);
        let drained = drain(self.grpc_task, self.http_task, self.grace).await;
        if let Some(task) = self.upstream_prometheus_task {
            task.abort();
        }
        let _ = self.statsd_stop_tx.send(());
        if let Some(task) = self.statsd_task {
            let _ = tokio::time::timeout(STATSD_LAST_FLUSH_PATIENCE, task).await;
        }
        let _ = self.lease_stop_tx.send(());
        if tokio::time::timeout(LEASE_RETURN_PATIENCE, self.lease_task)
            .await
            .is_err()
        {
            tracing::warn!(patience = ?LEASE_RETURN_PATIENCE, "leases not all given back before exit");
        }
        drained
    }
}

/// Waits for both ports to finish their calls, at most `grace`.
async fn drain(
    grpc_task: tokio::task::JoinHandle<()>,
    http_task: tokio::task::JoinHandle<Result<(), std::io::Error>>,
    grace: Duration,
) -> Result<(), ServeError> {
    let drained = tokio::time::timeout(grace, async { (grpc_task.await, http_task.await) }).await;
    match drained {
        Ok((grpc, http)) => {
            if let Err(e) = grpc {
                tracing::warn!(error = %e, "the gRPC port's task failed");
            }
            if let Ok(Err(e)) = http {
                return Err(ServeError::Http(e));
            }
            tracing::info!("every call in flight finished");
        }
        Err(_) => tracing::warn!(
            ?grace,
            "calls still in flight at the end of the grace period"
        ),
    }
    Ok(())
}

/// Resolves on SIGINT or SIGTERM.
pub(super) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    tracing::info!("shutdown signal received: no new connections, finishing calls in flight");
}

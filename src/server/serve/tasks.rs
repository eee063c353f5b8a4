//! The tasks a server runs beside its ports: the rules kept in force (the watched
//! directory or the xDS stream), readiness and the store's health, the rejection cache's
//! pruning, the leases, and upstream's Prometheus port. Each is spawned here and stopped
//! by `shutdown.rs`. And their supervision ([`supervise`]): a port or rule task that ends
//! before the shutdown (a panic, an accept loop that gave up) makes the server say so and
//! stop being ready at once, then stop — never up and ready with a dead listener.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use super::stores::WarmUp;
use super::{ServeError, ServeOptions};
use crate::config::reload::{self, ReloadTiming};
use crate::config::LoadOptions;
use crate::engine::Engine;
use crate::server::grpc::HealthWatch;
use crate::server::xds::{self, XdsOptions};
use crate::server::{statsd, upstream_prometheus};
use crate::service::metrics::statsd_mapping::StatsdMapping;
use crate::service::metrics::Metrics;
use crate::service::RateLimiter;
use crate::store::BucketStore;

/// How often the `store` health service re-checks that the store answers.
const STORE_HEALTH_INTERVAL: Duration = Duration::from_secs(5);
/// How often the supervised tasks are looked at: a dead one is reported well within a
/// second (a readiness probe's period is seconds).
const SUPERVISION_POLL: Duration = Duration::from_millis(100);

/// How often the rejection cache drops images no request can use any more (entries live
/// at most two cache lifetimes past their last use, plus this).
const REJECTION_PRUNE_INTERVAL: Duration = Duration::from_secs(1);

/// envoyproxy/ratelimit's Prometheus port, bound, with its mapping read.
pub(super) struct UpstreamPort {
    pub(super) listener: TcpListener,
    pub(super) mapping: Arc<StatsdMapping>,
    pub(super) path: String,
}

/// Serves envoyproxy/ratelimit's Prometheus port until `stopped` resolves (a failure is
/// logged: the rate-limit ports go on).
pub(super) fn spawn_upstream_prometheus(
    port: UpstreamPort,
    metrics: &Arc<Metrics>,
    stopped: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    let addr = port.listener.local_addr().ok();
    tracing::info!(addr = ?addr, path = %port.path, "envoyproxy/ratelimit's Prometheus port");
    let metrics = metrics.clone();
    tokio::spawn(async move {
        let served =
            upstream_prometheus::serve(metrics, port.mapping, port.path, port.listener, stopped)
                .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "envoyproxy/ratelimit's Prometheus port failed");
        }
    })
}

/// Sends the stats to statsd when asked; the sender asks for a last flush, once the
/// calls have finished.
pub(super) fn spawn_statsd(
    options: &ServeOptions,
    metrics: &Arc<Metrics>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    Option<tokio::task::JoinHandle<()>>,
) {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = options
        .statsd
        .clone()
        .map(|statsd| tokio::spawn(statsd::run(metrics.clone(), statsd, stop_rx)));
    (stop_tx, task)
}

/// Watches the config for changes: each good load is put in force and counted, each bad
/// one counted and logged while the previous config stays.
pub(super) fn watch_config<S: BucketStore>(
    limiter: &Arc<RateLimiter<S>>,
    options: &ServeOptions,
    hash: &str,
) -> Result<reload::ConfigWatch, ServeError> {
    let limiter = limiter.clone();
    let path = options.config.display().to_string();
    reload::watch(
        options.config.clone(),
        options.load.clone(),
        hash.to_string(),
        ReloadTiming::default(),
        move |result| match result {
            Ok(config) => {
                tracing::info!(
                    path = %path,
                    domains = config.domains().count(),
                    hash = config.hash(),
                    "config reloaded"
                );
                limiter.metrics().config_loaded(config.hash());
                limiter.replace_config(config, &path);
            }
            Err(errors) => {
                limiter.config_rejected(&path, &errors.to_string());
                tracing::error!(
                    path = %path,
                    errors = %errors,
                    "config reload rejected; the previous config stays in force"
                );
            }
        },
    )
    .map_err(|source| ServeError::Watch {
        path: options.config.display().to_string(),
        source,
    })
}

/// Subscribes to the rules an xDS control plane pushes: each push applied as a reload is
/// (the metrics and `/rlconfig` follow), or refused with the rules in force kept. Returns
/// the task and a future that resolves once a first push has been applied.
pub(super) fn spawn_xds<S: BucketStore>(
    limiter: &Arc<RateLimiter<S>>,
    options: XdsOptions,
    load: LoadOptions,
) -> (tokio::task::JoinHandle<()>, WarmUp) {
    let (first_tx, mut first_rx) = watch::channel(false);
    let limiter = limiter.clone();
    let server = options.server.clone();
    let on_push = move |version: &str, push: xds::Push| {
        let source = format!("xDS {server}, version {version:?}");
        match push {
            Ok(config) => {
                limiter.metrics().config_loaded(config.hash());
                limiter.replace_config(Arc::new(config), &source);
                first_tx.send_replace(true);
            }
            Err(e) => limiter.config_rejected(&source, &e),
        }
    };
    let task = tokio::spawn(xds::subscribe(options, load, on_push));
    let first: WarmUp = Box::pin(async move {
        let _ = first_rx.wait_for(|landed| *landed).await;
    });
    (task, first)
}

/// Readiness (gRPC health of the server and the rate-limit service, `/healthcheck`):
/// NOT_SERVING until the store has answered a first call (`warm_up`), then SERVING for
/// good: a store outage is answered by each rule's failure_mode. The `store` health
/// service follows the store itself, checked every [`STORE_HEALTH_INTERVAL`].
pub(super) fn spawn_health<S: BucketStore>(
    limiter: &Arc<RateLimiter<S>>,
    warm_up: Option<WarmUp>,
) -> (HealthWatch, tokio::task::JoinHandle<()>, Readiness) {
    let (ready_tx, ready_rx) = watch::channel(warm_up.is_none());
    let ready_tx = Arc::new(ready_tx);
    let (store_tx, store_rx) = watch::channel(warm_up.is_none());
    let readiness = Readiness {
        grpc: ready_tx.clone(),
    };
    let limiter = limiter.clone();
    let task = tokio::spawn(async move {
        if let Some(warm_up) = warm_up {
            warm_up.await;
            limiter.set_ready(true);
            ready_tx.send_replace(true);
            store_tx.send_replace(true);
        }
        let mut tick = tokio::time::interval(STORE_HEALTH_INTERVAL);
        tick.tick().await;
        loop {
            tick.tick().await;
            let ok = limiter.check_store().await;
            if let Err(e) = &ok {
                tracing::warn!(error = %e, "store health check failed");
            }
            store_tx.send_if_modified(|h| std::mem::replace(h, ok.is_ok()) != ok.is_ok());
        }
    });
    let watch = HealthWatch {
        ready: ready_rx,
        store: store_rx,
    };
    (watch, task, readiness)
}

/// The gRPC health services' readiness, as the supervision withdraws it (`/healthcheck`
/// follows the limiter's own flag).
pub(super) struct Readiness {
    grpc: Arc<watch::Sender<bool>>,
}

/// A task the server needs until its shutdown: the name the log gives it, and whether it
/// has ended (`JoinHandle::is_finished`: looked at, never awaited, so the stop can still
/// await it).
pub(super) struct Supervised<'a> {
    pub(super) name: &'static str,
    pub(super) ended: &'a (dyn Fn() -> bool + Sync),
}

/// Resolves with the name of the first of `tasks` that ends, after making the server
/// not ready on every surface (`/healthcheck`, gRPC health) and saying so: a port that
/// stopped accepting, or rules no longer kept in force, are not a server to send calls
/// to. `health` (the task that would set readiness once warmed up) is stopped first so
/// that it cannot set it back. The caller stops the server; the process exits with an
/// error, as an orchestrator expects of a server that lost a part.
pub(super) async fn supervise<S: BucketStore>(
    limiter: &RateLimiter<S>,
    readiness: &Readiness,
    health: &tokio::task::JoinHandle<()>,
    tasks: &[Supervised<'_>],
) -> &'static str {
    let mut tick = tokio::time::interval(SUPERVISION_POLL);
    loop {
        tick.tick().await;
        if let Some(task) = tasks.iter().find(|t| (t.ended)()) {
            health.abort();
            limiter.set_ready(false);
            readiness.grpc.send_replace(false);
            tracing::error!(
                task = task.name,
                "a task the server needs ended unexpectedly: not ready, stopping"
            );
            return task.name;
        }
    }
}

/// Drops the rejection cache's dead entries every [`REJECTION_PRUNE_INTERVAL`].
pub(super) fn spawn_prune<S: BucketStore>(engine: Arc<Engine<S>>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(REJECTION_PRUNE_INTERVAL);
        loop {
            tick.tick().await;
            engine.prune_rejections();
        }
    })
}

/// Leases are fetched and given back in a task of their own; at shutdown (the sender
/// sends, once the calls have finished) it gives back everything it holds.
pub(super) fn spawn_leases<S: BucketStore>(
    engine: Arc<Engine<S>>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        engine
            .run_leases(async move {
                let _ = stop_rx.await;
            })
            .await;
    });
    (stop_tx, task)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::store::memory::MemoryStore;

    fn limiter() -> Arc<RateLimiter<MemoryStore>> {
        let config = Config::from_documents(&[]).expect("no documents, no errors");
        let engine = Arc::new(Engine::new(
            Arc::new(MemoryStore::new()),
            crate::engine::EngineOptions::default(),
        ));
        Arc::new(RateLimiter::new(Arc::new(config), engine))
    }

    /// The test-only hook: a listener task made to end. Within a second the server is
    /// not ready on both surfaces and the supervision names the task.
    #[tokio::test]
    async fn a_listener_task_that_ends_makes_the_server_not_ready_within_a_second() {
        let limiter = limiter();
        let (health, health_task, readiness) = spawn_health(&limiter, None);
        assert!(limiter.readiness().is_ok() && *health.ready.borrow());
        let (end_tx, end_rx) = tokio::sync::oneshot::channel::<()>();
        let grpc = tokio::spawn(async move {
            let _ = end_rx.await;
        });
        let http = tokio::spawn(std::future::pending::<()>());
        let grpc_ended = || grpc.is_finished();
        let http_ended = || http.is_finished();
        let tasks = [
            Supervised {
                name: "gRPC port",
                ended: &grpc_ended,
            },
            Supervised {
                name: "HTTP port",
                ended: &http_ended,
            },
        ];
        let watching = supervise(&limiter, &readiness, &health_task, &tasks);
        tokio::pin!(watching);
        // Nothing ended: the supervision waits, the server stays ready.
        assert!(
            tokio::time::timeout(Duration::from_millis(300), &mut watching)
                .await
                .is_err()
        );
        assert!(limiter.readiness().is_ok());
        end_tx.send(()).unwrap();
        let ended = tokio::time::timeout(Duration::from_secs(1), &mut watching)
            .await
            .expect("reported within a second");
        assert_eq!(ended, "gRPC port");
        assert!(limiter.readiness().is_err());
        assert!(!*health.ready.borrow());
        http.abort();
    }
}

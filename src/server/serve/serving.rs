//! A server on one store, from its start to its stop: the policy over the store, the
//! rules kept in force, readiness, the two ports and the tasks beside them, then, on a
//! shutdown signal, the stop (`shutdown.rs`). What is the same for every store; what
//! differs is `stores.rs`'s.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use super::shutdown::{shutdown_signal, Running};
use super::stores::{StoreSetup, WarmUp};
use super::tasks::{
    spawn_health, spawn_leases, spawn_prune, spawn_statsd, spawn_upstream_prometheus, spawn_xds,
    supervise, watch_config, Readiness, Supervised, UpstreamPort,
};
use super::{ServeError, ServeOptions, StoreKind};
use crate::config::reload::ConfigWatch;
use crate::config::Config;
use crate::engine::{Engine, EngineOptions};
use crate::server::grpc::{HealthWatch, PortOptions};
use crate::server::tls::TlsState;
use crate::server::{grpc, http};
use crate::service::metrics::Metrics;
use crate::service::RateLimiter;
use crate::store::metered::Metered;
use crate::store::BucketStore;

/// What every store's server shares: the config, the listeners, the options, the
/// metrics.
pub(super) struct Serving<'a> {
    pub(super) config: Arc<Config>,
    pub(super) grpc: TcpListener,
    pub(super) http: TcpListener,
    pub(super) upstream_prometheus: Option<UpstreamPort>,
    pub(super) options: &'a ServeOptions,
    pub(super) metrics: Arc<Metrics>,
}

/// How often the TLS files are checked for a new certificate.
const TLS_RELOAD_POLL: Duration = Duration::from_secs(2);

/// What the "serving" log line says of the store.
struct StoreSummary {
    name: &'static str,
    partition_write_budget: u64,
    leases: bool,
}

/// Where the rules come from once serving: the watched directory (its watch kept alive)
/// or the xDS stream (its task, and the first push readiness waits for unless the server
/// may start without rules).
struct RuleSource {
    watch: Option<ConfigWatch>,
    task: Option<tokio::task::JoinHandle<()>>,
    first: Option<WarmUp>,
}

/// Serves on `setup`'s store until a shutdown signal, then drains the calls, sends the
/// last stats and gives the leases back.
pub(super) async fn serve_on<S: BucketStore>(
    setup: StoreSetup<S>,
    serving: Serving<'_>,
) -> Result<(), ServeError> {
    let Serving {
        config,
        grpc: grpc_listener,
        http: http_listener,
        upstream_prometheus,
        options,
        metrics,
    } = serving;
    let summary = StoreSummary {
        name: setup.name,
        partition_write_budget: setup.engine.partition_write_budget,
        leases: setup.engine.leases.is_some(),
    };
    let limiter = limiter(setup.store, setup.engine, &config, options, &metrics);
    let rules = rule_source(&limiter, options, config.hash())?;
    let warm_up = ready_when(setup.warm_up, rules.first);
    limiter.set_ready(warm_up.is_none());

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    log_serving(&grpc_listener, &http_listener, options, &summary);
    let (health, health_task, readiness) = spawn_health(&limiter, warm_up);
    let port = port_options(options, health)?;
    let prune_task = spawn_prune(limiter.engine().clone());
    let (lease_stop_tx, lease_task) = spawn_leases(limiter.engine().clone());
    let grpc = grpc::serve_with(limiter.clone(), grpc_listener, port, stopped());
    let http = http::serve(limiter.clone(), http_listener, stopped(), options.ui);
    #[cfg(feature = "test-hooks")]
    let (grpc, http) = (
        super::test_hooks::ended_early("grpc", grpc, ()),
        super::test_hooks::ended_early("http", http, Ok(())),
    );
    let grpc_task = tokio::spawn(grpc);
    let http_task = tokio::spawn(http);
    let (statsd_stop_tx, statsd_task) = spawn_statsd(options, &metrics);
    let upstream_prometheus_task =
        upstream_prometheus.map(|port| spawn_upstream_prometheus(port, &metrics, stopped()));

    let supervised = [
        Supervised {
            name: "gRPC port",
            ended: &|| grpc_task.is_finished(),
        },
        Supervised {
            name: "HTTP port",
            ended: &|| http_task.is_finished(),
        },
        Supervised {
            name: "rules",
            ended: &|| ended(&rules.task, &rules.watch),
        },
    ];
    let ended = until_stopped(&limiter, &readiness, &health_task, &supervised).await;
    let running = Running {
        _config_watch: rules.watch,
        rules_task: rules.task,
        health_task,
        prune_task,
        stop_tx,
        grpc_task,
        http_task,
        grace: options.shutdown_grace,
        upstream_prometheus_task,
        statsd_stop_tx,
        statsd_task,
        lease_stop_tx,
        lease_task,
    };
    let stopped = running.stop().await;
    ended.map_or(stopped, |task| Err(ServeError::TaskEnded(task)))
}

/// The policy over `store`: each store call metered, the engine's view in the metrics,
/// answering as `options` say.
fn limiter<S: BucketStore>(
    store: Arc<S>,
    engine: EngineOptions,
    config: &Arc<Config>,
    options: &ServeOptions,
    metrics: &Arc<Metrics>,
) -> Arc<RateLimiter<Metered<S>>> {
    let store = Arc::new(Metered::new(store, metrics.clone()));
    let engine = Arc::new(Engine::new(store, engine));
    metrics.attach_engine(engine.view());
    Arc::new(
        RateLimiter::new(config.clone(), engine)
            .with_answer(options.answer.clone())
            .with_global_quota(options.global_quota_mode)
            .with_request_limits(options.request_limits.clone())
            .with_store_timeout(options.store_timeout)
            .with_metrics(metrics.clone())
            .with_top_values(options.top_values)
            .with_top_metric(options.top_values_metric),
    )
}

/// The rules kept in force: the config directory watched (`hash`: the loaded one's), or
/// the xDS stream subscribed to.
fn rule_source<S: BucketStore>(
    limiter: &Arc<RateLimiter<S>>,
    options: &ServeOptions,
    hash: &str,
) -> Result<RuleSource, ServeError> {
    Ok(match &options.xds {
        None => RuleSource {
            watch: Some({
                limiter.config_came_from(&options.config.display().to_string());
                watch_config(limiter, options, hash)?
            }),
            task: None,
            first: None,
        },
        Some(xds) => {
            limiter.config_came_from(&format!("xDS {}, no push yet", xds.server));
            let (task, first) = spawn_xds(limiter, xds.clone(), options.load.clone());
            RuleSource {
                watch: None,
                task: Some(task),
                first: (!xds.start_without_rules).then_some(first),
            }
        }
    })
}

/// How the gRPC port serves: TLS (its files watched) when asked, readiness from `health`.
/// Warns of a stream limit too low for a client's first burst (`burst_warning`).
fn port_options(options: &ServeOptions, health: HealthWatch) -> Result<PortOptions, ServeError> {
    let tls = match &options.tls {
        Some(files) => Some(Arc::new(TlsState::start(files.clone(), TLS_RELOAD_POLL)?)),
        None => None,
    };
    if let Some(warning) = options.port_limits.burst_warning() {
        tracing::warn!("{warning}");
    }
    Ok(PortOptions {
        tls,
        health: Some(health),
        trace_context: options.trace_context,
        limits: options.port_limits.clone(),
        // A memory store is this process's own: there is no fleet to share a limit with.
        rlqs_fleet: !matches!(options.store, StoreKind::Memory { .. }),
    })
}

/// Waits for a shutdown signal (`None`), or for one of `tasks` to end (its name, once
/// the server is no longer ready: `tasks.rs`, `supervise`).
async fn until_stopped<S: BucketStore>(
    limiter: &RateLimiter<S>,
    readiness: &Readiness,
    health: &tokio::task::JoinHandle<()>,
    tasks: &[Supervised<'_>],
) -> Option<&'static str> {
    tokio::select! {
        _ = shutdown_signal() => None,
        task = supervise(limiter, readiness, health, tasks) => Some(task),
    }
}

/// Whether the task keeping the rules in force (the xDS stream's, or the reload's)
/// ended.
fn ended(task: &Option<tokio::task::JoinHandle<()>>, watch: &Option<ConfigWatch>) -> bool {
    task.as_ref().is_some_and(|t| t.is_finished())
        || watch.as_ref().is_some_and(|w| w.is_finished())
}

/// Ready once the store has answered and, with rules over xDS, the first push landed
/// (`None`: ready at once).
fn ready_when(store: Option<WarmUp>, rules: Option<WarmUp>) -> Option<WarmUp> {
    match (store, rules) {
        (None, None) => None,
        (store, rules) => Some(Box::pin(async move {
            if let Some(store) = store {
                store.await;
            }
            if let Some(rules) = rules {
                rules.await;
            }
        })),
    }
}

/// Logs where the server listens, on which store, with which options.
fn log_serving(
    grpc_listener: &TcpListener,
    http_listener: &TcpListener,
    options: &ServeOptions,
    store: &StoreSummary,
) {
    tracing::info!(
        grpc = %grpc_listener.local_addr().unwrap_or(options.grpc_addr),
        http = %http_listener.local_addr().unwrap_or(options.http_addr),
        store = store.name,
        partition_write_budget = store.partition_write_budget,
        leases = store.leases,
        tls = options.tls.is_some(),
        mtls = options.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
        worker_threads = tokio::runtime::Handle::current().metrics().num_workers(),
        "serving"
    );
}

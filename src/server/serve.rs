//! Putting a server together: load the config, build the store and the engine, bind the
//! gRPC and HTTP listeners (and, when asked, upstream's Prometheus port), watch the config
//! for changes, sweep expired buckets of the memory store, and on SIGINT/SIGTERM stop
//! accepting, let calls in flight finish within the grace period, and return.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::grpc::{HealthWatch, PortOptions};
use super::port_limits::PortLimits;
use super::statsd::{self, StatsdOptions};
use super::tls::{TlsError, TlsFiles, TlsState};
use super::upstream_prometheus::{self, UpstreamPrometheusOptions};
use super::xds::{self, XdsOptions};
use super::{grpc, http};
use crate::config::reload::{self, ReloadTiming};
use crate::config::{Config, ConfigErrors, LoadOptions};
#[cfg(feature = "dynamodb")]
use crate::engine::DEFAULT_PARTITION_WRITE_BUDGET;
use crate::engine::{
    Clock, Engine, EngineOptions, LeaseOptions, SystemClock, UNLIMITED_PARTITION_WRITE_BUDGET,
};
use crate::service::metrics::statsd_mapping::StatsdMapping;
use crate::service::metrics::Metrics;
use crate::service::{AnswerOptions, RateLimiter, RequestLimits};
#[cfg(any(feature = "dynamodb", feature = "redis"))]
use crate::store::breaker::Breaker;
#[cfg(any(feature = "dynamodb", feature = "redis"))]
use crate::store::detached::Detached;
#[cfg(feature = "dynamodb")]
use crate::store::dynamodb::{DynamoOptions, DynamoStore};
use crate::store::memory::{BoundTooSmall, MemoryStore};
use crate::store::metered::Metered;
#[cfg(feature = "redis")]
use crate::store::redis::{RedisOptions, RedisStore, DEFAULT_KEY_WRITE_BUDGET};
use crate::store::BucketStore;

/// Which store backs the buckets.
#[derive(Debug, Clone)]
pub enum StoreKind {
    /// In this process; nothing else to run. Holds at most `max_bytes` of items
    /// (`--memory-max-bytes`), evicting what no decision needs first.
    Memory { max_bytes: u64 },
    /// A DynamoDB table shared by every server of a fleet.
    #[cfg(feature = "dynamodb")]
    DynamoDb(DynamoOptions),
    /// A Redis (or Valkey) server or Cluster shared by every server of a fleet.
    #[cfg(feature = "redis")]
    Redis(RedisOptions),
}

/// Everything `shardgate serve` is told.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// The rule file or directory (unused when the rules come over xDS).
    pub config: PathBuf,
    /// Rules pushed by an xDS control plane instead of read from `config`.
    pub xds: Option<XdsOptions>,
    /// How the config's documents combine (`--merge-domain-config`).
    pub load: LoadOptions,
    pub grpc_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub store: StoreKind,
    pub partition_write_budget: Option<u64>,
    /// Token leases for hot buckets (`None`: the store's default, on for DynamoDB, off
    /// for the memory store, where a store call already costs no more than a lease).
    pub leases: Option<bool>,
    /// Global shadow mode, dynamic metadata and `RateLimit-*` headers.
    pub answer: AnswerOptions,
    /// Every rule in quota mode.
    pub global_quota_mode: bool,
    /// Bounds on what one request may carry.
    pub request_limits: RequestLimits,
    /// How long calls in flight may take to finish after a shutdown signal.
    pub shutdown_grace: Duration,
    /// TLS on the gRPC port, if set.
    pub tls: Option<TlsFiles>,
    /// The gRPC port's HTTP/2 limits and request message bound.
    pub port_limits: PortLimits,
    /// The longest a call waits for the store, and the deadline of a caller that sets
    /// none (a caller's `grpc-timeout` shortens it).
    pub store_timeout: Duration,
    /// Each call's `decision` span joins the trace its caller sends (`traceparent`): set
    /// when spans are exported (feature `otel`).
    pub trace_context: bool,
    /// Also send the stats to statsd, if set.
    pub statsd: Option<StatsdOptions>,
    /// Also serve envoyproxy/ratelimit's Prometheus port, if set.
    pub upstream_prometheus: Option<UpstreamPrometheusOptions>,
}

/// Why the server could not start or stopped with an error.
#[derive(Debug, Error)]
pub enum ServeError {
    #[error("config {path} is invalid:\n{errors}")]
    Config { path: String, errors: ConfigErrors },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot watch {path} for changes: {source}")]
    Watch {
        path: String,
        #[source]
        source: notify::Error,
    },
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("HTTP server failed: {0}")]
    Http(#[source] std::io::Error),
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    #[error("--memory-max-bytes: {0}")]
    MemoryBound(#[from] BoundTooSmall),
    /// The upstream Prometheus port's mapping file: unreadable, or not a mapping shardgate
    /// can follow (the message names the file and what in it).
    #[error("statsd mapping file {0}")]
    Mapping(String),
}

/// How often the memory store drops expired buckets (its bound needs no sweep: it is
/// kept as each item is written).
const EVICTION_INTERVAL: Duration = Duration::from_secs(10);

/// Consecutive store failures that open the circuit, and how long it stays open.
#[cfg(any(feature = "dynamodb", feature = "redis"))]
const BREAKER_THRESHOLD: u32 = 5;
#[cfg(any(feature = "dynamodb", feature = "redis"))]
const BREAKER_COOL_OFF: Duration = Duration::from_millis(500);

/// How often the `store` health service re-checks that the store answers.
const STORE_HEALTH_INTERVAL: Duration = Duration::from_secs(5);
/// How often the rejection cache drops images no request can use any more (entries live
/// at most two cache lifetimes past their last use, plus this).
const REJECTION_PRUNE_INTERVAL: Duration = Duration::from_secs(1);

/// How often the TLS files are checked for a new certificate.
const TLS_RELOAD_POLL: Duration = Duration::from_secs(2);

#[cfg(feature = "dynamodb")]
/// How long each start-up attempt to reach the store may take (credentials, a first call,
/// connections): far more than a call may take once serving.
const WARM_UP_PATIENCE: Duration = Duration::from_secs(10);

#[cfg(feature = "dynamodb")]
/// Connections opened to DynamoDB before serving (more are opened as calls need them).
const WARM_UP_CONNECTIONS: usize = 8;

/// A future that resolves once the store has answered (the server's warm-up).
type WarmUp = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

/// Runs `shardgate serve` until a shutdown signal.
pub async fn run(options: ServeOptions) -> Result<(), ServeError> {
    let metrics = Arc::new(Metrics::new());
    // A mapping file the port cannot follow stops the start before anything is bound.
    let upstream_mapping = match &options.upstream_prometheus {
        Some(port) => Some(Arc::new(port.mapping.load().map_err(ServeError::Mapping)?)),
        None => None,
    };
    let config = match &options.xds {
        // No rules until the control plane's first push.
        Some(xds) => {
            tracing::info!(server = %xds.server, node = %xds.node_id, "rules from xDS");
            Config::from_documents(&[]).expect("no documents, no errors")
        }
        None => {
            let config = Config::load_with(&options.config, &options.load).map_err(|errors| {
                ServeError::Config {
                    path: options.config.display().to_string(),
                    errors,
                }
            })?;
            tracing::info!(
                path = %options.config.display(),
                domains = config.domains().count(),
                hash = config.hash(),
                "config loaded"
            );
            config
        }
    };
    metrics.config_loaded(config.hash());
    let grpc_listener = bind(options.grpc_addr).await?;
    let http_listener = bind(options.http_addr).await?;
    let upstream_prometheus = match (&options.upstream_prometheus, upstream_mapping) {
        (Some(port), Some(mapping)) => Some(UpstreamPort {
            listener: bind(port.addr).await?,
            mapping,
            path: port.path.clone(),
        }),
        _ => None,
    };
    let serving = Serving {
        config: Arc::new(config),
        grpc: grpc_listener,
        http: http_listener,
        upstream_prometheus,
        options: &options,
        metrics: metrics.clone(),
    };
    match &options.store {
        StoreKind::Memory { max_bytes } => {
            let store = Arc::new(MemoryStore::with_max_bytes(*max_bytes)?);
            {
                let store = store.clone();
                metrics.attach_memory_store(move || store.stats());
            }
            let budget = options
                .partition_write_budget
                .unwrap_or(UNLIMITED_PARTITION_WRITE_BUDGET);
            let sweeper = {
                let store = store.clone();
                tokio::spawn(async move {
                    let mut tick = tokio::time::interval(EVICTION_INTERVAL);
                    loop {
                        tick.tick().await;
                        store.evict_expired(SystemClock.now_ms() / 1_000);
                    }
                })
            };
            let setup = StoreSetup {
                store,
                engine: engine_options(budget, options.leases.unwrap_or(false)),
                name: "memory",
                warm_up: None,
            };
            let result = serve_on(setup, serving).await;
            sweeper.abort();
            result?;
        }
        #[cfg(feature = "dynamodb")]
        StoreKind::DynamoDb(dynamo) => {
            let mut dynamo = dynamo.clone();
            dynamo.timeout = options.store_timeout;
            let breaker = Arc::new(Breaker::new(
                DynamoStore::connect(&dynamo).await,
                BREAKER_THRESHOLD,
                BREAKER_COOL_OFF,
            ));
            {
                let store = breaker.clone();
                metrics.attach_capacity(move || store.inner().ledger().totals());
            }
            let warm_up: WarmUp = Box::pin(warm_up(breaker.clone()));
            // Each call in a task of its own: a caller's deadline never cancels a call
            // that is resolving credentials or opening a connection (see `detached.rs`).
            let store = Arc::new(Detached::new(breaker));
            metrics.attach_pressure(store.pressure().clone());
            let budget = options
                .partition_write_budget
                .unwrap_or(DEFAULT_PARTITION_WRITE_BUDGET);
            let setup = StoreSetup {
                store,
                engine: engine_options(budget, options.leases.unwrap_or(true)),
                name: "dynamodb",
                warm_up: Some(warm_up),
            };
            serve_on(setup, serving).await?;
        }
        #[cfg(feature = "redis")]
        StoreKind::Redis(redis) => {
            let mut redis = redis.clone();
            redis.timeout = options.store_timeout;
            let store = RedisStore::new(redis);
            tracing::info!(?store, mode = ?store.options().mode(), "Redis store");
            let breaker = Arc::new(Breaker::new(store, BREAKER_THRESHOLD, BREAKER_COOL_OFF));
            let warm_up: WarmUp = Box::pin(redis_warm_up(breaker.clone()));
            // As on DynamoDB: a caller's deadline never cancels a call mid-way (a
            // connection being opened, a script being loaded).
            let store = Arc::new(Detached::new(breaker));
            metrics.attach_pressure(store.pressure().clone());
            let budget = options
                .partition_write_budget
                .unwrap_or(DEFAULT_KEY_WRITE_BUDGET);
            let setup = StoreSetup {
                store,
                engine: engine_options(budget, options.leases.unwrap_or(true)),
                name: "redis",
                warm_up: Some(warm_up),
            };
            serve_on(setup, serving).await?;
        }
    }
    tracing::info!("stopped");
    Ok(())
}

#[cfg(feature = "dynamodb")]
/// Resolves once DynamoDB has answered a first call (retried until it does, each attempt
/// under [`WARM_UP_PATIENCE`]), then closes the circuit the calls made meanwhile may have
/// opened.
async fn warm_up(store: Arc<Breaker<DynamoStore>>) {
    let started = std::time::Instant::now();
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match store
            .inner()
            .warm_up(WARM_UP_CONNECTIONS, WARM_UP_PATIENCE)
            .await
        {
            Ok(()) => {
                store.close();
                tracing::info!(
                    after = ?started.elapsed(),
                    attempts,
                    connections = WARM_UP_CONNECTIONS,
                    "store answered: serving"
                );
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, attempts, "store not answering yet: health NOT_SERVING");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

#[cfg(feature = "redis")]
/// Resolves once Redis has answered a `PING` (the connections opened; retried each second
/// until it does), then closes the circuit the calls made meanwhile may have opened.
async fn redis_warm_up(store: Arc<Breaker<RedisStore>>) {
    let started = std::time::Instant::now();
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match store.inner().warm_up().await {
            Ok(()) => {
                store.close();
                tracing::info!(after = ?started.elapsed(), attempts, "store answered: serving");
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, attempts, "store not answering yet: health NOT_SERVING");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

fn engine_options(partition_write_budget: u64, leases: bool) -> EngineOptions {
    EngineOptions {
        partition_write_budget,
        leases: leases.then(|| LeaseOptions {
            panic_at_fetch: lease_task_panic_wanted(),
            ..LeaseOptions::default()
        }),
        ..EngineOptions::default()
    }
}

/// Whether a test asked the lease task to panic at its first fetch
/// (`SHARDGATE_DEBUG_LEASE_TASK_PANIC=1`), to see its supervision and alert end to end.
/// Debug builds only: a release binary never reads the variable.
fn lease_task_panic_wanted() -> bool {
    cfg!(debug_assertions)
        && std::env::var_os("SHARDGATE_DEBUG_LEASE_TASK_PANIC").is_some_and(|v| v == "1")
}

/// How long the shutdown waits for the last statsd flush.
const STATSD_LAST_FLUSH_PATIENCE: Duration = Duration::from_secs(3);

/// How long the shutdown waits for the leases to go back after the calls finished.
const LEASE_RETURN_PATIENCE: Duration = Duration::from_secs(5);

/// What every store's server shares: the config, the listeners, the options, the
/// metrics.
struct Serving<'a> {
    config: Arc<Config>,
    grpc: TcpListener,
    http: TcpListener,
    upstream_prometheus: Option<UpstreamPort>,
    options: &'a ServeOptions,
    metrics: Arc<Metrics>,
}

/// envoyproxy/ratelimit's Prometheus port, bound, with its mapping read.
struct UpstreamPort {
    listener: TcpListener,
    mapping: Arc<StatsdMapping>,
    path: String,
}

/// What differs by store: the store, the engine's options for it, its name in the log,
/// and the warm-up the server waits for before it reports ready (`None`: ready at once).
struct StoreSetup<S> {
    store: Arc<S>,
    engine: EngineOptions,
    name: &'static str,
    warm_up: Option<WarmUp>,
}

/// Serves on `setup`'s store until a shutdown signal, then drains the calls, sends the
/// last stats and gives the leases back.
async fn serve_on<S: BucketStore>(
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
    let partition_write_budget = setup.engine.partition_write_budget;
    let leases = setup.engine.leases.is_some();
    let warm_up = setup.warm_up;
    let store = Arc::new(Metered::new(setup.store, metrics.clone()));
    let engine = Arc::new(Engine::new(store, setup.engine));
    metrics.attach_engine(engine.view());
    let limiter = Arc::new(
        RateLimiter::new(config.clone(), engine)
            .with_answer(options.answer.clone())
            .with_global_quota(options.global_quota_mode)
            .with_request_limits(options.request_limits.clone())
            .with_store_timeout(options.store_timeout)
            .with_metrics(metrics.clone()),
    );
    let (_watch, rules_task, first_rules) = match &options.xds {
        None => (
            Some(watch_config(&limiter, options, config.hash())?),
            None,
            None,
        ),
        Some(xds) => {
            let (task, first) = spawn_xds(&limiter, xds.clone(), options.load.clone());
            (
                None,
                Some(task),
                (!xds.start_without_rules).then_some(first),
            )
        }
    };
    // Ready once the store has answered and, with rules over xDS, the first push landed.
    let warm_up: Option<WarmUp> = match (warm_up, first_rules) {
        (None, None) => None,
        (store, rules) => Some(Box::pin(async move {
            if let Some(store) = store {
                store.await;
            }
            if let Some(rules) = rules {
                rules.await;
            }
        })),
    };
    limiter.set_ready(warm_up.is_none());

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }
    };
    tracing::info!(
        grpc = %grpc_listener.local_addr().unwrap_or(options.grpc_addr),
        http = %http_listener.local_addr().unwrap_or(options.http_addr),
        store = setup.name,
        partition_write_budget,
        leases,
        tls = options.tls.is_some(),
        mtls = options.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
        worker_threads = tokio::runtime::Handle::current().metrics().num_workers(),
        "serving"
    );
    let tls = match &options.tls {
        Some(files) => Some(Arc::new(TlsState::start(files.clone(), TLS_RELOAD_POLL)?)),
        None => None,
    };
    let (health, health_task) = spawn_health(&limiter, warm_up);
    let prune_task = spawn_prune(limiter.engine().clone());
    let (lease_stop_tx, lease_task) = spawn_leases(limiter.engine().clone());
    let port = PortOptions {
        tls,
        health: Some(health),
        trace_context: options.trace_context,
        limits: options.port_limits.clone(),
    };
    let grpc_task = tokio::spawn(grpc::serve_with(
        limiter.clone(),
        grpc_listener,
        port,
        stopped(),
    ));
    let http_task = tokio::spawn(http::serve(limiter, http_listener, stopped()));
    // statsd gets a last flush once the calls have finished.
    let (statsd_stop_tx, statsd_stop_rx) = tokio::sync::oneshot::channel::<()>();
    let statsd_task = options
        .statsd
        .clone()
        .map(|statsd| tokio::spawn(statsd::run(metrics.clone(), statsd, statsd_stop_rx)));
    let upstream_prometheus_task =
        upstream_prometheus.map(|port| spawn_upstream_prometheus(port, &metrics, stopped()));

    shutdown_signal().await;
    if let Some(task) = rules_task {
        task.abort();
    }
    health_task.abort();
    prune_task.abort();
    let _ = stop_tx.send(true);
    let drained = drain(grpc_task, http_task, options.shutdown_grace).await;
    if let Some(task) = upstream_prometheus_task {
        task.abort();
    }
    let _ = statsd_stop_tx.send(());
    if let Some(task) = statsd_task {
        let _ = tokio::time::timeout(STATSD_LAST_FLUSH_PATIENCE, task).await;
    }
    let _ = lease_stop_tx.send(());
    if tokio::time::timeout(LEASE_RETURN_PATIENCE, lease_task)
        .await
        .is_err()
    {
        tracing::warn!(patience = ?LEASE_RETURN_PATIENCE, "leases not all given back before exit");
    }
    drained
}

/// Serves envoyproxy/ratelimit's Prometheus port until `stopped` resolves (a failure is
/// logged: the rate-limit ports go on).
fn spawn_upstream_prometheus(
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

/// Watches the config for changes: each good load is put in force and counted, each bad
/// one counted and logged while the previous config stays.
fn watch_config<S: BucketStore>(
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
                limiter.replace_config(config);
            }
            Err(errors) => {
                limiter.metrics().config_rejected();
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
fn spawn_xds<S: BucketStore>(
    limiter: &Arc<RateLimiter<S>>,
    options: XdsOptions,
    load: LoadOptions,
) -> (tokio::task::JoinHandle<()>, WarmUp) {
    let (first_tx, mut first_rx) = watch::channel(false);
    let limiter = limiter.clone();
    let task = tokio::spawn(xds::subscribe(options, load, move |push| match push {
        Ok(config) => {
            limiter.metrics().config_loaded(config.hash());
            limiter.replace_config(Arc::new(config));
            first_tx.send_replace(true);
        }
        Err(_) => limiter.metrics().config_rejected(),
    }));
    let first: WarmUp = Box::pin(async move {
        let _ = first_rx.wait_for(|landed| *landed).await;
    });
    (task, first)
}

/// Readiness (gRPC health of the server and the rate-limit service, `/healthcheck`):
/// NOT_SERVING until the store has answered a first call (`warm_up`), then SERVING for
/// good: a store outage is answered by each rule's failure_mode. The `store` health
/// service follows the store itself, checked every [`STORE_HEALTH_INTERVAL`].
fn spawn_health<S: BucketStore>(
    limiter: &Arc<RateLimiter<S>>,
    warm_up: Option<WarmUp>,
) -> (HealthWatch, tokio::task::JoinHandle<()>) {
    let (ready_tx, ready_rx) = watch::channel(warm_up.is_none());
    let (store_tx, store_rx) = watch::channel(warm_up.is_none());
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
    (watch, task)
}

/// Drops the rejection cache's dead entries every [`REJECTION_PRUNE_INTERVAL`].
fn spawn_prune<S: BucketStore>(engine: Arc<Engine<S>>) -> tokio::task::JoinHandle<()> {
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
fn spawn_leases<S: BucketStore>(
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

/// Waits for both ports to finish their calls, at most `grace`.
async fn drain(
    grpc_task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    http_task: tokio::task::JoinHandle<Result<(), std::io::Error>>,
    grace: Duration,
) -> Result<(), ServeError> {
    let drained = tokio::time::timeout(grace, async { (grpc_task.await, http_task.await) }).await;
    match drained {
        Ok((grpc, http)) => {
            if let Ok(Err(e)) = grpc {
                return Err(e.into());
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
async fn shutdown_signal() {
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

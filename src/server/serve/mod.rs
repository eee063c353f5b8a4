//! Putting a server together: load the config, build the store and the engine, bind the
//! gRPC and HTTP listeners (and, when asked, upstream's Prometheus port), watch the config
//! for changes, sweep expired buckets of the memory store, and on SIGINT/SIGTERM stop
//! accepting, let calls in flight finish within the grace period, and return.
//!
//! This file holds what `shardgate serve` is told, how it fails, and the start: the
//! initial rules and the bound ports, then the store's server. `stores.rs` builds each
//! store, `serving.rs` runs a server on one, `tasks.rs` spawns the tasks beside its
//! ports, `shutdown.rs` stops it all.

mod serving;
mod shutdown;
mod stores;
mod tasks;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::net::TcpListener;

use super::port_limits::PortLimits;
use super::statsd::StatsdOptions;
use super::tls::{TlsError, TlsFiles};
use super::upstream_prometheus::UpstreamPrometheusOptions;
use super::xds::XdsOptions;
use crate::config::{Config, ConfigErrors, LoadOptions};
use crate::service::metrics::statsd_mapping::StatsdMapping;
use crate::service::metrics::Metrics;
use crate::service::{AnswerOptions, RequestLimits};
#[cfg(feature = "dynamodb")]
use crate::store::dynamodb::DynamoOptions;
use crate::store::memory::BoundTooSmall;
#[cfg(feature = "redis")]
use crate::store::redis::RedisOptions;
use serving::{serve_on, Serving};
use tasks::UpstreamPort;

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

/// Runs `shardgate serve` until a shutdown signal.
pub async fn run(options: ServeOptions) -> Result<(), ServeError> {
    let metrics = Arc::new(Metrics::new());
    // A mapping file the port cannot follow stops the start before anything is bound.
    let upstream_mapping = match &options.upstream_prometheus {
        Some(port) => Some(Arc::new(port.mapping.load().map_err(ServeError::Mapping)?)),
        None => None,
    };
    let config = initial_config(&options)?;
    metrics.config_loaded(config.hash());
    let serving = bind_ports(&options, config, upstream_mapping, metrics.clone()).await?;
    match &options.store {
        StoreKind::Memory { max_bytes } => {
            let (setup, sweeper) = stores::memory(*max_bytes, &options, &metrics)?;
            let result = serve_on(setup, serving).await;
            sweeper.abort();
            result?;
        }
        #[cfg(feature = "dynamodb")]
        StoreKind::DynamoDb(dynamo) => {
            let setup = stores::dynamodb(dynamo, &options, &metrics).await;
            serve_on(setup, serving).await?;
        }
        #[cfg(feature = "redis")]
        StoreKind::Redis(redis) => {
            let setup = stores::redis(redis, &options, &metrics);
            serve_on(setup, serving).await?;
        }
    }
    tracing::info!("stopped");
    Ok(())
}

/// The rules to start with: the config loaded (an error stops the start), or none until
/// the xDS control plane's first push.
fn initial_config(options: &ServeOptions) -> Result<Config, ServeError> {
    Ok(match &options.xds {
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
    })
}

/// Binds the gRPC and HTTP ports, and upstream's Prometheus port when it is asked for
/// (its `mapping` read), in that order: what every store's server shares.
async fn bind_ports(
    options: &ServeOptions,
    config: Config,
    mapping: Option<Arc<StatsdMapping>>,
    metrics: Arc<Metrics>,
) -> Result<Serving<'_>, ServeError> {
    let grpc_listener = bind(options.grpc_addr).await?;
    let http_listener = bind(options.http_addr).await?;
    let upstream_prometheus = match (&options.upstream_prometheus, mapping) {
        (Some(port), Some(mapping)) => Some(UpstreamPort {
            listener: bind(port.addr).await?,
            mapping,
            path: port.path.clone(),
        }),
        _ => None,
    };
    Ok(Serving {
        config: Arc::new(config),
        grpc: grpc_listener,
        http: http_listener,
        upstream_prometheus,
        options,
        metrics,
    })
}

/// A listener on `addr`; the error names it.
async fn bind(addr: SocketAddr) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}

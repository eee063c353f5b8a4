//! Putting a server together: load the config, build the store and the engine, bind the
//! gRPC and HTTP listeners (and, when asked, upstream's Prometheus port), watch the config
//! for changes, sweep expired buckets of the memory store, and on SIGINT/SIGTERM stop
//! accepting, let calls in flight finish within the grace period, and return.
//!
//! This file holds what `shardgate serve` is told, how it fails, and the start: the
//! initial rules and the bound ports, then the store's server. `stores.rs` builds each
//! store, `serving.rs` runs a server on one, `tasks.rs` spawns the tasks beside its
//! ports, `shutdown.rs` stops it all.

mod options;
mod serving;
mod shutdown;
mod stores;
mod tasks;
#[cfg(feature = "test-hooks")]
mod test_hooks;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::config::Config;
use crate::service::metrics::statsd_mapping::StatsdMapping;
use crate::service::metrics::Metrics;
use serving::{serve_on, Serving};
use tasks::UpstreamPort;

pub use options::{ServeError, ServeOptions, StoreKind};

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
#[expect(clippy::expect_used, reason = "no documents, no errors")]
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
            let mut names: Vec<&str> = config.domains().map(|d| &*d.name).collect();
            names.sort_unstable();
            tracing::info!(
                path = %options.config.display(),
                domains = config.domains().count(),
                names = %crate::support::text::elide(&names.join(", "), 512),
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

//! Putting a server together: load the config, build the store and the engine, bind the
//! gRPC listener, run until SIGINT/SIGTERM, and sweep expired buckets meanwhile.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use thiserror::Error;
use tokio::net::TcpListener;

use super::{grpc, RateLimiter};
use crate::config::{Config, ConfigErrors};
use crate::engine::{
    Clock, Engine, EngineOptions, SystemClock, DEFAULT_PARTITION_WRITE_BUDGET,
    UNLIMITED_PARTITION_WRITE_BUDGET,
};
use crate::store::dynamodb::{DynamoOptions, DynamoStore};
use crate::store::memory::MemoryStore;
use crate::store::BucketStore;

/// Which store backs the buckets.
#[derive(Debug, Clone)]
pub enum StoreKind {
    /// In this process; nothing else to run.
    Memory,
    /// A DynamoDB table shared by every server of a fleet.
    DynamoDb(DynamoOptions),
}

/// Everything `shardgate serve` is told.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub config: PathBuf,
    pub grpc_addr: SocketAddr,
    pub store: StoreKind,
    pub partition_write_budget: Option<u64>,
    pub global_shadow_mode: bool,
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
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// How often the memory store drops expired buckets.
const EVICTION_INTERVAL: Duration = Duration::from_secs(10);

/// Runs `shardgate serve` until a shutdown signal.
pub async fn run(options: ServeOptions) -> Result<(), ServeError> {
    let config = Config::load(&options.config).map_err(|errors| ServeError::Config {
        path: options.config.display().to_string(),
        errors,
    })?;
    tracing::info!(
        path = %options.config.display(),
        domains = config.domains().count(),
        hash = config.hash(),
        "config loaded"
    );
    let listener = TcpListener::bind(options.grpc_addr)
        .await
        .map_err(|source| ServeError::Bind {
            addr: options.grpc_addr,
            source,
        })?;
    let config = Arc::new(config);
    match &options.store {
        StoreKind::Memory => {
            let store = Arc::new(MemoryStore::new());
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
            let result = serve_on(store, budget, config, listener, &options, "memory").await;
            sweeper.abort();
            result?;
        }
        StoreKind::DynamoDb(dynamo) => {
            let store = Arc::new(DynamoStore::connect(dynamo).await);
            let budget = options
                .partition_write_budget
                .unwrap_or(DEFAULT_PARTITION_WRITE_BUDGET);
            serve_on(store, budget, config, listener, &options, "dynamodb").await?;
        }
    }
    tracing::info!("stopped");
    Ok(())
}

async fn serve_on<S: BucketStore>(
    store: Arc<S>,
    partition_write_budget: u64,
    config: Arc<Config>,
    listener: TcpListener,
    options: &ServeOptions,
    store_name: &str,
) -> Result<(), ServeError> {
    let engine_options = EngineOptions {
        partition_write_budget,
        ..EngineOptions::default()
    };
    let engine = Arc::new(Engine::new(store, engine_options));
    let limiter =
        Arc::new(RateLimiter::new(config, engine).with_global_shadow(options.global_shadow_mode));
    tracing::info!(
        addr = %listener.local_addr().unwrap_or(options.grpc_addr),
        store = store_name,
        partition_write_budget,
        "serving gRPC"
    );
    grpc::serve(limiter, listener, shutdown_signal()).await?;
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
    tracing::info!("shutdown signal received");
}

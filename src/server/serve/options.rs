//! What `shardgate serve` is told ([`ServeOptions`], with the store it runs on,
//! [`StoreKind`]) and how a server fails to start or stops on an error ([`ServeError`]).
//! Types only: the start is `mod.rs`'s.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

use crate::config::{ConfigErrors, LoadOptions};
use crate::server::port_limits::PortLimits;
use crate::server::statsd::StatsdOptions;
use crate::server::tls::{TlsError, TlsFiles};
use crate::server::upstream_prometheus::UpstreamPrometheusOptions;
use crate::server::xds::XdsOptions;
use crate::service::{AnswerOptions, RequestLimits};
#[cfg(feature = "dynamodb")]
use crate::store::dynamodb::DynamoOptions;
use crate::store::memory::BoundTooSmall;
#[cfg(feature = "redis")]
use crate::store::redis::RedisOptions;

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
    /// Each rule's most refused and admitted values kept (`/top`).
    pub top_values: bool,
    /// Each rule's top values exported as gauges on `/metrics`, this many (0: none).
    pub top_values_metric: usize,
    /// The operator's page served on the HTTP port (`/ui`).
    pub ui: bool,
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
    /// A task the server needs (a port, the rules' reload or xDS) ended before the
    /// shutdown (`serve/tasks.rs`, `supervise`): the server stopped rather than serve
    /// without it.
    #[error("the {0} task ended unexpectedly; the server stopped")]
    TaskEnded(&'static str),
}

//! `serve`'s arguments for the gRPC port's limits (docs/configuration.md, "The gRPC
//! port's limits"). Parsing only; the limits are enforced by `server/port_limits.rs`.

use std::time::Duration;

use clap::Args;
use shardgate::server::port_limits::{self, PortLimits};

use super::values::{parse_duration, positive_duration};

/// The gRPC port's limits (docs/configuration.md, "The gRPC port's limits").
#[derive(Args)]
pub(crate) struct GrpcPort {
    /// Calls one connection may have in flight; more are refused (REFUSED_STREAM),
    /// including the first burst on a new connection, sent before the client has read
    /// this: keep it ≥ 100, and cap streams in Envoy's cluster to spread its calls.
    #[arg(long, env = "SHARDGATE_GRPC_MAX_CONCURRENT_STREAMS", default_value_t = port_limits::DEFAULT_MAX_CONCURRENT_STREAMS, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) grpc_max_concurrent_streams: u32,
    /// The largest request message, in bytes; a larger one is refused (RESOURCE_EXHAUSTED)
    /// as soon as its prefix announces it.
    #[arg(long, env = "SHARDGATE_GRPC_MAX_MESSAGE_BYTES", default_value_t = port_limits::DEFAULT_MAX_MESSAGE_BYTES, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) grpc_max_message_bytes: u32,
    /// How often an idle connection is pinged, to close it when its peer is gone (0: never).
    #[arg(long, env = "SHARDGATE_GRPC_KEEPALIVE_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    pub(crate) grpc_keepalive_interval: Duration,
    /// How long a ping may go unanswered before its connection is closed.
    #[arg(long, env = "SHARDGATE_GRPC_KEEPALIVE_TIMEOUT", default_value = "20s", value_parser = positive_duration)]
    pub(crate) grpc_keepalive_timeout: Duration,
    /// Send GOAWAY to connections this old: their calls finish, the client reconnects
    /// (default, or 0: never; envoyproxy/ratelimit's GRPC_MAX_CONNECTION_AGE).
    #[arg(long, env = "SHARDGATE_GRPC_MAX_CONNECTION_AGE", value_parser = parse_duration)]
    pub(crate) grpc_max_connection_age: Option<Duration>,
    /// How long an aged connection's calls may take after its GOAWAY before it is closed
    /// anyway; a health Watch or reflection stream is ended at the GOAWAY
    /// (envoyproxy/ratelimit's GRPC_MAX_CONNECTION_AGE_GRACE).
    #[arg(long, env = "SHARDGATE_GRPC_MAX_CONNECTION_AGE_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub(crate) grpc_max_connection_age_grace: Duration,
}

impl GrpcPort {
    /// The limits the port enforces (a zero interval or age: never).
    pub(crate) fn limits(&self) -> PortLimits {
        let nonzero = |d: Duration| (!d.is_zero()).then_some(d);
        PortLimits {
            max_concurrent_streams: self.grpc_max_concurrent_streams,
            keepalive_interval: nonzero(self.grpc_keepalive_interval),
            keepalive_timeout: self.grpc_keepalive_timeout,
            max_connection_age: self.grpc_max_connection_age.and_then(nonzero),
            max_connection_age_grace: self.grpc_max_connection_age_grace,
            preface_timeout: port_limits::PREFACE_TIMEOUT,
            max_message_bytes: self.grpc_max_message_bytes,
        }
    }
}

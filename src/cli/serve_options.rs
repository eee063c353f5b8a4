//! `serve`'s arguments turned into the library's `ServeOptions`: the checks the flags
//! cannot say by themselves (the namespace's length, a store this build lacks, Redis's
//! settings), each failing with its message on stderr. No parsing (that is `serve.rs`'s)
//! and no serving (that is the library's).

use std::process::ExitCode;
use std::time::Duration;

use shardgate::config::LoadOptions;
use shardgate::server::serve::{ServeOptions, StoreKind};
use shardgate::server::statsd::{self, StatsdOptions, StatsdProtocol};
use shardgate::server::tls::TlsFiles;
use shardgate::service::{AnswerOptions, RateLimitHeaders, RequestLimits};
use shardgate::store::key::MAX_NAMESPACE_BYTES;

use super::serve::{Serve, StatsdTags, StatsdTransport, Switch};
use super::stores::{Dynamo, Redis, Store};
use crate::fail;

/// The server's options from the command line (`trace_context`: spans are exported).
pub(crate) fn serve_options(args: Serve, trace_context: bool) -> Result<ServeOptions, ExitCode> {
    let store_timeout = args.dynamo.store_timeout;
    if args.dynamo.namespace.len() > MAX_NAMESPACE_BYTES {
        return Err(fail(format!(
            "--namespace is {} bytes long, at most {MAX_NAMESPACE_BYTES} (it is part of every store key)",
            args.dynamo.namespace.len()
        )));
    }
    let statsd = statsd_options(&args);
    let answer = answer_options(&args);
    let upstream_prometheus = args.upstream_prometheus.options().map_err(fail)?;
    let xds = args.xds.options();
    // Rules over xDS replace the files: no path is read then.
    let config = match &xds {
        Some(_) => args.rules.config.clone().unwrap_or_default(),
        None => args.rules.path().map_err(fail)?,
    };
    Ok(ServeOptions {
        xds,
        config,
        store_timeout,
        grpc_addr: args.grpc_addr,
        http_addr: args.http_addr,
        shutdown_grace: args.shutdown_grace,
        tls: match (args.tls_cert, args.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert,
                key,
                client_ca: args.tls_client_ca,
                client_cert_optional: args.tls_client_cert_optional,
            }),
            _ => None,
        },
        store: match args.store {
            Store::Memory => StoreKind::Memory {
                max_bytes: args.memory_max_bytes,
            },
            Store::Dynamodb => dynamodb_store(args.dynamo)?,
            Store::Redis => redis_store(args.redis, &args.dynamo.namespace, store_timeout)?,
        },
        partition_write_budget: args.partition_write_budget,
        leases: args.leases.map(|s| matches!(s, Switch::On)),
        global_quota_mode: args.global_quota_mode,
        top_values: !args.no_top_values,
        top_values_metric: usize::from(args.top_values_metric),
        // The page carries tenant identifiers: on by default only where the HTTP port
        // is reachable from this host alone.
        ui: args.ui.map_or(args.http_addr.ip().is_loopback(), |s| {
            matches!(s, Switch::On)
        }),
        load: LoadOptions {
            merge_domains: args.merge_domain_config,
        },
        answer,
        request_limits: RequestLimits {
            max_descriptors: args.max_descriptors,
            max_entries: args.max_entries,
            max_key_bytes: args.max_key_bytes,
            max_value_bytes: args.max_value_bytes,
        },
        trace_context,
        port_limits: args.grpc.limits(),
        statsd,
        upstream_prometheus,
    })
}

/// The statsd export, when `--statsd-addr` asks for one.
fn statsd_options(args: &Serve) -> Option<StatsdOptions> {
    args.statsd_addr.clone().map(|addr| StatsdOptions {
        addr,
        protocol: match args.statsd_protocol {
            StatsdTransport::Udp => StatsdProtocol::Udp,
            StatsdTransport::Tcp => StatsdProtocol::Tcp,
        },
        flush_interval: args
            .statsd_flush_interval
            .unwrap_or(statsd::DEFAULT_FLUSH_INTERVAL),
        tags: args
            .statsd_tags
            .clone()
            .map(|StatsdTags(tags)| tags)
            .unwrap_or_default(),
    })
}

/// Global shadow mode, dynamic metadata and the `RateLimit-*` headers' names.
fn answer_options(args: &Serve) -> AnswerOptions {
    AnswerOptions {
        global_shadow: args.global_shadow_mode,
        dynamic_metadata: args.response_dynamic_metadata,
        headers: args.rate_limit_headers.then(|| RateLimitHeaders {
            limit: args.limit_header.clone(),
            remaining: args.remaining_header.clone(),
            reset: args.reset_header.clone(),
        }),
    }
}

/// `--store dynamodb`: the table's options.
#[cfg(feature = "dynamodb")]
fn dynamodb_store(dynamo: Dynamo) -> Result<StoreKind, ExitCode> {
    Ok(StoreKind::DynamoDb(dynamo.options()))
}

/// `--store dynamodb` in a build without it: refused.
#[cfg(not(feature = "dynamodb"))]
fn dynamodb_store(_: Dynamo) -> Result<StoreKind, ExitCode> {
    Err(fail(
        "--store dynamodb: this shardgate was built without the `dynamodb` feature",
    ))
}

/// `--store redis`: its options, refused when they do not hold together.
#[cfg(feature = "redis")]
fn redis_store(redis: Redis, namespace: &str, timeout: Duration) -> Result<StoreKind, ExitCode> {
    let redis = redis.options(namespace.to_string(), timeout);
    if let Err(e) = redis.validate() {
        return Err(fail(format!("--store redis: {e}")));
    }
    Ok(StoreKind::Redis(redis))
}

/// `--store redis` in a build without it: refused.
#[cfg(not(feature = "redis"))]
fn redis_store(_: Redis, _: &str, _: Duration) -> Result<StoreKind, ExitCode> {
    Err(fail(
        "--store redis: this shardgate was built without the `redis` feature",
    ))
}

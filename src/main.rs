//! The `shardgate` command line: `serve`, `check-config`, `table create` and `inspect`.
//! Parsing and dispatch only; the store arguments and the two store commands are in
//! `cli/stores.rs`.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The process's allocator. Each call allocates a few boxed futures of 1–4 KB (tonic's
/// unary call, the decision), sizes glibc serves from its locked, consolidating slow path;
/// mimalloc serves them from per-thread pages. `bench/pair.py` measured the difference.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Args, Parser, Subcommand, ValueEnum};

use shardgate::config::{Config, LoadOptions};
use shardgate::server::port_limits::{self, PortLimits};
use shardgate::server::serve::{self, ServeOptions, StoreKind};
use shardgate::server::statsd::{self, StatsdOptions, StatsdProtocol};
use shardgate::server::tls::TlsFiles;
use shardgate::service::metrics::statsd::{parse_tags, StatsdTag};
use shardgate::service::{AnswerOptions, RateLimitHeaders, RequestLimits};
use shardgate::store::key::MAX_NAMESPACE_BYTES;

mod cli;
#[cfg(any(feature = "dynamodb", feature = "redis"))]
use cli::stores::{inspect_bucket, InspectArgs};
#[cfg(feature = "dynamodb")]
use cli::stores::{table_create, TableCommand};
use cli::stores::{Dynamo, Redis, Store};
use cli::upstream_prometheus::UpstreamPrometheusArgs;
use cli::xds::XdsArgs;
#[cfg(feature = "otel")]
use shardgate::telemetry::SpanExport;

#[derive(Parser)]
#[command(
    name = "shardgate",
    version,
    about = "An external rate-limit server for Envoy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve Envoy's rate-limit gRPC API.
    Serve(Box<Serve>),
    /// Validate a config file or directory: prints OK, or every error (exit code 1).
    CheckConfig {
        /// A YAML file or a directory of YAML files.
        path: PathBuf,
        /// Merge documents of one domain, as `serve --merge-domain-config` does.
        #[arg(long, env = "SHARDGATE_MERGE_DOMAIN_CONFIG")]
        merge_domain_config: bool,
    },
    /// Manage the DynamoDB table.
    #[cfg(feature = "dynamodb")]
    Table {
        #[command(subcommand)]
        command: TableCommand,
    },
    /// Print every shard of one bucket as JSON (a shared store: DynamoDB or Redis).
    #[cfg(any(feature = "dynamodb", feature = "redis"))]
    Inspect(Box<InspectArgs>),
}

#[derive(Parser)]
struct Serve {
    /// Rate-limit rules: a YAML file or a directory of YAML files (or --xds-server).
    #[arg(long, env = "SHARDGATE_CONFIG", required_unless_present = "xds_server")]
    config: Option<PathBuf>,
    #[command(flatten)]
    xds: XdsArgs,
    /// Address of the gRPC listener.
    #[arg(long, env = "SHARDGATE_GRPC_ADDR", default_value = "0.0.0.0:8081")]
    grpc_addr: SocketAddr,
    /// Address of the HTTP listener (/metrics, /healthcheck, /rlconfig, /json).
    #[arg(long, env = "SHARDGATE_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    http_addr: SocketAddr,
    /// After SIGTERM/SIGINT, how long calls in flight may take to finish (e.g. 10s, 500ms).
    #[arg(long, env = "SHARDGATE_SHUTDOWN_GRACE", default_value = "10s", value_parser = parse_duration)]
    shutdown_grace: Duration,
    /// Where buckets live.
    #[arg(long, env = "SHARDGATE_STORE", value_enum, default_value_t = Store::Memory)]
    store: Store,
    #[command(flatten)]
    dynamo: Dynamo,
    #[command(flatten)]
    redis: Redis,
    /// Writes per second one shard item absorbs before its bucket is spread over more
    /// shards: the `wcu` capacity written on new items (default: 1000 on DynamoDB, 5000
    /// on Redis, unlimited on the memory store).
    #[arg(long, env = "SHARDGATE_PARTITION_WRITE_BUDGET")]
    partition_write_budget: Option<u64>,
    /// Most bytes of bucket items the memory store holds (e.g. 256MiB, 1GiB; at least
    /// 1MiB). Past it, a new bucket first evicts buckets refilled to full (no decision
    /// changes), then the least recently used (docs/configuration.md, "Memory store
    /// bound").
    #[arg(long, env = "SHARDGATE_MEMORY_MAX_BYTES", default_value = "256MiB", value_parser = parse_bytes)]
    memory_max_bytes: u64,
    /// Token leases: a bucket hot in this process is answered from a block of tokens
    /// taken from its shard in advance (default: on for DynamoDB and Redis, off for the
    /// memory store). A rule opts out with `lease: false`.
    #[arg(long, env = "SHARDGATE_LEASES", value_enum)]
    leases: Option<Switch>,
    /// Most descriptors one request may carry.
    #[arg(long, env = "SHARDGATE_MAX_DESCRIPTORS", default_value_t = RequestLimits::default().max_descriptors)]
    max_descriptors: usize,
    /// Most entries one descriptor may carry.
    #[arg(long, env = "SHARDGATE_MAX_ENTRIES", default_value_t = RequestLimits::default().max_entries)]
    max_entries: usize,
    /// Longest descriptor key, in bytes.
    #[arg(long, env = "SHARDGATE_MAX_KEY_BYTES", default_value_t = RequestLimits::default().max_key_bytes)]
    max_key_bytes: usize,
    /// Longest descriptor value, in bytes.
    #[arg(long, env = "SHARDGATE_MAX_VALUE_BYTES", default_value_t = RequestLimits::default().max_value_bytes)]
    max_value_bytes: usize,
    /// Evaluate, count and report every rule, but answer OK overall: each descriptor
    /// keeps its own code (envoyproxy/ratelimit's SHADOW_MODE).
    #[arg(long, env = "SHARDGATE_GLOBAL_SHADOW_MODE")]
    global_shadow_mode: bool,
    /// Merge config files that name the same domain into one tree (an error otherwise);
    /// a top-level descriptor repeated across them is still an error
    /// (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG).
    #[arg(long, env = "SHARDGATE_MERGE_DOMAIN_CONFIG")]
    merge_domain_config: bool,
    /// Decide every rule in quota mode: a request is refused only when all its quota
    /// descriptors are over (envoyproxy/ratelimit's QUOTA_MODE).
    #[arg(long, env = "SHARDGATE_GLOBAL_QUOTA_MODE")]
    global_quota_mode: bool,
    /// Send dynamic metadata with each answer: the domain, the descriptors and the
    /// passing descriptors' rule `metadata` (envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA).
    #[arg(long, env = "SHARDGATE_RESPONSE_DYNAMIC_METADATA")]
    response_dynamic_metadata: bool,
    /// Add RateLimit-Limit, -Remaining and -Reset headers for the descriptor closest to
    /// its limit, on allowed and refused requests alike (LIMIT_RESPONSE_HEADERS_ENABLED).
    #[arg(long, env = "SHARDGATE_RATE_LIMIT_HEADERS")]
    rate_limit_headers: bool,
    /// Name of the limit header.
    #[arg(long, env = "SHARDGATE_LIMIT_HEADER", default_value = "RateLimit-Limit", value_parser = header_name)]
    limit_header: String,
    /// Name of the remaining header.
    #[arg(long, env = "SHARDGATE_REMAINING_HEADER", default_value = "RateLimit-Remaining", value_parser = header_name)]
    remaining_header: String,
    /// Name of the reset header (whole seconds until the bucket is full again, or until
    /// a refused request would fit).
    #[arg(long, env = "SHARDGATE_RESET_HEADER", default_value = "RateLimit-Reset", value_parser = header_name)]
    reset_header: String,
    /// Log format.
    #[arg(long, env = "SHARDGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Also log each span when it closes, with its fields and duration: the `decision`
    /// span of every call once RUST_LOG enables it at debug (docs/operations.md, Tracing).
    #[arg(long, env = "SHARDGATE_LOG_SPANS")]
    log_spans: bool,
    /// Export each call's `decision` span over OTLP/gRPC to this collector (e.g.
    /// http://127.0.0.1:4317). Without it, the OpenTelemetry SDK's own
    /// OTEL_EXPORTER_OTLP_ENDPOINT turns the export on (docs/operations.md, "Exporting
    /// spans with OpenTelemetry").
    #[arg(long, env = "SHARDGATE_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// How spans are sent: OTLP over gRPC (to a collector's port 4317) or over HTTP (port
    /// 4318; a URL without a path gets /v1/traces). Default: OTEL_EXPORTER_OTLP_PROTOCOL
    /// (`grpc` or `http/protobuf`) if set, else grpc.
    #[arg(long, env = "SHARDGATE_OTLP_PROTOCOL", value_enum)]
    otlp_protocol: Option<OtlpTransport>,
    /// Also send the stats to statsd at this host:port, in envoyproxy/ratelimit's stat
    /// names (for a statsd_exporter and the dashboards built on it); /metrics stays.
    #[arg(long, env = "SHARDGATE_STATSD_ADDR")]
    statsd_addr: Option<String>,
    /// The transport to statsd.
    #[arg(long, env = "SHARDGATE_STATSD_PROTOCOL", value_enum, default_value_t = StatsdTransport::Udp, requires = "statsd_addr")]
    statsd_protocol: StatsdTransport,
    /// How often the stats are sent to statsd (e.g. 10s).
    #[arg(long, env = "SHARDGATE_STATSD_FLUSH_INTERVAL", value_parser = parse_duration, requires = "statsd_addr")]
    statsd_flush_interval: Option<Duration>,
    /// Tags added to the `ratelimit.` stats sent to statsd, as name:value,name:value.
    #[arg(long, env = "SHARDGATE_STATSD_TAGS", value_parser = parse_statsd_tags, requires = "statsd_addr")]
    statsd_tags: Option<StatsdTags>,
    #[command(flatten)]
    upstream_prometheus: UpstreamPrometheusArgs,
    /// Threads answering requests (default: one per CPU core). Fewer threads hop fewer
    /// tasks between cores: on a 2-core machine sharing its cores with DynamoDB Local,
    /// one thread cut shardgate's CPU per DynamoDB decision by a fifth (README,
    /// Performance).
    #[arg(long, env = "SHARDGATE_WORKER_THREADS")]
    worker_threads: Option<std::num::NonZeroUsize>,
    /// Serve gRPC over TLS with this PEM certificate chain (re-read when it changes).
    #[arg(long, env = "SHARDGATE_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, env = "SHARDGATE_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Require client certificates issued by this PEM CA (mutual TLS).
    #[arg(long, env = "SHARDGATE_TLS_CLIENT_CA", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    #[command(flatten)]
    grpc: GrpcPort,
}

/// `--statsd-protocol`.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum StatsdTransport {
    Udp,
    Tcp,
}

/// `--statsd-tags`' list, one value to clap (a `Vec` would be read as many values).
#[derive(Clone, Debug)]
struct StatsdTags(Vec<StatsdTag>);

fn parse_statsd_tags(text: &str) -> Result<StatsdTags, String> {
    parse_tags(text).map(StatsdTags)
}

/// The gRPC port's limits (docs/configuration.md, "The gRPC port's limits").
#[derive(Args)]
struct GrpcPort {
    /// Calls one connection may have in flight; more are refused (REFUSED_STREAM). Envoy
    /// honours it and opens another connection instead.
    #[arg(long, env = "SHARDGATE_GRPC_MAX_CONCURRENT_STREAMS", default_value_t = port_limits::DEFAULT_MAX_CONCURRENT_STREAMS, value_parser = clap::value_parser!(u32).range(1..))]
    grpc_max_concurrent_streams: u32,
    /// The largest request message, in bytes; a larger one is refused (RESOURCE_EXHAUSTED)
    /// as soon as its prefix announces it.
    #[arg(long, env = "SHARDGATE_GRPC_MAX_MESSAGE_BYTES", default_value_t = port_limits::DEFAULT_MAX_MESSAGE_BYTES, value_parser = clap::value_parser!(u32).range(1..))]
    grpc_max_message_bytes: u32,
    /// How often an idle connection is pinged, to close it when its peer is gone (0: never).
    #[arg(long, env = "SHARDGATE_GRPC_KEEPALIVE_INTERVAL", default_value = "60s", value_parser = parse_duration)]
    grpc_keepalive_interval: Duration,
    /// How long a ping may go unanswered before its connection is closed.
    #[arg(long, env = "SHARDGATE_GRPC_KEEPALIVE_TIMEOUT", default_value = "20s", value_parser = positive_duration)]
    grpc_keepalive_timeout: Duration,
    /// Send GOAWAY to connections this old: their calls finish, the client reconnects
    /// (default, or 0: never; envoyproxy/ratelimit's GRPC_MAX_CONNECTION_AGE).
    #[arg(long, env = "SHARDGATE_GRPC_MAX_CONNECTION_AGE", value_parser = parse_duration)]
    grpc_max_connection_age: Option<Duration>,
}

impl GrpcPort {
    fn limits(&self) -> PortLimits {
        let nonzero = |d: Duration| (!d.is_zero()).then_some(d);
        PortLimits {
            max_concurrent_streams: self.grpc_max_concurrent_streams,
            keepalive_interval: nonzero(self.grpc_keepalive_interval),
            keepalive_timeout: self.grpc_keepalive_timeout,
            max_connection_age: self.grpc_max_connection_age.and_then(nonzero),
            max_message_bytes: self.grpc_max_message_bytes,
        }
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Switch {
    On,
    Off,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// A response header name Envoy accepts: an HTTP token (RFC 9110), at most 128 bytes.
fn header_name(s: &str) -> Result<String, String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if s.is_empty() || s.len() > 128 || !s.chars().all(token) {
        return Err(format!(
            "{:?} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~, at most 128 bytes)",
            shardgate::support::text::elide(s, 64)
        ));
    }
    Ok(s.to_string())
}

/// Logs to stderr, filtered by RUST_LOG (default info); with `export`, the `decision`
/// spans also go to the exporter, through a filter of that layer's own (the log level
/// stays as it is).
fn init_logging(
    format: LogFormat,
    spans: bool,
    #[cfg(feature = "otel")] export: Option<&SpanExport>,
) {
    use tracing_subscriber::fmt::format::FmtSpan;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let log = tracing_subscriber::fmt::layer()
        .with_span_events(if spans { FmtSpan::CLOSE } else { FmtSpan::NONE })
        .with_writer(std::io::stderr);
    let log = match format {
        LogFormat::Text => log.with_filter(filter).boxed(),
        LogFormat::Json => log.json().with_filter(filter).boxed(),
    };
    let subscriber = tracing_subscriber::registry().with(log);
    #[cfg(feature = "otel")]
    let subscriber = subscriber.with(export.map(SpanExport::layer));
    subscriber.init();
}

/// The export of the `decision` spans, if it is wanted (`shardgate::telemetry::wanted`).
/// Must run inside the runtime (see `SpanExport::start`).
/// The transport is `--otlp-protocol`, else the SDK's protocol variables, else gRPC.
#[cfg(feature = "otel")]
fn span_export(
    endpoint: Option<&str>,
    protocol: Option<OtlpTransport>,
) -> Result<Option<SpanExport>, ExitCode> {
    use shardgate::telemetry::OtlpProtocol;
    let env = |name: &str| std::env::var(name).ok();
    if !shardgate::telemetry::wanted(endpoint, env) {
        return Ok(None);
    }
    let protocol = match protocol {
        Some(OtlpTransport::Grpc) => OtlpProtocol::Grpc,
        Some(OtlpTransport::Http) => OtlpProtocol::Http,
        None => OtlpProtocol::from_env(env)
            .map_err(fail)?
            .unwrap_or(OtlpProtocol::Grpc),
    };
    SpanExport::start(endpoint, protocol)
        .map(Some)
        .map_err(fail)
}

#[cfg(not(feature = "otel"))]
fn span_export(
    endpoint: Option<&str>,
    _protocol: Option<OtlpTransport>,
) -> Result<Option<std::convert::Infallible>, ExitCode> {
    match endpoint {
        Some(_) => Err(fail(
            "--otlp-endpoint: this shardgate was built without the `otel` feature",
        )),
        None => Ok(None),
    }
}

/// `--otlp-protocol`.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum OtlpTransport {
    Grpc,
    Http,
}

/// A duration as humantime writes it (`10s`, `500ms`, `1m30s`), or a bare number of
/// seconds (`2`, `0.5`).
fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(seconds) = s.parse::<f64>() {
        return Duration::try_from_secs_f64(seconds)
            .map_err(|_| format!("'{s}' is not a non-negative number of seconds"));
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("'{s}' is not a duration ({e}; try 10s, 500ms, 1m30s)"))
}

/// A duration above zero.
fn positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err(format!("'{}' must be more than zero", s.trim())),
        d => Ok(d),
    }
}

/// A size in bytes: a bare number, or with a unit (`256MiB`, `1GiB`, `512MB`).
fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    s.parse::<bytesize::ByteSize>()
        .map(|size| size.as_u64())
        .map_err(|_| format!("'{s}' is not a size (try 256MiB, 1GiB, or a number of bytes)"))
}

/// A multi-thread runtime of `workers` threads (default: tokio's, one per core).
fn runtime_with(
    workers: Option<std::num::NonZeroUsize>,
) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = workers {
        builder.worker_threads(n.get());
    }
    builder.enable_all().build().map_err(|e| {
        eprintln!("cannot start the runtime: {e}");
        ExitCode::FAILURE
    })
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("{message}");
    ExitCode::FAILURE
}

fn main() -> ExitCode {
    // envoyproxy/ratelimit's variables become ours before the arguments are read (no
    // thread is running yet, so changing the environment is safe).
    let env: std::collections::BTreeMap<String, String> = std::env::vars().collect();
    let upstream = shardgate::upstream_env::translate(&env);
    for alias in &upstream.set {
        std::env::set_var(alias.ours, &alias.value);
    }
    let cli = Cli::parse_from(invocation(std::env::args_os().collect()));
    match cli.command {
        Command::CheckConfig {
            path,
            merge_domain_config,
        } => match Config::load_with(
            &path,
            &LoadOptions {
                merge_domains: merge_domain_config,
            },
        ) {
            Ok(_) => {
                println!("OK");
                ExitCode::SUCCESS
            }
            Err(errors) => fail(errors),
        },
        #[cfg(feature = "dynamodb")]
        Command::Table {
            command: TableCommand::Create { dynamo },
        } => table_create(dynamo),
        #[cfg(any(feature = "dynamodb", feature = "redis"))]
        Command::Inspect(args) => inspect_bucket(*args),
        Command::Serve(args) => serve(args, &upstream),
    }
}

/// `shardgate serve`: the runtime, the span export and logging, the report of
/// envoyproxy/ratelimit's variables, then the server until a shutdown signal.
fn serve(args: Box<Serve>, upstream: &shardgate::upstream_env::Translation) -> ExitCode {
    // The runtime comes first, then the span export inside it, then logging: the
    // OTLP exporter's tonic channel spawns its connection task on the runtime when
    // it is built, and the exporting layer must be in the subscriber from the
    // start. (A `reload` layer filled in later, or an exporter built lazily, would
    // keep a handle or a check on every span for the life of the process; building
    // the runtime logs nothing, so nothing is lost by starting it first.)
    let rt = match runtime_with(args.worker_threads) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let export = {
        let _in_runtime = rt.enter();
        match span_export(args.otlp_endpoint.as_deref(), args.otlp_protocol) {
            Ok(export) => export,
            Err(code) => return code,
        }
    };
    init_logging(
        args.log_format,
        args.log_spans,
        #[cfg(feature = "otel")]
        export.as_ref(),
    );
    if !upstream.refused.is_empty() {
        return fail(format!(
            "envoyproxy/ratelimit settings shardgate cannot follow:\n  {}",
            upstream.refused.join("\n  ")
        ));
    }
    for alias in &upstream.set {
        tracing::info!(
            from = alias.from,
            to = alias.ours,
            "envoyproxy/ratelimit variable honoured"
        );
    }
    if !upstream.ignored.is_empty() {
        tracing::warn!(
            ignored = %upstream.ignored.join(", "),
            "envoyproxy/ratelimit variables with no meaning in shardgate (docs/configuration.md, \"Environment\")"
        );
    }
    let options = match serve_options(*args, export.is_some()) {
        Ok(options) => options,
        Err(code) => return code,
    };
    let served = rt.block_on(serve::run(options));
    // The calls have drained: the spans of the last ones are flushed now, from
    // this thread, while the runtime's workers still drive the connection.
    #[cfg(feature = "otel")]
    if let Some(export) = export {
        export.shutdown();
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
}

/// The server's options from the command line (`trace_context`: spans are exported).
fn serve_options(args: Serve, trace_context: bool) -> Result<ServeOptions, ExitCode> {
    let store_timeout = args.dynamo.store_timeout;
    if args.dynamo.namespace.len() > MAX_NAMESPACE_BYTES {
        return Err(fail(format!(
                "--namespace is {} bytes long, at most {MAX_NAMESPACE_BYTES} (it is part of every store key)",
                args.dynamo.namespace.len()
            )));
    }
    let statsd = args.statsd_addr.clone().map(|addr| StatsdOptions {
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
    });
    let upstream_prometheus = args.upstream_prometheus.options().map_err(fail)?;
    Ok(ServeOptions {
        xds: args.xds.options(),
        config: args.config.unwrap_or_default(),
        store_timeout,
        grpc_addr: args.grpc_addr,
        http_addr: args.http_addr,
        shutdown_grace: args.shutdown_grace,
        tls: match (args.tls_cert, args.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles {
                cert,
                key,
                client_ca: args.tls_client_ca,
            }),
            _ => None,
        },
        store: match args.store {
            Store::Memory => StoreKind::Memory {
                max_bytes: args.memory_max_bytes,
            },
            #[cfg(feature = "dynamodb")]
            Store::Dynamodb => StoreKind::DynamoDb(args.dynamo.options()),
            #[cfg(not(feature = "dynamodb"))]
            Store::Dynamodb => {
                return Err(fail(
                    "--store dynamodb: this shardgate was built without the `dynamodb` feature",
                ))
            }
            #[cfg(feature = "redis")]
            Store::Redis => {
                let redis = args
                    .redis
                    .options(args.dynamo.namespace.clone(), store_timeout);
                if let Err(e) = redis.validate() {
                    return Err(fail(format!("--store redis: {e}")));
                }
                StoreKind::Redis(redis)
            }
            #[cfg(not(feature = "redis"))]
            Store::Redis => {
                return Err(fail(
                    "--store redis: this shardgate was built without the `redis` feature",
                ))
            }
        },
        partition_write_budget: args.partition_write_budget,
        leases: args.leases.map(|s| matches!(s, Switch::On)),
        global_quota_mode: args.global_quota_mode,
        load: LoadOptions {
            merge_domains: args.merge_domain_config,
        },
        answer: AnswerOptions {
            global_shadow: args.global_shadow_mode,
            dynamic_metadata: args.response_dynamic_metadata,
            headers: args.rate_limit_headers.then(|| RateLimitHeaders {
                limit: args.limit_header.clone(),
                remaining: args.remaining_header.clone(),
                reset: args.reset_header.clone(),
            }),
        },
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

/// The name envoyproxy/ratelimit's image runs its server by, with no arguments (Envoy
/// Gateway's generated Deployment sets `command: ["/bin/ratelimit"]`).
const UPSTREAM_COMMAND: &str = "ratelimit";

/// The arguments to parse: the process's own, except that invoked as [`UPSTREAM_COMMAND`]
/// with none, shardgate serves, so an image that links the name to shardgate starts it
/// as upstream's did, configured by upstream's environment. Any argument given under that
/// name is read as ours (`ratelimit check-config …` works).
fn invocation(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    let called = args
        .first()
        .and_then(|arg0| std::path::Path::new(arg0).file_name())
        .is_some_and(|name| name == UPSTREAM_COMMAND);
    if called && args.len() == 1 {
        args.push("serve".into());
    }
    args
}

#[cfg(test)]
mod tests {
    use super::{invocation, parse_bytes, parse_duration, Cli, Command, Parser, PortLimits};
    use std::time::Duration;

    #[test]
    fn invoked_as_upstreams_ratelimit_with_no_arguments_it_serves() {
        let args = |a: &[&str]| {
            a.iter()
                .map(Into::into)
                .collect::<Vec<std::ffi::OsString>>()
        };
        assert_eq!(
            invocation(args(&["/bin/ratelimit"])),
            args(&["/bin/ratelimit", "serve"])
        );
        assert_eq!(
            invocation(args(&["ratelimit"])),
            args(&["ratelimit", "serve"])
        );
        // Arguments are ours under either name; other names are left alone.
        for kept in [
            &["/bin/ratelimit", "check-config", "c.yaml"][..],
            &["/usr/local/bin/shardgate"],
            &["/opt/ratelimit-tools/shardgate"],
            &["/bin/ratelimiter"],
        ] {
            assert_eq!(invocation(args(kept)), args(kept));
        }
    }

    #[test]
    fn the_port_flags_default_to_the_port_limits_defaults() {
        let cli = Cli::try_parse_from(["shardgate", "serve", "--config", "c.yaml"]).unwrap();
        let Command::Serve(serve) = cli.command else {
            panic!("serve")
        };
        assert_eq!(serve.grpc.limits(), PortLimits::default());
    }

    #[test]
    fn the_statsd_flags_parse_and_need_an_address() {
        let cli = Cli::try_parse_from([
            "shardgate",
            "serve",
            "--config",
            "c.yaml",
            "--statsd-addr",
            "127.0.0.1:9125",
            "--statsd-protocol",
            "tcp",
            "--statsd-flush-interval",
            "2s",
            "--statsd-tags",
            "zone:eu,app:rl",
        ])
        .unwrap();
        let Command::Serve(serve) = cli.command else {
            panic!("serve")
        };
        assert_eq!(serve.statsd_tags.map(|t| t.0.len()), Some(2));
        assert_eq!(serve.statsd_flush_interval, Some(Duration::from_secs(2)));
        let alone = [
            "shardgate",
            "serve",
            "--config",
            "c.yaml",
            "--statsd-tags",
            "a:b",
        ];
        assert!(
            Cli::try_parse_from(alone).is_err(),
            "tags without an address"
        );
        let bad = Cli::try_parse_from([
            "shardgate",
            "serve",
            "--config",
            "c.yaml",
            "--statsd-addr",
            "x:1",
            "--statsd-tags",
            "novalue",
        ]);
        assert!(bad.err().unwrap().to_string().contains("'novalue'"));
    }

    #[test]
    fn the_upstream_prometheus_flags_parse_and_need_an_address() {
        let parse = |extra: &[&str]| {
            let mut args = vec!["shardgate", "serve", "--config", "c.yaml"];
            args.extend_from_slice(extra);
            Cli::try_parse_from(args).map(|cli| match cli.command {
                Command::Serve(serve) => serve.upstream_prometheus.options(),
                _ => panic!("serve"),
            })
        };
        let options = parse(&["--upstream-prometheus-addr", ":19001"])
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(options.addr, "0.0.0.0:19001".parse().unwrap());
        assert_eq!(options.path, "/metrics");
        // Off by default; its other flags need the address.
        assert_eq!(parse(&[]).unwrap(), Ok(None));
        for alone in [
            &["--upstream-prometheus-path", "/m"][..],
            &["--upstream-prometheus-mapping", "m.yaml"],
        ] {
            assert!(parse(alone).is_err(), "{alone:?}");
        }
        assert!(parse(&["--upstream-prometheus-addr", "localhost:1"]).is_err());
    }

    #[test]
    fn sizes_parse_with_units_or_as_bytes_and_the_default_is_the_stores() {
        assert_eq!(
            parse_bytes("256MiB"),
            Ok(shardgate::store::memory::DEFAULT_MAX_BYTES)
        );
        assert_eq!(parse_bytes("1 GiB"), Ok(1 << 30));
        assert_eq!(parse_bytes("512MB"), Ok(512_000_000));
        assert_eq!(parse_bytes("1048576"), Ok(1 << 20));
        for bad in ["-1", "ten", "5 parsecs", ""] {
            let e = parse_bytes(bad).unwrap_err();
            assert!(e.contains(&format!("'{bad}'")), "{bad}: {e}");
        }
    }

    #[test]
    fn durations_parse_as_humantime_or_bare_seconds() {
        let ms = Duration::from_millis;
        assert_eq!(parse_duration("10s"), Ok(ms(10_000)));
        assert_eq!(parse_duration("500ms"), Ok(ms(500)));
        assert_eq!(parse_duration("1m30s"), Ok(ms(90_000)));
        assert_eq!(parse_duration(" 2 "), Ok(ms(2_000)));
        assert_eq!(parse_duration("0.25"), Ok(ms(250)));
        for bad in ["-1", "NaN", "inf", "ten", "5x", ""] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains(&format!("'{}'", bad.trim())), "{bad}: {e}");
        }
    }
}

//! `shardgate serve`'s arguments: the flags of the server itself and the small value
//! types they parse into. Parsing only: `serve_options.rs` turns them into the library's
//! `ServeOptions`; the store, xDS, gRPC port and upstream Prometheus arguments are
//! flattened in from their own files.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use shardgate::service::metrics::statsd::{parse_tags, StatsdTag};
use shardgate::service::RequestLimits;

use super::grpc_port::GrpcPort;
use super::rules::RulesArg;
use super::stores::{Dynamo, Redis, Store};
use super::upstream_prometheus::UpstreamPrometheusArgs;
use super::values::{parse_bytes, parse_duration};
use super::xds::XdsArgs;

// `serve --help`'s sections, by topic.
const RULES: &str = "Rules";
const XDS: &str = "Rules over xDS";
const PORTS: &str = "Ports and TLS";
const STORE: &str = "Store";
const DYNAMODB: &str = "DynamoDB store";
const REDIS: &str = "Redis store";
const REQUESTS: &str = "Request bounds";
const ANSWERS: &str = "Answers (envoyproxy/ratelimit switches)";
const LOGS: &str = "Logs and tracing";
const STATS: &str = "Stats (statsd; envoyproxy/ratelimit compatible Prometheus port)";
const GRPC_LIMITS: &str = "gRPC port limits";

// Everything `serve` is told on its command line (or by the `SHARDGATE_*` variables). A
// plain comment: a doc comment here would become the command's help text.
#[derive(Parser)]
pub(crate) struct Serve {
    #[command(flatten, next_help_heading = RULES)]
    pub(crate) rules: RulesArg,
    #[command(flatten, next_help_heading = XDS)]
    pub(crate) xds: XdsArgs,
    /// Address of the gRPC listener.
    #[arg(help_heading = PORTS, long, env = "SHARDGATE_GRPC_ADDR", default_value = "0.0.0.0:8081")]
    pub(crate) grpc_addr: SocketAddr,
    /// Address of the HTTP listener (/metrics, /healthcheck, /rlconfig, /json).
    #[arg(help_heading = PORTS, long, env = "SHARDGATE_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub(crate) http_addr: SocketAddr,
    /// After SIGTERM/SIGINT, how long calls in flight may take to finish (e.g. 10s, 500ms).
    #[arg(help_heading = PORTS, long, env = "SHARDGATE_SHUTDOWN_GRACE", default_value = "10s", value_parser = parse_duration)]
    pub(crate) shutdown_grace: Duration,
    /// Where buckets live.
    #[arg(help_heading = STORE, long, env = "SHARDGATE_STORE", value_enum, default_value_t = Store::Memory)]
    pub(crate) store: Store,
    #[command(flatten, next_help_heading = DYNAMODB)]
    pub(crate) dynamo: Dynamo,
    #[command(flatten, next_help_heading = REDIS)]
    pub(crate) redis: Redis,
    /// Writes per second one shard item absorbs before its bucket is spread over more
    /// shards: the `wcu` capacity written on new items (default: 1000 on DynamoDB, 5000
    /// on Redis, unlimited on the memory store).
    #[arg(help_heading = STORE, long, env = "SHARDGATE_PARTITION_WRITE_BUDGET")]
    pub(crate) partition_write_budget: Option<u64>,
    /// Most bytes of bucket items the memory store holds (e.g. 256MiB, 1GiB; at least
    /// 1MiB). Past it, a new bucket first evicts buckets refilled to full (no decision
    /// changes), then the least recently used (docs/configuration.md, "Memory store
    /// bound").
    #[arg(help_heading = STORE, long, env = "SHARDGATE_MEMORY_MAX_BYTES", default_value = "256MiB", value_parser = parse_bytes)]
    pub(crate) memory_max_bytes: u64,
    /// Token leases: a bucket hot in this process is answered from a block of tokens
    /// taken from its shard in advance (default: on for DynamoDB and Redis, off for the
    /// memory store). A rule opts out with `lease: false`.
    #[arg(help_heading = STORE, long, env = "SHARDGATE_LEASES", value_enum)]
    pub(crate) leases: Option<Switch>,
    /// Most descriptors one request may carry.
    #[arg(help_heading = REQUESTS, long, env = "SHARDGATE_MAX_DESCRIPTORS", default_value_t = RequestLimits::default().max_descriptors)]
    pub(crate) max_descriptors: usize,
    /// Most entries one descriptor may carry.
    #[arg(help_heading = REQUESTS, long, env = "SHARDGATE_MAX_ENTRIES", default_value_t = RequestLimits::default().max_entries)]
    pub(crate) max_entries: usize,
    /// Longest descriptor key, in bytes.
    #[arg(help_heading = REQUESTS, long, env = "SHARDGATE_MAX_KEY_BYTES", default_value_t = RequestLimits::default().max_key_bytes)]
    pub(crate) max_key_bytes: usize,
    /// Longest descriptor value, in bytes.
    #[arg(help_heading = REQUESTS, long, env = "SHARDGATE_MAX_VALUE_BYTES", default_value_t = RequestLimits::default().max_value_bytes)]
    pub(crate) max_value_bytes: usize,
    /// Evaluate, count and report every rule, but answer OK overall: each descriptor
    /// keeps its own code (envoyproxy/ratelimit's SHADOW_MODE).
    #[arg(help_heading = ANSWERS, long, env = "SHARDGATE_GLOBAL_SHADOW_MODE")]
    pub(crate) global_shadow_mode: bool,
    /// Merge config files that name the same domain into one tree (an error otherwise);
    /// a top-level descriptor repeated across them is still an error
    /// (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG).
    #[arg(help_heading = RULES, long, env = "SHARDGATE_MERGE_DOMAIN_CONFIG")]
    pub(crate) merge_domain_config: bool,
    /// Decide every rule in quota mode: a request is refused only when all its quota
    /// descriptors are over (envoyproxy/ratelimit's QUOTA_MODE).
    #[arg(help_heading = ANSWERS, long, env = "SHARDGATE_GLOBAL_QUOTA_MODE")]
    pub(crate) global_quota_mode: bool,
    /// Keep no per-rule tables of the descriptor values most refused and admitted (`GET
    /// /top` and the page then list none). They are kept by default, in fixed memory.
    #[arg(help_heading = ANSWERS, long, env = "SHARDGATE_NO_TOP_VALUES")]
    pub(crate) no_top_values: bool,
    /// Also export each rule's N most refused and N most admitted values as gauges on
    /// /metrics (`shardgate_top_refused_hits{domain,rule,value}`, `..._admitted_...`), at
    /// most 64; 0 (the default) exports none. Bounded, but each value is a series and a
    /// tenant identifier: raise it with care.
    #[arg(help_heading = ANSWERS, long, env = "SHARDGATE_TOP_VALUES_METRIC", default_value_t = 0,
          value_parser = clap::value_parser!(u16).range(0..=64))]
    pub(crate) top_values_metric: u16,
    /// The operator's page, `/ui` on the HTTP port: on by default only when --http-addr
    /// is a loopback address (the page shows request values, tenant identifiers often);
    /// `on` serves it on any address, `off` nowhere.
    #[arg(help_heading = ANSWERS, long, env = "SHARDGATE_UI")]
    pub(crate) ui: Option<Switch>,
    /// Send dynamic metadata with each answer: the domain, the descriptors and the
    /// passing descriptors' rule `metadata` (envoyproxy/ratelimit's RESPONSE_DYNAMIC_METADATA).
    #[arg(help_heading = ANSWERS, long, env = "SHARDGATE_RESPONSE_DYNAMIC_METADATA")]
    pub(crate) response_dynamic_metadata: bool,
    /// Add RateLimit-Limit, -Remaining and -Reset headers for the descriptor closest to
    /// its limit, on allowed and refused requests alike (LIMIT_RESPONSE_HEADERS_ENABLED).
    #[arg(help_heading = ANSWERS, long, env = "SHARDGATE_RATE_LIMIT_HEADERS")]
    pub(crate) rate_limit_headers: bool,
    /// Name of the limit header.
    #[arg(help_heading = ANSWERS, long, env = "SHARDGATE_LIMIT_HEADER", default_value = "RateLimit-Limit", value_parser = header_name)]
    pub(crate) limit_header: String,
    /// Name of the remaining header.
    #[arg(help_heading = ANSWERS, long, env = "SHARDGATE_REMAINING_HEADER", default_value = "RateLimit-Remaining", value_parser = header_name)]
    pub(crate) remaining_header: String,
    /// Name of the reset header (whole seconds until the bucket is full again, or until
    /// a refused request would fit).
    #[arg(help_heading = ANSWERS, long, env = "SHARDGATE_RESET_HEADER", default_value = "RateLimit-Reset", value_parser = header_name)]
    pub(crate) reset_header: String,
    /// Log format.
    #[arg(help_heading = LOGS, long, env = "SHARDGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
    /// Also log each span when it closes, with its fields and duration: the `decision`
    /// span of every call once RUST_LOG enables it at debug (docs/operations.md, Tracing).
    #[arg(help_heading = LOGS, long, env = "SHARDGATE_LOG_SPANS")]
    pub(crate) log_spans: bool,
    /// Export each call's `decision` span over OTLP/gRPC to this collector (e.g.
    /// http://127.0.0.1:4317). Without it, the OpenTelemetry SDK's own
    /// OTEL_EXPORTER_OTLP_ENDPOINT turns the export on (docs/operations.md, "Exporting
    /// spans with OpenTelemetry").
    #[arg(help_heading = LOGS, long, env = "SHARDGATE_OTLP_ENDPOINT")]
    pub(crate) otlp_endpoint: Option<String>,
    /// How spans are sent: OTLP over gRPC (to a collector's port 4317) or over HTTP (port
    /// 4318; a URL without a path gets /v1/traces). Default: OTEL_EXPORTER_OTLP_PROTOCOL
    /// (`grpc` or `http/protobuf`) if set, else grpc.
    #[arg(help_heading = LOGS, long, env = "SHARDGATE_OTLP_PROTOCOL", value_enum)]
    pub(crate) otlp_protocol: Option<OtlpTransport>,
    /// Also send the stats to statsd at this host:port, in envoyproxy/ratelimit's stat
    /// names (for a statsd_exporter and the dashboards built on it); /metrics stays.
    #[arg(help_heading = STATS, long, env = "SHARDGATE_STATSD_ADDR")]
    pub(crate) statsd_addr: Option<String>,
    /// The transport to statsd.
    #[arg(help_heading = STATS, long, env = "SHARDGATE_STATSD_PROTOCOL", value_enum, default_value_t = StatsdTransport::Udp, requires = "statsd_addr")]
    pub(crate) statsd_protocol: StatsdTransport,
    /// How often the stats are sent to statsd (e.g. 10s).
    #[arg(help_heading = STATS, long, env = "SHARDGATE_STATSD_FLUSH_INTERVAL", value_parser = parse_duration, requires = "statsd_addr")]
    pub(crate) statsd_flush_interval: Option<Duration>,
    /// Tags added to the `ratelimit.` stats sent to statsd, as name:value,name:value.
    #[arg(help_heading = STATS, long, env = "SHARDGATE_STATSD_TAGS", value_parser = parse_statsd_tags, requires = "statsd_addr")]
    pub(crate) statsd_tags: Option<StatsdTags>,
    #[command(flatten, next_help_heading = STATS)]
    pub(crate) upstream_prometheus: UpstreamPrometheusArgs,
    /// Threads answering requests (default: one per CPU core). Fewer threads hop fewer
    /// tasks between cores: on a 2-core machine sharing its cores with DynamoDB Local,
    /// one thread cut shardgate's CPU per DynamoDB decision by a fifth (README,
    /// Performance). 1 runs tokio's current-thread scheduler: every connection on one
    /// core, at the default's CPU per call (bench/README.md).
    #[arg(help_heading = PORTS, long, env = "SHARDGATE_WORKER_THREADS")]
    pub(crate) worker_threads: Option<std::num::NonZeroUsize>,
    /// Serve gRPC over TLS with this PEM certificate chain (re-read when it changes).
    #[arg(help_heading = PORTS, long, env = "SHARDGATE_TLS_CERT", requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(help_heading = PORTS, long, env = "SHARDGATE_TLS_KEY", requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// Require client certificates issued by this PEM CA (mutual TLS).
    #[arg(help_heading = PORTS, long, env = "SHARDGATE_TLS_CLIENT_CA", requires = "tls_cert")]
    pub(crate) tls_client_ca: Option<PathBuf>,
    /// With --tls-client-ca: let clients connect without a certificate too (one presented
    /// must still be issued by that CA).
    #[arg(
        help_heading = PORTS,
        long,
        env = "SHARDGATE_TLS_CLIENT_CERT_OPTIONAL",
        requires = "tls_client_ca"
    )]
    pub(crate) tls_client_cert_optional: bool,
    #[command(flatten, next_help_heading = GRPC_LIMITS)]
    pub(crate) grpc: GrpcPort,
}

/// `--statsd-protocol`.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum StatsdTransport {
    Udp,
    Tcp,
}

/// `--statsd-tags`' list, one value to clap (a `Vec` would be read as many values).
#[derive(Clone, Debug)]
pub(crate) struct StatsdTags(pub(crate) Vec<StatsdTag>);

/// `--statsd-tags`: name:value pairs, as the statsd export reads them.
pub(crate) fn parse_statsd_tags(text: &str) -> Result<StatsdTags, String> {
    parse_tags(text).map(StatsdTags)
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Switch {
    On,
    Off,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// A response header name Envoy accepts: an HTTP token (RFC 9110), at most 128 bytes.
pub(crate) fn header_name(s: &str) -> Result<String, String> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    if s.is_empty() || s.len() > 128 || !s.chars().all(token) {
        return Err(format!(
            "{:?} is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~, at most 128 bytes)",
            shardgate::support::text::elide(s, 64)
        ));
    }
    Ok(s.to_string())
}

/// `--otlp-protocol`.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum OtlpTransport {
    Grpc,
    Http,
}

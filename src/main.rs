//! The `shardgate` command line: `serve`, `check-config`, `explain`, `table create` and
//! `inspect`.
//! Parsing and dispatch only: `serve`'s arguments are in `cli/serve.rs` (and the files
//! it flattens in), their translation into the server's options in
//! `cli/serve_options.rs`, the store arguments and the two store commands in
//! `cli/stores.rs`.

#![forbid(unsafe_code)]
// A panic on the request path ends that call (`server/panics.rs`), never the process; still
// none is written casually: an `expect` outside tests is allowed where it stands, with the
// reason it cannot fail, and `unwrap` not at all; nor an index or a slice (`v[i]`, `&s[a..]`)
// but where an `#[expect]` on the smallest item says why it is in range: the rest use
// `get`, iterators, slice patterns or checked splits. Tests unwrap and index freely.
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

use std::path::PathBuf;
use std::process::ExitCode;

/// The process's allocator. Each call allocates a few boxed futures of 1–4 KB (tonic's
/// unary call, the decision), sizes glibc serves from its locked, consolidating slow path;
/// mimalloc serves them from per-thread pages. `bench/pair.py` measured the difference.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand};

use shardgate::config::{Config, LoadOptions};
use shardgate::server::serve;

mod cli;
use cli::explain::{explain, ExplainArgs};
use cli::rules::RulesArg;
use cli::serve::{LogFormat, OtlpTransport, Serve};
use cli::serve_options::serve_options;
#[cfg(any(feature = "dynamodb", feature = "redis"))]
use cli::stores::{inspect_bucket, InspectArgs};
#[cfg(feature = "dynamodb")]
use cli::stores::{table_create, TableCommand};
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
        /// The same as --config (kept for scripts that give the path alone).
        #[arg(value_name = "PATH")]
        path: Option<PathBuf>,
        #[command(flatten)]
        rules: RulesArg,
        /// Merge documents of one domain, as `serve --merge-domain-config` does.
        #[arg(long, env = "SHARDGATE_MERGE_DOMAIN_CONFIG")]
        merge_domain_config: bool,
    },
    /// Explain one descriptor: the rules it walks through, its bucket and balances, the
    /// answer it would get now (reads the store, never writes).
    Explain(Box<ExplainArgs>),
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

/// Logs to stderr, filtered by RUST_LOG (default: shardgate's own lines at info, the
/// crates it uses at warn); with `export`, the `decision` spans also go to the exporter,
/// through a filter of that layer's own (the log level stays as it is). Colour codes only
/// on a terminal, and never under `NO_COLOR`.
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
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let log = tracing_subscriber::fmt::layer()
        .with_span_events(if spans { FmtSpan::CLOSE } else { FmtSpan::NONE })
        .with_ansi(colours_wanted(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR"),
        ))
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

/// The log filter without RUST_LOG: shardgate's lines at info, its dependencies' at warn
/// (their info and debug lines are about their own workings: HTTP/2 frames, connections).
const DEFAULT_LOG_FILTER: &str = "warn,shardgate=info";

/// Whether to write colour codes: to a terminal only, and not when `NO_COLOR` is set to
/// anything but the empty string (no-color.org).
fn colours_wanted(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
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

/// The runtime answering requests: a multi-thread runtime of `workers` threads (default:
/// tokio's, one per core), or, for one thread, tokio's current-thread scheduler on the
/// main thread (no worker thread beside it to wake). Either way a gRPC connection's
/// calls run inside the connection's own task, so a burst of calls is answered in one
/// write (`server/connection.rs`; bench/README.md, "One task per connection").
fn runtime_with(
    workers: Option<std::num::NonZeroUsize>,
) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut builder = match workers {
        Some(n) if n.get() == 1 => tokio::runtime::Builder::new_current_thread(),
        Some(n) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(n.get());
            builder
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
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
            rules,
            merge_domain_config,
        } => check_config(path, rules, merge_domain_config),
        #[cfg(feature = "dynamodb")]
        Command::Table {
            command: TableCommand::Create { dynamo },
        } => table_create(dynamo),
        #[cfg(any(feature = "dynamodb", feature = "redis"))]
        Command::Inspect(args) => inspect_bucket(*args),
        Command::Serve(args) => serve(args, &upstream),
        Command::Explain(args) => explain(*args),
    }
}

/// `shardgate check-config [PATH | --config PATH]`: OK, or every error.
fn check_config(path: Option<PathBuf>, rules: RulesArg, merge_domains: bool) -> ExitCode {
    let path = match path.map_or_else(|| rules.path(), Ok) {
        Ok(path) => path,
        Err(e) => return fail(e),
    };
    match Config::load_with(&path, &LoadOptions { merge_domains }) {
        Ok(_) => {
            println!("OK");
            ExitCode::SUCCESS
        }
        Err(errors) => fail(errors),
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
    tracing::info!(
        version = shardgate::support::build::VERSION,
        features = shardgate::support::build::FEATURES,
        "shardgate starting"
    );
    if !upstream.refused.is_empty() {
        return fail(format!(
            "envoyproxy/ratelimit settings shardgate cannot follow:\n  {}",
            upstream.refused.join("\n  ")
        ));
    }
    shardgate::upstream_env::log_start_up(upstream);
    let options = match serve_options(*args, export.is_some()) {
        Ok(options) => options,
        Err(code) => return code,
    };
    let served = rt.block_on(serve::run(options));
    // The calls have drained: the spans of the last ones are flushed now, from a
    // blocking thread while this one drives the runtime, so the exporter's connection
    // is driven with one thread (the current-thread scheduler) too.
    #[cfg(feature = "otel")]
    if let Some(export) = export {
        let _ = rt.block_on(rt.spawn_blocking(move || export.shutdown()));
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(e),
    }
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
    use super::{invocation, Cli, Command, Parser};
    use shardgate::server::port_limits::PortLimits;
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
    fn colour_codes_only_on_a_terminal_without_no_color() {
        use super::colours_wanted;
        assert!(colours_wanted(true, None));
        assert!(colours_wanted(true, Some("".into())));
        assert!(!colours_wanted(true, Some("1".into())));
        assert!(!colours_wanted(false, None));
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
        // The flags' names say "envoyproxy/ratelimit compatible"; the first ones stay.
        let renamed = parse(&[
            "--ratelimit-compat-prometheus-addr",
            ":19002",
            "--ratelimit-compat-prometheus-path",
            "/m",
        ])
        .unwrap()
        .unwrap()
        .unwrap();
        assert_eq!(
            (renamed.addr, renamed.path.as_str()),
            ("0.0.0.0:19002".parse().unwrap(), "/m")
        );
    }
}

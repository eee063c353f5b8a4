//! The `shardgate` command line: `serve` and `check-config`. Parsing and dispatch only.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use shardgate::config::Config;
use shardgate::service::server::{self, ServeOptions, StoreKind};

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
    Serve(Serve),
    /// Validate a config file or directory: prints OK, or every error (exit code 1).
    CheckConfig {
        /// A YAML file or a directory of YAML files.
        path: PathBuf,
    },
}

#[derive(Parser)]
struct Serve {
    /// Rate-limit rules: a YAML file or a directory of YAML files.
    #[arg(long, env = "SHARDGATE_CONFIG")]
    config: PathBuf,
    /// Address of the gRPC listener.
    #[arg(long, env = "SHARDGATE_GRPC_ADDR", default_value = "0.0.0.0:8081")]
    grpc_addr: SocketAddr,
    /// Where buckets live.
    #[arg(long, env = "SHARDGATE_STORE", value_enum, default_value_t = Store::Memory)]
    store: Store,
    /// Writes per second one shard item absorbs before its bucket is spread over more
    /// shards (default: unlimited on the memory store).
    #[arg(long, env = "SHARDGATE_PARTITION_WRITE_BUDGET")]
    partition_write_budget: Option<u64>,
    /// Evaluate and report every rule, but never answer OVER_LIMIT.
    #[arg(long, env = "SHARDGATE_GLOBAL_SHADOW_MODE")]
    global_shadow_mode: bool,
    /// Log format.
    #[arg(long, env = "SHARDGATE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, ValueEnum)]
enum Store {
    /// The embedded in-memory store (one process, nothing else to run).
    Memory,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { path } => match Config::load(&path) {
            Ok(_) => {
                println!("OK");
                ExitCode::SUCCESS
            }
            Err(errors) => {
                eprintln!("{errors}");
                ExitCode::FAILURE
            }
        },
        Command::Serve(args) => {
            init_logging(args.log_format);
            let options = ServeOptions {
                config: args.config,
                grpc_addr: args.grpc_addr,
                store: match args.store {
                    Store::Memory => StoreKind::Memory,
                },
                partition_write_budget: args.partition_write_budget,
                global_shadow_mode: args.global_shadow_mode,
            };
            let runtime = match tokio::runtime::Runtime::new() {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(server::run(options)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

//! The command line's store arguments, shared by `serve`, `table create` and `inspect`:
//! which store, how to reach DynamoDB or Redis, and the two administrative commands that
//! read or create the shared store. Parsing and dispatch only: the stores are the
//! library's.

use std::path::PathBuf;
#[cfg(any(feature = "dynamodb", feature = "redis"))]
use std::process::ExitCode;
use std::time::Duration;

#[cfg(feature = "dynamodb")]
use clap::Subcommand;
use clap::{Args, ValueEnum};

#[cfg(feature = "dynamodb")]
use shardgate::store::dynamodb::{self, DynamoOptions, DynamoStore, TableCreated};
#[cfg(any(feature = "dynamodb", feature = "redis"))]
use shardgate::store::key::stored_entity;
#[cfg(feature = "redis")]
use shardgate::store::redis::{RedisMode, RedisOptions, RedisStore, RedisTls};
#[cfg(any(feature = "dynamodb", feature = "redis"))]
use shardgate::store::{inspect, InspectedShard, Name};

#[cfg(any(feature = "dynamodb", feature = "redis"))]
use crate::{fail, runtime_with};

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum Store {
    /// The embedded in-memory store (one process, nothing else to run).
    Memory,
    /// A DynamoDB table shared by a fleet of servers.
    Dynamodb,
    /// A Redis or Valkey (one server or a Cluster) shared by a fleet of servers.
    Redis,
}

#[cfg(feature = "dynamodb")]
#[derive(Subcommand)]
pub(crate) enum TableCommand {
    /// Create the table if it does not exist (on-demand billing, TTL on `ttl`).
    Create {
        #[command(flatten)]
        dynamo: Dynamo,
    },
}

/// Where the DynamoDB table is. Credentials and region come from the standard AWS chain.
#[derive(Args)]
pub(crate) struct Dynamo {
    /// DynamoDB table name.
    #[arg(long, env = "SHARDGATE_TABLE", default_value = "shardgate")]
    pub(crate) table: String,
    /// Endpoint override, for DynamoDB Local only.
    #[arg(long, env = "SHARDGATE_DYNAMODB_ENDPOINT")]
    pub(crate) dynamodb_endpoint: Option<String>,
    /// AWS region (default: from the AWS configuration chain).
    #[arg(long, env = "SHARDGATE_REGION")]
    pub(crate) region: Option<String>,
    /// Key prefix, so several deployments can share one table.
    #[arg(long, env = "SHARDGATE_NAMESPACE", default_value = "default")]
    pub(crate) namespace: String,
    /// The longest one store call may take, retries included, and the deadline of a
    /// caller that sends no `grpc-timeout` (e.g. 1s, 250ms). A caller's own deadline
    /// (Envoy sends its `timeout`) is answered within, less a small margin.
    #[arg(long, env = "SHARDGATE_STORE_TIMEOUT", default_value = "1s", value_parser = super::values::store_timeout)]
    pub(crate) store_timeout: Duration,
}

#[cfg(feature = "dynamodb")]
impl Dynamo {
    /// Options for an administrative command: table creation and reads may take longer
    /// than a request-path call.
    pub(crate) fn admin_options(self) -> DynamoOptions {
        let mut o = self.options();
        o.timeout = o.timeout.max(Duration::from_secs(10));
        o
    }

    pub(crate) fn options(self) -> DynamoOptions {
        DynamoOptions {
            table: self.table,
            namespace: self.namespace,
            endpoint: self.dynamodb_endpoint,
            region: self.region,
            timeout: self.store_timeout,
        }
    }
}

/// Where Redis is (`--store redis`).
#[derive(Args)]
pub(crate) struct Redis {
    /// Redis URL: redis://[user:password@]host:port[/db], rediss://… (TLS) or
    /// unix:///path; for a Cluster, its seed nodes, comma-separated.
    #[arg(
        long,
        env = "SHARDGATE_REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        value_delimiter = ','
    )]
    pub(crate) redis_url: Vec<String>,
    /// `single`, `cluster` or `sentinel` (default: cluster when several URLs are given).
    /// Under `sentinel` the URLs are the Sentinels' (`rediss://`: TLS to the Sentinels and
    /// to the master they name).
    #[arg(long, env = "SHARDGATE_REDIS_MODE", value_enum)]
    pub(crate) redis_mode: Option<RedisModeArg>,
    /// Under `--redis-mode sentinel`: the name of the master the Sentinels watch.
    #[arg(long, env = "SHARDGATE_REDIS_SENTINEL_MASTER")]
    pub(crate) redis_sentinel_master: Option<String>,
    /// Under `--redis-mode sentinel`: the master's `password` or `user:password` (the
    /// Sentinels' own go in their URLs).
    #[arg(long, env = "SHARDGATE_REDIS_MASTER_AUTH", hide_env_values = true)]
    pub(crate) redis_master_auth: Option<String>,
    /// Connections to a single Redis (each pipelines every call sent on it).
    #[arg(long, env = "SHARDGATE_REDIS_POOL_SIZE", default_value_t = 4)]
    pub(crate) redis_pool_size: usize,
    /// PEM CA bundle that signed the Redis server's certificate (default: system roots).
    #[arg(long, env = "SHARDGATE_REDIS_TLS_CA")]
    pub(crate) redis_tls_ca: Option<PathBuf>,
    /// PEM client certificate, for a Redis that requires one (with --redis-tls-client-key).
    #[arg(long, env = "SHARDGATE_REDIS_TLS_CLIENT_CERT")]
    pub(crate) redis_tls_client_cert: Option<PathBuf>,
    /// PEM key of --redis-tls-client-cert.
    #[arg(long, env = "SHARDGATE_REDIS_TLS_CLIENT_KEY")]
    pub(crate) redis_tls_client_key: Option<PathBuf>,
    /// Accept a Redis certificate that does not name the host (the chain is still checked).
    /// Not under Sentinel with TLS (refused: see docs/operations.md).
    #[arg(long, env = "SHARDGATE_REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")]
    pub(crate) redis_tls_skip_hostname_verification: bool,
    /// Allow `#insecure` on a rediss:// URL (no check of Redis's certificate at all).
    #[arg(long, env = "SHARDGATE_REDIS_TLS_ALLOW_INSECURE")]
    pub(crate) redis_tls_allow_insecure: bool,
}

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum RedisModeArg {
    Single,
    Cluster,
    Sentinel,
}

#[cfg(feature = "redis")]
impl Redis {
    pub(crate) fn options(self, namespace: String, timeout: Duration) -> RedisOptions {
        RedisOptions {
            urls: self.redis_url,
            mode: self.redis_mode.map(|m| match m {
                RedisModeArg::Single => RedisMode::Single,
                RedisModeArg::Cluster => RedisMode::Cluster,
                RedisModeArg::Sentinel => RedisMode::Sentinel {
                    master: self.redis_sentinel_master.clone().unwrap_or_default(),
                },
            }),
            master_auth: self.redis_master_auth,
            namespace,
            timeout,
            pool_size: self.redis_pool_size,
            tls: RedisTls {
                ca_file: self.redis_tls_ca,
                client_cert: self.redis_tls_client_cert,
                client_key: self.redis_tls_client_key,
                skip_hostname_verification: self.redis_tls_skip_hostname_verification,
                allow_insecure: self.redis_tls_allow_insecure,
            },
        }
    }
}

/// `shardgate table create`.
#[cfg(feature = "dynamodb")]
pub(crate) fn table_create(dynamo: Dynamo) -> ExitCode {
    let rt = match runtime_with(None) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let options = dynamo.admin_options();
    rt.block_on(async {
        let client = dynamodb::client(&options).await;
        match dynamodb::create_table(&client, &options.table).await {
            Ok(TableCreated::Created) => {
                println!("created table {}", options.table);
                ExitCode::SUCCESS
            }
            Ok(TableCreated::AlreadyExisted) => {
                println!("table {} already exists", options.table);
                ExitCode::SUCCESS
            }
            Err(e) => fail(e),
        }
    })
}

/// `shardgate inspect`: every shard of one bucket, as JSON.
/// `inspect`: which bucket, in which shared store, and how to reach it.
#[cfg(any(feature = "dynamodb", feature = "redis"))]
#[derive(Args)]
pub(crate) struct InspectArgs {
    /// The store to read, as `serve --store` (the same default: the embedded store, which
    /// holds nothing here; set SHARDGATE_STORE, upstream's REDIS_URL, or --store).
    #[arg(long, env = "SHARDGATE_STORE", value_enum, default_value_t = Store::Memory)]
    pub(crate) store: Store,
    #[command(flatten)]
    pub(crate) dynamo: Dynamo,
    #[command(flatten)]
    pub(crate) redis: Redis,
    /// The bucket's entity, as shardgate encodes it (e.g. `tenant=acme/api_key=k1`).
    #[arg(long)]
    pub(crate) entity: String,
    /// The bucket's resource (default resource: the domain).
    #[arg(long)]
    pub(crate) resource: String,
}

#[cfg(any(feature = "dynamodb", feature = "redis"))]
pub(crate) fn inspect_bucket(args: InspectArgs) -> ExitCode {
    let InspectArgs {
        store,
        dynamo,
        redis,
        entity,
        resource,
    } = args;
    // A build with one store reads only that store's arguments.
    #[cfg(not(feature = "redis"))]
    let _ = redis;
    #[cfg(not(feature = "dynamodb"))]
    let _ = dynamo;
    let (entity, resource) = (entity.as_str(), resource.as_str());
    let rt = match runtime_with(None) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    // The bucket's key: a long entity is stored under its digest.
    let stored = stored_entity(Name::new(entity));
    let shards = rt.block_on(async {
        match store {
            #[cfg(feature = "dynamodb")]
            Store::Dynamodb => {
                let store = DynamoStore::connect(&dynamo.admin_options()).await;
                inspect(&store, &stored, resource).await
            }
            #[cfg(feature = "redis")]
            Store::Redis => {
                let timeout = dynamo.store_timeout.max(Duration::from_secs(10));
                let options = redis.options(dynamo.namespace, timeout);
                if let Err(e) = options.validate() {
                    return Err(e.to_string());
                }
                inspect(&RedisStore::new(options), &stored, resource).await
            }
            _ => {
                return Err(
                    "inspect reads a shared store, and the store is the embedded one \
                     (the default): give --store dynamodb or redis, or set SHARDGATE_STORE \
                     (or envoyproxy/ratelimit's REDIS_URL) as the server has it"
                        .into(),
                )
            }
        }
        .map_err(|e| e.to_string())
    });
    match shards {
        Ok(shards) => {
            let out = serde_json::json!({
                "entity": entity,
                "stored_entity": stored.as_str(),
                "resource": resource,
                "shard_count": shards.len(),
                "shards": shards.iter().map(InspectedShard::to_json).collect::<Vec<_>>(),
            });
            println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

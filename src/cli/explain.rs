//! `shardgate explain --config FILE DOMAIN key=value…`: one descriptor explained in
//! words, as `POST /explain` does on a running server — the walk through the rules, the
//! bucket and its balances, the answer a request of one hit would get. With
//! `--store dynamodb` or `redis` the balances are the fleet's (read, never written); on the
//! default embedded store they are those of an empty store. Parsing and dispatch only:
//! the explanation is the library's (`service/explain.rs`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;

use shardgate::config::{Config, LoadOptions};
use shardgate::engine::{Engine, EngineOptions};
use shardgate::service::RateLimiter;
use shardgate::store::memory::MemoryStore;
use shardgate::store::BucketStore;

use super::stores::{Dynamo, Redis, Store};
use crate::{fail, runtime_with};

#[derive(Args)]
pub(crate) struct ExplainArgs {
    /// A YAML file or a directory of YAML files, as `serve --config`.
    #[arg(long, env = "SHARDGATE_CONFIG")]
    config: PathBuf,
    /// Merge documents of one domain, as `serve --merge-domain-config` does.
    #[arg(long, env = "SHARDGATE_MERGE_DOMAIN_CONFIG")]
    merge_domain_config: bool,
    /// The store whose balances to read (default: an empty embedded store).
    #[arg(long, value_enum, default_value_t = Store::Memory)]
    store: Store,
    #[command(flatten)]
    dynamo: Dynamo,
    #[command(flatten)]
    redis: Redis,
    /// The request's domain.
    domain: String,
    /// The descriptor's entries, in order: `key=value` (the value may hold `=`).
    #[arg(required = true, value_parser = entry)]
    entries: Vec<(String, String)>,
}

/// `key=value`, split at the first `=`.
fn entry(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("'{text}' is not key=value")),
    }
}

pub(crate) fn explain(args: ExplainArgs) -> ExitCode {
    let options = LoadOptions {
        merge_domains: args.merge_domain_config,
    };
    let config = match Config::load_with(&args.config, &options) {
        Ok(c) => Arc::new(c),
        Err(errors) => return fail(errors),
    };
    let rt = match runtime_with(None) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let text = rt.block_on(async move { on_store(args, config).await });
    match text {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(e) => fail(e),
    }
}

/// The explanation read from the store `args` names.
async fn on_store(args: ExplainArgs, config: Arc<Config>) -> Result<String, String> {
    let ExplainArgs {
        store,
        dynamo,
        redis,
        domain,
        entries,
        ..
    } = args;
    // A build with one store reads only that store's arguments.
    #[cfg(not(feature = "redis"))]
    let _ = redis;
    #[cfg(not(feature = "dynamodb"))]
    let _ = &dynamo;
    match store {
        Store::Memory => Ok(explained(MemoryStore::new(), config, &domain, &entries).await),
        #[cfg(feature = "dynamodb")]
        Store::Dynamodb => {
            let options = dynamo.admin_options();
            let store = shardgate::store::dynamodb::DynamoStore::connect(&options).await;
            Ok(explained(store, config, &domain, &entries).await)
        }
        #[cfg(feature = "redis")]
        Store::Redis => {
            let timeout = dynamo.store_timeout.max(std::time::Duration::from_secs(10));
            let options = redis.options(dynamo.namespace, timeout);
            options.validate().map_err(|e| e.to_string())?;
            let store = shardgate::store::redis::RedisStore::new(options);
            Ok(explained(store, config, &domain, &entries).await)
        }
        #[allow(unreachable_patterns)]
        _ => Err("this build has no such store".to_string()),
    }
}

async fn explained<S: BucketStore>(
    store: S,
    config: Arc<Config>,
    domain: &str,
    entries: &[(String, String)],
) -> String {
    let engine = Arc::new(Engine::new(Arc::new(store), EngineOptions::default()));
    RateLimiter::new(config, engine)
        .explain(domain, entries)
        .await
}

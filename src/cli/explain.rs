//! `shardgate explain [--config PATH] DOMAIN key=value…`: one descriptor explained in
//! words, as `POST /explain` does on a running server — the walk through the rules, the
//! bucket and its balances, the answer a request of one hit would get. The rules and the
//! store are `serve`'s, from the same flags and variables (`SHARDGATE_CONFIG`,
//! `SHARDGATE_STORE`, upstream's `RUNTIME_ROOT` and `REDIS_*`), so in a server's pod it
//! reads what the server reads. On a shared store (DynamoDB, Redis) the balances are the
//! fleet's (read, never written); on the embedded store they are those of this command's
//! own empty store, and the output says so first. Parsing and dispatch only: the
//! explanation is the library's (`service/explain.rs`).

use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;

use shardgate::config::{Config, LoadOptions};
use shardgate::engine::{Engine, EngineOptions};
use shardgate::service::RateLimiter;
use shardgate::store::memory::MemoryStore;
use shardgate::store::BucketStore;

use super::rules::RulesArg;
use super::stores::{Dynamo, Redis, Store};
use crate::{fail, runtime_with};

#[derive(Args)]
pub(crate) struct ExplainArgs {
    #[command(flatten)]
    rules: RulesArg,
    /// Merge documents of one domain, as `serve --merge-domain-config` does.
    #[arg(long, env = "SHARDGATE_MERGE_DOMAIN_CONFIG")]
    merge_domain_config: bool,
    /// The store whose balances to read, as `serve --store` (the embedded store: an empty
    /// one of this command's own, not a running server's).
    #[arg(long, env = "SHARDGATE_STORE", value_enum, default_value_t = Store::Memory)]
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
    let path = match args.rules.path() {
        Ok(path) => path,
        Err(e) => return fail(e),
    };
    let config = match Config::load_with(&path, &options) {
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

/// Said before an explanation read from the embedded store: its balances are not any
/// server's.
const EMPTY_STORE_NOTE: &str = "balances: an empty embedded store of this command's own, \
     not a running server's (give --store redis or dynamodb, as the server has it, or ask \
     the server: POST /explain on its HTTP port)";

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
        Store::Memory => Ok(format!(
            "{EMPTY_STORE_NOTE}\n{}",
            explained(MemoryStore::new(), config, &domain, &entries).await
        )),
        #[cfg(feature = "dynamodb")]
        Store::Dynamodb => {
            let options = dynamo.admin_options();
            let store = shardgate::store::dynamodb::DynamoStore::connect(&options).await;
            let from = format!(
                "balances: DynamoDB table '{}' (namespace '{}')",
                options.table, options.namespace
            );
            Ok(format!(
                "{from}\n{}",
                explained(store, config, &domain, &entries).await
            ))
        }
        #[cfg(feature = "redis")]
        Store::Redis => {
            let timeout = dynamo.store_timeout.max(std::time::Duration::from_secs(10));
            let from = format!("balances: Redis (namespace '{}')", dynamo.namespace);
            let options = redis.options(dynamo.namespace, timeout);
            options
                .validate()
                .map_err(|e| format!("--store redis: {e}"))?;
            let store = shardgate::store::redis::RedisStore::new(options);
            Ok(format!(
                "{from}\n{}",
                explained(store, config, &domain, &entries).await
            ))
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

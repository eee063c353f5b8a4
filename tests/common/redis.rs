//! Redis for tests: `scripts/test` (and `.ci/run`) start one server and a three-master
//! Cluster with `scripts/redis-local` and export `SHARDGATE_TEST_REDIS_URL` and
//! `SHARDGATE_TEST_REDIS_CLUSTER` (comma-separated seed URLs). Each test gets a namespace
//! of its own, so tests never see each other's items.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use shardgate::store::redis::{RedisMode, RedisOptions, RedisStore, RedisTls, DEFAULT_POOL_SIZE};

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests with scripts/test, which starts Redis")
    })
}

/// The standalone server's URL.
pub fn url() -> String {
    var("SHARDGATE_TEST_REDIS_URL")
}

/// The Cluster's seed URLs.
pub fn cluster_urls() -> Vec<String> {
    var("SHARDGATE_TEST_REDIS_CLUSTER")
        .split(',')
        .map(str::to_string)
        .collect()
}

/// A namespace no other test uses.
pub fn namespace() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "t{}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    )
}

/// The options of a store on `urls` in `mode`, with the defaults a server uses.
pub fn options(urls: Vec<String>, mode: RedisMode) -> RedisOptions {
    RedisOptions {
        urls,
        mode: Some(mode),
        namespace: namespace(),
        timeout: Duration::from_secs(1),
        pool_size: DEFAULT_POOL_SIZE,
        tls: RedisTls::default(),
    }
}

/// A store on the standalone server, in a namespace of its own.
pub async fn store() -> RedisStore {
    RedisStore::new(options(vec![url()], RedisMode::Single))
}

/// A store on the Cluster, in a namespace of its own.
pub async fn cluster_store() -> RedisStore {
    RedisStore::new(options(cluster_urls(), RedisMode::Cluster))
}

/// What an expiry does (Redis's own waits for Redis's clock): deletes every item of the
/// store's namespace whose `ttl` field is at or before `now_s`, on every master. Returns
/// how many.
pub async fn sweep(store: &RedisStore, now_s: i64) -> usize {
    let urls = match store.options().mode() {
        RedisMode::Single => vec![url()],
        RedisMode::Cluster => cluster_urls(),
    };
    let pattern = format!("{{}}{}/*", store.namespace());
    let mut deleted = 0;
    for url in urls {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(&pattern)
            .query_async(&mut conn)
            .await
            .unwrap();
        for k in keys {
            let ttl: Option<i64> = redis::cmd("HGET")
                .arg(&k)
                .arg("ttl")
                .query_async(&mut conn)
                .await
                .unwrap();
            if ttl.is_some_and(|t| t <= now_s) {
                let n: usize = redis::cmd("DEL")
                    .arg(&k)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                deleted += n;
            }
        }
    }
    deleted
}

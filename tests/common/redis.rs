//! Redis for tests: `scripts/test` (and `.ci/run`) start one server and a three-master
//! Cluster with `scripts/redis-local` and export `SHARDGATE_TEST_REDIS_URL` and
//! `SHARDGATE_TEST_REDIS_CLUSTER` (comma-separated seed URLs). Each test gets a namespace
//! of its own, so tests never see each other's items.

use std::time::Duration;

use shardgate::store::redis::{RedisMode, RedisOptions, RedisStore, RedisTls, DEFAULT_POOL_SIZE};
use shardgate::store::{BucketItem, Debit, LimitParams, LimitState, MILLI, WCU_LIMIT};

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

/// The options of a store on `urls` in `mode`, with the defaults a server uses.
pub fn options(urls: Vec<String>, mode: RedisMode) -> RedisOptions {
    RedisOptions {
        urls,
        mode: Some(mode),
        namespace: super::unique_namespace(),
        timeout: Duration::from_secs(1),
        pool_size: DEFAULT_POOL_SIZE,
        tls: RedisTls::default(),
        master_auth: None,
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
        RedisMode::Sentinel { .. } => panic!("the sweep reads the shared servers only"),
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

/// A free loopback port: the kernel's pick, or with `SHARDGATE_TEST_PORTS=LOW-HIGH` (a
/// machine shared by several test runs, each given a range) one of that range not handed
/// out before in this process.
pub fn free_port() -> u16 {
    let Some((low, high)) = std::env::var("SHARDGATE_TEST_PORTS").ok().and_then(|r| {
        let (low, high) = r.split_once('-')?;
        Some((low.parse::<u16>().ok()?, high.parse::<u16>().ok()?))
    }) else {
        return std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
    };
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let port = (low..=high)
        .find(|p| !handed_out.contains(p) && std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port left in SHARDGATE_TEST_PORTS");
    handed_out.push(port);
    port
}

/// The `redis-server` the tests' own servers run: `SHARDGATE_TEST_REDIS_SERVER` (another
/// version's binary: Redis 6, Valkey), else Debian's on the `PATH`.
pub fn server_binary() -> String {
    std::env::var("SHARDGATE_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into())
}

/// A `redis-server` of the test's own on a free loopback port (for faults and TLS, which
/// must not touch the shared servers): stopped when dropped.
pub struct LocalRedis {
    pub port: u16,
    dir: tempfile::TempDir,
    args: Vec<String>,
    child: Option<std::process::Child>,
}

impl LocalRedis {
    /// Starts one with these extra arguments; waits until it listens.
    pub fn start(args: &[&str]) -> LocalRedis {
        LocalRedis::start_on(free_port(), args)
    }

    /// A free port whose Cluster bus port (+ 10000) is free too.
    pub fn free_port_with_bus() -> u16 {
        loop {
            let port = free_port();
            if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
                return port;
            }
        }
    }

    /// Whether it is running (not killed).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Starts one on `port` with these extra arguments; waits until it listens.
    pub fn start_on(port: u16, args: &[&str]) -> LocalRedis {
        let mut redis = LocalRedis {
            port,
            dir: tempfile::tempdir().unwrap(),
            args: args.iter().map(|a| a.to_string()).collect(),
            child: None,
        };
        redis.restart();
        redis
    }

    /// The directory it runs in (certificates may go there).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Starts it again on the same port (after [`LocalRedis::kill`]).
    pub fn restart(&mut self) {
        let tls = self.args.iter().any(|a| a == "--tls-port");
        let mut cmd = std::process::Command::new(server_binary());
        if tls {
            cmd.args(["--port", "0", "--tls-port", &self.port.to_string()]);
        } else {
            cmd.args(["--port", &self.port.to_string()]);
        }
        cmd.args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(self.args.iter().filter(|a| *a != "--tls-port"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        self.child = Some(
            cmd.spawn()
                .expect("redis-server (Debian: apt-get install redis-server)"),
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not listen"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills it (SIGKILL: nothing saved, connections reset).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// One command on a connection of its own (plain TCP only).
    pub async fn cmd(&self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        let client = redis::Client::open(self.url())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query_async(&mut conn).await
    }
}

impl Drop for LocalRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The `rpm` limit of [`full_item`]: `per_minute` a minute, a burst of as many.
pub fn rpm(per_minute: u64) -> LimitParams {
    LimitParams::new(per_minute, per_minute, 60_000)
}

/// A one-shard item written at `now_s`, its `rpm` limit ([`rpm`]) full, with the
/// `wcu` budget, expiring 10 minutes later.
pub fn full_item(per_minute: u64, now_s: i64) -> BucketItem {
    let tokens = i64::try_from(per_minute).expect("a test's rate") * MILLI;
    let wcu = LimitParams::new(1_000, 1_000, 1_000);
    BucketItem {
        refilled_at: now_s * 1_000,
        shard_count: 1,
        count_raised_at: 0,
        ttl: Some(now_s + 600),
        limits: [
            ("rpm", LimitState::new(rpm(per_minute), tokens, 0)),
            (WCU_LIMIT, LimitState::new(wcu, 1_000 * MILLI, 0)),
        ]
        .into_iter()
        .collect(),
    }
}

/// A debit of one `rpm` token, gated, with the limit's parameters.
pub fn one_token(per_minute: u64) -> Vec<Debit> {
    vec![Debit {
        limit: "rpm".into(),
        amount: MILLI,
        gated: true,
        params: Some(rpm(per_minute)),
    }]
}

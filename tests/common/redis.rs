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

/// A free loopback port (see [`super::serve_process::free_port`]).
pub fn free_port() -> u16 {
    super::serve_process::free_port()
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

    /// Starts a Cluster-enabled node (config file `nodes.conf` in its own dir) with these
    /// extra arguments. Its bus port is a free port of its own (`--cluster-port`, Redis 7+),
    /// not the node's port + 10000: that one may lie in the kernel's ephemeral range, where
    /// a parallel test's outgoing connection can take it first.
    pub fn start_cluster_node(extra: &[&str]) -> LocalRedis {
        let bus = free_port().to_string();
        let mut args = vec!["--cluster-enabled", "yes", "--cluster-config-file"];
        args.extend(["nodes.conf", "--cluster-port", &bus]);
        args.extend_from_slice(extra);
        LocalRedis::start_on(free_port(), &args)
    }

    /// The Cluster bus port it was started with (`--cluster-port`), if any.
    pub fn bus_port(&self) -> Option<u16> {
        let at = self.args.iter().position(|a| a == "--cluster-port")?;
        self.args.get(at + 1)?.parse().ok()
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
            .args(self.args.iter().filter(|a| *a != "--tls-port"));
        // Its log, kept to say why when it does not listen (a port taken, an argument
        // this version refuses).
        let log_path = self.dir.path().join("redis.log");
        let log = std::fs::File::create(&log_path).expect("redis.log");
        cmd.stdout(log.try_clone().expect("redis.log")).stderr(log);
        let mut child = cmd
            .spawn()
            .expect("redis-server (Debian: apt-get install redis-server)");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            let exited = child.try_wait().ok().flatten();
            if exited.is_some() || std::time::Instant::now() >= deadline {
                let _ = child.kill();
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                panic!(
                    "redis-server did not listen on {} (exit: {exited:?}); its log ends: {:?}",
                    self.port,
                    tail.into_iter().rev().collect::<Vec<_>>()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.child = Some(child);
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

//! The Redis store's own edges, on real `redis-server` processes: what the callers get
//! when Redis is killed and restarted, paused, busy with a runaway script, full
//! (`maxmemory`), or holds a key of another type; a Sentinel failover and a Cluster master
//! killed mid-load (served again by the promoted replica, and no more admitted than the
//! bound); TLS (a CA, a required client certificate) and passwords; Sentinel over TLS
//! (`scripts/redis-local sentinel-tls`: `shardgate serve` processes, by flags and by
//! upstream's variables, sharing a limit with client certificates required, then
//! following a failover; one without a certificate; a wrong CA); the key's own expiry
//! following the item's `ttl`; and a bucket's shards spread over a Cluster's masters. The
//! contract's conditions are `store_conformance.rs`'s, on every store.

#![cfg(feature = "redis")]
// The decision future of a RateLimiter on a Redis store, spawned, is deep for the Send check.
#![recursion_limit = "256"]

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::redis::{options, LocalRedis};
use common::serve_process::ServeProcess;
use common::tls_sentinel::TlsSentinel;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use shardgate::store::breaker::{Breaker, CircuitState};
use shardgate::store::redis::{RedisMode, RedisStore};
use shardgate::store::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Debit, DebitMode, DebitOutcome, StoreError,
    Write, MILLI,
};

const NOW_S: i64 = 1_800_000_000;

fn key(entity: &str, shard: u32) -> BucketKey {
    BucketKey::new(entity, "api", shard)
}

fn item() -> BucketItem {
    common::redis::full_item(10, NOW_S)
}

fn one_token() -> Vec<Debit> {
    common::redis::one_token(10)
}

const FAST: DebitMode = DebitMode::Fast {
    now_s: NOW_S,
    shard_count: 1,
};

fn store_on(url: String, timeout: Duration) -> RedisStore {
    let mut o = options(vec![url], RedisMode::Single);
    o.timeout = timeout;
    RedisStore::new(o)
}

async fn create<S: BucketStore>(s: &S, k: BucketKey) {
    let out = s
        .commit(&[Write::Create {
            key: k,
            item: item(),
        }])
        .await
        .unwrap();
    assert_eq!(out, CommitOutcome::Committed);
}

#[tokio::test]
async fn a_key_of_another_type_is_that_requests_error_and_never_trips_the_breaker() {
    let redis = LocalRedis::start(&[]);
    let store = store_on(redis.url(), Duration::from_secs(1));
    let rk = format!("{{}}{}/BUCKET#squatter#api#0", store.namespace());
    redis.cmd(&["SET", &rk, "not a hash"]).await.unwrap();
    let breaker = Breaker::new(store, 5, Duration::from_secs(60));
    for _ in 0..20 {
        let err = breaker
            .debit(&key("squatter", 0), &one_token(), FAST)
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
        assert!(!err.is_fault(), "{err}");
        assert!(err.to_string().len() < 600, "{err}");
    }
    assert_eq!(breaker.state(), CircuitState::Closed);
    // Another bucket is served meanwhile.
    create(&breaker, key("neighbour", 0)).await;
    let out = breaker
        .debit(&key("neighbour", 0), &one_token(), FAST)
        .await;
    assert!(matches!(out, Ok(DebitOutcome::Applied(_))), "{out:?}");
}

/// `EVALSHA` calls the server has run since its stats were reset.
async fn scripts_run(redis: &LocalRedis) -> u64 {
    let info = redis.cmd(&["INFO", "commandstats"]).await.unwrap();
    let info: String = redis::from_redis_value(info).unwrap();
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .map(|l| l.split(',').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

#[tokio::test]
async fn debits_waiting_together_leave_as_one_script_and_each_keeps_its_own_answer() {
    let redis = LocalRedis::start(&[]);
    let store = store_on(redis.url(), Duration::from_secs(5));
    store.warm_up().await.unwrap();
    for i in 0..16 {
        create(&store, key(&format!("b{i}"), 0)).await;
    }
    let rk = format!("{{}}{}/BUCKET#squatter#api#0", store.namespace());
    redis.cmd(&["SET", &rk, "not a hash"]).await.unwrap();
    // The script loaded once, so that the count below is of debits only.
    let _ = store
        .debit(&key("b0", 0), &one_token(), FAST)
        .await
        .unwrap();
    redis.cmd(&["CONFIG", "RESETSTAT"]).await.unwrap();

    let one = one_token();
    let mut calls: Vec<_> = (0..16)
        .map(|i| key(&format!("b{i}"), 0))
        .chain([key("squatter", 0), key("missing", 0)])
        .collect();
    calls.rotate_left(5);
    let outcomes =
        futures::future::join_all(calls.iter().map(|k| store.debit(k, &one, FAST))).await;
    for (k, outcome) in calls.iter().zip(outcomes) {
        match k.entity.as_str() {
            "squatter" => {
                let err = outcome.unwrap_err();
                assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
                assert!(err.to_string().contains("WRONGTYPE"), "{err}");
            }
            "missing" => assert_eq!(outcome.unwrap(), DebitOutcome::Refused(None)),
            "b0" => {
                let DebitOutcome::Applied(after) = outcome.unwrap() else {
                    panic!("b0 should apply");
                };
                assert_eq!(after.limits["rpm"].taken, 2 * MILLI, "its second token");
            }
            _ => {
                let DebitOutcome::Applied(after) = outcome.unwrap() else {
                    panic!("{k} should apply");
                };
                assert_eq!(after.limits["rpm"].taken, MILLI, "{k}");
            }
        }
    }
    // 18 debits queued in one poll: sent in one script (one more if the sender ran
    // between two of them), not 18.
    let scripts = scripts_run(&redis).await;
    assert!(
        (1..=2).contains(&scripts),
        "{scripts} scripts for 18 debits"
    );
    // Each item holds what its answer said.
    let stored = store.read(&[key("b3", 0)]).await.unwrap()[0]
        .clone()
        .unwrap();
    assert_eq!(stored.limits["rpm"].taken, MILLI);
}

#[tokio::test]
async fn a_killed_redis_is_an_outage_and_a_restarted_one_serves_again() {
    let mut redis = LocalRedis::start(&[]);
    let store = store_on(redis.url(), Duration::from_millis(500));
    create(&store, key("k", 0)).await;
    assert!(matches!(
        store.debit(&key("k", 0), &one_token(), FAST).await,
        Ok(DebitOutcome::Applied(_))
    ));
    redis.kill();
    let started = Instant::now();
    let err = store
        .debit(&key("k", 0), &one_token(), FAST)
        .await
        .unwrap_err();
    assert!(err.is_fault(), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "answered within its timeout: {:?}",
        started.elapsed()
    );
    // A restarted Redis has lost the items (nothing persisted) and the scripts: the
    // connection comes back, the scripts are loaded again, the bucket is created anew.
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match store.debit(&key("k", 0), &one_token(), FAST).await {
            Ok(DebitOutcome::Refused(None)) => break,
            Ok(other) => panic!("the restarted Redis holds nothing: {other:?}"),
            Err(e) if Instant::now() < deadline => {
                assert!(e.is_fault(), "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("not served again after a restart: {e}"),
        }
    }
    create(&store, key("k", 0)).await;
    assert!(matches!(
        store.debit(&key("k", 0), &one_token(), FAST).await,
        Ok(DebitOutcome::Applied(_))
    ));
}

#[tokio::test]
async fn a_paused_redis_is_cut_at_the_store_timeout() {
    let redis = LocalRedis::start(&[]);
    let store = store_on(redis.url(), Duration::from_millis(300));
    create(&store, key("k", 0)).await;
    redis
        .cmd(&["CLIENT", "PAUSE", "3000", "ALL"])
        .await
        .unwrap();
    let started = Instant::now();
    let err = store
        .debit(&key("k", 0), &one_token(), FAST)
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(err.is_fault(), "{err}");
    assert!(took < Duration::from_millis(2_500), "{took:?}");
}

#[tokio::test]
async fn a_full_redis_refuses_writes_as_an_outage_and_writes_nothing() {
    let redis = LocalRedis::start(&["--maxmemory-policy", "noeviction"]);
    let store = store_on(redis.url(), Duration::from_secs(1));
    create(&store, key("before", 0)).await;
    // Someone else's data, then a `maxmemory` below what Redis already holds: full.
    let filler = "x".repeat(1_024);
    for i in 0..2_000 {
        redis
            .cmd(&["SET", &format!("filler{i}"), &filler])
            .await
            .unwrap();
    }
    redis
        .cmd(&["CONFIG", "SET", "maxmemory", "1mb"])
        .await
        .unwrap();
    let err = store
        .commit(&[Write::Create {
            key: key("after", 0),
            item: item(),
        }])
        .await
        .unwrap_err();
    assert!(err.is_fault(), "{err}");
    assert!(err.to_string().contains("OOM"), "{err}");
    let err = store
        .debit(&key("before", 0), &one_token(), FAST)
        .await
        .unwrap_err();
    assert!(err.is_fault(), "a script that writes is refused too: {err}");
    let images = store
        .read(&[key("before", 0), key("after", 0)])
        .await
        .unwrap();
    assert_eq!(
        images[0].as_ref().unwrap().limits["rpm"].balance,
        10 * MILLI
    );
    assert_eq!(images[1], None);
}

#[tokio::test]
async fn a_password_protected_redis_needs_its_password() {
    let redis = LocalRedis::start(&["--requirepass", "s3cret"]);
    let with = store_on(
        format!("redis://:s3cret@127.0.0.1:{}", redis.port),
        Duration::from_secs(1),
    );
    create(&with, key("k", 0)).await;
    let without = store_on(redis.url(), Duration::from_secs(1));
    let err = without.read(&[key("k", 0)]).await.unwrap_err();
    assert!(err.is_fault(), "{err}");
    assert!(!err.to_string().contains("s3cret"), "{err}");
}

#[tokio::test]
async fn tls_with_a_ca_and_a_required_client_certificate() {
    let pki = common::tls::Pki::new("redis");
    let (cert, key_pem) = pki.leaf(&["localhost", "127.0.0.1"]);
    let (client_cert, client_key) = pki.leaf(&["shardgate"]);
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str, text: &str| common::tls::write(dir.path(), name, text);
    let (ca, cert, key_file) = (
        path("ca.pem", &pki.ca_pem),
        path("cert.pem", &cert),
        path("key.pem", &key_pem),
    );
    let (client_cert, client_key) = (
        path("client.pem", &client_cert),
        path("client-key.pem", &client_key),
    );
    let redis = LocalRedis::start(&[
        "--tls-port",
        "--tls-cert-file",
        cert.to_str().unwrap(),
        "--tls-key-file",
        key_file.to_str().unwrap(),
        "--tls-ca-cert-file",
        ca.to_str().unwrap(),
        "--tls-auth-clients",
        "yes",
    ]);
    let tls_store = |with_client: bool| {
        let mut o = options(
            vec![format!("rediss://localhost:{}", redis.port)],
            RedisMode::Single,
        );
        o.tls.ca_file = Some(ca.clone());
        if with_client {
            o.tls.client_cert = Some(client_cert.clone());
            o.tls.client_key = Some(client_key.clone());
        }
        RedisStore::new(o)
    };
    let store = tls_store(true);
    create(&store, key("k", 0)).await;
    assert!(matches!(
        store.debit(&key("k", 0), &one_token(), FAST).await,
        Ok(DebitOutcome::Applied(_))
    ));
    let err = tls_store(false).read(&[key("k", 0)]).await.unwrap_err();
    assert!(err.is_fault(), "no client certificate: {err}");
    // The system's roots do not know the test CA.
    let mut o = options(
        vec![format!("rediss://localhost:{}", redis.port)],
        RedisMode::Single,
    );
    o.tls.client_cert = Some(client_cert.clone());
    o.tls.client_key = Some(client_key.clone());
    let err = RedisStore::new(o).read(&[key("k", 0)]).await.unwrap_err();
    assert!(err.is_fault(), "an unknown CA: {err}");
}

#[tokio::test]
#[cfg_attr(not(redis_local), ignore = "needs Redis: run scripts/test")]
async fn the_keys_expiry_follows_the_items_ttl_plus_a_grace() {
    let store = common::redis::store().await;
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let mut it = item();
    it.ttl = Some(now_s + 600);
    let out = store
        .commit(&[Write::Create {
            key: key("ttl", 0),
            item: it,
        }])
        .await
        .unwrap();
    assert_eq!(out, CommitOutcome::Committed);
    let client = redis::Client::open(common::redis::url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let rk = format!("{{}}{}/BUCKET#ttl#api#0", store.namespace());
    let at: i64 = redis::cmd("EXPIRETIME")
        .arg(&rk)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(at, now_s + 600 + 60);

    // A key whose expiry was taken away (a `PERSIST` by hand, or an item that never
    // expired under its old rule) gets one back from the next slow pass's update.
    let _: i64 = redis::cmd("PERSIST")
        .arg(&rk)
        .query_async(&mut conn)
        .await
        .unwrap();
    let update = Write::Update {
        key: key("ttl", 0),
        expected_refilled_at: item().refilled_at,
        refilled_at: item().refilled_at + 1,
        ttl: Some(now_s + 900),
        shard_count: None,
        limits: vec![],
    };
    assert_eq!(
        store.commit(&[update]).await.unwrap(),
        CommitOutcome::Committed
    );
    let at: i64 = redis::cmd("EXPIRETIME")
        .arg(&rk)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(at, now_s + 900 + 60, "the expiry is back");
}

#[tokio::test]
#[cfg_attr(not(redis_local), ignore = "needs a Redis Cluster: run scripts/test")]
async fn a_buckets_shards_spread_over_the_clusters_masters() {
    let store = common::redis::cluster_store().await;
    for shard in 0..8 {
        create(&store, key("hot", shard)).await;
    }
    let pattern = format!("{{}}{}/BUCKET#hot#api#*", store.namespace());
    let mut masters_holding = 0;
    for url in common::redis::cluster_urls() {
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(&pattern)
            .query_async(&mut conn)
            .await
            .unwrap();
        if !keys.is_empty() {
            masters_holding += 1;
        }
    }
    assert_eq!(masters_holding, 3, "8 shards on 3 masters");
}

/// A Sentinel watching `master_port` as `mymaster`, quick to fail over.
struct Sentinel {
    port: u16,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    fn start(master_port: u16) -> Sentinel {
        let port = common::redis::free_port();
        let dir = tempfile::tempdir().unwrap();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor mymaster 127.0.0.1 {master_port} 1\n\
                 sentinel down-after-milliseconds mymaster 500\n\
                 sentinel failover-timeout mymaster 2000\n",
                dir.path().display()
            ),
        )
        .unwrap();
        let child = std::process::Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-sentinel did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        Sentinel {
            port,
            child,
            _dir: dir,
        }
    }

    async fn master_port(&self) -> Option<u16> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", self.port)).ok()?;
        let mut conn = client.get_multiplexed_async_connection().await.ok()?;
        let addr: Vec<String> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg("mymaster")
            .query_async(&mut conn)
            .await
            .ok()?;
        addr.get(1)?.parse().ok()
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn under_sentinel_a_failover_moves_the_store_to_the_promoted_replica() {
    let mut master = LocalRedis::start(&[]);
    let replica_of = master.port.to_string();
    let replica = LocalRedis::start(&["--replicaof", "127.0.0.1", &replica_of]);
    let sentinel = Sentinel::start(master.port);
    let mut o = options(
        vec![format!("redis://127.0.0.1:{}", sentinel.port)],
        RedisMode::Sentinel {
            master: "mymaster".into(),
        },
    );
    o.timeout = Duration::from_millis(500);
    let store = RedisStore::new(o);
    create(&store, key("k", 0)).await;
    assert!(matches!(
        store.debit(&key("k", 0), &one_token(), FAST).await,
        Ok(DebitOutcome::Applied(_))
    ));
    // The replica has the item before the master dies.
    let deadline = Instant::now() + Duration::from_secs(10);
    while master.cmd(&["WAIT", "1", "300"]).await != Ok(redis::Value::Int(1)) {
        assert!(Instant::now() < deadline, "the replica never caught up");
    }
    master.kill();
    let deadline = Instant::now() + Duration::from_secs(30);
    while sentinel.master_port().await != Some(replica.port) {
        assert!(
            Instant::now() < deadline,
            "Sentinel never promoted the replica"
        );
        // Meanwhile every call is an outage, answered within its timeout.
        if let Err(e) = store.debit(&key("k", 0), &one_token(), FAST).await {
            assert!(e.is_fault(), "{e}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The store finds the new master by itself; the item survived with both debits.
    let deadline = Instant::now() + Duration::from_secs(10);
    let image = loop {
        match store.debit(&key("k", 0), &one_token(), FAST).await {
            Ok(DebitOutcome::Applied(image)) => break image,
            Ok(other) => panic!("the promoted replica holds the item: {other:?}"),
            Err(e) if Instant::now() < deadline => {
                assert!(e.is_fault(), "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("not served after the failover: {e}"),
        }
    };
    assert!(image.limits["rpm"].balance <= 8 * MILLI, "{image:?}");
}

/// `EVALSHA` and `EVAL` calls `redis` has run.
async fn scripts_and_bodies_run(redis: &LocalRedis) -> u64 {
    let info = redis.cmd(&["INFO", "commandstats"]).await.unwrap();
    let info: String = redis::from_redis_value(info).unwrap();
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("cmdstat_evalsha:calls=")
                .or_else(|| l.strip_prefix("cmdstat_eval:calls="))
        })
        .map(|l| l.split(',').next().unwrap().parse::<u64>().unwrap())
        .sum()
}

/// A failover the old master does not notice (`SENTINEL FAILOVER`, the master up):
/// Sentinel promotes the replica, names it within a second, and demotes the old master
/// only when it next hears from it, about 10 s later; until then the old master takes
/// every write, and loses them all when it resyncs. The store follows the Sentinels'
/// switch (it asks them every 500 ms), not the demotion: before, its writes went on
/// landing on the old master until it was demoted.
#[tokio::test]
async fn under_sentinel_a_failover_is_followed_when_the_sentinels_switch_not_when_the_old_master_is_demoted(
) {
    let master = LocalRedis::start(&[]);
    let replica = LocalRedis::start(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
    let sentinel = Sentinel::start(master.port);
    let mut o = options(
        vec![format!("redis://127.0.0.1:{}", sentinel.port)],
        RedisMode::Sentinel {
            master: "mymaster".into(),
        },
    );
    o.timeout = Duration::from_millis(500);
    let store = RedisStore::new(o);
    create(&store, key("k", 0)).await;
    let client = redis::Client::open(format!("redis://127.0.0.1:{}", sentinel.port)).unwrap();
    let mut to_sentinel = client.get_multiplexed_async_connection().await.unwrap();
    // The Sentinel must know the replica (from the master's INFO) before it can promote it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out: redis::RedisResult<String> = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg("mymaster")
            .query_async(&mut to_sentinel)
            .await;
        match out {
            Ok(_) => break,
            Err(e) => assert!(Instant::now() < deadline, "no failover: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let failover = Instant::now();
    while sentinel.master_port().await != Some(replica.port) {
        assert!(
            failover.elapsed() < Duration::from_secs(20),
            "the Sentinel never named the replica"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let switched = failover.elapsed();
    let before = scripts_and_bodies_run(&replica).await;
    let followed = loop {
        let _ = store.debit(&key("k", 0), &one_token(), FAST).await;
        if scripts_and_bodies_run(&replica).await > before {
            break failover.elapsed();
        }
        assert!(
            failover.elapsed() < switched + Duration::from_secs(3),
            "no write on the promoted replica 3 s after the Sentinel named it \
             (named {switched:?} after the failover)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let old_role: String = redis::from_redis_value(match master.cmd(&["ROLE"]).await.unwrap() {
        redis::Value::Array(parts) => parts[0].clone(),
        other => other,
    })
    .unwrap();
    println!(
        "failover: the Sentinel named the replica after {switched:?}, the store wrote there \
         after {followed:?}; the old master's role then: {old_role}"
    );
}

/// The rules of the Sentinel servers: 5 an hour per user, a burst of 5.
const SENTINEL_RULES: &str =
    "domain: sentinel\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 5}\n";

/// Under Sentinel with `tls-auth-clients yes`: the Sentinel and the master it names both
/// require a client certificate, given by our flags or by upstream's variables.
#[tokio::test]
async fn under_sentinel_over_tls_servers_share_a_limit_through_the_master_the_sentinel_names() {
    let redis = TlsSentinel::start("yes");
    let sentinel_url = format!("rediss://127.0.0.1:{}", redis.sentinel);
    let ca = redis.ca.to_str().unwrap();
    let namespace = common::unique_namespace();
    let dirs = [(); 3].map(|_| tempfile::tempdir().unwrap());
    let by_flags_args = |certificate: bool| {
        let mut args = vec![
            "--store",
            "redis",
            "--redis-mode",
            "sentinel",
            "--redis-sentinel-master",
            "mymaster",
            "--redis-url",
            &sentinel_url,
            "--redis-tls-ca",
            ca,
            "--namespace",
            &namespace,
            "--log-format",
            "json",
        ];
        if certificate {
            args.extend([
                "--redis-tls-client-cert",
                redis.client.cert(),
                "--redis-tls-client-key",
                redis.client.key(),
            ]);
        }
        args
    };
    // One server by our flags, the other by an upstream Deployment's variables; the
    // same namespace, so the same buckets.
    let mut by_flags = ServeProcess::start(
        dirs[0].path(),
        "flags",
        &[SENTINEL_RULES],
        &by_flags_args(true),
        &[],
    );
    let upstream_url = format!("mymaster,127.0.0.1:{}", redis.sentinel);
    let mut by_upstream_env = ServeProcess::start(
        dirs[1].path(),
        "upstream",
        &[SENTINEL_RULES],
        &[],
        &[
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", &upstream_url),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", ca),
            ("REDIS_TLS_CLIENT_CERT", redis.client.cert()),
            ("REDIS_TLS_CLIENT_KEY", redis.client.key()),
            ("CACHE_KEY_PREFIX", &namespace),
        ],
    );
    // A third without a certificate: the Sentinel refuses its handshake.
    let mut without = ServeProcess::start(
        dirs[2].path(),
        "without",
        &[SENTINEL_RULES],
        &by_flags_args(false),
        &[],
    );
    by_flags.ready().await;
    by_upstream_env.ready().await;
    let started = Instant::now();
    let mut clients = [by_flags.client().await, by_upstream_env.client().await];
    let mut admitted = 0u64;
    for i in 0..12 {
        let answer = clients[i % 2]
            .should_rate_limit(common::server::one("sentinel", &[("user", "ada")]))
            .await
            .expect("answered")
            .into_inner();
        if answer.overall_code == Code::Ok as i32 {
            admitted += 1;
        }
    }
    // 5 an hour, a burst of 5: 5 admitted, plus what refilled while the test ran (one
    // token per 12 minutes), whatever the machine's speed.
    let refilled = started.elapsed().as_secs() * 5 / 3_600;
    assert!(
        (5..=5 + refilled).contains(&admitted),
        "admitted {admitted} of 12 across two servers sharing one bucket"
    );
    // The bucket is on the master and reached the replica over TLS replication.
    let pattern = format!("{{}}{namespace}/BUCKET#*");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !redis
        .cli(redis.replica, &["--scan", "--pattern", &pattern])
        .contains("user=ada")
    {
        assert!(
            Instant::now() < deadline,
            "the replica never got the bucket"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A failover over TLS: the Sentinel promotes the replica, and each server finds it
    // by itself (a write refused by the demoted master is an outage, so it asks again).
    let scripts_before =
        common::tls_sentinel::evalsha_calls(&redis.cli(redis.replica, &["INFO", "commandstats"]));
    let failover = redis.cli(redis.sentinel, &["SENTINEL", "FAILOVER", "mymaster"]);
    assert!(failover.contains("OK"), "{failover}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(redis.cli(redis.replica, &["ROLE"]).starts_with("master")
        && redis.cli(redis.master, &["ROLE"]).starts_with("slave"))
    {
        assert!(Instant::now() < deadline, "the replica was never promoted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A bucket of its own: any answer for it came from the store (no rejection cached).
    let mut answered = [false; 2];
    let mut admitted = 0u64;
    let started = Instant::now();
    let deadline = started + Duration::from_secs(30);
    while answered.contains(&false) {
        assert!(
            Instant::now() < deadline,
            "answered after the failover: {answered:?}\n{}\n{}",
            by_flags.log(),
            by_upstream_env.log()
        );
        for (i, client) in clients.iter_mut().enumerate() {
            match client
                .should_rate_limit(common::server::one("sentinel", &[("user", "grace")]))
                .await
            {
                Ok(answer) => {
                    answered[i] = true;
                    admitted += u64::from(answer.get_ref().overall_code == Code::Ok as i32);
                }
                // Until it has found the new master: the store's outage, failing closed.
                Err(status) => assert_eq!(status.code(), tonic::Code::Unavailable, "{status}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let refilled = started.elapsed().as_secs() * 5 / 3_600;
    assert!(
        (1..=5 + refilled).contains(&admitted),
        "admitted {admitted}"
    );
    let scripts_after =
        common::tls_sentinel::evalsha_calls(&redis.cli(redis.replica, &["INFO", "commandstats"]));
    assert!(
        scripts_after >= scripts_before + 2,
        "the promoted replica ran {scripts_before} then {scripts_after} scripts"
    );

    let error = without.store_warning().await;
    assert!(error.contains("Sentinel"), "{error}");
    assert!(error.contains("CertificateRequired"), "{error}");
    assert!(error.len() < 200, "{} bytes: {error}", error.len());
    assert_ne!(without.health(), Some(200), "serving without its store");
}

#[tokio::test]
async fn under_sentinel_over_tls_a_wrong_ca_is_a_short_clear_error_and_never_serving() {
    let redis = TlsSentinel::start("optional");
    let other = common::tls::Pki::new("another");
    let dir = tempfile::tempdir().unwrap();
    let wrong_ca = common::tls::write(dir.path(), "other-ca.pem", &other.ca_pem);
    let mut server = ServeProcess::start(
        dir.path(),
        "wrong-ca",
        &[SENTINEL_RULES],
        &[
            "--store",
            "redis",
            "--redis-mode",
            "sentinel",
            "--redis-sentinel-master",
            "mymaster",
            "--redis-url",
            &format!("rediss://127.0.0.1:{}", redis.sentinel),
            "--redis-tls-ca",
            wrong_ca.to_str().unwrap(),
            "--log-format",
            "json",
        ],
        &[],
    );
    let error = server.store_warning().await;
    assert!(error.contains("Sentinel"), "{error}");
    assert!(error.contains("UnknownIssuer"), "{error}");
    assert!(error.len() < 200, "{} bytes: {error}", error.len());
    assert_ne!(server.health(), Some(200), "serving without its store");
}

/// A Cluster of the test's own: three masters, each with a replica, that fails a master
/// over within a second or two.
struct FailoverCluster {
    nodes: Vec<LocalRedis>,
}

impl FailoverCluster {
    fn start() -> FailoverCluster {
        let mut nodes = Vec::new();
        while nodes.len() < 6 {
            nodes.push(LocalRedis::start_cluster_node(&[
                "--cluster-node-timeout",
                "1000",
            ]));
        }
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = std::process::Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = FailoverCluster { nodes };
        cluster.wait_ok(Duration::from_secs(20));
        // A replica promoted before its first sync would be refused (its data too old):
        // wait until every replica has synced with its master.
        let deadline = Instant::now() + Duration::from_secs(20);
        for n in &cluster.nodes {
            while Self::cli(n.port, &["INFO", "replication"]).contains("role:slave")
                && !Self::cli(n.port, &["INFO", "replication"]).contains("master_link_status:up")
            {
                assert!(Instant::now() < deadline, "a replica never synced");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        cluster
    }

    fn cli(port: u16, args: &[&str]) -> String {
        let out = std::process::Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Until every live node says `cluster_state:ok` and knows three masters.
    fn wait_ok(&self, patience: Duration) {
        let deadline = Instant::now() + patience;
        loop {
            let ok = self
                .nodes
                .iter()
                .filter(|n| n.is_running())
                .all(|n| Self::cli(n.port, &["CLUSTER", "INFO"]).contains("cluster_state:ok"));
            if ok {
                return;
            }
            assert!(Instant::now() < deadline, "the cluster is not ok");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    /// The node serving `redis_key` as master.
    fn master_of(&mut self, redis_key: &str) -> &mut LocalRedis {
        let port = self.nodes[0].port;
        let slot: u16 = Self::cli(port, &["CLUSTER", "KEYSLOT", redis_key])
            .trim()
            .parse()
            .unwrap();
        let nodes = Self::cli(port, &["CLUSTER", "NODES"]);
        let owner = nodes
            .lines()
            .find(|l| {
                l.contains("master")
                    && l.split_whitespace().skip(8).any(|range| {
                        let (a, b) = range.split_once('-').unwrap_or((range, range));
                        match (a.parse::<u16>(), b.parse::<u16>()) {
                            (Ok(a), Ok(b)) => (a..=b).contains(&slot),
                            _ => false,
                        }
                    })
            })
            .expect("a master serves the slot");
        let addr = owner.split_whitespace().nth(1).unwrap();
        let owner_port: u16 = addr.split(['@', ':']).nth(1).unwrap().parse().unwrap();
        self.nodes
            .iter_mut()
            .find(|n| n.port == owner_port)
            .unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_master_killed_mid_load_fails_over_and_admits_no_more_than_the_bound() {
    use shardgate::config::Config;
    use shardgate::engine::{Engine, EngineOptions, RandomDraw, SystemClock};
    use shardgate::service::RateLimiter;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    const RATE: u64 = 50;
    let mut cluster = FailoverCluster::start();
    let mut o = options(cluster.urls(), RedisMode::Cluster);
    o.timeout = Duration::from_millis(500);
    let store = Arc::new(RedisStore::new(o));
    let engine = Engine::with_parts(
        store.clone(),
        EngineOptions::default(),
        Arc::new(SystemClock),
        Arc::new(RandomDraw),
    );
    let rules = format!(
        "domain: f\ndescriptors:\n  - key: user\n    rate_limit: {{unit: second, requests_per_unit: {RATE}}}\n"
    );
    let config = Config::from_yaml("f.yaml", &rules).unwrap();
    let limiter = Arc::new(RateLimiter::new(Arc::new(config), Arc::new(engine)));
    let request = common::server::request("f", vec![common::server::desc(&[("user", "hot")])]);
    let (admitted, failed, admitted_after) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let started = Instant::now();
    let run_for = Duration::from_secs(8);
    let mut clients = Vec::new();
    for _ in 0..8 {
        let (limiter, request) = (limiter.clone(), request.clone());
        let (admitted, failed, admitted_after, killed) = (
            admitted.clone(),
            failed.clone(),
            admitted_after.clone(),
            killed.clone(),
        );
        clients.push(tokio::spawn(async move {
            // Bounded: at most 100,000 calls each, and the run's time.
            for _ in 0..100_000 {
                if started.elapsed() >= run_for {
                    break;
                }
                match limiter.should_rate_limit(&request).await {
                    Ok(r) if r.overall_code == 1 => {
                        admitted.fetch_add(1, Ordering::Relaxed);
                        if killed.load(Ordering::Relaxed) {
                            admitted_after.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        if failed.fetch_add(1, Ordering::Relaxed) % 50 == 0 {
                            eprintln!("{:?} {e}", started.elapsed());
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let key = format!("{{}}{}/BUCKET#user=hot#f#0", store.namespace());
    cluster.master_of(&key).kill();
    killed.store(true, Ordering::Relaxed);
    let admitted_at_kill = admitted.load(Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let (admitted, failed, admitted_after) = (
        admitted.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        admitted_after.load(Ordering::Relaxed),
    );
    let report = format!(
        "admitted {admitted} ({admitted_at_kill} before the kill, {admitted_after} after), \
         {failed} calls failed, in {elapsed:.1} s"
    );
    eprintln!("{report}");
    // The failover happened and the bucket is served again from the promoted replica.
    assert!(admitted_after > RATE, "{report}");
    assert!(failed > 0, "the kill was seen: {report}");
    // Capacity + rate × time, plus what asynchronous replication may lose at the kill:
    // the debits of the calls in flight (8 clients) that the replica had not received.
    let bound = RATE as f64 + RATE as f64 * elapsed + 8.0;
    assert!((admitted as f64) <= bound, "{report}; bound {bound:.0}");
}

#[tokio::test]
async fn a_redis_busy_with_a_long_script_is_an_outage_until_it_is_killed() {
    let redis = LocalRedis::start(&["--busy-reply-threshold", "100"]);
    let store = store_on(redis.url(), Duration::from_secs(1));
    create(&store, key("k", 0)).await;
    // Someone else's script that never ends, on a connection of its own.
    let url = redis.url();
    let runaway = tokio::spawn(async move {
        let client = redis::Client::open(url).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let _: redis::RedisResult<redis::Value> = redis::cmd("EVAL")
            .arg("while true do end")
            .arg(0)
            .query_async(&mut conn)
            .await;
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let err = store
        .debit(&key("k", 0), &one_token(), FAST)
        .await
        .unwrap_err();
    assert!(err.is_fault(), "{err}");
    assert!(err.to_string().contains("BUSY"), "{err}");
    // SCRIPT KILL is one of the few commands a busy Redis still runs.
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis.cmd(&["SCRIPT", "KILL"]).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "the runaway script was never killed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    runaway.await.unwrap();
    assert!(matches!(
        store.debit(&key("k", 0), &one_token(), FAST).await,
        Ok(DebitOutcome::Applied(_))
    ));
}

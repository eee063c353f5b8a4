//! What the store checks of the server it connects to (`src/store/redis/server.rs`), on
//! real servers: one server's URL that leads to a Cluster node is refused with a message
//! saying to use cluster mode (rather than failing every call on `MOVED`), one that leads
//! to a replica is refused as not the primary (a demoted primary behind the address), and
//! the same URL serves once it leads to a primary. The version check (Redis ≥ 6.0, any
//! Valkey) is a unit test there; `scripts/test` runs the store's suites on Redis 6.0.9 and
//! Valkey. And a Redis that is down (behind an address that still accepts TCP): one
//! connect at a time, paced, and every call answered at once meanwhile.

#![cfg(feature = "redis")]

#[macro_use]
mod common;

use common::redis::{options, LocalRedis};
use common::tcp_proxy::Proxy;
use shardgate::store::redis::{RedisMode, RedisStore};
use shardgate::store::StoreError;

#[tokio::test]
async fn a_cluster_nodes_url_as_one_server_is_refused_naming_cluster_mode() {
    let node = LocalRedis::start_cluster_node(&[]);
    let store = RedisStore::new(options(vec![node.url()], RedisMode::Single));
    let err = store.warm_up().await.unwrap_err();
    assert!(matches!(err, StoreError::Unavailable { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("--redis-mode cluster"), "{text}");
    assert!(text.len() < 400, "{text}");
}

#[tokio::test]
async fn a_replicas_url_is_refused_until_it_leads_to_a_primary() {
    let primary = LocalRedis::start(&[]);
    let replica = LocalRedis::start(&["--replicaof", "127.0.0.1", &primary.port.to_string()]);
    let proxy = Proxy::start(replica.port).await;
    let store = RedisStore::new(options(vec![proxy.url()], RedisMode::Single));
    let err = store.warm_up().await.unwrap_err();
    assert!(err.to_string().contains("replica"), "{err}");
    // Connects are paced after a failure: within the pause the error comes back at once.
    let again = store.warm_up().await.unwrap_err();
    assert!(again.to_string().contains("replica"), "{again}");
    let accepted = proxy.accepted();
    proxy.set_target(primary.port);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match store.warm_up().await {
            Ok(()) => break,
            Err(e) => {
                assert!(std::time::Instant::now() < deadline, "never served: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
    assert!(
        proxy.accepted() > accepted,
        "connected again through the address"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_is_down_sees_paced_connects_and_every_call_answers_at_once() {
    // The address answers TCP but nothing is behind it (Redis down behind a load
    // balancer): each connect the store tries is one connection the forwarder accepts.
    let gone = common::redis::free_port();
    let proxy = Proxy::start(gone).await;
    let store = std::sync::Arc::new(RedisStore::new(options(
        vec![proxy.url()],
        RedisMode::Single,
    )));
    let started = std::time::Instant::now();
    let mut calls = Vec::new();
    for _ in 0..400 {
        let store = store.clone();
        calls.push(tokio::spawn(async move {
            let t = std::time::Instant::now();
            let out = store.warm_up().await;
            (out.is_err(), t.elapsed())
        }));
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let mut slowest = std::time::Duration::ZERO;
    for c in calls {
        let (failed, took) = c.await.unwrap();
        assert!(failed, "nothing to answer");
        slowest = slowest.max(took);
    }
    let elapsed = started.elapsed();
    // One connect at a time, paced 100 ms doubling to 1 s after each failure: over the
    // ~2 s of calls a handful of connects, not one per call.
    let connects = proxy.accepted();
    println!("{connects} connects in {elapsed:?} for 400 calls; slowest call {slowest:?}");
    let bound = 2 + elapsed.as_millis() / 100;
    assert!(
        (connects as u128) <= bound,
        "{connects} connects in {elapsed:?} (at most {bound})"
    );
    // Every call ends within the store's deadline (1 s), most at once.
    assert!(
        slowest <= std::time::Duration::from_millis(1_500),
        "{slowest:?}"
    );
}

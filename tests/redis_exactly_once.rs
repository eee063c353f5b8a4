//! Calls whose answer is lost after Redis ran them: a forwarder (`common::tcp_proxy`)
//! passes the call, drops Redis's answer and closes the connection, so the client sends
//! the call again — the Cluster client by itself, the store itself on one server. A
//! credit (a refund, a lease's return, a spread commit's give-back) or a commit run twice
//! would give or take its tokens twice; each carries an operation id, and the second run
//! answers what the first did and writes nothing. On one server and on a Cluster (one
//! node announcing the forwarder's port, so the Cluster client reaches it through it).

#![cfg(feature = "redis")]

#[macro_use]
mod common;

use std::time::{Duration, Instant};

use common::redis::{full_item, one_token, options, rpm, LocalRedis};
use common::tcp_proxy::Proxy;
use shardgate::store::redis::{RedisMode, RedisStore};
use shardgate::store::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Credit, CreditGuard, Stamp, Write,
};

const NOW_S: i64 = 1_800_000_000;

/// One server behind the forwarder, and a store on the forwarder.
async fn single() -> (LocalRedis, Proxy, RedisStore) {
    let redis = LocalRedis::start(&[]);
    let proxy = Proxy::start(redis.port).await;
    let store = RedisStore::new(options(vec![proxy.url()], RedisMode::Single));
    (redis, proxy, store)
}

/// A one-node Cluster holding every slot that announces the forwarder's port, and a
/// store on it in Cluster mode: every connection the Cluster client makes goes through
/// the forwarder.
async fn cluster() -> (LocalRedis, Proxy, RedisStore) {
    let proxy = Proxy::start(1).await;
    let announce = proxy.port.to_string();
    let redis = LocalRedis::start_cluster_node(&[
        "--cluster-announce-ip",
        "127.0.0.1",
        "--cluster-announce-port",
        &announce,
    ]);
    proxy.set_target(redis.port);
    let mut add = vec!["CLUSTER".to_string(), "ADDSLOTS".to_string()];
    add.extend((0..16_384).map(|s: u32| s.to_string()));
    let add: Vec<&str> = add.iter().map(String::as_str).collect();
    redis.cmd(&add).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = redis.cmd(&["CLUSTER", "INFO"]).await.unwrap();
        let info: String = redis::from_redis_value(info).unwrap();
        if info.contains("cluster_state:ok") {
            break;
        }
        assert!(Instant::now() < deadline, "the one-node cluster is not ok");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let store = RedisStore::new(options(vec![proxy.url()], RedisMode::Cluster));
    (redis, proxy, store)
}

/// A shard with half its `rpm` tokens (5 of 10): room to give one back twice.
fn half_full() -> BucketItem {
    let mut item = full_item(10, NOW_S);
    item.limits.get_mut("rpm").unwrap().balance = 5_000;
    item
}

async fn balance(store: &RedisStore, key: &BucketKey) -> i64 {
    let items = store.read(std::slice::from_ref(key)).await.unwrap();
    items[0].as_ref().expect("the item").limits["rpm"].balance
}

async fn a_credit_whose_answer_is_lost_lands_once(store: RedisStore, proxy: Proxy) {
    let key = BucketKey::new("credit-cut", "api", 0);
    let item = half_full();
    let created = store
        .commit(&[Write::Create {
            key: key.clone(),
            item: item.clone(),
        }])
        .await
        .unwrap();
    assert!(matches!(created, CommitOutcome::Committed));
    let credit = vec![Credit {
        limit: "rpm".into(),
        amount: 1_000,
        ceiling: 10_000,
        params: rpm(10),
    }];
    let guard = CreditGuard::Unrefilled(Stamp::of(&item));
    // The script loaded first (a credit on no item): the answer cut is the credit's own,
    // not a `NOSCRIPT`.
    let warm = BucketKey::new("warm", "api", 0);
    assert!(store
        .credit(&warm, guard, &credit)
        .await
        .unwrap()
        .is_empty());
    proxy.cut_answer_to(b"credit-cut");
    let applied = store.credit(&key, guard, &credit).await.unwrap();
    assert_eq!(proxy.answers_cut(), 1, "the credit's answer was cut");
    assert_eq!(applied, credit, "the second run answers what the first did");
    assert_eq!(
        balance(&store, &key).await,
        6_000,
        "one token back, not two"
    );
}

async fn a_commit_whose_answer_is_lost_applies_once(store: RedisStore, proxy: Proxy) {
    let key = BucketKey::new("commit-cut", "api", 0);
    let created = store
        .commit(&[Write::Create {
            key: key.clone(),
            item: half_full(),
        }])
        .await
        .unwrap();
    assert!(matches!(created, CommitOutcome::Committed));
    proxy.cut_answer_to(b"commit-cut");
    let debit = Write::Debit {
        key: key.clone(),
        debits: one_token(10),
        ttl: None,
    };
    let out = store.commit(&[debit]).await.unwrap();
    assert_eq!(proxy.answers_cut(), 1, "the commit's answer was cut");
    assert!(matches!(out, CommitOutcome::Committed), "{out:?}");
    assert_eq!(
        balance(&store, &key).await,
        4_000,
        "one token taken, not two"
    );
}

#[tokio::test]
async fn on_one_server_a_credit_whose_answer_is_lost_lands_once() {
    let (_redis, proxy, store) = single().await;
    a_credit_whose_answer_is_lost_lands_once(store, proxy).await;
}

#[tokio::test]
async fn on_one_server_a_commit_whose_answer_is_lost_applies_once() {
    let (_redis, proxy, store) = single().await;
    a_commit_whose_answer_is_lost_applies_once(store, proxy).await;
}

#[tokio::test]
async fn on_a_cluster_a_credit_whose_answer_is_lost_lands_once() {
    let (_redis, proxy, store) = cluster().await;
    a_credit_whose_answer_is_lost_lands_once(store, proxy).await;
}

#[tokio::test]
async fn on_a_cluster_a_commit_whose_answer_is_lost_applies_once() {
    let (_redis, proxy, store) = cluster().await;
    a_commit_whose_answer_is_lost_applies_once(store, proxy).await;
}

#[tokio::test]
async fn an_operations_records_are_no_part_of_the_item_and_stay_few() {
    let (redis, _proxy, store) = single().await;
    let key = BucketKey::new("records", "api", 0);
    let mut item = full_item(10, NOW_S);
    item.limits.get_mut("rpm").unwrap().balance = 0;
    store
        .commit(&[Write::Create {
            key: key.clone(),
            item: item.clone(),
        }])
        .await
        .unwrap();
    let credit = vec![Credit {
        limit: "rpm".into(),
        amount: 1,
        ceiling: 10_000,
        params: rpm(10),
    }];
    for _ in 0..40 {
        let applied = store
            .credit(&key, CreditGuard::SameCount(1), &credit)
            .await
            .unwrap();
        assert_eq!(applied, credit);
    }
    // Read as an item: the records are skipped, the credits all landed.
    assert_eq!(balance(&store, &key).await, 40);
    // In the hash: at most 16 records kept.
    let prefix = format!("{}/BUCKET#records#api#0", store.namespace());
    let fields = redis
        .cmd(&["HKEYS", &format!("{{}}{prefix}")])
        .await
        .unwrap();
    let fields: Vec<String> = redis::from_redis_value(fields).unwrap();
    let records = fields.iter().filter(|f| f.starts_with("x:")).count();
    assert!((1..=16).contains(&records), "{records} records: {fields:?}");
}

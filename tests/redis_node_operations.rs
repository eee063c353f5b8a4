//! The Redis store's count of calls per node (`shardgate_redis_node_operations_total`)
//! against Redis's own count: on the shared three-master Cluster, debits spread over many
//! buckets land on every master, and each master's count grows by exactly what its
//! `INFO commandstats` says `EVALSHA` grew by. Alone in its test binary so that no other
//! test's calls reach the Cluster while it measures (cargo runs test binaries one at a
//! time).

#![cfg(feature = "redis")]

#[macro_use]
mod common;

use std::collections::BTreeMap;

use shardgate::store::redis::RedisStore;
use shardgate::store::{
    BucketItem, BucketKey, BucketStore, CommitOutcome, Debit, DebitMode, DebitOutcome, Write,
};

const NOW_S: i64 = 1_800_000_000;
const BUCKETS: usize = 48;

fn item() -> BucketItem {
    common::redis::full_item(1_000, NOW_S)
}

fn one_token() -> Vec<Debit> {
    common::redis::one_token(1_000)
}

async fn debit(store: &RedisStore, key: &BucketKey) {
    let mode = DebitMode::Fast {
        now_s: NOW_S,
        shard_count: 1,
    };
    let out = store.debit(key, &one_token(), mode).await.unwrap();
    assert!(matches!(out, DebitOutcome::Applied(_)), "{out:?}");
}

/// `EVALSHA` calls each master has run (`INFO commandstats`), by `host:port`.
async fn evalsha_calls() -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for url in common::redis::cluster_urls() {
        let client = redis::Client::open(url.as_str()).unwrap();
        let node = client.get_connection_info().addr().to_string();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .unwrap();
        let calls = info
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .map(|rest| rest.split(',').next().unwrap().parse().unwrap())
            .unwrap_or(0);
        out.insert(node, calls);
    }
    out
}

fn counted(store: &RedisStore) -> BTreeMap<String, u64> {
    store.node_operations().into_iter().collect()
}

#[tokio::test]
#[cfg_attr(not(redis_local), ignore = "needs a Redis Cluster: run scripts/test")]
async fn each_masters_operations_are_what_its_commandstats_say() {
    let store = common::redis::cluster_store().await;
    let keys: Vec<BucketKey> = (0..BUCKETS)
        .map(|i| BucketKey::new(format!("user={i}"), "api", 0))
        .collect();
    for k in &keys {
        let out = store
            .commit(&[Write::Create {
                key: k.clone(),
                item: item(),
            }])
            .await
            .unwrap();
        assert_eq!(out, CommitOutcome::Committed);
        // Loads the debit script on this key's master, so that no `NOSCRIPT` retry (a
        // second `EVALSHA` for one call) falls in the measured calls.
        debit(&store, k).await;
    }
    let (redis_before, ours_before) = (evalsha_calls().await, counted(&store));
    let mut calls = 0u64;
    for round in 0..3 {
        for k in keys.iter().skip(round) {
            debit(&store, k).await;
            calls += 1;
        }
    }
    let (redis_after, ours_after) = (evalsha_calls().await, counted(&store));

    assert_eq!(
        redis_after.keys().collect::<Vec<_>>(),
        ours_after.keys().collect::<Vec<_>>(),
        "one label per master, named as the cluster names it"
    );
    let mut total = 0;
    for (node, after) in &ours_after {
        let ours = after - ours_before.get(node).copied().unwrap_or(0);
        let theirs = redis_after[node] - redis_before[node];
        assert!(ours > 0, "no calls on {node}: {ours_after:?}");
        assert_eq!(ours, theirs, "{node}: ours {ours}, EVALSHA calls {theirs}");
        total += ours;
    }
    assert_eq!(total, calls);

    // The metric as a scrape reads it.
    let metrics = shardgate::service::metrics::Metrics::new();
    let nodes = std::sync::Arc::new(store);
    {
        let nodes = nodes.clone();
        metrics.attach_redis_nodes(move || nodes.node_operations());
    }
    let text = metrics.render();
    for (node, n) in &ours_after {
        let line = format!("shardgate_redis_node_operations_total{{node=\"{node}\"}} {n}");
        assert!(text.contains(&line), "{line} not in\n{text}");
    }
}

//! `explain` on a bucket spread over several shards: besides the one shard a request
//! draws, it sums the whole bucket over every shard that exists, each refilled to now,
//! and says how many are not created yet (issue 46: an operator asking "how close is this
//! tenant" needs the bucket, not one shard's share).

mod common;

use std::sync::Arc;

use shardgate::config::Config;
use shardgate::engine::{Engine, ManualClock, ScriptedDraw};
use shardgate::service::RateLimiter;
use shardgate::store::memory::MemoryStore;
use shardgate::store::{BucketKey, BucketStore, Write, MILLI};

use common::server::{one, serve_defaults};

const YAML: &str = "domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 60}
";

/// A limiter on `store`, its clock frozen at `now` and every draw on shard 0.
fn limiter(store: Arc<MemoryStore>, now: i64) -> RateLimiter<MemoryStore> {
    let config = Config::from_yaml("test.yaml", YAML).expect("valid config");
    let engine = Engine::with_parts(
        store,
        serve_defaults(),
        Arc::new(ManualClock::new(now)),
        Arc::new(ScriptedDraw::new(vec![0])),
    );
    RateLimiter::new(Arc::new(config), Arc::new(engine))
}

/// `entity '…', resource '…'` of the first bucket an explanation names.
fn bucket_of(explained: &str) -> (String, String) {
    let quoted = |after: &str| -> String {
        let rest = &explained[explained.find(after).expect(after) + after.len()..];
        rest[..rest.find('\'').expect("closing quote")].to_string()
    };
    (quoted("entity '"), quoted("resource '"))
}

#[tokio::test]
async fn a_sharded_bucket_is_summed_over_its_created_shards_refilled_to_now() {
    let now = 1_800_000_000_000;
    // The item a first request creates, as the template of shards of a bucket of 4.
    let first = Arc::new(MemoryStore::new());
    let one_shard = limiter(first.clone(), now);
    let req = one("d", &[("k", "tenant")]);
    one_shard.should_rate_limit(&req).await.expect("answered");
    let explained = one_shard
        .explain("d", &[("k".into(), "tenant".into())])
        .await;
    assert!(!explained.contains("all 1 shards"), "{explained}");
    let (entity, resource) = bucket_of(&explained);
    let key = |s| BucketKey::new(&entity, &resource, s);
    let template = first.read(&[key(0)]).await.expect("read")[0]
        .clone()
        .expect("the first request created shard 0");

    // Shards 0 and 2 of 4 exist (a quarter each: 15 tokens, refilled 15 a minute), last
    // refilled 20 s ago holding 3 and 14 tokens; 1 and 3 were never drawn.
    let store = Arc::new(MemoryStore::new());
    let shard = |tokens: i64| {
        let mut item = template.clone();
        item.shard_count = 4;
        item.refilled_at = now - 20_000;
        let limit = item.limits.get_mut("rl").expect("the rule's limit");
        limit.balance = tokens * MILLI;
        item
    };
    let writes = [
        Write::Create {
            key: key(0),
            item: shard(3),
        },
        Write::Create {
            key: key(2),
            item: shard(14),
        },
    ];
    store.commit(&writes).await.expect("created");

    let explained = limiter(store, now)
        .explain("d", &[("k".into(), "tenant".into())])
        .await;
    // Shard 0 alone: 3 + 20 s × 15/min = 8 of its 15.
    assert!(explained.contains("shard 0 of 4"), "{explained}");
    assert!(
        explained.contains("8 of 15 tokens left on this shard"),
        "{explained}"
    );
    // The whole bucket: shard 0's 8 and shard 2's 14 + 5 (held at its 15), of 30.
    assert!(
        explained.contains("all 4 shards (2 created; "),
        "{explained}"
    );
    assert!(
        explained.contains("23 of 30 tokens left on the created shards"),
        "{explained}"
    );
}

//! Tells the tests which shared stores are configured: with
//! `SHARDGATE_TEST_DYNAMODB_ENDPOINT` set (`scripts/test` starts a DynamoDB Local and sets
//! it) the DynamoDB variants of the tests run, with `SHARDGATE_TEST_REDIS_URL` and
//! `SHARDGATE_TEST_REDIS_CLUSTER` (`scripts/test` starts a Redis and a three-master
//! Cluster) the Redis ones; without them they are reported as ignored, with the reason,
//! so that a bare `cargo test` runs every other test and says what it skipped.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(dynamodb_local)");
    println!("cargo::rustc-check-cfg=cfg(redis_local)");
    println!("cargo::rerun-if-env-changed=SHARDGATE_TEST_DYNAMODB_ENDPOINT");
    println!("cargo::rerun-if-env-changed=SHARDGATE_TEST_REDIS_URL");
    println!("cargo::rerun-if-env-changed=SHARDGATE_TEST_REDIS_CLUSTER");
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    if set("SHARDGATE_TEST_DYNAMODB_ENDPOINT") {
        println!("cargo::rustc-cfg=dynamodb_local");
    }
    if set("SHARDGATE_TEST_REDIS_URL") && set("SHARDGATE_TEST_REDIS_CLUSTER") {
        println!("cargo::rustc-cfg=redis_local");
    }
}

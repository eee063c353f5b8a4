//! Tells the tests which shared stores are configured: with
//! `SHARDGATE_TEST_DYNAMODB_ENDPOINT` set (`scripts/test` starts a DynamoDB Local and sets
//! it) the DynamoDB variants of the tests run, with `SHARDGATE_TEST_REDIS_URL` and
//! `SHARDGATE_TEST_REDIS_CLUSTER` (`scripts/test` starts a Redis and a three-master
//! Cluster) the Redis ones; without them they are reported as ignored, with the reason,
//! so that a bare `cargo test` runs every other test and says what it skipped: each such
//! test as ignored with its reason, and the (debug) build in a warning cargo repeats on
//! every run. `scripts/test` (and so CI) fails if any store suite was skipped.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(dynamodb_local)");
    println!("cargo::rustc-check-cfg=cfg(redis_local)");
    println!("cargo::rerun-if-env-changed=SHARDGATE_TEST_DYNAMODB_ENDPOINT");
    println!("cargo::rerun-if-env-changed=SHARDGATE_TEST_REDIS_URL");
    println!("cargo::rerun-if-env-changed=SHARDGATE_TEST_REDIS_CLUSTER");
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty());
    // Said in debug builds, which `cargo test` makes; a release build (an image, a
    // benchmark) runs no test.
    let debug = std::env::var("PROFILE").is_ok_and(|p| p == "debug");
    let skipped = |store: &str, vars: &str| {
        if !debug {
            return;
        }
        println!(
            "cargo::warning=the {store} store's test suites are skipped (reported as ignored): \
             {vars} not set; scripts/test starts the store and runs them"
        )
    };
    if set("SHARDGATE_TEST_DYNAMODB_ENDPOINT") {
        println!("cargo::rustc-cfg=dynamodb_local");
    } else if std::env::var_os("CARGO_FEATURE_DYNAMODB").is_some() {
        skipped("DynamoDB", "SHARDGATE_TEST_DYNAMODB_ENDPOINT");
    }
    if set("SHARDGATE_TEST_REDIS_URL") && set("SHARDGATE_TEST_REDIS_CLUSTER") {
        println!("cargo::rustc-cfg=redis_local");
    } else if std::env::var_os("CARGO_FEATURE_REDIS").is_some() {
        skipped(
            "Redis",
            "SHARDGATE_TEST_REDIS_URL and SHARDGATE_TEST_REDIS_CLUSTER",
        );
    }
}

//! Tells the tests whether a DynamoDB Local is configured: with
//! `SHARDGATE_TEST_DYNAMODB_ENDPOINT` set (`scripts/test` starts one and sets it) the
//! DynamoDB variants of the tests run; without it they are reported as ignored, with the
//! reason, so that a bare `cargo test` runs every other test and says what it skipped.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(dynamodb_local)");
    println!("cargo::rerun-if-env-changed=SHARDGATE_TEST_DYNAMODB_ENDPOINT");
    if std::env::var_os("SHARDGATE_TEST_DYNAMODB_ENDPOINT").is_some_and(|v| !v.is_empty()) {
        println!("cargo::rustc-cfg=dynamodb_local");
    }
}

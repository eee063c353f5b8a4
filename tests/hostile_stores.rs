//! Hostile descriptor values against every store, over gRPC: values as long as a request
//! may carry (1 KB) made of the characters that grow most when encoded (`/`, `%`,
//! multi-byte), on a key-only rule, so that each value is a bucket of its own whose key
//! would pass DynamoDB's 2,048-byte limit. The store behind the server is the production
//! stack's (a circuit breaker in front), memory and DynamoDB Local alike: one client's
//! values never change another tenant's answers, never open the circuit, and each long
//! value is limited exactly like a short one, in a bucket of its own.

#[macro_use]
mod common;

use std::sync::Arc;
use std::time::Duration;

use common::server::{code, one, StoreServer};
use shardgate::engine::EngineOptions;
use shardgate::store::breaker::{Breaker, CircuitState};
use shardgate::store::BucketStore;
use tonic::Code as Status;

const RULES: &str = "
domain: hostile
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 5}
";

/// Values of 1,023–1,024 bytes: each encodes to about 3 KB of entity. The last two share
/// their first thousand bytes and so the readable head of their stored form: only the
/// digest tells them apart.
fn long_values() -> Vec<String> {
    vec![
        "/".repeat(1_024),
        "%".repeat(1_024),
        "é".repeat(512),
        "日本".repeat(170) + "語",
        "#=:*".repeat(256),
        format!("{}a", "/".repeat(1_023)),
        format!("{}b", "/".repeat(1_023)),
    ]
}

cross_store! {
    async fn a_flood_of_long_values_hurts_no_one<S: BucketStore>(store: S) {
        let store = Arc::new(Breaker::new(store, 5, Duration::from_millis(500)));
        let options = EngineOptions {
            rejection_cache_ms: 0,
            ..EngineOptions::default()
        };
        let server = StoreServer::start(RULES, store.clone(), options).await;
        let mut c = server.client().await;
        let mut tenant_answers = Vec::new();
        for value in long_values() {
            // Three admitted, the fourth over: the rule's limit, as for a short value.
            let mut codes = Vec::new();
            for _ in 0..4 {
                let r = c.ok(one("hostile", &[("user", &value)])).await;
                codes.push(code(r.overall_code) as i32);
            }
            assert_eq!(
                codes,
                vec![1, 1, 1, 2],
                "a {}-byte value is limited like any other",
                value.len()
            );
            // Another tenant, between the floods: unaffected.
            let r = c.ok(one("hostile", &[("tenant", "acme")])).await;
            tenant_answers.push(r.overall_code);
        }
        assert_eq!(
            tenant_answers,
            vec![1, 1, 1, 1, 1, 2, 2],
            "the tenant's own five, then its own limit"
        );
        assert_eq!(store.state(), CircuitState::Closed, "no store fault seen");
        // A short value is its own bucket too.
        let r = c.ok(one("hostile", &[("user", "short")])).await;
        assert_eq!(r.overall_code, 1);

        // A value past the request bound is refused, naming it, in a short message.
        let err = c
            .call(one("hostile", &[("user", &"/".repeat(1_025))]))
            .await
            .expect_err("past the bound");
        assert_eq!(err.code(), Status::InvalidArgument);
        assert!(err.message().contains("descriptors[0].entries[0].value"));
        assert!(
            err.message().len() <= 1_100,
            "{} bytes",
            err.message().len()
        );
    }
}

//! The `decision` span: each call's domain, matched rules, outcome and store calls, as a
//! subscriber that enables it sees them when the span closes.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::server::{desc, desc_hits, one, request, LogBuffer};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use shardgate::config::Config;
use shardgate::engine::{Engine, EngineOptions};
use shardgate::service::RateLimiter;
use shardgate::store::memory::MemoryStore;
use shardgate::store::metered::{CallObserver, Metered};
use tracing_subscriber::fmt::format::FmtSpan;

const YAML: &str = "domain: d
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
";

/// The one closed `decision` span line in `text`.
fn closed_decision(text: &str) -> String {
    let lines: Vec<_> = text
        .lines()
        .filter(|l| l.contains("decision{") && l.contains("close"))
        .collect();
    assert_eq!(lines.len(), 1, "one closed decision span:\n{text}");
    lines[0].to_string()
}

/// Counts the store calls it is told of: an account of them independent of the span's.
#[derive(Default)]
struct CallCount(AtomicU32);

impl CallObserver for CallCount {
    fn observe(&self, _operation: &'static str, _outcome: &'static str, _elapsed: Duration) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

#[test]
fn each_decision_is_a_span_with_its_rules_outcome_and_store_calls() {
    let log = LogBuffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_ansi(false)
        .with_span_events(FmtSpan::CLOSE)
        .with_env_filter("shardgate::service::decision=debug")
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let config = Config::from_yaml("a.yaml", YAML).unwrap();
    // As the server stacks it: the store behind the wrapper that counts its calls.
    let calls = Arc::new(CallCount::default());
    let store = Metered::new(Arc::new(MemoryStore::new()), calls.clone());
    let engine = Arc::new(Engine::new(Arc::new(store), EngineOptions::default()));
    let limiter = RateLimiter::new(Arc::new(config), engine);
    // The closed span's line, and the store calls the decision made.
    let decide = |req: &RateLimitRequest| {
        let before = calls.0.load(Ordering::Relaxed);
        let _ = rt.block_on(limiter.should_rate_limit(req));
        let made = calls.0.load(Ordering::Relaxed) - before;
        (closed_decision(&log.take()), made)
    };

    let two = request(
        "d",
        vec![
            desc(&[("tenant", "acme")]),
            desc(&[("free", "x")]),
            desc(&[("nothing", "y")]),
        ],
    );
    // A new bucket: one debit, which creates it.
    let (first, made) = decide(&two);
    assert_eq!(made, 1);
    assert!(first.contains(r#"domain="d""#), "{first}");
    assert!(first.contains("rules=d.tenant,unlimited,-"), "{first}");
    assert!(first.contains(r#"outcome="OK""#), "{first}");
    assert!(first.contains("store_calls=1"), "{first}");
    assert!(!first.contains("failure_mode"), "{first}");
    assert!(!first.contains("engine_calls"), "{first}");
    assert!(first.contains(" DEBUG "), "{first}");

    // Refused from the image that debit returned (it left the bucket short): the
    // rejection cache answers, no call.
    let (second, made) = decide(&one("d", &[("tenant", "acme")]));
    assert_eq!(made, 0);
    assert!(second.contains(r#"outcome="OVER_LIMIT""#), "{second}");
    assert!(second.contains("rules=d.tenant "), "{second}");
    assert!(second.contains("store_calls=0"), "{second}");

    // A new bucket asked for two hits, more than a new shard holds: its debit creates
    // nothing, and the slow path refuses without another call.
    let (third, made) = decide(&request("d", vec![desc_hits(&[("tenant", "other")], 2)]));
    assert!(third.contains(r#"outcome="OVER_LIMIT""#), "{third}");
    assert_eq!(made, 1, "{third}");
    assert!(third.contains("store_calls=1"), "{third}");

    let (unknown, made) = decide(&one("nowhere", &[("tenant", "acme")]));
    assert_eq!(made, 0);
    assert!(unknown.contains(r#"domain="nowhere""#), "{unknown}");
    assert!(unknown.contains(r#"outcome="UNKNOWN_DOMAIN""#), "{unknown}");
    assert!(unknown.contains("store_calls=0"), "{unknown}");

    let (invalid, _) = decide(&request("d", vec![]));
    assert!(
        invalid.contains(r#"outcome="INVALID_ARGUMENT""#),
        "{invalid}"
    );
}

/// At the default level (info) the span is disabled: no line, nothing recorded.
#[test]
fn the_span_is_silent_at_info() {
    let log = LogBuffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_ansi(false)
        .with_span_events(FmtSpan::CLOSE)
        .with_env_filter("info")
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let config = Config::from_yaml("a.yaml", YAML).unwrap();
    let engine = Arc::new(Engine::new(
        Arc::new(MemoryStore::new()),
        EngineOptions::default(),
    ));
    let limiter = RateLimiter::new(Arc::new(config), engine);
    rt.block_on(limiter.should_rate_limit(&one("d", &[("tenant", "acme")])))
        .unwrap();
    assert_eq!(log.take(), "");
}

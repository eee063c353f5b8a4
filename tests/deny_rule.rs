//! envoyproxy/ratelimit's deny-list idiom (its README's "black list": a rule of
//! `requests_per_unit: 0`, `bar: banned` in its example) is a plain refusal (issue 48,
//! item 4): 100 calls make no store call, log no warning and leave the per-shard-ceiling
//! counter (which fires `ShardgatePerShardCeilingRefusals`) where it was; a request that
//! carries such a descriptor with another is refused whole without debiting the other.
//! The ceiling keeps its meaning: a request larger than a real limit's shard share still
//! counts and warns.

mod common;

use std::sync::{Arc, Mutex};

use common::server::{code, desc, desc_hits, request};
use common::Recorder;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use shardgate::config::Config;
use shardgate::engine::{Engine, EngineOptions, ManualClock, ScriptedDraw};
use shardgate::service::RateLimiter;
use shardgate::store::memory::MemoryStore;

const RULES: &str = "
domain: example
descriptors:
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: bar
    value: banned
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: bar
    value: shadow_banned
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: small
    rate_limit: {unit: minute, requests_per_unit: 2}
";

/// The WARN lines logged while a test runs (a subscriber of this thread only).
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Warnings {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Warnings {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_string)
            .collect()
    }
}

fn counter(engine: &Engine<Recorder<MemoryStore>>, name: &str) -> u64 {
    engine
        .stats()
        .counted()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no counter {name}"))
        .value
}

struct Bench {
    limiter: RateLimiter<Recorder<MemoryStore>>,
    recorder: Arc<Recorder<MemoryStore>>,
    engine: Arc<Engine<Recorder<MemoryStore>>>,
}

fn bench() -> Bench {
    let config = Config::from_yaml("deny.yaml", RULES).unwrap_or_else(|e| panic!("{e}"));
    let recorder = Recorder::new(MemoryStore::new());
    let engine = Arc::new(Engine::with_parts(
        recorder.clone(),
        EngineOptions::default(),
        Arc::new(ManualClock::new(1_800_000_000_000)),
        Arc::new(ScriptedDraw::default()),
    ));
    Bench {
        limiter: RateLimiter::new(Arc::new(config), engine.clone()),
        recorder,
        engine,
    }
}

#[tokio::test]
async fn a_deny_rule_refuses_without_the_store_a_warning_or_a_ceiling_count() {
    let warnings = Warnings::default();
    let writer = warnings.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _log = tracing::subscriber::set_default(subscriber);
    let b = bench();
    let ceiling_before = counter(&b.engine, "per_shard_ceiling_rejections");
    for call in 0..100 {
        let r = b
            .limiter
            .should_rate_limit(&request("example", vec![desc(&[("bar", "banned")])]))
            .await
            .unwrap();
        assert_eq!(code(r.overall_code), Code::OverLimit, "call {call}");
        let status = &r.statuses[0];
        assert_eq!(code(status.code), Code::OverLimit);
        assert_eq!(status.current_limit.as_ref().unwrap().requests_per_unit, 0);
        assert_eq!(status.limit_remaining, 0);
    }
    assert_eq!(b.recorder.calls(), [], "no store call");
    assert_eq!(
        counter(&b.engine, "per_shard_ceiling_rejections"),
        ceiling_before
    );
    assert_eq!(warnings.lines(), Vec::<String>::new(), "no WARN line");

    // In shadow mode the rule is counted, never enforced, and still costs no store call.
    let r = b
        .limiter
        .should_rate_limit(&request("example", vec![desc(&[("bar", "shadow_banned")])]))
        .await
        .unwrap();
    assert_eq!(code(r.overall_code), Code::Ok);
    assert_eq!(b.recorder.calls(), []);

    // The ceiling keeps its meaning: 5 hits of a 2-a-minute limit can never be admitted,
    // and that is counted and warned about.
    let r = b
        .limiter
        .should_rate_limit(&request("example", vec![desc_hits(&[("small", "s")], 5)]))
        .await
        .unwrap();
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(
        counter(&b.engine, "per_shard_ceiling_rejections"),
        ceiling_before + 1
    );
    let lines = warnings.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("one shard's share"), "{lines:?}");
}

#[tokio::test]
async fn a_request_with_a_denied_descriptor_is_refused_whole_and_debits_nothing() {
    let b = bench();
    let r = b
        .limiter
        .should_rate_limit(&request(
            "example",
            vec![desc(&[("foo", "f")]), desc(&[("bar", "banned")])],
        ))
        .await
        .unwrap();
    assert_eq!(code(r.overall_code), Code::OverLimit);
    assert_eq!(code(r.statuses[0].code), Code::Ok, "foo itself fits");
    assert_eq!(code(r.statuses[1].code), Code::OverLimit);
    // foo was only looked at: all or nothing, so its bucket is as full as before.
    assert!(
        b.recorder
            .calls()
            .iter()
            .all(|c| matches!(c, common::Call::Read { .. })),
        "{:?}",
        b.recorder.calls()
    );
    // A request of zero hits only looks (as for any rule), and is answered OK.
    let r = b
        .limiter
        .should_rate_limit(&request(
            "example",
            vec![desc_hits(&[("bar", "banned")], 0)],
        ))
        .await
        .unwrap();
    assert_eq!(code(r.overall_code), Code::Ok);
}

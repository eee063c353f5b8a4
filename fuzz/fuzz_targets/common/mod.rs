//! What the request targets share: one runtime and one config for the whole fuzzing
//! process, a fresh rate limiter on the memory store and a frozen clock for every input
//! (so an input's outcome never depends on the inputs before it and a crash reproduces
//! from its file alone), and the invariants every answer must satisfy.

// Each target uses its own subset.
#![allow(dead_code)]

use std::collections::HashSet;
use std::sync::{Arc, OnceLock};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use shardgate::config::{Config, Rule, RuleLimit, Unit};
use shardgate::engine::{
    Clock, Engine, EngineOptions, ManualClock, ScriptedDraw, UNLIMITED_PARTITION_WRITE_BUDGET,
};
use shardgate::service::{AnswerOptions, CallError, RateLimitHeaders, RateLimiter, RequestLimits};
use shardgate::store::memory::MemoryStore;

/// An arbitrary fixed "now" (epoch ms).
pub const START_MS: i64 = 1_826_000_000_000;

const EXAMPLE: &str = include_str!("../../../config/example.yaml");
const RULES: &str = include_str!("rules.yaml");

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

pub struct World {
    pub runtime: tokio::runtime::Runtime,
    pub config: Arc<Config>,
}

/// Built once per process.
pub fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let docs = [
            ("config/example.yaml".to_string(), EXAMPLE.to_string()),
            ("fuzz/rules.yaml".to_string(), RULES.to_string()),
        ];
        let config = Config::from_documents(&docs)
            .unwrap_or_else(|e| panic!("the fuzz targets' config must load:\n{e}"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime");
        World {
            runtime,
            config: Arc::new(config),
        }
    })
}

/// A rate limiter over a fresh memory store, on a frozen clock.
pub struct Limiter {
    pub limiter: RateLimiter<MemoryStore>,
    pub store: Arc<MemoryStore>,
    pub clock: Arc<ManualClock>,
}

/// Engine options as `shardgate serve --store memory` uses them.
pub fn serve_options() -> EngineOptions {
    EngineOptions {
        partition_write_budget: UNLIMITED_PARTITION_WRITE_BUDGET,
        ..EngineOptions::default()
    }
}

/// A write budget of one write per shard and second, so that repeated requests make
/// the engine double shards (the DynamoDB store's behaviour, here on the memory store).
pub fn tiny_budget_options() -> EngineOptions {
    EngineOptions {
        partition_write_budget: 1,
        rejection_cache_ms: 0,
        ..EngineOptions::default()
    }
}

pub fn limiter(config: Arc<Config>, options: EngineOptions) -> Limiter {
    let store = Arc::new(MemoryStore::new());
    let clock = Arc::new(ManualClock::new(START_MS));
    let engine = Arc::new(Engine::with_parts(
        store.clone(),
        options,
        clock.clone(),
        Arc::new(ScriptedDraw::default()),
    ));
    Limiter {
        limiter: RateLimiter::new(config, engine),
        store,
        clock,
    }
}

/// Why `req` must be refused with INVALID_ARGUMENT under the default request bounds, or
/// `None` when it is within them (it may still be refused for its hits).
pub fn out_of_bounds(req: &RateLimitRequest) -> Option<String> {
    let l = RequestLimits::default();
    if req.domain.is_empty() {
        return Some("domain".into());
    }
    if req.descriptors.is_empty() || req.descriptors.len() > l.max_descriptors {
        return Some("descriptors".into());
    }
    for (i, d) in req.descriptors.iter().enumerate() {
        if d.entries.is_empty() || d.entries.len() > l.max_entries {
            return Some(format!("descriptors[{i}].entries"));
        }
        for (j, e) in d.entries.iter().enumerate() {
            if e.key.is_empty() || e.key.len() > l.max_key_bytes {
                return Some(format!("descriptors[{i}].entries[{j}].key"));
            }
            if e.value.len() > l.max_value_bytes {
                return Some(format!("descriptors[{i}].entries[{j}].value"));
            }
        }
        if let Some(limit) = &d.limit {
            if Unit::from_proto(limit.unit).is_none() {
                return Some(format!("descriptors[{i}].limit.unit"));
            }
        }
    }
    None
}

/// The rule each descriptor matches in the tree (`None` for an override or no match).
fn tree_rules(config: &Config, req: &RateLimitRequest) -> Vec<Option<Arc<Rule>>> {
    let domain = config.domain(&req.domain);
    req.descriptors
        .iter()
        .map(|d| match (&d.limit, domain) {
            (None, Some(domain)) => domain.match_descriptor(&d.entries).cloned(),
            _ => None,
        })
        .collect()
}

/// Whether the request's outcome may change the buckets even when it is refused:
/// overdraft usage is always recorded.
pub fn may_debit_when_refused(config: &Config, req: &RateLimitRequest) -> bool {
    tree_rules(config, req)
        .iter()
        .flatten()
        .any(|r| matches!(&r.limit, RuleLimit::Limited(l) if l.overdraft))
}

/// Checks one answer of a limiter configured like `serve`, or (`global_shadow`) of one
/// with global shadow mode, dynamic metadata and headers on.
pub fn check_answer(
    config: &Config,
    req: &RateLimitRequest,
    answer: &Result<RateLimitResponse, CallError>,
    global_shadow: bool,
) {
    let expected_refusal = out_of_bounds(req);
    let resp = match answer {
        Err(CallError::Unavailable(e)) => panic!("the memory store never fails, got: {e}"),
        Err(CallError::InvalidArgument(m)) => {
            assert!(!m.is_empty());
            match &expected_refusal {
                Some(field) => assert!(
                    m.contains(field.as_str()),
                    "refusal {m:?} should name {field}"
                ),
                None => assert!(
                    m.contains("hits_addend"),
                    "a request within bounds refused for something else than hits: {m:?}"
                ),
            }
            return;
        }
        Ok(resp) => resp,
    };
    if let Some(field) = expected_refusal {
        panic!("accepted a request with an invalid {field}: {resp:?}");
    }
    assert_eq!(
        resp.statuses.len(),
        req.descriptors.len(),
        "one status per descriptor"
    );
    assert!(
        resp.overall_code == OK || resp.overall_code == OVER,
        "overall code {}",
        resp.overall_code
    );
    for s in &resp.statuses {
        assert!(s.code == OK || s.code == OVER, "status code {}", s.code);
    }
    if global_shadow {
        // Run with metadata and headers on too: each descriptor keeps its code, the
        // request is never refused, the metadata names the domain, and the headers speak
        // for a descriptor exactly when one has a limit.
        assert_eq!(resp.overall_code, OK, "global shadow never refuses");
        let meta = resp
            .dynamic_metadata
            .as_ref()
            .expect("dynamic metadata asked for");
        assert!(meta.fields.contains_key("domain") && meta.fields.contains_key("descriptors"));
        let limited = resp.statuses.iter().any(|s| s.current_limit.is_some());
        assert_eq!(
            resp.response_headers_to_add.len(),
            if limited { 3 } else { 0 }
        );
        return;
    }
    if resp.overall_code == OVER {
        assert!(
            resp.statuses.iter().any(|s| s.code == OVER),
            "an OVER_LIMIT answer names a descriptor that is over: {resp:?}"
        );
    }
    let Some(_) = config.domain(&req.domain) else {
        assert_eq!(resp.overall_code, OK, "unknown domain");
        assert!(resp
            .statuses
            .iter()
            .all(|s| s.code == OK && s.current_limit.is_none()));
        return;
    };
    let rules = tree_rules(config, req);
    let replaced: HashSet<&str> = rules
        .iter()
        .flatten()
        .flat_map(|r| r.replaces.iter().map(String::as_str))
        .collect();
    for (i, (rule, s)) in rules.iter().zip(&resp.statuses).enumerate() {
        // Only quota-mode descriptors can be over while the request passes.
        let quota = rule.as_ref().is_some_and(|r| r.quota_mode);
        if s.code == OVER && !quota {
            assert_eq!(
                resp.overall_code, OVER,
                "descriptors[{i}] is over but the request passed: {resp:?}"
            );
        }
        let Some(rule) = rule else { continue };
        if rule.shadow_mode {
            assert_eq!(s.code, OK, "descriptors[{i}] is shadow mode");
        }
        // Any of its names (a `rate_limits` list has several) replaced drops the rule.
        let is_replaced = rule
            .stated_limits()
            .any(|l| l.name.is_some_and(|n| replaced.contains(n)));
        if matches!(rule.limit, RuleLimit::Unlimited) && !is_replaced {
            assert_eq!(s.code, OK, "descriptors[{i}] is unlimited");
            assert_eq!(s.limit_remaining, u32::MAX, "descriptors[{i}] is unlimited");
        }
        if is_replaced {
            assert_eq!(s.code, OK, "descriptors[{i}] is replaced");
        }
    }
}

/// Checks that a refused request that can take nothing, asked again at the same instant,
/// is refused again the same way.
pub fn check_refusal_repeats(first: &RateLimitResponse, again: &RateLimitResponse) {
    assert_eq!(
        again.overall_code, first.overall_code,
        "a refused request took something: first {first:?}, again {again:?}"
    );
    let codes = |r: &RateLimitResponse| r.statuses.iter().map(|s| s.code).collect::<Vec<_>>();
    assert_eq!(
        codes(again),
        codes(first),
        "a refused request took something: first {first:?}, again {again:?}"
    );
}

/// Runs one decoded request through a fresh limiter like `serve`'s: twice at the same
/// instant, then after a minute and after a year (refill and expiry), checking every
/// answer; then through a global-shadow limiter with a one-write-per-second shard budget
/// (shard doubling), four times at one instant. Renders the metrics at the end.
pub fn run_request(req: &RateLimitRequest) {
    let w = world();
    let config = &w.config;
    w.runtime.block_on(async {
        let l = limiter(config.clone(), serve_options());
        let first = l.limiter.should_rate_limit(req).await;
        check_answer(config, req, &first, false);
        let Ok(first) = first else {
            // Refused as malformed: nothing more to learn from this input.
            return;
        };
        let second = l.limiter.should_rate_limit(req).await;
        check_answer(config, req, &second, false);
        if first.overall_code == OVER && !may_debit_when_refused(config, req) {
            check_refusal_repeats(&first, second.as_ref().expect("checked"));
        }
        for advance_ms in [60_000, 365 * 86_400_000] {
            l.clock.advance(advance_ms);
            let later = l.limiter.should_rate_limit(req).await;
            check_answer(config, req, &later, false);
        }
        l.store.evict_expired(l.clock.now_ms() / 1_000);
        let _ = l.limiter.metrics().render();

        let shadow = limiter(config.clone(), tiny_budget_options());
        let shadow_limiter = shadow.limiter.with_answer(AnswerOptions {
            global_shadow: true,
            dynamic_metadata: true,
            headers: Some(RateLimitHeaders::default()),
        });
        for _ in 0..4 {
            let answer = shadow_limiter.should_rate_limit(req).await;
            check_answer(config, req, &answer, true);
        }
    });
}

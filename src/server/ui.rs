//! The operator's page (`/ui` on the HTTP port): who is being limited now and why, in one
//! place — the rules as loaded with their last reload (and the last one refused), each
//! rule's hits per second admitted and refused over 15 minutes, the top values of `/top`,
//! an explain form (`POST /explain`, the CLI's answer), and the store's health.
//!
//! Everything is served from the binary (`ui_assets/`, included at build time): the page,
//! its script and style, and the charts, rendered here as SVG (`ui_chart.rs`). No request
//! leaves the page's origin, and a strict Content-Security-Policy says so to the browser.
//! The page carries request values (tenant identifiers, often): it is on by default only
//! on a loopback HTTP port (`--ui`). It reads and decides nothing itself: every number
//! comes from the rate limiter, the top-values board, the engine or the store.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use serde_json::json;

use super::rule_text::{limit_text, rule_flags};
use super::ui_chart::chart_svg;
use crate::service::RateLimiter;
use crate::store::BucketStore;

/// Nothing but this origin: scripts, styles, images (the charts) and fetches.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
    connect-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'";

const PAGE: &str = include_str!("ui_assets/page.html");
const SCRIPT: &str = include_str!("ui_assets/app.js");
const STYLE: &str = include_str!("ui_assets/app.css");
/// The tab's icon: without one the browser asks for `/favicon.ico` and logs its 404.
const ICON: &str = include_str!("ui_assets/favicon.svg");

/// The hottest buckets listed.
const HOTTEST: usize = 10;

/// The page's routes, to merge into the HTTP port's.
pub fn routes<S: BucketStore>() -> Router<Arc<RateLimiter<S>>> {
    Router::new()
        .route(
            "/ui",
            get(|| async { asset("text/html; charset=utf-8", PAGE) }),
        )
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        )
        .route(
            "/ui/app.css",
            get(|| async { asset("text/css; charset=utf-8", STYLE) }),
        )
        .route(
            "/ui/icon.svg",
            get(|| async { asset("image/svg+xml", ICON) }),
        )
        .route("/ui/state", get(state::<S>))
        .route("/ui/chart.svg", get(chart::<S>))
}

/// A response with the page's headers: the policy, no sniffing, no caching (the page
/// shows what is happening now), no referrer.
fn asset(content_type: &'static str, body: impl Into<axum::body::Body>) -> Response {
    let mut response = body.into().into_response();
    let headers = response.headers_mut();
    let set = |h: &mut axum::http::HeaderMap, name: HeaderName, value: &'static str| {
        h.insert(name, HeaderValue::from_static(value));
    };
    set(headers, header::CONTENT_TYPE, content_type);
    set(headers, header::CONTENT_SECURITY_POLICY, CSP);
    set(headers, header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    set(headers, header::CACHE_CONTROL, "no-store");
    set(headers, header::REFERRER_POLICY, "no-referrer");
    response
}

/// `GET /ui/state`: the rules, the config's history, the store's health and each rule's
/// hits per second now, as JSON.
async fn state<S: BucketStore>(State(limiter): State<Arc<RateLimiter<S>>>) -> Response {
    let config = limiter.config();
    let mut domains: Vec<_> = config.domains().collect();
    domains.sort_by(|a, b| a.name.cmp(&b.name));
    let domains: Vec<_> = domains
        .iter()
        .map(|d| {
            let rules: Vec<_> = d
                .rules()
                .map(|r| {
                    json!({
                        "rule": r.stats_key,
                        "limit": limit_text(r),
                        "resource": r.resource,
                        "flags": rule_flags(r),
                        "source": &*r.source,
                    })
                })
                .collect();
            json!({ "name": &*d.name, "rules": rules })
        })
        .collect();
    let now: Vec<_> = limiter
        .top()
        .rates(None, None)
        .into_iter()
        .map(|r| {
            let (ok, over) = r.ticks.last().copied().unwrap_or_default();
            let secs = r.current_tick_seconds.max(1) as f64;
            json!({ "domain": r.domain, "rule": r.rule,
                    "ok_per_second": ok as f64 / secs, "over_per_second": over as f64 / secs })
        })
        .collect();
    let body = json!({
        "config": { "hash": config.hash(), "events": limiter.config_events(), "domains": domains },
        "rates": now,
        "top_values": limiter.top().enabled(),
        "store": store_health(&limiter).await,
    });
    asset("application/json", body.to_string())
}

/// The store's health: a read now, the circuit breaker, the calls by outcome since start,
/// leases and the most sharded buckets.
async fn store_health<S: BucketStore>(limiter: &RateLimiter<S>) -> serde_json::Value {
    let engine = limiter.engine();
    let view = engine.view();
    let check = match limiter.check_store().await {
        Ok(()) => "OK".to_string(),
        Err(e) => e,
    };
    let calls = limiter.metrics().store_call_totals();
    let hottest: Vec<_> = view
        .hottest(HOTTEST)
        .into_iter()
        .map(|b| json!({ "entity": b.entity, "resource": b.resource, "shards": b.shard_count }))
        .collect();
    json!({
        "check": check,
        "circuit": engine.store().circuit(),
        "leases_on": view.leases_on(),
        // Millitokens held in leases, in tokens.
        "leased_tokens": view.leased_outstanding() as f64 / 1000.0,
        "calls": calls,
        "hottest": hottest,
    })
}

/// `GET /ui/chart.svg?domain=D&rule=K`: one rule's chart.
async fn chart<S: BucketStore>(
    State(limiter): State<Arc<RateLimiter<S>>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let (Some(domain), Some(rule)) = (query.get("domain"), query.get("rule")) else {
        return (StatusCode::BAD_REQUEST, "domain and rule are required\n").into_response();
    };
    match limiter.top().rates(Some(domain), Some(rule)).first() {
        Some(r) => asset("image/svg+xml", chart_svg(r)),
        None => (StatusCode::NOT_FOUND, "no such rule\n").into_response(),
    }
}

//! The HTTP surface (`--http-addr`): `GET /metrics` (Prometheus), `GET /healthcheck`
//! (readiness), `GET /healthcheck/store` (whether the store answers now), `GET /rlconfig`
//! (the loaded rules as text), `GET /top` (each rule's most refused and admitted
//! descriptor values, JSON; `?n=` values per table, `?domain=` one domain), the operator's
//! page (`/ui`, `ui.rs`, when on) and `POST /json` (a proto3-JSON `RateLimitRequest` answered
//! like the gRPC call: 200 OK, 429 over limit, 400 bad body).
//!
//! It translates HTTP to the [`RateLimiter`] and the metrics; it decides nothing itself.

use std::fmt::Write as _;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;

use super::json;
use super::rule_text::{limit_text, rule_flags};
use super::ui;
use crate::service::decision::{CallError, RateLimiter};
use crate::store::BucketStore;
use crate::support::text::{elide, MESSAGE_BYTES};

/// The HTTP routes over one rate limiter; with `ui`, the operator's page too.
pub fn router<S: BucketStore>(limiter: Arc<RateLimiter<S>>, ui: bool) -> Router {
    let page = if ui { ui::routes() } else { Router::new() };
    Router::new()
        .merge(page)
        .route("/metrics", get(metrics::<S>))
        .route("/healthcheck", get(healthcheck::<S>))
        .route("/healthcheck/store", get(store_check::<S>))
        .route("/rlconfig", get(rlconfig::<S>))
        .route("/top", get(top::<S>))
        .route("/json", post(json_call::<S>))
        .route("/explain", post(explain::<S>))
        .with_state(limiter)
}

/// Serves the HTTP surface on `listener` until `shutdown` resolves.
pub async fn serve<S: BucketStore>(
    limiter: Arc<RateLimiter<S>>,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ui: bool,
) -> std::io::Result<()> {
    axum::serve(listener, router(limiter, ui))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn metrics<S: BucketStore>(State(limiter): State<Arc<RateLimiter<S>>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        limiter.metrics().render(),
    )
        .into_response()
}

/// Readiness: 200 once the store has answered after start-up, whatever it does later (a
/// store outage is answered by the rules' `failure_mode`); 503 before.
async fn healthcheck<S: BucketStore>(State(limiter): State<Arc<RateLimiter<S>>>) -> Response {
    match limiter.readiness() {
        Ok(()) => (StatusCode::OK, "OK\n").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n")).into_response(),
    }
}

/// The store's health now: one read of a key no bucket uses.
async fn store_check<S: BucketStore>(State(limiter): State<Arc<RateLimiter<S>>>) -> Response {
    match limiter.check_store().await {
        Ok(()) => (StatusCode::OK, "OK\n").into_response(),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("store unavailable: {e}\n"),
        )
            .into_response(),
    }
}

/// The values listed per table when `/top` is not told.
const TOP_LISTED: usize = 10;

/// `GET /top`: what the page's tables show, as JSON. It carries request values (tenant
/// identifiers, often): the HTTP port is an operator's, not a caller's.
async fn top<S: BucketStore>(
    State(limiter): State<Arc<RateLimiter<S>>>,
    Query(query): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let n = match query.get("n").map(|n| n.parse::<usize>()) {
        None => TOP_LISTED,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return (StatusCode::BAD_REQUEST, "n: expected a number\n").into_response();
        }
    };
    let report = limiter
        .top()
        .report(n, query.get("domain").map(String::as_str));
    (
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_string(&report).unwrap_or_default(),
    )
        .into_response()
}

async fn rlconfig<S: BucketStore>(State(limiter): State<Arc<RateLimiter<S>>>) -> Response {
    let config = limiter.config();
    let mut out = format!("config hash: {}\n", config.hash());
    let mut domains: Vec<_> = config.domains().collect();
    domains.sort_by(|a, b| a.name.cmp(&b.name));
    for d in domains {
        let _ = writeln!(out, "domain {}:", d.name);
        for r in d.rules() {
            let flags = rule_flags(r);
            let _ = writeln!(
                out,
                "  {}: {} resource {}{}{}",
                r.stats_key,
                limit_text(r),
                r.resource,
                if flags.is_empty() { "" } else { "; " },
                flags.join(", ")
            );
        }
    }
    if let Some(board) = limiter.rlqs() {
        out.push_str(&board.rlconfig());
    }
    ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], out).into_response()
}

/// `POST /explain`: `/json`'s request body, answered in words — each descriptor's walk
/// through the rules, its bucket and balances, and what it would be answered now. Never
/// debits.
async fn explain<S: BucketStore>(
    State(limiter): State<Arc<RateLimiter<S>>>,
    body: Bytes,
) -> Response {
    let text = |status, t: String| {
        (
            status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            t,
        )
            .into_response()
    };
    let explained = match json::parse_request(&body) {
        Ok(request) => limiter.explain_request(&request).await,
        Err(m) => Err(m),
    };
    match explained {
        Ok(t) => text(StatusCode::OK, t + "\n"),
        Err(m) => text(
            StatusCode::BAD_REQUEST,
            format!("{}\n", elide(&m, MESSAGE_BYTES)),
        ),
    }
}

async fn json_call<S: BucketStore>(
    State(limiter): State<Arc<RateLimiter<S>>>,
    body: Bytes,
) -> Response {
    let bad = |m: String| {
        (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::json!({ "error": elide(&m, MESSAGE_BYTES) }).to_string(),
        )
            .into_response()
    };
    let request = match json::parse_request(&body) {
        Ok(r) => r,
        Err(m) => return bad(m),
    };
    match limiter.should_rate_limit(&request).await {
        Ok(response) => {
            let status = if response.overall_code
                == envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code::OverLimit as i32
            {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (
                status,
                [(header::CONTENT_TYPE, "application/json")],
                json::render_response(&response).to_string(),
            )
                .into_response()
        }
        Err(CallError::InvalidArgument(m)) => bad(m),
        Err(e @ CallError::Unavailable(_)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::json!({ "error": elide(&e.to_string(), MESSAGE_BYTES) }).to_string(),
        )
            .into_response(),
    }
}

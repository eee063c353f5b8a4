//! Arbitrary bytes as the body of `POST /json` (the HTTP surface's proto3-JSON
//! `RateLimitRequest`), through shardgate's axum router in process: JSON parsing, the
//! decision and the JSON rendering of the answer.
//!
//! Invariants: no panic; the answer is 200 (OK), 429 (OVER_LIMIT) or 400 (bad body or
//! refused request), never 5xx on the memory store; its body is JSON, with an `error`
//! string for 400 and an `overallCode` matching the status otherwise, and one status per
//! descriptor of the request.

#![no_main]

mod common;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

fuzz_target!(|data: &[u8]| {
    let w = common::world();
    let l = common::limiter(w.config.clone(), common::serve_options());
    // The operator page off: the fuzzed route is /json.
    let router = shardgate::server::http::router(Arc::new(l.limiter), false);
    let request = Request::builder()
        .method("POST")
        .uri("/json")
        .header("content-type", "application/json")
        .body(Body::from(data.to_vec()))
        .expect("a valid request head");
    w.runtime.block_on(async {
        let response = router.oneshot(request).await.expect("infallible");
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("the response body completes")
            .to_bytes();
        let json: serde_json::Value =
            serde_json::from_slice(&body).expect("every answer of /json is JSON");
        match status {
            StatusCode::BAD_REQUEST => {
                assert!(json["error"].is_string(), "400 names the error: {json}");
            }
            StatusCode::OK | StatusCode::TOO_MANY_REQUESTS => {
                let expected = if status == StatusCode::OK {
                    "OK"
                } else {
                    "OVER_LIMIT"
                };
                assert_eq!(json["overallCode"], expected, "{json}");
                let statuses = json["statuses"].as_array().expect("statuses");
                let sent: serde_json::Value =
                    serde_json::from_slice(data).expect("an answered body was JSON");
                let descriptors = sent
                    .get("descriptors")
                    .and_then(|d| d.as_array())
                    .map_or(0, Vec::len);
                assert_eq!(statuses.len(), descriptors, "one status per descriptor");
            }
            other => panic!("HTTP {other}: {json}"),
        }
    });
});

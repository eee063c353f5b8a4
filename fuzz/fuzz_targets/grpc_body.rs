//! Arbitrary bytes as the HTTP/2 body of a `ShouldRateLimit` call (gRPC length-prefixed
//! frames), through shardgate's `Rls` route in process: the framing check and the first
//! message's gathering, protobuf decoding, the call, the answer's framing and the mapping
//! of its errors to gRPC statuses.
//!
//! Invariants: no panic; every answer carries a grpc-status of OK, INVALID_ARGUMENT
//! (a refused request, a body that does not decode or holds no whole message),
//! RESOURCE_EXHAUSTED (a frame header announcing more than the 64 KiB limit) or
//! INTERNAL only for a compression flag set without a negotiated encoding (the gRPC
//! compression spec's rule); never UNAVAILABLE or UNKNOWN on the memory store; an OK
//! answer is one frame holding a `RateLimitResponse` with statuses.

#![no_main]

mod common;

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use http_body_util::{BodyExt, Full};
use libfuzzer_sys::fuzz_target;
use prost::Message;
use shardgate::server::rls::Rls;
use tonic::codegen::http;
use tower::ServiceExt;

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

fuzz_target!(|data: &[u8]| {
    let w = common::world();
    let l = common::limiter(w.config.clone(), common::serve_options());
    let service = Rls::new(Arc::new(l.limiter));
    let request = http::Request::builder()
        .method("POST")
        .uri(PATH)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(Full::new(bytes_of(data))))
        .expect("a valid request head");
    w.runtime.block_on(async {
        let response = service.oneshot(request).await.expect("infallible");
        let (parts, body) = response.into_parts();
        let collected = body.collect().await.expect("the response body completes");
        let trailers = collected.trailers().cloned();
        let body = collected.to_bytes();
        // Trailers-only answers carry the status in the headers.
        let status_of = |h: &http::HeaderMap| {
            h.get("grpc-status")
                .map(|v| v.to_str().expect("ASCII status").to_string())
        };
        let status = status_of(&parts.headers)
            .or_else(|| trailers.as_ref().and_then(status_of))
            .expect("every answer has a grpc-status");
        let message = parts
            .headers
            .get("grpc-message")
            .or_else(|| trailers.as_ref().and_then(|t| t.get("grpc-message")))
            .map(|v| String::from_utf8_lossy(v.as_bytes()).replace("%20", " "))
            .unwrap_or_default();
        match status.as_str() {
            "0" => {
                assert!(body.len() >= 5, "an OK answer has a frame");
                assert_eq!(body[0], 0, "uncompressed");
                let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
                assert_eq!(body.len(), 5 + len, "exactly one frame");
                let resp = RateLimitResponse::decode(&body[5..]).expect("a RateLimitResponse");
                assert!(!resp.statuses.is_empty(), "an OK answer has statuses");
            }
            "3" => {}
            "13" => assert!(
                message.contains("protocol error: received message with"),
                "INTERNAL only for a bad compression flag, got {message:?}"
            ),
            "8" => assert!(
                message.contains("more than the 65536-byte limit"),
                "RESOURCE_EXHAUSTED only for an oversized frame, got {message:?}"
            ),
            other => panic!("grpc-status {other} ({message:?})"),
        }
    });
});

fn bytes_of(data: &[u8]) -> tonic::codegen::Bytes {
    tonic::codegen::Bytes::copy_from_slice(data)
}

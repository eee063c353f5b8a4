//! Hostile input over gRPC: oversized and malformed requests are refused with
//! INVALID_ARGUMENT naming the field (never a panic), and descriptor values built to forge
//! another bucket's key never share a bucket with it.

#[macro_use]
mod common;

use std::sync::Arc;

use common::h2_call::{h2_call, H2Answer, SHOULD_RATE_LIMIT};
use common::server::{desc, desc_hits, one, request, TestServer};
use shardgate::config::{Config, MAX_TOKENS};
use shardgate::engine::Engine;
use shardgate::service::RateLimiter;
use shardgate::store::BucketStore;
use std::time::Duration;
use tonic::Code as Status;

const RULES: &str = "
domain: hostile
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 3}
    descriptors:
      - key: b
        rate_limit: {unit: minute, requests_per_unit: 3}
  - key: a_b
    rate_limit: {unit: minute, requests_per_unit: 3}
";

async fn refused_with(
    server: &TestServer,
    req: envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest,
    field: &str,
) {
    let mut c = server.client().await;
    let err = c.call(req).await.expect_err("must be refused");
    assert_eq!(err.code(), Status::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains(field),
        "message {:?} must name {field}",
        err.message()
    );
}

#[tokio::test]
async fn oversized_and_malformed_requests_name_the_field() {
    let server = TestServer::start(RULES).await;
    let many = (0..65).map(|_| desc(&[("user", "u")])).collect();
    refused_with(&server, request("hostile", many), "descriptors").await;
    let long_entries: Vec<(String, String)> = (0..17)
        .map(|i| (format!("k{i}"), "v".to_string()))
        .collect();
    let refs: Vec<(&str, &str)> = long_entries
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    refused_with(&server, one("hostile", &refs), "descriptors[0].entries").await;
    let long_value = "v".repeat(1_025);
    refused_with(
        &server,
        one("hostile", &[("user", &long_value)]),
        "descriptors[0].entries[0].value",
    )
    .await;
    let long_key = "k".repeat(257);
    refused_with(
        &server,
        one("hostile", &[(&long_key, "v")]),
        "descriptors[0].entries[0].key",
    )
    .await;
    refused_with(
        &server,
        one("hostile", &[("", "v")]),
        "descriptors[0].entries[0].key",
    )
    .await;
    refused_with(
        &server,
        request("hostile", vec![desc(&[])]),
        "descriptors[0].entries",
    )
    .await;
    refused_with(&server, request("", vec![desc(&[("user", "u")])]), "domain").await;
    refused_with(&server, request("hostile", vec![]), "descriptors").await;
    // hits × 1000 millitokens must fit: u64::MAX hits is refused, not wrapped.
    refused_with(
        &server,
        request("hostile", vec![desc_hits(&[("user", "u")], u64::MAX)]),
        "descriptors[0].hits_addend",
    )
    .await;
    // The server is still healthy afterwards.
    let mut c = server.client().await;
    c.ok(one("hostile", &[("user", "still-served")])).await;
}

#[tokio::test]
async fn huge_but_representable_hits_are_refused_without_debit() {
    let server = TestServer::start(RULES).await;
    let mut c = server.client().await;
    let r = c
        .ok(request(
            "hostile",
            vec![desc_hits(&[("user", "big")], MAX_TOKENS)],
        ))
        .await;
    assert_eq!(r.overall_code, 2, "over limit");
    // One more than a descriptor may take: the request's error, naming the field.
    refused_with(
        &server,
        request(
            "hostile",
            vec![desc_hits(&[("user", "big")], MAX_TOKENS + 1)],
        ),
        "descriptors[0].hits_addend",
    )
    .await;
    let r = c.ok(one("hostile", &[("user", "big")])).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 2,
        "the refused request took nothing"
    );
}

type Entries = Vec<(&'static str, &'static str)>;

/// Pairs built to forge each other's bucket key: each must land in its own bucket.
fn forged_pairs() -> Vec<(Entries, Entries)> {
    vec![
        (vec![("a_b", "c")], vec![("a", "b_c")]),
        (vec![("a", "x"), ("b", "y")], vec![("a", "x/b=y")]),
        (vec![("user", "x#api#0")], vec![("user", "x")]),
        (vec![("user", "y#hostile#1")], vec![("user", "y")]),
        (vec![("user", "x%2Fy")], vec![("user", "x/y")]),
        (vec![("user", "x=y")], vec![("user", "x%3Dy")]),
        (vec![("user", "line\nbreak")], vec![("user", "line")]),
        (
            vec![("user", "ünïcødé")],
            vec![("user", "%C3%BCn%C3%AFc%C3%B8d%C3%A9")],
        ),
        (vec![("user", "a_b")], vec![("user", "a b")]),
        (vec![("user", "*")], vec![("user", "%2A")]),
    ]
}

cross_store! {
    /// Spends `first`'s 3 tokens, then checks `second` still has its own, for every pair,
    /// through the service layer on `store`.
    async fn forged_values_never_share_a_bucket<S: BucketStore>(store: S) {
        let config = Config::from_yaml("hostile.yaml", RULES).unwrap();
        let engine = Arc::new(Engine::new(Arc::new(store), common::server::serve_defaults()));
        let limiter = RateLimiter::new(Arc::new(config), engine);
        for (first, second) in forged_pairs() {
            for _ in 0..3 {
                let r = limiter.should_rate_limit(&one("hostile", &first)).await;
                assert_eq!(r.unwrap().overall_code, 1, "{first:?} has tokens");
            }
            let over = limiter.should_rate_limit(&one("hostile", &first)).await;
            assert_eq!(over.unwrap().overall_code, 2, "{first:?} is spent");
            let r = limiter
                .should_rate_limit(&one("hostile", &second))
                .await
                .unwrap();
            assert_eq!(
                r.overall_code, 1,
                "{second:?} must not share {first:?}'s bucket"
            );
            assert_eq!(r.statuses[0].limit_remaining, 2, "{second:?}");
        }
    }
}

/// The same over gRPC (the request path Envoy uses), memory store.
#[tokio::test]
async fn forged_values_never_share_a_bucket_over_grpc() {
    let server = TestServer::start(RULES).await;
    let mut c = server.client().await;
    for (first, second) in forged_pairs() {
        // Spend all 3 tokens of `first` ...
        for _ in 0..3 {
            c.ok(one("hostile", &first)).await;
        }
        let over = c.ok(one("hostile", &first)).await;
        assert_eq!(over.overall_code, 2, "{first:?} is spent");
        // ... and `second` still has its own.
        let r = c.ok(one("hostile", &second)).await;
        assert_eq!(
            r.overall_code, 1,
            "{second:?} must not share {first:?}'s bucket"
        );
        assert_eq!(r.statuses[0].limit_remaining, 2, "{second:?}");
    }
}

/// Sends `body` as-is (gRPC framing included) and returns the answer's grpc-status and
/// percent-decoded grpc-message, from the headers of a trailers-only answer or the
/// trailers.
async fn raw_call(server: &TestServer, body: &'static [u8]) -> (String, String) {
    let answer = raw_call_with(server, SHOULD_RATE_LIMIT, &[], &[body]).await;
    (answer.status, answer.message)
}

/// [`raw_call`] to any path, with more request headers, the body sent as one DATA frame
/// per chunk and the stream ended with the last.
async fn raw_call_with(
    server: &TestServer,
    path: &str,
    headers: &[(&str, &str)],
    chunks: &[&'static [u8]],
) -> H2Answer {
    let chunks = chunks
        .iter()
        .map(|c| bytes::Bytes::from_static(c))
        .collect();
    h2_call(
        server.addr,
        path,
        headers,
        chunks,
        true,
        Duration::from_secs(10),
    )
    .await
}

/// Bodies that hold no whole message are the client's error, answered with the status
/// gRPC clients and operators expect, and the server keeps answering.
#[tokio::test]
async fn broken_grpc_framing_is_a_client_error() {
    let server = TestServer::start(RULES).await;
    let cases: [(&[u8], &str, &str); 7] = [
        (b"", "3", "the request body holds no message"),
        // Two bytes of a five-byte prefix.
        (
            b"\x00\x00",
            "3",
            "ends 2 bytes into a 5-byte message prefix",
        ),
        // A frame announcing 10 bytes, holding 3.
        (
            b"\x00\x00\x00\x00\x0a\x0a\x01h",
            "3",
            "7 bytes short of its 10-byte message",
        ),
        // A whole frame whose protobuf is cut short.
        (
            b"\x00\x00\x00\x00\x03\x0a\x05h",
            "3",
            "not a RateLimitRequest",
        ),
        // A protobuf string that is not UTF-8 (domain = 0xff).
        (
            b"\x00\x00\x00\x00\x03\x0a\x01\xff",
            "3",
            "not a RateLimitRequest",
        ),
        // 2^31 bytes announced: over the 64 KiB limit, refused before anything is read.
        (b"\x00\x80\x00\x00\x00", "8", "announces 2147483648 bytes"),
        // Compressed without a negotiated encoding: INTERNAL, as gRPC's spec requires.
        (b"\x01\x00\x00\x00\x00", "13", "compressed-flag"),
    ];
    for (body, status, message) in cases {
        let (got, text) = raw_call(&server, body).await;
        assert_eq!(got, status, "{body:?}: {text}");
        assert!(text.contains(message), "{body:?}: {text:?}");
    }
    let mut c = server.client().await;
    c.ok(one("hostile", &[("user", "still-served")])).await;
}

/// A request the client compressed is refused as gRPC asks (UNIMPLEMENTED, naming what is
/// accepted): shardgate negotiates no compression. `identity` is no compression, and a
/// declared encoding whose message is not compressed is served (as grpc-go serves it).
#[tokio::test]
async fn a_compressed_request_is_unimplemented() {
    let server = TestServer::start(RULES).await;
    let gzip = [("grpc-encoding", "gzip")];
    let answer = raw_call_with(
        &server,
        SHOULD_RATE_LIMIT,
        &gzip,
        &[b"\x01\x00\x00\x00\x00"],
    )
    .await;
    assert_eq!(answer.status, "12", "{}", answer.message);
    assert!(answer.message.contains("'gzip'"), "{}", answer.message);
    assert_eq!(answer.accept_encoding, "identity");
    let long: &'static str = Box::leak("x".repeat(4000).into_boxed_str());
    let answer = raw_call_with(
        &server,
        SHOULD_RATE_LIMIT,
        &[("grpc-encoding", long)],
        &[b"\x01\x00\x00\x00\x00"],
    )
    .await;
    assert_eq!(answer.status, "12");
    assert!(
        answer.message.len() < 200,
        "a client's header is quoted bounded: {} bytes",
        answer.message.len()
    );
    let identity = [("grpc-encoding", "identity")];
    let answer = raw_call_with(&server, SHOULD_RATE_LIMIT, &identity, &[b""]).await;
    assert_eq!(
        (answer.status.as_str(), answer.message.as_str()),
        ("3", "the request body holds no message")
    );
    // Declared, not used: the message is read and decided.
    use prost::Message;
    let message = one("hostile", &[("user", "declared")]).encode_to_vec();
    let mut body = vec![0u8];
    body.extend((message.len() as u32).to_be_bytes());
    body.extend(&message);
    let body: &'static [u8] = Box::leak(body.into_boxed_slice());
    let answer = raw_call_with(&server, SHOULD_RATE_LIMIT, &gzip, &[body]).await;
    assert_eq!(answer.status, "0", "{}", answer.message);
}

/// The port routes the rate-limit service's paths to it and every other to tonic's
/// router: another method of the service, or another service, is UNIMPLEMENTED.
#[tokio::test]
async fn other_methods_and_services_are_unimplemented() {
    let server = TestServer::start(RULES).await;
    for path in [
        "/envoy.service.ratelimit.v3.RateLimitService/Other",
        "/envoy.service.ratelimit.v3.RateLimitService/",
        "/envoy.service.ratelimit.v2.RateLimitService/ShouldRateLimit",
        "/acme.Widgets/Get",
    ] {
        let answer = raw_call_with(&server, path, &[], &[b"\x00\x00\x00\x00\x00"]).await;
        assert_eq!(answer.status, "12", "{path}: {}", answer.message);
    }
    let mut c = server.client().await;
    c.ok(one("hostile", &[("user", "routed")])).await;
}

/// A message is read whole however the client's DATA frames cut it, and a unary call's
/// first message is the one decided (any after it are checked and dropped, as tonic did).
#[tokio::test]
async fn a_message_in_any_frames_is_read_whole() {
    use prost::Message;
    let server = TestServer::start(RULES).await;
    let message = one("hostile", &[("user", "framed")]).encode_to_vec();
    let mut body = vec![0u8];
    body.extend((message.len() as u32).to_be_bytes());
    body.extend(&message);
    let body: &'static [u8] = Box::leak(body.into_boxed_slice());
    for split in [1, 3, 5, 6, body.len() - 1] {
        let (a, b) = body.split_at(split);
        let answer = raw_call_with(&server, SHOULD_RATE_LIMIT, &[], &[a, b]).await;
        assert_eq!(answer.status, "0", "split at {split}: {}", answer.message);
    }
    let bytewise: Vec<&'static [u8]> = body.chunks(1).collect();
    assert_eq!(
        raw_call_with(&server, SHOULD_RATE_LIMIT, &[], &bytewise)
            .await
            .status,
        "0"
    );
    // Two messages: the second, empty, is framed whole but not decided (decided, it would
    // be INVALID_ARGUMENT: it names no domain).
    let two: &'static [u8] = Box::leak([body, b"\x00\x00\x00\x00\x00"].concat().into_boxed_slice());
    assert_eq!(
        raw_call_with(&server, SHOULD_RATE_LIMIT, &[], &[two])
            .await
            .status,
        "0"
    );
    // ... and a second message cut short fails the call, as before.
    let cut: &'static [u8] = Box::leak(
        [body, b"\x00\x00\x00\x00\x09ab"]
            .concat()
            .into_boxed_slice(),
    );
    let answer = raw_call_with(&server, SHOULD_RATE_LIMIT, &[], &[cut]).await;
    assert_eq!(answer.status, "3", "{}", answer.message);
    assert!(
        answer
            .message
            .contains("7 bytes short of its 9-byte message"),
        "{}",
        answer.message
    );
    // A later message's compressed flag is refused as the first one's is.
    let later: &'static [u8] =
        Box::leak([body, b"\x01\x00\x00\x00\x00"].concat().into_boxed_slice());
    let answer = raw_call_with(&server, SHOULD_RATE_LIMIT, &[], &[later]).await;
    assert_eq!(answer.status, "13", "{}", answer.message);
}

//! The gRPC port's limits against hostile HTTP/2 clients: streams past the per-connection
//! limit refused, a flood of streams the server must reset itself ended with GOAWAY, a
//! request message announced too large refused at its prefix, a body that stalls answered
//! when its time is up, with the server's defaults — and a well-behaved client on another
//! connection answered inside its deadline throughout. Then the connection's lifetime: a
//! peer that stops answering pings dropped, an old connection sent GOAWAY.

mod common;

use std::time::Duration;

use common::h2_call::{h2_call, H2Answer, SHOULD_RATE_LIMIT};
use common::raw_h2::{self, RawConnection};
use common::server::{one, TestServer};
use shardgate::server::port_limits::PortLimits;

const RULES: &str = "
domain: port
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000}
";

const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// The default bounds (`PortLimits::default()`, as `serve` uses them).
const MAX_STREAMS: u32 = 1024;
const MAX_MESSAGE_BYTES: u32 = 64 * 1024;

/// How long a test waits for what it expects before it fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// A well-behaved client on a connection of its own gets an OK answer inside a 1 s
/// deadline.
async fn answered_within_a_second(server: &TestServer) {
    let mut client = server.client().await;
    let mut request = tonic::Request::new(one("port", &[("user", "calm")]));
    request.set_timeout(Duration::from_secs(1));
    let call = client.0.should_rate_limit(request);
    let answer = tokio::time::timeout(Duration::from_secs(1), call)
        .await
        .expect("answered inside its 1 s deadline")
        .expect("answered OK");
    assert_eq!(answer.into_inner().overall_code, 1);
}

/// The server's first SETTINGS frame, as `(identifier, value)` pairs.
async fn server_settings(conn: &mut RawConnection) -> Vec<(u16, u32)> {
    let settings = conn
        .frame_where(PATIENCE, |f| f.kind == raw_h2::SETTINGS && f.flags & 1 == 0)
        .await
        .expect("the server's SETTINGS");
    settings.settings()
}

#[tokio::test]
async fn the_port_announces_its_http2_limits() {
    let server = TestServer::start(RULES).await;
    let mut conn = RawConnection::open(server.addr).await;
    let settings = server_settings(&mut conn).await;
    let value = |id| settings.iter().find(|(i, _)| *i == id).map(|(_, v)| *v);
    assert_eq!(
        value(raw_h2::MAX_CONCURRENT_STREAMS),
        Some(MAX_STREAMS),
        "{settings:?}"
    );
    assert_eq!(value(raw_h2::MAX_HEADER_LIST_SIZE), Some(16 * 1024));
    // 16 KiB frames are the protocol's default: the setting need not be sent.
    assert!(matches!(value(raw_h2::MAX_FRAME_SIZE), None | Some(16_384)));
}

/// Thousands of streams opened at once on one connection: those past the limit are
/// refused (REFUSED_STREAM, which a client may retry elsewhere), the others are answered
/// once their bodies' time is up, and another connection is served meanwhile.
#[tokio::test]
async fn streams_past_the_limit_are_refused() {
    let server = TestServer::start(RULES).await;
    let mut conn = RawConnection::open(server.addr).await;
    let opened = MAX_STREAMS + 76;
    let mut burst = Vec::new();
    for i in 0..opened {
        // Headers and no body yet: every stream waits for its message.
        burst.extend(raw_h2::headers(
            1 + 2 * i,
            &raw_h2::grpc_request(SHOULD_RATE_LIMIT),
            false,
        ));
    }
    conn.send(&burst).await;
    answered_within_a_second(&server).await;
    let mut refused = 0;
    let mut answered = 0;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while refused + answered < opened && tokio::time::Instant::now() < deadline {
        let Some(frame) = conn.frame_where(PATIENCE, |_| true).await else {
            break;
        };
        match frame.kind {
            raw_h2::RST_STREAM if frame.error_code() == raw_h2::REFUSED_STREAM => refused += 1,
            raw_h2::HEADERS if frame.flags & raw_h2::END_STREAM != 0 => answered += 1,
            _ => {}
        }
    }
    assert_eq!(
        refused,
        opened - MAX_STREAMS,
        "streams refused past the limit"
    );
    assert_eq!(answered, MAX_STREAMS, "every stream let in is answered");
    answered_within_a_second(&server).await;
}

/// Requests the server must reset itself (here: no `:method`), sent by the thousand: past
/// h2's local-reset limit the offender gets GOAWAY ENHANCE_YOUR_CALM and its connection
/// is closed, instead of the server queueing resets for as long as the client sends.
#[tokio::test]
async fn a_flood_of_locally_reset_streams_ends_in_goaway() {
    let server = TestServer::start(RULES).await;
    let mut conn = RawConnection::open(server.addr).await;
    let mut flood = Vec::new();
    for i in 0..1_500u32 {
        flood.extend(raw_h2::headers(
            1 + 2 * i,
            &raw_h2::malformed_request(),
            true,
        ));
    }
    conn.send(&flood).await;
    let (frames, closed) = conn.frames_until_closed(PATIENCE).await;
    let resets = frames
        .iter()
        .filter(|f| f.kind == raw_h2::RST_STREAM && f.error_code() == raw_h2::PROTOCOL_ERROR)
        .count();
    let goaway = frames.iter().find(|f| f.kind == raw_h2::GOAWAY);
    assert_eq!(
        goaway.map(raw_h2::Frame::error_code),
        Some(raw_h2::ENHANCE_YOUR_CALM),
        "{resets} streams reset, then no GOAWAY: {:?}",
        {
            let mut kinds = std::collections::BTreeMap::new();
            for f in &frames {
                let code =
                    matches!(f.kind, raw_h2::RST_STREAM | raw_h2::GOAWAY).then(|| f.error_code());
                *kinds.entry((f.kind, code)).or_insert(0) += 1;
            }
            kinds
        }
    );
    assert!(closed, "the offender's connection is closed");
    assert!(resets <= 1_024, "{resets} resets before the GOAWAY");
    answered_within_a_second(&server).await;
}

/// Sends the headers of a call to `path` and `body`, ending the stream only if `end`, and
/// waits for the answer; the request stream stays open unless ended, to watch the server
/// reset it.
async fn call_with_body(server: &TestServer, path: &str, body: Vec<u8>, end: bool) -> H2Answer {
    h2_call(server.addr, path, &[], vec![body.into()], end, PATIENCE).await
}

/// A gRPC message prefix announcing `len` bytes.
fn prefix(len: u32) -> Vec<u8> {
    let mut p = vec![0u8];
    p.extend(len.to_be_bytes());
    p
}

#[tokio::test]
async fn a_message_announced_too_large_is_refused_at_its_prefix() {
    let server = TestServer::start(RULES).await;
    // The prefix alone, the stream left open: nothing of the body is awaited.
    let too_large = prefix(MAX_MESSAGE_BYTES + 1);
    let call = call_with_body(&server, SHOULD_RATE_LIMIT, too_large.clone(), false).await;
    assert_eq!(call.status, "8", "RESOURCE_EXHAUSTED: {}", call.message);
    assert_eq!(
        call.message,
        "the request message announces 65537 bytes, more than the 65536-byte limit"
    );
    // At the limit, the message is read (and is no RateLimitRequest).
    let mut whole = prefix(MAX_MESSAGE_BYTES);
    whole.extend(vec![0xffu8; MAX_MESSAGE_BYTES as usize]);
    let call = call_with_body(&server, SHOULD_RATE_LIMIT, whole, true).await;
    assert_eq!(call.status, "3", "{}", call.message);
    // Health's and reflection's messages are bounded alike (tonic's codec answers
    // OUT_OF_RANGE).
    let call = call_with_body(&server, HEALTH_CHECK, too_large, false).await;
    assert_eq!(call.status, "11", "{}", call.message);
    answered_within_a_second(&server).await;
}

/// A body that stops arriving, from a client that sent no `grpc-timeout`: answered
/// DEADLINE_EXCEEDED once the store timeout (1 s by default) has passed, and its stream
/// reset so that what it held is freed.
#[tokio::test]
async fn a_stalled_body_is_answered_when_its_time_is_up() {
    let server = TestServer::start(RULES).await;
    let mut body = prefix(10);
    body.extend(b"\x0a\x04po");
    let mut call = call_with_body(&server, SHOULD_RATE_LIMIT, body, false).await;
    assert_eq!(call.status, "4", "DEADLINE_EXCEEDED: {}", call.message);
    assert_eq!(
        call.message,
        "the request body was not whole within 1s (--store-timeout)"
    );
    let reset = tokio::time::timeout(
        PATIENCE,
        futures::future::poll_fn(|cx| call.stream.poll_reset(cx)),
    )
    .await
    .expect("the stream is reset")
    .unwrap();
    assert_eq!(reset, h2::Reason::NO_ERROR);
    answered_within_a_second(&server).await;
}

/// A peer that stops answering (here: a raw client that never answers PING) is dropped
/// once a ping has gone unanswered for the keepalive timeout, while a client that answers
/// keeps its connection. Short, non-default values; the defaults (a ping a minute, 20 s
/// for its answer) are checked in `port_limits.rs`.
#[tokio::test]
async fn a_peer_that_never_answers_pings_is_dropped() {
    let limits = PortLimits {
        keepalive_interval: Some(Duration::from_millis(200)),
        keepalive_timeout: Duration::from_millis(200),
        ..PortLimits::default()
    };
    let server = TestServer::start_limited(RULES, limits).await;
    let mut client = server.client().await;
    let mut silent = RawConnection::open(server.addr).await;
    let (frames, closed) = silent.frames_until_closed(PATIENCE).await;
    let pings = frames
        .iter()
        .filter(|f| f.kind == raw_h2::PING && f.flags & 1 == 0)
        .count();
    assert!(pings >= 1, "pinged: {frames:?}");
    assert!(closed, "closed once its ping went unanswered");
    // The well-behaved client's connection, idle all along, answered the pings.
    client.ok(one("port", &[("user", "pinged")])).await;
}

/// With a maximum connection age, a connection that old is sent GOAWAY (NO_ERROR: its
/// client reconnects); by default connections are not aged.
#[tokio::test]
async fn an_old_connection_is_sent_goaway() {
    let limits = PortLimits {
        max_connection_age: Some(Duration::from_millis(300)),
        ..PortLimits::default()
    };
    let aged = TestServer::start_limited(RULES, limits).await;
    let mut conn = RawConnection::open(aged.addr).await;
    let goaway = conn
        .frame_where(PATIENCE, |f| f.kind == raw_h2::GOAWAY)
        .await
        .expect("GOAWAY once the connection is 300 ms old");
    assert_eq!(goaway.error_code(), raw_h2::NO_ERROR);
    answered_within_a_second(&aged).await;

    let default = TestServer::start(RULES).await;
    let mut conn = RawConnection::open(default.addr).await;
    let goaway = conn
        .frame_where(Duration::from_secs(1), |f| f.kind == raw_h2::GOAWAY)
        .await;
    assert!(goaway.is_none(), "no GOAWAY by default: {goaway:?}");
}

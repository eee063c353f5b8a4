//! One gRPC call made with the `h2` crate rather than a gRPC client, so a test controls the
//! bytes: a body of any framing (or none), extra headers, a stream left open. The answer is
//! read the way a gRPC client reads it, from the headers of a trailers-only answer or from
//! the trailers. Frame-level lies (bad frames, floods) belong to [`super::raw_h2`].

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;

/// The path of `RateLimitService/ShouldRateLimit`.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// What a call was answered, and its request stream, still open unless the call ended it,
/// so a test can watch the server reset it.
pub struct H2Answer {
    pub status: String,
    /// Percent-decoded, as gRPC clients show it.
    pub message: String,
    pub accept_encoding: String,
    pub stream: h2::SendStream<Bytes>,
}

/// Opens a connection of its own to `addr`, sends a gRPC call to `path` with `headers`
/// added and the body as one DATA frame per chunk, ends the request stream with the last
/// chunk only if `end` (with no chunks: on the headers), and waits up to `patience` for the
/// answer's headers.
pub async fn h2_call(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    chunks: Vec<Bytes>,
    end: bool,
    patience: Duration,
) -> H2Answer {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (send, connection) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(connection);
    let request = http::Request::builder()
        .method(http::Method::POST)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    let request = headers
        .iter()
        .fold(request, |r, (name, value)| r.header(*name, *value))
        .body(())
        .unwrap();
    let mut send = send.ready().await.unwrap();
    let (response, mut stream) = send
        .send_request(request, end && chunks.is_empty())
        .unwrap();
    let last = chunks.len();
    for (i, chunk) in chunks.into_iter().enumerate() {
        stream.send_data(chunk, end && i + 1 == last).unwrap();
    }
    let response = tokio::time::timeout(patience, response)
        .await
        .expect("answered in time")
        .unwrap();
    let (parts, mut recv) = response.into_parts();
    while let Some(chunk) = recv.data().await {
        chunk.unwrap();
    }
    let trailers = recv.trailers().await.unwrap().unwrap_or_default();
    let field = |name: &str| {
        let value = parts.headers.get(name).or_else(|| trailers.get(name));
        value.map_or_else(String::new, |v| {
            percent_encoding::percent_decode(v.as_bytes())
                .decode_utf8_lossy()
                .into_owned()
        })
    };
    H2Answer {
        status: field("grpc-status"),
        message: field("grpc-message"),
        accept_encoding: field("grpc-accept-encoding"),
        stream,
    }
}

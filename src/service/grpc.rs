//! The gRPC surface: Envoy's `RateLimitService`, `grpc.health.v1` health and gRPC
//! reflection, served by tonic on one listener.
//!
//! It translates between tonic and [`RateLimiter`]; it decides nothing itself.

use std::sync::Arc;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::codegen::http;
use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;

use super::deadline;
use super::decision::{CallError, RateLimiter};
use super::socket::no_delay;
use super::tls::TlsState;
use crate::store::BucketStore;
use crate::text::{elide, MESSAGE_BYTES};

/// Service names the health service reports on: the overall server and the rate-limit
/// service under its short and full names.
pub const HEALTH_SERVICES: [&str; 2] = ["ratelimit", "envoy.service.ratelimit.v3.RateLimitService"];

/// File descriptors of the rate-limit API, for reflection (generated from Envoy's protos
/// by `scripts/gen_descriptor.py`).
const RLS_DESCRIPTOR_SET: &[u8] = include_bytes!("rls_descriptor.bin");

/// The tonic service around a [`RateLimiter`].
pub struct Grpc<S: BucketStore> {
    limiter: Arc<RateLimiter<S>>,
}

impl<S: BucketStore> Grpc<S> {
    pub fn new(limiter: Arc<RateLimiter<S>>) -> Grpc<S> {
        Grpc { limiter }
    }
}

#[tonic::async_trait]
impl<S: BucketStore> RateLimitService for Grpc<S> {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        // Before anything else: the caller's clock started when it sent the request.
        let received = tokio::time::Instant::now();
        let caller = request
            .metadata()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(deadline::parse_grpc_timeout);
        let by = deadline::deadline(received, caller, self.limiter.store_timeout());
        match self
            .limiter
            .should_rate_limit_by(request.get_ref(), by)
            .await
        {
            Ok(resp) => Ok(Response::new(resp)),
            Err(e @ CallError::InvalidArgument(_)) => Err(Status::invalid_argument(message(&e))),
            Err(e @ CallError::Unavailable(_)) => Err(Status::unavailable(message(&e))),
        }
    }
}

/// A status message: an error's text, bounded (a client refuses trailers past a few KB,
/// and a message quotes request values).
fn message(e: &CallError) -> String {
    elide(&e.to_string(), MESSAGE_BYTES).into_owned()
}

/// Serves gRPC on `listener` until `shutdown` resolves (health always SERVING).
pub async fn serve<S: BucketStore>(
    limiter: Arc<RateLimiter<S>>,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    serve_with(limiter, listener, None, None, shutdown).await
}

/// Serves gRPC over TLS (see [`super::tls`]) on `listener` until `shutdown` resolves.
pub async fn serve_tls<S: BucketStore>(
    limiter: Arc<RateLimiter<S>>,
    listener: TcpListener,
    tls: Arc<TlsState>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    serve_with(limiter, listener, Some(tls), None, shutdown).await
}

/// Serves gRPC, over TLS if `tls` is set, with the health service following `healthy`
/// (SERVING while it holds true, NOT_SERVING otherwise) when it is given.
pub async fn serve_with<S: BucketStore>(
    limiter: Arc<RateLimiter<S>>,
    listener: TcpListener,
    tls: Option<Arc<TlsState>>,
    healthy: Option<watch::Receiver<bool>>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let router = router(limiter, healthy).await;
    match tls {
        Some(tls) => {
            router
                .serve_with_incoming_shutdown(tls.incoming(listener), shutdown)
                .await
        }
        None => {
            let incoming = tokio_stream::StreamExt::map(TcpListenerStream::new(listener), |conn| {
                conn.inspect(no_delay)
            });
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await
        }
    }
}

async fn set_health(reporter: &tonic_health::server::HealthReporter, serving: bool) {
    let status = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    reporter.set_service_status("", status).await;
    for name in HEALTH_SERVICES {
        reporter.set_service_status(name, status).await;
    }
}

/// A response of the gRPC listener.
pub type GrpcResponse = http::Response<tonic::body::Body>;

/// The server stack: every route behind [`refuse_undecodable`].
type Stack = tower::layer::util::Stack<
    tower::util::MapResponseLayer<fn(GrpcResponse) -> GrpcResponse>,
    tower::layer::util::Identity,
>;

/// tonic's answers to a request body it could not turn into a message, by the message it
/// gives, and the status shardgate answers instead. A body that does not decode, or holds
/// no whole message, is the client's error: INVALID_ARGUMENT (tonic says INTERNAL, which
/// reads as a server fault), keeping tonic's message, which names what was wrong (for
/// protobuf, the field). A frame longer than the 4 MiB limit is RESOURCE_EXHAUSTED, the
/// gRPC spec's code for an oversized message (tonic says OUT_OF_RANGE). A compressed
/// frame nobody negotiated stays INTERNAL, as gRPC's compression spec requires.
const CLIENT_ERRORS: [(&str, &str, &str); 4] = [
    ("13", "failed to decode Protobuf message", "3"),
    ("13", "Missing request message", "3"),
    ("13", "Unexpected EOF decoding stream", "3"),
    ("11", "decoded message length too large", "8"),
];

/// Gives a request body that does not make a message (malformed protobuf, a string that
/// is not UTF-8, an empty or cut-short body, an oversized frame) the status of a client
/// error; see [`CLIENT_ERRORS`]. Every route of the server passes through it.
pub fn refuse_undecodable(mut response: GrpcResponse) -> GrpcResponse {
    let headers = response.headers_mut();
    let Some(status) = headers.get("grpc-status") else {
        return response;
    };
    if status == "0" {
        return response;
    }
    let message = headers
        .get("grpc-message")
        .map(|m| percent_encoding::percent_decode(m.as_bytes()).decode_utf8_lossy())
        .unwrap_or_default();
    let mapped = CLIENT_ERRORS
        .iter()
        .find(|(from, text, _)| status == *from && message.contains(text))
        .map(|(_, _, to)| *to);
    if let Some(to) = mapped {
        headers.insert("grpc-status", http::HeaderValue::from_static(to));
    }
    response
}

/// The rate-limit service with health and reflection beside it.
async fn router<S: BucketStore>(
    limiter: Arc<RateLimiter<S>>,
    healthy: Option<watch::Receiver<bool>>,
) -> tonic::transport::server::Router<Stack> {
    let (reporter, health) = tonic_health::server::health_reporter();
    set_health(&reporter, healthy.as_ref().is_none_or(|h| *h.borrow())).await;
    if let Some(mut healthy) = healthy {
        tokio::spawn(async move {
            while healthy.changed().await.is_ok() {
                let serving = *healthy.borrow_and_update();
                set_health(&reporter, serving).await;
            }
        });
    }
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(RLS_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("the embedded descriptor sets are valid");
    tonic::transport::Server::builder()
        .layer(tower::util::MapResponseLayer::new(
            refuse_undecodable as fn(GrpcResponse) -> GrpcResponse,
        ))
        .add_service(health)
        .add_service(reflection)
        .add_service(RateLimitServiceServer::new(Grpc::new(limiter)))
}

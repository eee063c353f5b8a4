//! The gRPC listener: Envoy's `RateLimitService` (`rls.rs`), `grpc.health.v1` health and
//! gRPC reflection, served by tonic on one listener, over TLS when configured, each call
//! in its caller's trace context when spans are exported (`trace_context.rs`). It
//! assembles and serves; it decides nothing itself.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tonic_health::ServingStatus;

use super::decision::RateLimiter;
use super::rls::{Rls, SERVICE_NAME};
use super::socket::no_delay;
use super::tls::TlsState;
#[cfg(feature = "otel")]
use super::trace_context::TraceContextLayer;
use crate::store::BucketStore;

/// Service names the health service reports on: the overall server and the rate-limit
/// service under its short and full names.
pub const HEALTH_SERVICES: [&str; 2] = ["ratelimit", SERVICE_NAME];

/// File descriptors of the rate-limit API, for reflection (generated from Envoy's protos
/// by `scripts/gen_descriptor.py`).
const RLS_DESCRIPTOR_SET: &[u8] = include_bytes!("rls_descriptor.bin");

/// Serves gRPC on `listener` until `shutdown` resolves (health always SERVING).
pub async fn serve<S: BucketStore>(
    limiter: Arc<RateLimiter<S>>,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    serve_with(limiter, listener, None, None, false, shutdown).await
}

/// Serves gRPC over TLS (see [`super::tls`]) on `listener` until `shutdown` resolves.
pub async fn serve_tls<S: BucketStore>(
    limiter: Arc<RateLimiter<S>>,
    listener: TcpListener,
    tls: Arc<TlsState>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    serve_with(limiter, listener, Some(tls), None, false, shutdown).await
}

/// Serves gRPC, over TLS if `tls` is set, with the health service following `healthy`
/// (SERVING while it holds true, NOT_SERVING otherwise) when it is given, and each call
/// in the trace context its caller sends when `trace_context` is set (spans exported;
/// ignored without the `otel` feature).
pub async fn serve_with<S: BucketStore>(
    limiter: Arc<RateLimiter<S>>,
    listener: TcpListener,
    tls: Option<Arc<TlsState>>,
    healthy: Option<watch::Receiver<bool>>,
    trace_context: bool,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    let metrics = limiter.metrics().clone();
    let router = router(limiter, healthy, trace_context).await;
    match tls {
        Some(tls) => {
            router
                .serve_with_incoming_shutdown(tls.incoming(listener, metrics), shutdown)
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

/// The layers around every gRPC service: the caller's trace context, when built with
/// `otel`.
#[cfg(feature = "otel")]
type Layers = tower::layer::util::Stack<TraceContextLayer, tower::layer::util::Identity>;
#[cfg(not(feature = "otel"))]
type Layers = tower::layer::util::Identity;

/// The rate-limit service with health and reflection beside it.
async fn router<S: BucketStore>(
    limiter: Arc<RateLimiter<S>>,
    healthy: Option<watch::Receiver<bool>>,
    trace_context: bool,
) -> tonic::transport::server::Router<Layers> {
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
    #[cfg(feature = "otel")]
    let mut server =
        tonic::transport::Server::builder().layer(TraceContextLayer::new(trace_context));
    #[cfg(not(feature = "otel"))]
    let mut server = {
        let _no_trace_context_without_otel = trace_context;
        tonic::transport::Server::builder()
    };
    server
        .add_service(health)
        .add_service(reflection)
        .add_service(Rls::new(limiter))
}

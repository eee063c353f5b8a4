//! The gRPC listener: Envoy's `RateLimitService` (`rls.rs`), its Rate Limit Quota Service
//! (`rlqs.rs`), `grpc.health.v1` health and gRPC reflection on one listener, over TLS when
//! configured, each call in its caller's trace context when spans are exported
//! (`trace_context.rs`). It assembles and serves; it decides nothing itself.
//!
//! The rate-limit service's calls go to it straight from the port ([`Port`]); only the
//! others (RLQS, health, reflection, any unknown service) go through tonic's router, held
//! to their deadline and the connection's close (`others.rs`). Every call is fenced against
//! a panic (`panics.rs`); a request that is not gRPC is refused HTTP 415
//! (`content_type.rs`). The port's HTTP/2 limits are `port_limits.rs`'; its connections
//! are accepted by `accept.rs` and served, each by one task with its calls, by
//! `connection/`.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use std::pin::Pin;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use http_body_util::Either as EitherBody;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tonic::service::Routes;
use tonic_health::ServingStatus;
use tower::{Layer, Service};

use super::accept::Accepting;
use super::connection::{self, ConnectionContext};
use super::content_type;
use super::others::{self, OtherFuture};
use super::panics::{CallId, Fenced};
use super::port_limits::PortLimits;
use super::rlqs::Rlqs;
use super::rls::{self, Rls, SERVICE_NAME};
use super::tls::TlsState;
#[cfg(feature = "otel")]
use super::trace_context::TraceContextLayer;
use super::unary_response::AnswerBody;
use crate::service::decision::RateLimiter;
use crate::store::BucketStore;

/// Service names the health service reports readiness on (besides the server's own, ""):
/// the rate-limit service under its short and full names. Ready once the store has
/// answered after start-up, and from then on whatever the store does: a store outage is
/// answered by each rule's `failure_mode`, which only a server in the endpoints can give.
pub const HEALTH_SERVICES: [&str; 2] = ["ratelimit", SERVICE_NAME];

/// The health service name that follows the store itself (SERVING while it answers), for
/// whoever wants to route away from a server whose store does not answer.
pub const STORE_HEALTH_SERVICE: &str = "store";

/// What the health service follows: readiness (see [`HEALTH_SERVICES`]) and the store's
/// health (see [`STORE_HEALTH_SERVICE`]), each SERVING while it holds true.
#[derive(Debug, Clone)]
pub struct HealthWatch {
    pub ready: watch::Receiver<bool>,
    pub store: watch::Receiver<bool>,
}

/// File descriptors of the rate-limit API, for reflection (generated from Envoy's protos
/// by `scripts/gen_descriptor.py`).
const RLS_DESCRIPTOR_SET: &[u8] = include_bytes!("rls_descriptor.bin");

/// How the port serves, beyond its listener.
#[derive(Default)]
pub struct PortOptions {
    /// TLS (see [`super::tls`]) when set.
    pub tls: Option<Arc<TlsState>>,
    /// What the health service follows when it is given; always SERVING otherwise.
    pub health: Option<HealthWatch>,
    /// Each call in the trace context its caller sends (spans exported; ignored without
    /// the `otel` feature).
    pub trace_context: bool,
    /// HTTP/2 limits and the request message bound.
    pub limits: PortLimits,
    /// RLQS limits shared with the other servers of a fleet through the store (a store
    /// they share: DynamoDB, Redis), rather than divided among this server's Envoys.
    pub rlqs_fleet: bool,
}

/// Serves gRPC on `listener` until `shutdown` resolves (health always SERVING).
pub async fn serve<S: BucketStore>(
    limiter: Arc<RateLimiter<S>>,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    serve_with(limiter, listener, PortOptions::default(), shutdown).await
}

/// Serves gRPC over TLS (see [`super::tls`]) on `listener` until `shutdown` resolves.
pub async fn serve_tls<S: BucketStore>(
    limiter: Arc<RateLimiter<S>>,
    listener: TcpListener,
    tls: Arc<TlsState>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let options = PortOptions {
        tls: Some(tls),
        ..PortOptions::default()
    };
    serve_with(limiter, listener, options, shutdown).await
}

/// Serves gRPC on `listener` as `options` say until `shutdown` resolves, then until the
/// calls in flight have finished.
pub async fn serve_with<S: BucketStore>(
    limiter: Arc<RateLimiter<S>>,
    listener: TcpListener,
    options: PortOptions,
    shutdown: impl std::future::Future<Output = ()> + Send,
) {
    let metrics = limiter.metrics().clone();
    let limits = options.limits;
    let rlqs = Rlqs::server(
        limiter.clone(),
        limits.max_message_len(),
        options.rlqs_fleet,
    );
    let rls = Rls::new(limiter).with_max_message_len(limits.max_message_len());
    let others = others(options.health, limits.max_message_len(), rlqs).await;
    let trace_context = options.trace_context;
    let make = move |context| {
        layers(trace_context).layer(Port {
            rls: rls.clone(),
            others: others.clone(),
            context,
        })
    };
    let accepting = Accepting::new(listener, metrics.clone());
    match options.tls {
        Some(tls) => {
            let incoming = tls.incoming(accepting, metrics.clone());
            connection::serve(incoming, make, limits, metrics, shutdown).await
        }
        None => connection::serve(accepting, make, limits, metrics, shutdown).await,
    }
}

/// The gRPC port's calls on one connection: the rate-limit service's to it directly,
/// after one comparison of the path, and every other call through tonic's router. Through
/// the router, every call paid its routing: axum's path match, its URL-parameter and
/// matched-path request extensions (a map allocated per call), a clone of the route's
/// boxed service and the request's body boxed once more (measured in bench/README.md,
/// "Where a request's CPU goes"). Every call is fenced against a panic (`panics.rs`); a
/// request that is not gRPC is refused before either.
struct Port<S: BucketStore> {
    rls: Rls<S>,
    /// Health, reflection, and UNIMPLEMENTED for any other service.
    others: Routes,
    context: Arc<ConnectionContext>,
}

impl<S: BucketStore> Clone for Port<S> {
    fn clone(&self) -> Port<S> {
        Port {
            rls: self.rls.clone(),
            others: self.others.clone(),
            context: self.context.clone(),
        }
    }
}

/// What the port answers with: the rate-limit service's own body, or tonic's.
type PortBody = EitherBody<AnswerBody, Body>;

type Answered<B> = Result<Response<B>, Infallible>;

/// A call's answer on the port.
enum PortFuture {
    Rls(Fenced<rls::CallFuture>),
    Other(Fenced<OtherFuture>),
    Refused(Option<Response<AnswerBody>>),
}

impl std::future::Future for PortFuture {
    type Output = Answered<PortBody>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answered<PortBody>> {
        match self.get_mut() {
            PortFuture::Rls(call) => Pin::new(call)
                .poll(cx)
                .map(|a| a.map(|r| r.map(EitherBody::Left))),
            PortFuture::Other(call) => Pin::new(call)
                .poll(cx)
                .map(|a| a.map(|r| r.map(EitherBody::Right))),
            PortFuture::Refused(answer) => match answer.take() {
                Some(answer) => Poll::Ready(Ok(answer.map(EitherBody::Left))),
                None => Poll::Pending,
            },
        }
    }
}

impl<S: BucketStore> Service<Request<Body>> for Port<S> {
    type Response = Response<PortBody>;
    type Error = Infallible;
    type Future = PortFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // The rate-limit service is always ready.
        Service::<Request<Body>>::poll_ready(&mut self.others, cx)
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        // Before anything else: the caller's clock started when it sent the request.
        let arrived = tokio::time::Instant::now();
        if let Some(refused) = content_type::refusal(request.headers()) {
            return PortFuture::Refused(Some(refused));
        }
        let id = CallId::next(&self.context, request.headers());
        if rls::serves(request.uri().path()) {
            let call = self.rls.call_at(request, arrived);
            PortFuture::Rls(Fenced::new(
                call,
                id,
                "ShouldRateLimit",
                self.context.clone(),
            ))
        } else {
            let deadline = others::deadline(request.headers(), arrived);
            let answer = self.others.call(request);
            let call = others::bounded(answer, deadline, self.context.closing());
            PortFuture::Other(Fenced::new(
                call,
                id,
                "health or reflection",
                self.context.clone(),
            ))
        }
    }
}

/// Sets the status of each of `names`.
async fn set_health(
    reporter: &tonic_health::server::HealthReporter,
    names: &[&str],
    serving: bool,
) {
    let status = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    for name in names {
        reporter.set_service_status(name, status).await;
    }
}

/// Keeps `names` following `watch` (SERVING while it holds true), from now on.
async fn follow(
    reporter: &tonic_health::server::HealthReporter,
    names: &'static [&'static str],
    mut watch: watch::Receiver<bool>,
) {
    let now = *watch.borrow_and_update();
    set_health(reporter, names, now).await;
    let reporter = reporter.clone();
    tokio::spawn(async move {
        while watch.changed().await.is_ok() {
            let serving = *watch.borrow_and_update();
            set_health(&reporter, names, serving).await;
        }
    });
}

/// The layers around every gRPC service: the caller's trace context, when built with
/// `otel`.
#[cfg(feature = "otel")]
fn layers(trace_context: bool) -> TraceContextLayer {
    TraceContextLayer::new(trace_context)
}

/// No layer: no trace context is read without `otel`.
#[cfg(not(feature = "otel"))]
fn layers(_trace_context: bool) -> tower::layer::util::Identity {
    tower::layer::util::Identity::new()
}

/// Readiness names: the server's own and [`HEALTH_SERVICES`].
const READY_NAMES: [&str; 3] = ["", HEALTH_SERVICES[0], HEALTH_SERVICES[1]];

/// Health, reflection and the Rate Limit Quota Service (`rlqs.rs`, a long-lived stream:
/// not on the rate-limit route's unary path), in tonic's router, their request messages
/// bounded as the rate-limit service's are.
#[expect(clippy::expect_used, reason = "the embedded descriptor sets are valid")]
async fn others<S: BucketStore>(
    health: Option<HealthWatch>,
    max_message_len: usize,
    rlqs: RateLimitQuotaServiceServer<Rlqs<S>>,
) -> Routes {
    let (reporter, service) = tonic_health::server::health_reporter();
    let service = service.max_decoding_message_size(max_message_len);
    match health {
        Some(HealthWatch { ready, store }) => {
            follow(&reporter, &READY_NAMES, ready).await;
            follow(&reporter, &[STORE_HEALTH_SERVICE], store).await;
        }
        None => {
            set_health(&reporter, &READY_NAMES, true).await;
            set_health(&reporter, &[STORE_HEALTH_SERVICE], true).await;
        }
    }
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(RLS_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("the embedded descriptor sets are valid")
        .max_decoding_message_size(max_message_len);
    Routes::new(service)
        .add_service(reflection)
        .add_service(rlqs)
        .prepare()
}

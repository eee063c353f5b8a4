//! The caller's trace context on a gRPC call (feature `otel`): when spans are exported, a
//! call carrying W3C `traceparent` (and `tracestate`) metadata, as Envoy sends it when
//! its tracing propagates, runs with that context as its OpenTelemetry parent, so the
//! call's `decision` span is a child of Envoy's span in the same trace.
//!
//! A tower layer around every gRPC service, before tonic decodes anything: it reads two
//! headers and nothing else, and decides nothing. Off (export off), it passes each call
//! through untouched: no header is read and the call's future is not wrapped.

use std::task::{Context, Poll};

use futures::future::Either;
use opentelemetry::context::{FutureExt, WithContext};
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::codegen::http::{HeaderMap, Request};

/// The layer: `on` when spans are exported.
#[derive(Debug, Clone, Copy)]
pub struct TraceContextLayer {
    on: bool,
}

impl TraceContextLayer {
    pub fn new(on: bool) -> TraceContextLayer {
        TraceContextLayer { on }
    }
}

impl<S> tower::Layer<S> for TraceContextLayer {
    type Service = TraceContext<S>;

    fn layer(&self, inner: S) -> TraceContext<S> {
        TraceContext { inner, on: self.on }
    }
}

/// A gRPC service whose calls run in the caller's trace context.
#[derive(Debug, Clone)]
pub struct TraceContext<S> {
    inner: S,
    on: bool,
}

impl<S, B> tower::Service<Request<B>> for TraceContext<S>
where
    S: tower::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<S::Future, WithContext<S::Future>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        if !self.on || !request.headers().contains_key("traceparent") {
            return Either::Left(self.inner.call(request));
        }
        // A malformed `traceparent` gives an empty context: the span starts a trace of
        // its own, as the W3C specification asks.
        let parent = TraceContextPropagator::new().extract(&Metadata(request.headers()));
        Either::Right(self.inner.call(request).with_context(parent))
    }
}

/// gRPC metadata (HTTP/2 headers) as the propagator reads a carrier.
struct Metadata<'a>(&'a HeaderMap);

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

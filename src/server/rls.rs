//! The `envoy.service.ratelimit.v3.RateLimitService` route: one unary gRPC call over
//! HTTP/2, read (`framing.rs`), decided, and answered (`unary_response.rs`) by shardgate itself.
//! Every way a call can fail carries its gRPC code by construction — a typed error mapped
//! to a status, never a message text recognised afterwards.
//!
//! The connection is shardgate's own (`connection/`, on hyper's HTTP/2 server); tonic
//! serves only the other services. tonic's generic unary machinery (a metadata map and a
//! request built per call, a codec, an encoder stream, a boxed body each way) is what this
//! route does without, for one method whose request and answer are bytes shardgate reads
//! and writes itself; the call reads its `grpc-timeout` itself (`service/deadline.rs`).
//!
//! It translates between gRPC and [`RateLimiter`]; it decides nothing itself.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::time::Instant;
use tonic::body::Body;
use tonic::codegen::http;
use tonic::Status;

use super::framing::{first_message, BodyBounds, Encoding};
use super::port_limits::DEFAULT_MAX_MESSAGE_BYTES;
use super::unary_response::{self, AnswerBody};
use crate::service::deadline;
use crate::service::decision::{CallError, RateLimiter};
use crate::service::wire::RequestView;
use crate::store::BucketStore;
use crate::support::text::{elide, MESSAGE_BYTES};

/// The gRPC service name, as Envoy's `grpc_service` and health checks name it.
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// The one method's path.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Whether `path` is one of the rate-limit service's, `/{SERVICE_NAME}/{method}` (it
/// answers UNIMPLEMENTED for any method but `ShouldRateLimit`).
pub fn serves(path: &str) -> bool {
    path.strip_prefix('/')
        .and_then(|p| p.strip_prefix(SERVICE_NAME))
        .is_some_and(|rest| rest.starts_with('/'))
}

/// The rate-limit service: a tower service for the gRPC port.
pub struct Rls<S: BucketStore> {
    limiter: Arc<RateLimiter<S>>,
    /// The largest request message accepted.
    max_message_len: usize,
}

impl<S: BucketStore> Rls<S> {
    /// The service, accepting request messages up to the port's default bound.
    pub fn new(limiter: Arc<RateLimiter<S>>) -> Rls<S> {
        Rls {
            limiter,
            max_message_len: DEFAULT_MAX_MESSAGE_BYTES as usize,
        }
    }

    /// Accepting request messages up to `len` bytes.
    pub fn with_max_message_len(self, len: usize) -> Rls<S> {
        Rls {
            max_message_len: len,
            ..self
        }
    }
}

/// One `ShouldRateLimit` call: its message read whole and in place (`wire.rs`), decided,
/// answered. It owns its limiter, so this future is the whole boxed call: an `async`
/// block around it would be one more copy of a few KB on every request.
///
/// `received` is when its headers arrived: the deadline counts the time the call waited
/// in its connection before it was polled.
async fn should_rate_limit<S: BucketStore>(
    limiter: Arc<RateLimiter<S>>,
    max_message_len: usize,
    request: http::Request<Body>,
    received: Instant,
) -> Result<http::Response<AnswerBody>, Infallible> {
    let (parts, body) = request.into_parts();
    let caller = parts
        .headers
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(deadline::parse_grpc_timeout);
    let by = deadline::deadline(received, caller, limiter.store_timeout());
    let encoding = Encoding::of(&parts.headers);
    drop(parts);
    // The body gets `--store-timeout` from the headers' arrival, whatever the caller's
    // `grpc-timeout` says (a shorter one still ends the call earlier): the time a call is
    // given when its caller says nothing, and far more than Envoy, which sends the message
    // with the headers, ever takes.
    let bounds = BodyBounds {
        max_message_len,
        due: received + limiter.store_timeout(),
        within: limiter.store_timeout(),
    };
    let message = match first_message(body, bounds, encoding).await {
        Ok(message) => message,
        Err(status) => return Ok(unary_response::failure(status)),
    };
    let view = match RequestView::decode(&message, limiter.request_limits().keep()) {
        Ok(view) => view,
        Err(e) => {
            return Ok(unary_response::failure(Status::invalid_argument(
                message_text(&format_args!("the request is not a RateLimitRequest: {e}")),
            )))
        }
    };
    #[cfg(feature = "test-hooks")]
    panic_trigger(&view);
    Ok(match limiter.should_rate_limit_by(&view, by).await {
        Ok(reply) => unary_response::answer(reply.bytes()),
        Err(e @ CallError::InvalidArgument(_)) => {
            unary_response::failure(Status::invalid_argument(message_text(&e)))
        }
        Err(e @ CallError::Unavailable(_)) => {
            unary_response::failure(Status::unavailable(message_text(&e)))
        }
    })
}

impl<S: BucketStore> Clone for Rls<S> {
    fn clone(&self) -> Rls<S> {
        Rls {
            limiter: self.limiter.clone(),
            max_message_len: self.max_message_len,
        }
    }
}

/// A panic on purpose, for the tests that show a call's panic stays in its call: a
/// descriptor entry keyed `shardgate-test-panic`. Built only with the `test-hooks`
/// feature, which only tests build (never a release: no client can reach it).
#[cfg(feature = "test-hooks")]
fn panic_trigger(view: &RequestView<'_>) {
    let asked = view
        .descriptors()
        .any(|d| d.entries.iter().any(|e| e.key == "shardgate-test-panic"));
    if asked {
        panic!("the test-only panic trigger (feature test-hooks)");
    }
}

/// One call's answer, boxed: the whole call is this one allocation.
pub type CallFuture =
    Pin<Box<dyn Future<Output = Result<http::Response<AnswerBody>, Infallible>> + Send + 'static>>;

impl<S: BucketStore> Rls<S> {
    /// The call `request`, whose headers arrived at `received`.
    pub fn call_at(&self, request: http::Request<Body>, received: Instant) -> CallFuture {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            let status =
                Status::unimplemented(format!("{SERVICE_NAME} has one method, ShouldRateLimit"));
            return Box::pin(std::future::ready(Ok(unary_response::failure(status))));
        }
        Box::pin(should_rate_limit(
            self.limiter.clone(),
            self.max_message_len,
            request,
            received,
        ))
    }
}

impl<S: BucketStore> tower::Service<http::Request<Body>> for Rls<S> {
    type Response = http::Response<AnswerBody>;
    type Error = Infallible;
    type Future = CallFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        self.call_at(request, Instant::now())
    }
}

/// A status message: an error's text, bounded (a client refuses trailers past a few KB,
/// and a message quotes request values).
fn message_text(e: &impl std::fmt::Display) -> String {
    elide(&e.to_string(), MESSAGE_BYTES).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_s_paths_are_its_own() {
        assert!(serves(SHOULD_RATE_LIMIT));
        assert!(serves("/envoy.service.ratelimit.v3.RateLimitService/Other"));
        assert!(serves("/envoy.service.ratelimit.v3.RateLimitService/"));
        for other in [
            "/envoy.service.ratelimit.v3.RateLimitServiceX/ShouldRateLimit",
            "/envoy.service.ratelimit.v2.RateLimitService/ShouldRateLimit",
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            "/grpc.health.v1.Health/Check",
            "/",
        ] {
            assert!(!serves(other), "{other}");
        }
    }
}

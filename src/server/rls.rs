//! The `envoy.service.ratelimit.v3.RateLimitService` route: one unary gRPC call over
//! HTTP/2, read (`framing.rs`), decided, and answered (`unary_response.rs`) by shardgate itself.
//! Every way a call can fail carries its gRPC code by construction — a typed error mapped
//! to a status, never a message text recognised afterwards.
//!
//! tonic still runs the connection (HTTP/2, `grpc-timeout`) and the other services; its
//! generic unary machinery (a metadata map and a request built per call, a codec, an
//! encoder stream, a boxed body each way) is what this route does without, for one
//! method whose request and answer are bytes shardgate reads and writes itself.
//!
//! It translates between gRPC and [`RateLimiter`]; it decides nothing itself.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::http;
use tonic::Status;

use super::framing::{check_encoding, first_message, BodyBounds};
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
async fn should_rate_limit<S: BucketStore>(
    limiter: Arc<RateLimiter<S>>,
    max_message_len: usize,
    request: http::Request<Body>,
) -> Result<http::Response<AnswerBody>, Infallible> {
    // Before anything else: the caller's clock started when it sent the request.
    let received = tokio::time::Instant::now();
    let (parts, body) = request.into_parts();
    let caller = parts
        .headers
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(deadline::parse_grpc_timeout);
    let by = deadline::deadline(received, caller, limiter.store_timeout());
    if let Err(status) = check_encoding(&parts.headers) {
        return Ok(unary_response::failure(status));
    }
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
    let message = match first_message(body, bounds).await {
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

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S: BucketStore> tower::Service<http::Request<Body>> for Rls<S> {
    type Response = http::Response<AnswerBody>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<AnswerBody>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            let status =
                Status::unimplemented(format!("{SERVICE_NAME} has one method, ShouldRateLimit"));
            return Box::pin(std::future::ready(Ok(unary_response::failure(status))));
        }
        Box::pin(should_rate_limit(
            self.limiter.clone(),
            self.max_message_len,
            request,
        ))
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

//! The `envoy.service.ratelimit.v3.RateLimitService` route: tonic's unary-call machinery
//! (compression, trailers, status encoding) with shardgate's own codec and framing check,
//! so that every way a request body can fail carries its gRPC code by construction — a
//! typed error mapped to a status, never a message text recognised afterwards.
//!
//! It translates between gRPC and [`RateLimiter`]; it decides nothing itself.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes};
use tonic::body::Body;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};

use super::deadline;
use super::decision::{CallError, RateLimiter};
use super::framing::{Checked, MAX_REQUEST_MESSAGE_BYTES};
use super::reply::Reply;
use super::wire::RequestView;
use crate::store::BucketStore;
use crate::text::{elide, MESSAGE_BYTES};

/// The gRPC service name, as Envoy's `grpc_service` and health checks name it.
pub const SERVICE_NAME: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// The one method's path.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The rate-limit service: a tower service for tonic's router.
pub struct Rls<S: BucketStore> {
    limiter: Arc<RateLimiter<S>>,
}

impl<S: BucketStore> Rls<S> {
    pub fn new(limiter: Arc<RateLimiter<S>>) -> Rls<S> {
        Rls { limiter }
    }
}

/// One `ShouldRateLimit` call: its message, read in place (`wire.rs`), then decided. It
/// owns its limiter (moved in by [`Call`]), so this future is the whole boxed call: an
/// `async` block around it would be one more copy of a few KB on every request.
async fn should_rate_limit<S: BucketStore>(
    limiter: Arc<RateLimiter<S>>,
    request: Request<Bytes>,
) -> Result<Response<Reply>, Status> {
    // Before anything else: the caller's clock started when it sent the request.
    let received = tokio::time::Instant::now();
    let caller = request
        .metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(deadline::parse_grpc_timeout);
    let by = deadline::deadline(received, caller, limiter.store_timeout());
    let view =
        RequestView::decode(request.get_ref(), limiter.request_limits().keep()).map_err(|e| {
            Status::invalid_argument(message(&format_args!(
                "the request is not a RateLimitRequest: {e}"
            )))
        })?;
    match limiter.should_rate_limit_by(&view, by).await {
        Ok(resp) => Ok(Response::new(resp)),
        Err(e @ CallError::InvalidArgument(_)) => Err(Status::invalid_argument(message(&e))),
        Err(e @ CallError::Unavailable(_)) => Err(Status::unavailable(message(&e))),
    }
}

impl<S: BucketStore> Clone for Rls<S> {
    fn clone(&self) -> Rls<S> {
        Rls {
            limiter: self.limiter.clone(),
        }
    }
}

impl<S: BucketStore> NamedService for Rls<S> {
    const NAME: &'static str = SERVICE_NAME;
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S: BucketStore> tower::Service<http::Request<Body>> for Rls<S> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != SHOULD_RATE_LIMIT {
            let status =
                Status::unimplemented(format!("{SERVICE_NAME} has one method, ShouldRateLimit"));
            return Box::pin(async move { Ok(status.into_http()) });
        }
        let call = Call(Some(self.limiter.clone()));
        Box::pin(async move {
            let request =
                request.map(|body| Body::new(Checked::new(body, MAX_REQUEST_MESSAGE_BYTES)));
            let mut grpc = tonic::server::Grpc::new(RlsCodec)
                .apply_max_message_size_config(Some(MAX_REQUEST_MESSAGE_BYTES), None);
            Ok(grpc.unary(call, request).await)
        })
    }
}

/// One decoded call, as tonic's unary machinery runs it: it holds the limiter until its
/// one call takes it (a clone there would be a second write per request to the limiter's
/// reference count, a line both worker threads write).
struct Call<S: BucketStore>(Option<Arc<RateLimiter<S>>>);

impl<S: BucketStore> tonic::server::UnaryService<Bytes> for Call<S> {
    type Response = Reply;
    type Future = BoxFuture<Result<Response<Reply>, Status>>;

    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        match self.0.take() {
            Some(limiter) => Box::pin(should_rate_limit(limiter, request)),
            // tonic's unary machinery calls once; a second call has no limiter to use.
            None => Box::pin(std::future::ready(Err(Status::internal(
                "a unary call was made twice",
            )))),
        }
    }
}

/// A status message: an error's text, bounded (a client refuses trailers past a few KB,
/// and a message quotes request values).
fn message(e: &impl std::fmt::Display) -> String {
    elide(&e.to_string(), MESSAGE_BYTES).into_owned()
}

/// The request's message as received (read in place by `wire.rs` once the call runs),
/// the response as `reply.rs` wrote it.
struct RlsCodec;

impl Codec for RlsCodec {
    type Encode = Reply;
    type Decode = Bytes;
    type Encoder = ResponseEncoder;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> ResponseEncoder {
        ResponseEncoder
    }

    fn decoder(&mut self) -> RequestDecoder {
        RequestDecoder
    }
}

/// The first size of the buffer a call's response is encoded into, and of the one its
/// request is received into: a rate-limit response is tens of bytes and a request a few
/// hundred, and tonic's default (8 KiB per buffer, two per call) is past the sizes glibc's
/// per-thread cache serves (1 KiB), so each call paid two trips through `malloc`'s slow
/// path. A larger message grows the buffer as it is written, by this much at a time.
const RESPONSE_BUFFER_BYTES: usize = 512;
const REQUEST_BUFFER_BYTES: usize = 1024;

/// How often tonic yields while encoding a stream: a unary call sends one message, so
/// only the default's value matters (32 KiB, kept).
const YIELD_THRESHOLD_BYTES: usize = 32 * 1024;

struct ResponseEncoder;

impl Encoder for ResponseEncoder {
    type Item = Reply;
    type Error = Status;

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(RESPONSE_BUFFER_BYTES, YIELD_THRESHOLD_BYTES)
    }

    /// The reply's bytes, already encoded (EncodeBuf grows as written to).
    fn encode(&mut self, item: Reply, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(item.bytes());
        Ok(())
    }
}

struct RequestDecoder;

impl Decoder for RequestDecoder {
    type Item = Bytes;
    type Error = Status;

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(REQUEST_BUFFER_BYTES, YIELD_THRESHOLD_BYTES)
    }

    /// The message's bytes, taken from the receive buffer without a copy (tonic's buffer
    /// is a `BytesMut`; `copy_to_bytes` splits it).
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

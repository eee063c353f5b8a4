//! A call's answer fenced against a panic ([`Fenced`]): a panic while the call is
//! decided or its answer encoded — in the policy, the engine, or the memory store, which
//! runs inline in the call — ends that call alone, answered INTERNAL, logged at error
//! with the call's request id ([`CallId`]) and counted (`shardgate_call_panics_total`).
//! Without it the panic unwound out of the connection's task, which runs every call of
//! the connection (`connection/`), and took them all down with it.
//!
//! A panic later, while the answer is sent, is caught by the connection's own fence
//! (`connection/calls.rs`), which resets the stream. What panicked is the panic's
//! message; the rest of the call's state is dropped, never used again.

use std::any::Any;
use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::codegen::http::{HeaderMap, HeaderValue, Response};
use tonic::Status;

use super::connection::ConnectionContext;
use crate::service::metrics::PanicEnd;
use crate::support::text::{elide, panic_text};

/// The most of a panic's message or a client's request id written to the log.
const LOGGED_BYTES: usize = 256;

/// What a log line names a call by: the caller's `x-request-id` when it sent one, and
/// always the connection's number and the call's number on it.
#[derive(Debug, Clone)]
pub struct CallId {
    pub connection: u64,
    pub call: u64,
    pub x_request_id: Option<HeaderValue>,
}

impl CallId {
    /// The id of the next call on `context`'s connection, with these request headers.
    pub fn next(context: &ConnectionContext, headers: &HeaderMap) -> CallId {
        CallId {
            connection: context.id,
            call: context.next_call(),
            x_request_id: headers.get("x-request-id").cloned(),
        }
    }
}

impl fmt::Display for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.connection, self.call)?;
        if let Some(id) = &self.x_request_id {
            let id = String::from_utf8_lossy(id.as_bytes());
            write!(f, " (x-request-id {})", elide(&id, LOGGED_BYTES))?;
        }
        Ok(())
    }
}

/// A call's answer (`call`), or INTERNAL if it panics.
pub struct Fenced<F> {
    /// `None` once it has answered or panicked.
    call: Option<F>,
    id: CallId,
    /// The method, for the log.
    method: &'static str,
    context: Arc<ConnectionContext>,
}

impl<F> Fenced<F> {
    pub fn new(call: F, id: CallId, method: &'static str, context: Arc<ConnectionContext>) -> Self {
        Fenced {
            call: Some(call),
            id,
            method,
            context,
        }
    }

    /// The INTERNAL answer of a call that panicked, logged and counted.
    fn panicked<B: Default>(&self, panic: &(dyn Any + Send)) -> Response<B> {
        self.context
            .metrics
            .port()
            .call_panicked(PanicEnd::Internal);
        tracing::error!(
            request_id = %self.id,
            method = self.method,
            panic = %panic_text(panic, LOGGED_BYTES),
            "a call panicked; it was answered INTERNAL, the connection's other calls go on"
        );
        Status::internal(format!(
            "the server failed while answering this call (request id {}); its log says why",
            self.id
        ))
        .into_http()
    }
}

impl<F, B> Future for Fenced<F>
where
    F: Future<Output = Result<Response<B>, Infallible>> + Unpin,
    B: Default,
{
    type Output = Result<Response<B>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(call) = self.call.as_mut() else {
            // Polled after its answer: hyper never does; a call that panicked said so.
            return Poll::Pending;
        };
        let panic = match catch_unwind(AssertUnwindSafe(|| Pin::new(call).poll(cx))) {
            Ok(Poll::Pending) => return Poll::Pending,
            Ok(Poll::Ready(answer)) => {
                self.call = None;
                return Poll::Ready(answer);
            }
            Err(panic) => panic,
        };
        // What the call held is dropped now; a drop that panics too is caught alike.
        let call = self.call.take();
        let _ = catch_unwind(AssertUnwindSafe(move || drop(call)));
        Poll::Ready(Ok(self.panicked(&*panic)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::metrics::Metrics;

    /// True, where the compiler cannot see it.
    fn context_free() -> bool {
        std::hint::black_box(true)
    }

    fn context() -> Arc<ConnectionContext> {
        crate::server::connection::test_context(Arc::new(Metrics::new()))
    }

    #[tokio::test]
    async fn a_panic_is_answered_internal_with_the_request_id() {
        let context = context();
        let mut headers = HeaderMap::new();
        headers.insert("x-request-id", HeaderValue::from_static("abc-123"));
        let id = CallId::next(&context, &headers);
        let call: Pin<Box<dyn Future<Output = Result<Response<()>, Infallible>> + Send>> =
            Box::pin(async {
                if context_free() {
                    panic!("deciding went wrong");
                }
                Ok(Response::new(()))
            });
        let answer = Fenced::new(call, id, "ShouldRateLimit", context.clone())
            .await
            .unwrap();
        assert_eq!(answer.headers()["grpc-status"], "13");
        let message = answer.headers()["grpc-message"].to_str().unwrap();
        assert!(message.contains("abc-123"), "{message}");
        assert_eq!(context.metrics.port().panics(), 1);
        let long = std::panic::catch_unwind(|| {
            if context_free() {
                panic!("{}", "x".repeat(5000));
            }
        });
        let text = panic_text(&*long.unwrap_err(), LOGGED_BYTES);
        assert!(text.len() < 300, "{}", text.len());
    }
}

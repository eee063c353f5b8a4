//! The gRPC port's calls other than the rate-limit service's (health, reflection, any
//! unknown service), as tonic's router answers them, held to two ends tonic's router does
//! not keep: the caller's `grpc-timeout` (counted from the call's arrival), past which the
//! call is ended DEADLINE_EXCEEDED, and the connection's close, at which a call that would
//! stream on (health `Watch`, a reflection stream) is ended UNAVAILABLE — its client
//! watches again on another connection — instead of holding the closing connection, or
//! the server's shutdown, until its grace runs out.
//!
//! A call is only ended while it waits: a frame ready to go (an answer, a status) is
//! always sent first.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::Frame;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tonic::body::Body;
use tonic::codegen::http::{HeaderMap, Response};
use tonic::Status;

use crate::service::deadline::parse_grpc_timeout;

type Answered = Result<Response<Body>, Infallible>;

/// A boxed future of what tonic's router answers.
pub type OtherFuture = Pin<Box<dyn Future<Output = Answered> + Send>>;

/// When a call must be over by: its arrival plus the caller's `grpc-timeout`, if it sent
/// one (a malformed one is no deadline, as tonic read it).
pub fn deadline(headers: &HeaderMap, arrived: Instant) -> Option<Instant> {
    let timeout = headers
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(parse_grpc_timeout)?;
    arrived.checked_add(timeout)
}

/// `answer`, held to `deadline` and ended when `closing` turns true.
pub fn bounded(
    answer: impl Future<Output = Answered> + Send + 'static,
    deadline: Option<Instant>,
    closing: watch::Receiver<bool>,
) -> OtherFuture {
    Box::pin(async move {
        let response = match deadline {
            Some(at) => match tokio::time::timeout_at(at, answer).await {
                Ok(response) => response,
                Err(_) => return Ok(late().into_http()),
            },
            None => answer.await,
        };
        Ok(response?.map(|body| {
            Body::new(Ending {
                body,
                deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
                closing: Box::pin(closed(closing)),
                ended: false,
            })
        }))
    })
}

fn late() -> Status {
    Status::deadline_exceeded("the call's grpc-timeout passed")
}

/// Resolves when the connection starts closing (never if its task is gone: then so is
/// the call).
async fn closed(mut closing: watch::Receiver<bool>) {
    if closing.wait_for(|closing| *closing).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// An answer's body, ended with a status trailer at its deadline or when its connection
/// starts closing.
struct Ending {
    body: Body,
    deadline: Option<Pin<Box<Sleep>>>,
    closing: Pin<Box<dyn Future<Output = ()> + Send>>,
    ended: bool,
}

impl Ending {
    /// Why the body ends now, if it must.
    fn end(&mut self, cx: &mut Context<'_>) -> Option<Status> {
        if let Some(deadline) = &mut self.deadline {
            if deadline.as_mut().poll(cx).is_ready() {
                return Some(late());
            }
        }
        if self.closing.as_mut().poll(cx).is_ready() {
            return Some(Status::unavailable(
                "the server is closing this connection; call again on a new one",
            ));
        }
        None
    }
}

impl http_body::Body for Ending {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if polled.is_ready() {
            return polled;
        }
        let Some(status) = self.end(cx) else {
            return Poll::Pending;
        };
        self.ended = true;
        let mut trailers = HeaderMap::new();
        Poll::Ready(Some(match status.add_header(&mut trailers) {
            Ok(()) => Ok(Frame::trailers(trailers)),
            Err(status) => Err(status),
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.ended || self.body.is_end_stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::time::Duration;

    /// A body that sends one message and then waits for ever, as a health `Watch` does.
    fn watching() -> Answered {
        let first = futures::stream::once(async {
            Ok::<_, Status>(Frame::data(Bytes::from_static(b"\0\0\0\0\x02\x08\x01")))
        });
        let stream = first.chain(futures::stream::pending());
        Ok(Response::new(Body::new(http_body_util::StreamBody::new(
            stream,
        ))))
    }

    async fn trailers_status(response: Response<Body>) -> (usize, String) {
        let mut body = response.into_body();
        let mut messages = 0;
        loop {
            let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
                .await
                .expect("the body ends")
                .unwrap()
                .unwrap();
            match frame.into_data() {
                Ok(_) => messages += 1,
                Err(frame) => {
                    let trailers = frame.into_trailers().unwrap();
                    return (messages, trailers["grpc-status"].to_str().unwrap().into());
                }
            }
        }
    }

    use futures::StreamExt;

    #[tokio::test]
    async fn a_held_stream_ends_at_its_deadline() {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-timeout", "50m".parse().unwrap());
        let at = deadline(&headers, Instant::now());
        let (_tx, closing) = watch::channel(false);
        let response = bounded(async { watching() }, at, closing).await.unwrap();
        assert_eq!(trailers_status(response).await, (1, "4".to_string()));
    }

    #[tokio::test]
    async fn a_held_stream_ends_when_its_connection_closes() {
        let (tx, closing) = watch::channel(false);
        let response = bounded(async { watching() }, None, closing).await.unwrap();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            tx.send(true).unwrap();
        });
        assert_eq!(trailers_status(response).await, (1, "14".to_string()));
    }

    #[tokio::test]
    async fn a_late_answer_is_deadline_exceeded() {
        let (_tx, closing) = watch::channel(false);
        let at = Some(Instant::now() + Duration::from_millis(20));
        let never = std::future::pending::<Answered>();
        let response = bounded(never, at, closing).await.unwrap();
        assert_eq!(response.headers()["grpc-status"], "4");
    }
}

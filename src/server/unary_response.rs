//! The HTTP/2 shape of a unary gRPC answer: `content-type: application/grpc`, one
//! length-prefixed message and `grpc-status: 0` trailers; or, for a failed call, the
//! status alone in the headers (gRPC's trailers-only response). The body is two frames
//! handed over as they are, with no encoder stream or boxed body around them.
//!
//! It frames bytes; what the message says is `response_encoding.rs`' concern.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use http_body::Frame;
use tonic::codegen::http::{self, header, HeaderMap, HeaderValue};
use tonic::Status;

/// The body of a unary answer: the message, then the trailers; empty in a trailers-only
/// response.
#[derive(Debug, Default)]
pub struct AnswerBody {
    message: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

/// An answered call: `message` (encoded, without its prefix) and status OK.
#[expect(clippy::expect_used, reason = "an answer is far below 4 GiB")]
pub fn answer(message: &[u8]) -> http::Response<AnswerBody> {
    let mut framed = BytesMut::with_capacity(5 + message.len());
    framed.put_u8(0); // not compressed
    framed.put_u32(u32::try_from(message.len()).expect("an answer is far below 4 GiB"));
    framed.put_slice(message);
    let mut trailers = HeaderMap::with_capacity(1);
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let mut response = http::Response::new(AnswerBody {
        message: Some(framed.freeze()),
        trailers: Some(trailers),
    });
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

/// A failed call: its status (code, message, metadata) in the headers, no body.
pub fn failure(status: Status) -> http::Response<AnswerBody> {
    status.into_http()
}

impl http_body::Body for AnswerBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        let frame = match this.message.take() {
            Some(message) => Frame::data(message),
            None => match this.trailers.take() {
                Some(trailers) => Frame::trailers(trailers),
                None => return Poll::Ready(None),
            },
        };
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.message.is_none() && self.trailers.is_none()
    }

    // No exact `size_hint`: hyper would send it as `content-length`, which tonic's answers
    // never carried and a hop to HTTP/1.1 or gRPC-web would have to reconcile with the
    // trailers.
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body::Body;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn an_answer_is_one_framed_message_then_ok_trailers() {
        let response = answer(b"\x08\x01");
        assert_eq!(response.status(), http::StatusCode::OK);
        assert_eq!(response.headers()["content-type"], "application/grpc");
        assert_eq!(
            response.headers().len(),
            1,
            "no content-length, as tonic sent none"
        );
        assert_eq!(response.body().size_hint().exact(), None);
        let mut body = response.into_body();
        // Exactly two frames, in order: the framed message, then the trailers.
        let first = body.frame().await.unwrap().unwrap();
        assert_eq!(
            &first.into_data().unwrap()[..],
            b"\x00\x00\x00\x00\x02\x08\x01"
        );
        assert!(!body.is_end_stream());
        let second = body.frame().await.unwrap().unwrap();
        let trailers = second.into_trailers().unwrap();
        assert_eq!(trailers["grpc-status"], "0");
        assert_eq!(trailers.len(), 1);
        assert!(body.is_end_stream());
        assert!(body.frame().await.is_none());
    }

    #[tokio::test]
    async fn a_failure_is_trailers_only() {
        let response = failure(Status::invalid_argument("descriptors[0]: empty"));
        let headers = response.headers().clone();
        assert_eq!(headers["content-type"], "application/grpc");
        assert_eq!(headers["grpc-status"], "3");
        // Percent-encoded, as gRPC's protocol asks.
        assert_eq!(headers["grpc-message"], "descriptors[0]:%20empty");
        assert!(response.body().is_end_stream());
        let body = response.into_body().collect().await.unwrap();
        assert!(body.trailers().is_none());
        assert!(body.to_bytes().is_empty());
    }
}

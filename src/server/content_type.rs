//! The gRPC port's first check of a request: its `content-type` must be gRPC's
//! (`application/grpc`, or a subtype: `application/grpc+proto`). Anything else is
//! answered HTTP 415 Unsupported Media Type, as gRPC's HTTP/2 protocol asks, so that an
//! HTTP client (a `curl` or a misrouted proxy) is not answered 200 OK as if it had been
//! served; the answer also carries `grpc-status` INTERNAL and a message naming what was
//! sent, as grpc-go's server answers, for a gRPC client that got here by mistake.

use tonic::codegen::http::{HeaderMap, Response, StatusCode};
use tonic::Status;

use super::unary_response::{self, AnswerBody};
use crate::support::text::elide;

/// The most of a client's content type quoted back to it.
const QUOTED_BYTES: usize = 64;

/// The 415 answer to a request with these headers, unless it is a gRPC request.
pub fn refusal(headers: &HeaderMap) -> Option<Response<AnswerBody>> {
    let sent = headers.get("content-type").map(|v| v.as_bytes());
    if sent.is_some_and(is_grpc) {
        return None;
    }
    let sent = sent.map_or_else(
        || "none".to_string(),
        |v| format!("'{}'", elide(&String::from_utf8_lossy(v), QUOTED_BYTES)),
    );
    let status = Status::internal(format!(
        "not a gRPC request: content-type {sent}, where application/grpc is served"
    ));
    let mut answer = unary_response::failure(status);
    *answer.status_mut() = StatusCode::UNSUPPORTED_MEDIA_TYPE;
    Some(answer)
}

/// `application/grpc`, alone or followed by `+` or `;` (a subtype or parameters).
fn is_grpc(content_type: &[u8]) -> bool {
    const GRPC: &[u8] = b"application/grpc";
    content_type
        .split_at_checked(GRPC.len())
        .is_some_and(|(head, rest)| {
            head.eq_ignore_ascii_case(GRPC) && matches!(rest.first(), None | Some(b'+' | b';'))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_grpc_content_types_pass() {
        for good in [
            "application/grpc",
            "application/grpc+proto",
            "Application/GRPC",
            "application/grpc; charset=utf-8",
        ] {
            assert!(is_grpc(good.as_bytes()), "{good}");
        }
        for bad in [
            "application/json",
            "application/grpc-web",
            "text/plain",
            "application/grp",
            "",
        ] {
            assert!(!is_grpc(bad.as_bytes()), "{bad}");
        }
        let mut headers = HeaderMap::new();
        let refused = refusal(&headers).unwrap();
        assert_eq!(refused.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        assert!(refused.headers()["grpc-message"]
            .to_str()
            .unwrap()
            .contains("none"));
        headers.insert("content-type", "application/json".parse().unwrap());
        let refused = refusal(&headers).unwrap();
        assert_eq!(refused.status(), 415);
        assert_eq!(refused.headers()["grpc-status"], "13");
        headers.insert("content-type", "application/grpc".parse().unwrap());
        assert!(refusal(&headers).is_none());
    }
}

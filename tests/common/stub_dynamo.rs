//! A stand-in for DynamoDB's JSON API on 127.0.0.1, for the answers DynamoDB Local cannot
//! be made to give on demand: throttling of one key, a transaction conflict that takes its
//! time, a 500. Each request is answered by the test's rule, after the rule's delay, and
//! recorded when it arrives (a request the client gave up on still counts: it reached the
//! store).

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use shardgate::store::dynamodb::{DynamoOptions, DynamoStore};

/// One request as it arrived: its operation (`UpdateItem`, …) and body.
#[derive(Debug, Clone)]
pub struct Request {
    pub operation: String,
    pub body: String,
}

impl Request {
    /// Whether the request concerns the bucket of entity `entity` (any shard).
    pub fn concerns(&self, entity: &str) -> bool {
        self.body.contains(&format!("/BUCKET#{entity}#"))
    }
}

/// How a request is answered.
#[derive(Debug, Clone)]
pub struct Answer {
    pub delay: Duration,
    pub status: StatusCode,
    pub body: String,
}

impl Answer {
    /// DynamoDB's answer for an error `code` (HTTP 400), with `extra` JSON fields.
    pub fn error(code: &str, extra: serde_json::Value) -> Answer {
        let mut body = serde_json::json!({
            "__type": format!("com.amazonaws.dynamodb.v20120810#{code}"),
            "message": format!("the stand-in answers {code}"),
        });
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        Answer {
            delay: Duration::ZERO,
            status: StatusCode::BAD_REQUEST,
            body: body.to_string(),
        }
    }

    /// An HTTP 500 (`InternalServerError`): the SDK retries it.
    pub fn server_error() -> Answer {
        Answer {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            ..Answer::error("InternalServerError", serde_json::json!({}))
        }
    }

    /// A 200 with `body`.
    pub fn ok(body: serde_json::Value) -> Answer {
        Answer {
            delay: Duration::ZERO,
            status: StatusCode::OK,
            body: body.to_string(),
        }
    }

    /// What a store that found nothing answers: a fast debit's condition failed on a
    /// missing item; a read found nothing.
    pub fn nothing(request: &Request) -> Answer {
        match request.operation.as_str() {
            "BatchGetItem" => Answer::ok(serde_json::json!({"Responses": {}})),
            _ => Answer::error("ConditionalCheckFailedException", serde_json::json!({})),
        }
    }

    /// The same answer, `delay` later.
    pub fn after(self, delay: Duration) -> Answer {
        Answer { delay, ..self }
    }
}

type Rule = dyn Fn(&Request) -> Answer + Send + Sync;

struct Shared {
    rule: Box<Rule>,
    seen: Mutex<Vec<Request>>,
}

/// The stand-in, serving until dropped (its task runs as long as the test's runtime).
pub struct Stub {
    pub endpoint: String,
    shared: Arc<Shared>,
}

impl Stub {
    /// Serves on a free loopback port, answering by `rule`.
    pub async fn start(rule: impl Fn(&Request) -> Answer + Send + Sync + 'static) -> Stub {
        let shared = Arc::new(Shared {
            rule: Box::new(rule),
            seen: Mutex::new(Vec::new()),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .fallback(answer)
            .with_state(shared.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Stub { endpoint, shared }
    }

    /// Requests received so far that `which` picks.
    pub fn count(&self, which: impl Fn(&Request) -> bool) -> usize {
        self.shared
            .seen
            .lock()
            .unwrap()
            .iter()
            .filter(|r| which(r))
            .count()
    }

    /// Options of a store on this stand-in whose calls take at most `timeout`.
    pub fn options(&self, timeout: Duration) -> DynamoOptions {
        // Static credentials from the environment, never instance metadata.
        std::env::set_var("AWS_ACCESS_KEY_ID", "local");
        std::env::set_var("AWS_SECRET_ACCESS_KEY", "local");
        std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
        DynamoOptions {
            table: "stub".into(),
            namespace: "ns".into(),
            endpoint: Some(self.endpoint.clone()),
            region: Some("us-east-1".into()),
            timeout,
        }
    }

    /// A store on this stand-in, set up as the server sets one up.
    pub async fn store(&self, timeout: Duration) -> DynamoStore {
        DynamoStore::connect(&self.options(timeout)).await
    }
}

async fn answer(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let request = Request {
        operation: headers
            .get("x-amz-target")
            .and_then(|v| v.to_str().ok())
            .and_then(|t| t.rsplit('.').next())
            .unwrap_or("?")
            .to_string(),
        body: String::from_utf8_lossy(&body).into_owned(),
    };
    let answer = (shared.rule)(&request);
    shared.seen.lock().unwrap().push(request);
    tokio::time::sleep(answer.delay).await;
    (
        answer.status,
        [
            ("content-type", "application/x-amz-json-1.0"),
            ("x-amzn-requestid", "stand-in"),
        ],
        answer.body,
    )
        .into_response()
}

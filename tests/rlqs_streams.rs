//! The Rate Limit Quota Service's streams on a real server (loopback, Envoy's generated
//! client), against clients that misbehave: a fault in one stream stays in that stream,
//! a stream holds a bounded number of buckets, a report past the message bound ends its
//! stream with an error, and a stream's end takes its buckets and demand with it.
//! (The share math is unit-tested in src/service/rlqs/; a real Envoy in tests/envoy/.)

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::server::TestServer;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use shardgate::server::rlqs::MAX_BUCKETS_PER_STREAM;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Streaming};

const RULES: &str = "
domain: rlqs
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 50}
";

/// A stream: its report sender and its answers.
struct Client {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: Streaming<RateLimitQuotaResponse>,
}

async fn open(server: &TestServer) -> Client {
    let mut client = RateLimitQuotaServiceClient::new(server.channel().await)
        .max_encoding_message_size(16 << 20);
    let (reports, rx) = mpsc::channel(16);
    // The first report is queued before the call so that its headers and message leave
    // together (tonic waits for the server's headers, which come with the first answer).
    let answers = client.stream_rate_limit_quotas(ReceiverStream::new(rx));
    let first = report("rlqs", &[("tenant", "warmup")]);
    reports.send(first).await.unwrap();
    let mut answers = answers.await.expect("the stream opens").into_inner();
    next(&mut answers).await.expect("the warm-up is answered");
    Client { reports, answers }
}

fn usage(entries: &[(&str, &str)]) -> BucketQuotaUsage {
    let bucket: HashMap<String, String> = entries
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    BucketQuotaUsage {
        bucket_id: Some(BucketId { bucket }),
        time_elapsed: None,
        num_requests_allowed: 1,
        num_requests_denied: 0,
    }
}

fn report(domain: &str, entries: &[(&str, &str)]) -> RateLimitQuotaUsageReports {
    RateLimitQuotaUsageReports {
        domain: domain.into(),
        bucket_quota_usages: vec![usage(entries)],
    }
}

async fn next(
    answers: &mut Streaming<RateLimitQuotaResponse>,
) -> Result<RateLimitQuotaResponse, tonic::Status> {
    match tokio::time::timeout(Duration::from_secs(10), answers.message()).await {
        Ok(Ok(Some(answer))) => Ok(answer),
        Ok(Ok(None)) => Err(tonic::Status::ok("the stream ended")),
        Ok(Err(status)) => Err(status),
        Err(_) => panic!("no answer within 10 s"),
    }
}

/// The tenants an answer assigns, sorted.
fn tenants(answer: &RateLimitQuotaResponse) -> Vec<String> {
    let mut t: Vec<String> = answer
        .bucket_action
        .iter()
        .filter(|a| matches!(a.bucket_action, Some(Action::QuotaAssignmentAction(_))))
        .filter_map(|a| a.bucket_id.as_ref()?.bucket.get("tenant").cloned())
        .collect();
    t.sort();
    t
}

#[tokio::test]
async fn an_oversized_report_ends_its_stream_alone() {
    let server = TestServer::start(RULES).await;
    let mut bad = open(&server).await;
    let mut good = open(&server).await;
    // A bucket id of too many entries is not tracked; its neighbour in the report is.
    let many: Vec<(String, String)> = (0..17).map(|i| (format!("k{i}"), "v".into())).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut two = report("rlqs", &[("tenant", "acme")]);
    two.bucket_quota_usages.push(usage(&many));
    bad.reports.send(two).await.unwrap();
    let answer = next(&mut bad.answers).await.unwrap();
    assert_eq!(tenants(&answer), ["acme"]);
    assert_eq!(answer.bucket_action.len(), 1);
    // A report past the port's message bound (64 KiB) ends that stream with an error.
    let huge = "x".repeat(100 * 1024);
    bad.reports
        .send(report("rlqs", &[("tenant", &huge)]))
        .await
        .unwrap();
    let status = next(&mut bad.answers).await.unwrap_err();
    assert_ne!(status.code(), Code::Ok, "{status:?}");
    // The other stream, on another connection, is still answered.
    good.reports
        .send(report("rlqs", &[("tenant", "acme")]))
        .await
        .unwrap();
    assert_eq!(tenants(&next(&mut good.answers).await.unwrap()), ["acme"]);
}

#[tokio::test]
async fn a_stream_without_a_domain_is_refused() {
    let server = TestServer::start(RULES).await;
    let mut client = RateLimitQuotaServiceClient::new(server.channel().await);
    let (tx, rx) = mpsc::channel(1);
    tx.send(report("", &[("tenant", "acme")])).await.unwrap();
    let mut answers = client
        .stream_rate_limit_quotas(ReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let status = next(&mut answers).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
}

#[tokio::test]
async fn a_stream_holds_a_bounded_number_of_buckets_and_its_end_lets_them_go() {
    let server = TestServer::start(RULES).await;
    let rlqs = || server.limiter.metrics().rlqs();
    let mut client = open(&server).await;
    // The warm-up bucket and MAX_BUCKETS_PER_STREAM more, in reports of 500.
    let names: Vec<String> = (0..MAX_BUCKETS_PER_STREAM)
        .map(|i| format!("t{i}"))
        .collect();
    let mut assigned = 0;
    for chunk in names.chunks(500) {
        let reports = RateLimitQuotaUsageReports {
            domain: "rlqs".into(),
            bucket_quota_usages: chunk.iter().map(|t| usage(&[("tenant", t)])).collect(),
        };
        client.reports.send(reports).await.unwrap();
        assigned += tenants(&next(&mut client.answers).await.unwrap()).len();
    }
    assert_eq!(
        assigned,
        MAX_BUCKETS_PER_STREAM - 1,
        "one place was the warm-up's"
    );
    assert_eq!(rlqs().buckets(), MAX_BUCKETS_PER_STREAM as i64);
    assert_eq!(rlqs().streams_open(), 1);
    drop(client);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while rlqs().streams_open() != 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!((rlqs().streams_open(), rlqs().buckets()), (0, 0));
}

//! RLQS servers of a fleet sharing one limit through their store (docs/rlqs.md, "A fleet"):
//! two servers in this process on one store, as two replicas on one DynamoDB table or
//! Redis, each with one stream (an Envoy's) that reports more demand than the limit. The
//! rates they assign together stay within the limit, every token they may hand out was
//! drawn from the store first, and a stream learns a new rate without sending a report.
//! (The bank's arithmetic is property-tested in src/service/rlqs/grant.rs; real Envoys in
//! tests/envoy/test_rlqs_fleet.py.)

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::Strategy;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use shardgate::config::Config;
use shardgate::engine::{Engine, EngineOptions, ManualClock, RandomDraw};
use shardgate::server::grpc;
use shardgate::service::RateLimiter;
use shardgate::store::memory::MemoryStore;
use shardgate::store::BucketStore;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Streaming;

const LIMIT: f64 = 50.0;

fn rules(per_second: u32) -> String {
    format!(
        "domain: rlqs\ndescriptors:\n  - key: tenant\n    rate_limit: {{unit: second, requests_per_unit: {per_second}}}\n"
    )
}

/// A server of the fleet: its limiter, its address, and its stop.
struct Replica<S: BucketStore = MemoryStore> {
    limiter: Arc<RateLimiter<S>>,
    addr: SocketAddr,
    _stop: oneshot::Sender<()>,
}

async fn replica(store: &Arc<MemoryStore>) -> Replica {
    replica_with(store, &rules(LIMIT as u32)).await
}

async fn replica_with(store: &Arc<MemoryStore>, yaml: &str) -> Replica {
    let engine = Arc::new(Engine::new(store.clone(), EngineOptions::default()));
    replica_on(engine, yaml).await
}

async fn replica_on<S: BucketStore>(engine: Arc<Engine<S>>, yaml: &str) -> Replica<S> {
    let config = Config::from_yaml("rlqs.yaml", yaml).unwrap();
    let limiter = Arc::new(RateLimiter::new(Arc::new(config), engine));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let options = grpc::PortOptions {
        rlqs_fleet: true,
        ..grpc::PortOptions::default()
    };
    tokio::spawn(grpc::serve_with(
        limiter.clone(),
        listener,
        options,
        async {
            let _ = stopped.await;
        },
    ));
    Replica {
        limiter,
        addr,
        _stop: stop,
    }
}

/// One stream: its report sender and its answers.
struct Envoy {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: Streaming<RateLimitQuotaResponse>,
}

/// A report of `requests` to tenant `acme` over `seconds`, all of them allowed.
fn report(requests: u64, seconds: i64) -> RateLimitQuotaUsageReports {
    let bucket: HashMap<String, String> = [("tenant".to_string(), "acme".to_string())].into();
    RateLimitQuotaUsageReports {
        domain: "rlqs".into(),
        bucket_quota_usages: vec![BucketQuotaUsage {
            bucket_id: Some(BucketId { bucket }),
            time_elapsed: Some(PbDuration { seconds, nanos: 0 }),
            num_requests_allowed: requests,
            num_requests_denied: 0,
        }],
    }
}

async fn open(addr: SocketAddr) -> Envoy {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = RateLimitQuotaServiceClient::new(channel);
    let (reports, rx) = mpsc::channel(16);
    let answers = client.stream_rate_limit_quotas(ReceiverStream::new(rx));
    reports.send(report(1, 0)).await.unwrap();
    let answers = answers.await.expect("the stream opens").into_inner();
    Envoy { reports, answers }
}

/// The tokens per second of an answer's token bucket for acme (`None`: another action).
fn rate(answer: &RateLimitQuotaResponse) -> Option<f64> {
    let action = answer.bucket_action.first()?.bucket_action.as_ref()?;
    let Action::QuotaAssignmentAction(q) = action else {
        return None;
    };
    let Some(Strategy::TokenBucket(t)) = q.rate_limit_strategy.as_ref()?.strategy.as_ref() else {
        return Some(0.0);
    };
    let interval = t.fill_interval.as_ref()?;
    Some(f64::from(t.tokens_per_fill.as_ref()?.value) / interval.seconds.max(1) as f64)
}

/// The next answer within `wait` (`None`: none came).
async fn next(envoy: &mut Envoy, wait: Duration) -> Option<RateLimitQuotaResponse> {
    match tokio::time::timeout(wait, envoy.answers.message()).await {
        Ok(Ok(Some(a))) => Some(a),
        Ok(other) => panic!("the stream ended: {other:?}"),
        Err(_) => None,
    }
}

/// A metric's value on `r`'s `/metrics` (0 when absent).
fn metric<S: BucketStore>(r: &Replica<S>, name: &str) -> f64 {
    let text = r.limiter.metrics().render();
    text.lines()
        .find(|l| l.starts_with(&format!("{name} ")))
        .and_then(|l| l.split_whitespace().last()?.parse().ok())
        .unwrap_or(0.0)
}

/// Tokens `r` drew and did not give back.
fn drawn(r: &Replica) -> f64 {
    metric(r, "shardgate_rlqs_drawn_tokens_total") - returned(r)
}

fn returned(r: &Replica) -> f64 {
    metric(r, "shardgate_rlqs_returned_tokens_total")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_store_assign_no_more_than_the_limit_together() {
    let store = Arc::new(MemoryStore::new());
    let started = Instant::now();
    let (a, b) = (replica(&store).await, replica(&store).await);
    let (mut ea, mut eb) = (open(a.addr).await, open(b.addr).await);
    let mut rates = [0.0f64; 2];
    let mut pushed = [0usize; 2];
    // What the Envoys could admit by their assignments: each rate for as long as it
    // held, and a new bucket's first tokens (at most a tenth of a second of its rate).
    let mut could_admit = 0.0f64;
    let mut last = Instant::now();
    let mut take = |rates: &mut [f64; 2], i: usize, r: f64, could_admit: &mut f64| {
        let now = Instant::now();
        *could_admit += (rates[0] + rates[1]) * now.duration_since(last).as_secs_f64();
        last = now;
        if r != rates[i] {
            *could_admit += (r * 0.1).max(1.0);
        }
        rates[i] = r;
    };
    // Each Envoy reports 200 requests a second (four times the limit) every second, and
    // takes every answer — to a report or pushed — as its assignment from then on.
    let deadline = Instant::now() + Duration::from_secs(6);
    while Instant::now() < deadline {
        for (i, envoy) in [&mut ea, &mut eb].into_iter().enumerate() {
            envoy.reports.send(report(200, 1)).await.unwrap();
            let answer = next(envoy, Duration::from_secs(5))
                .await
                .expect("an answer");
            take(
                &mut rates,
                i,
                rate(&answer).expect("a token bucket"),
                &mut could_admit,
            );
            // Answers pushed between reports: a rate that moved.
            while let Some(answer) = next(envoy, Duration::from_millis(50)).await {
                take(
                    &mut rates,
                    i,
                    rate(&answer).expect("a token bucket"),
                    &mut could_admit,
                );
                pushed[i] += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let kept = rates[0];
    take(&mut rates, 0, kept, &mut could_admit);
    let elapsed = started.elapsed().as_secs_f64();
    let drawn = drawn(&a) + drawn(&b);
    let bound = LIMIT + LIMIT * (elapsed + 1.0);
    println!(
        "rates {rates:?}, could admit {could_admit:.0}, drawn {drawn}, bound {bound:.0} in {elapsed:.1} s, pushed {pushed:?}"
    );
    // Every token the assignments let through was drawn first, and the draws came from
    // the one bucket: its burst, its refill and the runway a bank holds ahead.
    assert!(could_admit <= drawn + 1.0, "{could_admit} > {drawn}");
    assert!(drawn <= bound, "{drawn} > {bound}");
    // Both hold a part of it, and together most of it.
    assert!(rates.iter().all(|&r| r >= 0.1 * LIMIT), "{rates:?}");
    assert!(
        could_admit >= 0.5 * LIMIT * elapsed,
        "{could_admit} in {elapsed}"
    );
    // New rates reached the streams between their reports.
    assert!(pushed.iter().sum::<usize>() > 0, "{pushed:?}");
    // Each token bucket sent counted the share it was for.
    let shares =
        metric(&a, "shardgate_rlqs_share_count") + metric(&b, "shardgate_rlqs_share_count");
    assert!(
        shares >= (2 + pushed[0] + pushed[1]) as f64,
        "{shares} shares counted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_limit_reaches_the_envoy_without_a_report() {
    let store = Arc::new(MemoryStore::new());
    let a = replica(&store).await;
    let mut envoy = open(a.addr).await;
    let first = next(&mut envoy, Duration::from_secs(5)).await.unwrap();
    let before = rate(&first).unwrap();
    assert!(before >= 0.5 * LIMIT, "{before}");
    // `explain` and `/rlconfig` show the bucket, its stream and this server's grant.
    let acme = [("tenant".to_string(), "acme".to_string())];
    let said = a.limiter.explain("rlqs", &acme).await;
    assert!(
        said.contains("\nRLQS: rlqs (tenant=acme): 1 Envoy stream reporting")
            && said.contains("this server draws from the store:"),
        "{said}"
    );
    let board = a.limiter.rlqs().expect("the RLQS service made its board");
    assert!(
        board
            .rlconfig()
            .starts_with("rlqs buckets: 1:\n  rlqs (tenant=acme): 1 Envoy stream"),
        "{}",
        board.rlconfig()
    );
    let lowered = Config::from_yaml("rlqs.yaml", &rules(5)).unwrap();
    a.limiter.replace_config(Arc::new(lowered), "rlqs.yaml");
    // No report sent: the server's draws at the lowered limit cut the rate, pushed.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut now_rate = before;
    while now_rate > 5.0 && Instant::now() < deadline {
        if let Some(answer) = next(&mut envoy, Duration::from_millis(200)).await {
            now_rate = rate(&answer).unwrap();
        }
    }
    assert!(
        now_rate <= 5.0,
        "still {now_rate}/s 5 s after the limit fell to 5/s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_limit_is_drawn_a_token_at_a_time() {
    // 6 a minute: a draw's runway is a tenth of a token, drawn as a whole one.
    let slow = "domain: rlqs\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 6}\n";
    let store = Arc::new(MemoryStore::new());
    let a = replica_with(&store, slow).await;
    let mut envoy = open(a.addr).await;
    let first = next(&mut envoy, Duration::from_secs(5)).await.unwrap();
    let r = rate(&first).expect("a token bucket");
    assert!(r > 0.0 && r <= 0.1, "{r} tokens/s for 6 a minute");
    // Every token promised was drawn.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(drawn(&a) >= 1.0 && drawn(&a) <= 6.0 + 1.0, "{}", drawn(&a));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn when_demand_falls_the_surplus_goes_back_to_the_store() {
    // The store's clock stands still, so its bucket moves only by draws and give-backs:
    // what it holds is exactly its burst less what was drawn and not given back.
    let burst = 500.0;
    let yaml = "domain: rlqs\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 50, burst: 500}\n";
    let engine = Arc::new(Engine::with_parts(
        Arc::new(MemoryStore::new()),
        EngineOptions::default(),
        Arc::new(ManualClock::new(1_800_000_000_000)),
        Arc::new(RandomDraw),
    ));
    let a = replica_on(engine, yaml).await;
    let mut envoy = open(a.addr).await;
    next(&mut envoy, Duration::from_secs(5)).await.unwrap();
    // Past a new bucket's first 6 s (drawn for at its whole limit), then a tenth of it.
    let steps = [(7, 200), (3, 5)];
    for (seconds, per_second) in steps {
        for _ in 0..seconds {
            envoy.reports.send(report(per_second, 1)).await.unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
            while next(&mut envoy, Duration::from_millis(1)).await.is_some() {}
        }
    }
    let acme = [("tenant".to_string(), "acme".to_string())];
    let said = a.limiter.explain("rlqs", &acme).await;
    let left: f64 = said
        .split(" of 500 tokens left")
        .next()
        .and_then(|s| s.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no balance in {said}"));
    let (gross, back) = (
        metric(&a, "shardgate_rlqs_drawn_tokens_total"),
        returned(&a),
    );
    println!("drawn {gross}, given back {back}, the bucket holds {left} of {burst}");
    // What the bank held beyond the runway of the lower target (about half a second of
    // the old rate, less what the new Envoy bucket started with).
    assert!(
        back >= 5.0,
        "{back} given back after demand fell to a tenth"
    );
    assert_eq!(left, burst - gross + back, "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_that_fails_open_is_divided_locally_while_the_store_fails() {
    let yaml = "domain: rlqs\ndescriptors:\n  - key: tenant\n    failure_mode: allow\n    rate_limit: {unit: second, requests_per_unit: 50}\n";
    let (store, release) = common::held::Held::new();
    release.send(true).unwrap();
    let engine = Arc::new(Engine::new(Arc::new(store), EngineOptions::default()));
    let a = replica_on(engine, yaml).await;
    let mut envoy = open(a.addr).await;
    let first = rate(&next(&mut envoy, Duration::from_secs(5)).await.unwrap()).unwrap();
    assert!(first >= 0.5 * LIMIT, "{first}");
    // The store stops answering: each draw times out (1 s). With `failure_mode: deny` the
    // rate would fall to nothing as the bank empties; failing open, the Envoy gets the
    // limit this server divides on its own.
    release.send(false).unwrap();
    let mut rates = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(6);
    while Instant::now() < deadline {
        envoy.reports.send(report(200, 1)).await.unwrap();
        while let Some(answer) = next(&mut envoy, Duration::from_millis(500)).await {
            rates.push(rate(&answer).unwrap());
        }
    }
    println!("rates while the store failed: {rates:?}");
    let last = *rates.last().unwrap();
    assert!((last - LIMIT).abs() < 1.0, "{rates:?}");
    assert!(metric(&a, "shardgate_rlqs_draws_total{outcome=\"error\"}") >= 1.0);
    // The store is back: the next draws land and the fleet's rate is in force again.
    release.send(true).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut after = Vec::new();
    while Instant::now() < deadline {
        envoy.reports.send(report(200, 1)).await.unwrap();
        while let Some(answer) = next(&mut envoy, Duration::from_millis(500)).await {
            after.push(rate(&answer).unwrap());
        }
    }
    println!("rates once it answered again: {after:?}");
    assert!(metric(&a, "shardgate_rlqs_draws_total{outcome=\"full\"}") >= 2.0);
    assert!(
        after.iter().any(|&r| r < LIMIT - 1.0),
        "{after:?}: never drawn again"
    );
}

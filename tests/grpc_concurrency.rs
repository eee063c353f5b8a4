//! Many clients racing for one bucket over real gRPC connections: the server must never
//! admit more than the bucket's capacity plus what it refilled during the run, and must
//! keep admitting as tokens come back (not just refuse everything once contended).

mod common;

use std::time::{Duration, Instant};

use common::server::*;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use shardgate::engine::{EngineOptions, EngineStats, SystemClock};

const CLIENTS: usize = 64;
/// How long the clients hammer.
const RUN: Duration = Duration::from_secs(3);
/// Per-client request cap, so the loop is bounded in count as well as time.
const MAX_REQUESTS_PER_CLIENT: usize = 20_000;
const BURST: u64 = 50;
const PER_SECOND: u64 = 20;

const HOT_BUCKET: &str = "
domain: hot
descriptors:
  - key: route
    rate_limit: {unit: second, requests_per_unit: 20, burst: 50, name: route_rps}
";

struct Tally {
    admitted: u64,
    refused: u64,
    elapsed: Duration,
}

/// `CLIENTS` tasks, each on its own HTTP/2 connection, send one-descriptor requests for
/// the same bucket until `RUN` has passed (or their cap), counting the answers.
async fn hammer(server: &TestServer) -> Tally {
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(server.client().await);
    }
    // Measured around the whole run: the bucket is created by the first request, so it
    // cannot have refilled for longer than this.
    let start = Instant::now();
    let deadline = start + RUN;
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                let (mut admitted, mut refused) = (0u64, 0u64);
                for _ in 0..MAX_REQUESTS_PER_CLIENT {
                    if Instant::now() >= deadline {
                        break;
                    }
                    let r = c.ok(one("hot", &[("route", "/checkout")])).await;
                    let s = &r.statuses[0];
                    match code(r.overall_code) {
                        Code::Ok => {
                            assert_eq!(code(s.code), Code::Ok, "{r:?}");
                            // At most the burst: a fast debit does not refill the stored
                            // balance, and the answer projects its refill to now, so a
                            // shard refilled past its ceiling since its last slow pass
                            // reports the ceiling after a debit (the debit came out of
                            // tokens the clamp drops; the slow pass agrees).
                            assert!(s.limit_remaining <= BURST as u32, "{r:?}");
                            admitted += 1;
                        }
                        Code::OverLimit => {
                            assert_eq!(code(s.code), Code::OverLimit, "{r:?}");
                            assert!(reset_ms(s) > 0, "a refusal says when to retry: {r:?}");
                            refused += 1;
                        }
                        other => panic!("unexpected overall code {other:?}: {r:?}"),
                    }
                }
                (admitted, refused)
            })
        })
        .collect();
    let mut tally = Tally {
        admitted: 0,
        refused: 0,
        elapsed: Duration::ZERO,
    };
    for t in tasks {
        let (a, r) = tokio::time::timeout(RUN + CALL_TIMEOUT * 2, t)
            .await
            .expect("client task finishes after the run")
            .expect("client task did not panic");
        tally.admitted += a;
        tally.refused += r;
    }
    tally.elapsed = start.elapsed();
    tally
}

/// The most a bucket of `BURST` tokens refilled at `PER_SECOND` can admit in `elapsed`.
fn upper_bound(elapsed: Duration, burst: u64) -> u64 {
    burst + (PER_SECOND as f64 * elapsed.as_secs_f64()).ceil() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_clients_on_one_bucket_admit_at_most_burst_plus_refill() {
    let server = TestServer::start(HOT_BUCKET).await;
    let t = hammer(&server).await;
    let upper = upper_bound(t.elapsed, BURST);
    eprintln!(
        "admitted {} refused {} in {:?} (bound {upper})",
        t.admitted, t.refused, t.elapsed
    );
    assert!(
        t.admitted <= upper,
        "admitted {} > burst {BURST} + {PER_SECOND}/s × {:?} = {upper}",
        t.admitted,
        t.elapsed
    );
    // Contention really happened...
    assert!(
        t.refused >= 2 * t.admitted,
        "only {} refused against {} admitted",
        t.refused,
        t.admitted
    );
    // ...and the limiter kept admitting as tokens came back: the whole burst plus at
    // least the refill of the first RUN − 1 s (the last second is slack for a slow box).
    let lower = BURST + PER_SECOND * (RUN.as_secs() - 1);
    assert!(
        t.admitted >= lower,
        "admitted only {} (expected ≥ {lower}) in {:?}",
        t.admitted,
        t.elapsed
    );
}

/// With a tiny partition write budget the hot bucket spreads over several shards while the
/// clients race. Each doubling may leave an old shard holding more than its new share
/// until a slow pass clamps it (docs/architecture.md, "The acquire algorithm": at most `C/2` once per
/// doubling, `MAX_SHARD_COUNT` = 32 → at most 5 doublings), so the bound here is
/// `C + 5 × C/2 + refill`; the refill and the burst must still be served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_hot_bucket_stays_within_burst_plus_refill_plus_the_doubling_transient() {
    let options = EngineOptions {
        partition_write_budget: 5,
        ..serve_defaults()
    };
    let server =
        TestServer::start_with(HOT_BUCKET, options, std::sync::Arc::new(SystemClock), None).await;
    let t = hammer(&server).await;
    let stats = server.limiter.engine().stats();
    let doublings = EngineStats::get(&stats.shard_doublings);
    let shards = server
        .limiter
        .engine()
        .known_shard_count("route=%2Fcheckout", "hot");
    let upper = upper_bound(t.elapsed, BURST + doublings * BURST / 2);
    eprintln!(
        "admitted {} refused {} in {:?}; {doublings} doublings, {shards} shards (bound {upper})",
        t.admitted, t.refused, t.elapsed
    );
    assert!(
        doublings >= 1,
        "a budget of 5 writes/s must make the bucket double"
    );
    assert!(shards > 1, "the bucket is spread over {shards} shard(s)");
    assert!(
        t.admitted <= upper,
        "admitted {} > {upper} ({doublings} doublings) in {:?}",
        t.admitted,
        t.elapsed
    );
    assert!(
        t.admitted >= BURST,
        "admitted only {} (expected at least the burst {BURST})",
        t.admitted
    );
}

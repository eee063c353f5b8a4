//! A small, bounded HTTP/2 load generator for `ShouldRateLimit`, used by `bench/run` where
//! h2load cannot go: h2load sends one request body for every request (`-d FILE`), so it
//! cannot rotate over 100,000 distinct descriptors. This tool sends pre-encoded gRPC
//! frames (5-byte prefix + protobuf, written by `bench/frames.py`), one after the other
//! from a file of concatenated frames, and checks **every** answer: HTTP status, the
//! `grpc-status` trailer, and the `RateLimitResponse`'s `overall_code`.
//!
//! Like `h2load -t1`, it runs on one thread. It opens `--connections` HTTP/2 connections
//! and keeps `--concurrency` streams in flight across them (spread evenly). It stops
//! starting requests at `--duration` or after `--max-requests`, whichever comes first,
//! then waits at most 5 s for the streams in flight.
//!
//!     rls_load --addr 127.0.0.1:8081 --frames distinct.bin --concurrency 64 \
//!              [--connections 2] [--duration 10] [--max-requests 5000000] \
//!              [--log-file PATH] [--offset N]
//!
//! Output: one JSON object on stdout (counts, req/s, latency percentiles in µs); with
//! `--log-file`, one line per request in h2load's `--log-file` format (start time in µs
//! since the epoch, HTTP status, µs until the end of the response) plus two columns:
//! grpc-status and overall_code (-1 when absent).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[path = "support/latency.rs"]
mod latency;

use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use prost::Message;

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// How long to wait for the streams in flight once no new request is started.
const DRAIN: Duration = Duration::from_secs(5);
/// Hard cap on requests of one run, whatever the flags say.
const MAX_REQUESTS_CAP: u64 = 50_000_000;
/// Hard cap on the run's duration, whatever the flags say.
const MAX_DURATION_CAP: Duration = Duration::from_secs(600);

struct Args {
    addr: String,
    frames: String,
    concurrency: usize,
    connections: usize,
    duration: Duration,
    max_requests: u64,
    log_file: Option<String>,
    offset: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        addr: String::new(),
        frames: String::new(),
        concurrency: 1,
        connections: 0,
        duration: Duration::from_secs(10),
        max_requests: 5_000_000,
        log_file: None,
        offset: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let num = |v: String| v.parse::<f64>().map_err(|e| format!("{v}: {e}"));
        match flag.as_str() {
            "--addr" => a.addr = value()?,
            "--frames" => a.frames = value()?,
            "--concurrency" => a.concurrency = num(value()?)? as usize,
            "--connections" => a.connections = num(value()?)? as usize,
            "--duration" => a.duration = Duration::from_secs_f64(num(value()?)?),
            "--max-requests" => a.max_requests = num(value()?)? as u64,
            "--log-file" => a.log_file = Some(value()?),
            "--offset" => a.offset = num(value()?)? as usize,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.addr.is_empty() || a.frames.is_empty() {
        return Err("--addr and --frames are required".into());
    }
    a.concurrency = a.concurrency.max(1);
    if a.connections == 0 {
        a.connections = a.concurrency.min(2);
    }
    a.connections = a.connections.clamp(1, a.concurrency);
    a.duration = a.duration.min(MAX_DURATION_CAP);
    a.max_requests = a.max_requests.min(MAX_REQUESTS_CAP);
    Ok(a)
}

/// Splits a file of concatenated gRPC frames into one body per frame (prefix included).
fn split_frames(data: Bytes) -> Result<Vec<Bytes>, String> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < data.len() {
        if data.len() - at < 5 {
            return Err(format!("truncated frame prefix at byte {at}"));
        }
        if data[at] != 0 {
            return Err(format!("compressed frame at byte {at}"));
        }
        let len = u32::from_be_bytes([data[at + 1], data[at + 2], data[at + 3], data[at + 4]]);
        let end = at + 5 + len as usize;
        if end > data.len() {
            return Err(format!("truncated frame at byte {at}"));
        }
        out.push(data.slice(at..end));
        at = end;
    }
    if out.is_empty() {
        return Err("no frames".into());
    }
    Ok(out)
}

/// What one answer was.
struct Answer {
    start_us: u64,
    http: i32,
    latency_us: u64,
    grpc_status: i32,
    overall: i32,
}

#[derive(Default)]
struct Tally {
    answers: Vec<Answer>,
    stream_errors: u64,
    first_error: Option<String>,
}

struct Shared {
    bodies: Vec<Bytes>,
    next: AtomicUsize,
    issued: AtomicU64,
    max_requests: u64,
    deadline: Instant,
    stop: AtomicBool,
    uri: http::Uri,
}

impl Shared {
    /// The next body, or None when the run is over (time or count).
    fn take(&self) -> Option<Bytes> {
        if self.stop.load(Ordering::Relaxed) || Instant::now() >= self.deadline {
            return None;
        }
        if self.issued.fetch_add(1, Ordering::Relaxed) >= self.max_requests {
            return None;
        }
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.bodies.len();
        Some(self.bodies[i].clone())
    }
}

fn epoch_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn grpc_status_of(map: Option<&http::HeaderMap>) -> Option<i32> {
    map?.get("grpc-status")?.to_str().ok()?.parse().ok()
}

/// The overall code of a one-message gRPC body; -1 when it does not decode.
fn overall_of(body: &[u8]) -> i32 {
    if body.len() < 5 || body[0] != 0 {
        return -1;
    }
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    if body.len() != 5 + len {
        return -1;
    }
    match RateLimitResponse::decode(&body[5..]) {
        Ok(r) => r.overall_code,
        Err(_) => -1,
    }
}

async fn one_call(
    send: &mut h2::client::SendRequest<Bytes>,
    shared: &Shared,
    body: Bytes,
) -> Result<Answer, h2::Error> {
    let request = http::Request::builder()
        .method(http::Method::POST)
        .uri(shared.uri.clone())
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .expect("a valid request");
    let start_us = epoch_us();
    let started = Instant::now();
    let mut ready = send.clone().ready().await?;
    let (response, mut stream) = ready.send_request(request, false)?;
    stream.send_data(body, true)?;
    let response = response.await?;
    let (parts, mut recv) = response.into_parts();
    let mut data = BytesMut::new();
    while let Some(chunk) = recv.data().await {
        let chunk = chunk?;
        let _ = recv.flow_control().release_capacity(chunk.len());
        data.extend_from_slice(&chunk);
    }
    let trailers = recv.trailers().await?;
    let latency_us = started.elapsed().as_micros() as u64;
    // A trailers-only answer carries grpc-status in the headers.
    let grpc_status = grpc_status_of(trailers.as_ref())
        .or_else(|| grpc_status_of(Some(&parts.headers)))
        .unwrap_or(-1);
    let overall = if grpc_status == 0 {
        overall_of(&data)
    } else {
        -1
    };
    Ok(Answer {
        start_us,
        http: i32::from(parts.status.as_u16()),
        latency_us,
        grpc_status,
        overall,
    })
}

async fn stream_slot(mut send: h2::client::SendRequest<Bytes>, shared: Arc<Shared>) -> Tally {
    let mut tally = Tally::default();
    while let Some(body) = shared.take() {
        match one_call(&mut send, &shared, body).await {
            Ok(a) => tally.answers.push(a),
            Err(e) => {
                tally.stream_errors += 1;
                if tally.first_error.is_none() {
                    tally.first_error = Some(e.to_string());
                }
                if e.is_io() || e.is_go_away() {
                    break;
                }
            }
        }
    }
    tally
}

async fn run(args: Args) -> Result<serde_json::Value, String> {
    let data = std::fs::read(&args.frames).map_err(|e| format!("{}: {e}", args.frames))?;
    let bodies = split_frames(Bytes::from(data)).map_err(|e| format!("{}: {e}", args.frames))?;
    let uri: http::Uri = format!("http://{}{PATH}", args.addr)
        .parse()
        .map_err(|e| format!("{e}"))?;

    let mut sends = Vec::new();
    for _ in 0..args.connections {
        let tcp = tokio::net::TcpStream::connect(&args.addr)
            .await
            .map_err(|e| format!("connect {}: {e}", args.addr))?;
        let _ = tcp.set_nodelay(true);
        let (send, conn) = h2::client::Builder::new()
            .initial_window_size((1 << 30) - 1)
            .initial_connection_window_size((1 << 30) - 1)
            .handshake::<_, Bytes>(tcp)
            .await
            .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        sends.push(send);
    }

    let started = Instant::now();
    let shared = Arc::new(Shared {
        next: AtomicUsize::new(args.offset % bodies.len()),
        bodies,
        issued: AtomicU64::new(0),
        max_requests: args.max_requests,
        deadline: started + args.duration,
        stop: AtomicBool::new(false),
        uri,
    });
    let mut tasks = Vec::new();
    for i in 0..args.concurrency {
        let send = sends[i % sends.len()].clone();
        tasks.push(tokio::spawn(stream_slot(send, shared.clone())));
    }
    let mut tally = Tally::default();
    let drain_until = shared.deadline + DRAIN;
    for t in tasks {
        let left = drain_until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, t).await {
            Ok(Ok(t)) => {
                tally.answers.extend(t.answers);
                tally.stream_errors += t.stream_errors;
                if tally.first_error.is_none() {
                    tally.first_error = t.first_error;
                }
            }
            Ok(Err(e)) => return Err(format!("a stream task failed: {e}")),
            Err(_) => {
                shared.stop.store(true, Ordering::Relaxed);
                tally.stream_errors += 1;
                tally
                    .first_error
                    .get_or_insert_with(|| "drain timeout".into());
            }
        }
    }
    let elapsed = started.elapsed();
    // The measured window: from the first request to the last answer.
    let window_s = tally
        .answers
        .iter()
        .map(|a| a.start_us + a.latency_us)
        .max()
        .zip(tally.answers.iter().map(|a| a.start_us).min())
        .map(|(end, start)| (end.saturating_sub(start)) as f64 / 1e6)
        .unwrap_or(elapsed.as_secs_f64())
        .max(1e-6);

    if let Some(path) = &args.log_file {
        let f = std::fs::File::create(path).map_err(|e| format!("{path}: {e}"))?;
        let mut w = std::io::BufWriter::new(f);
        for a in &tally.answers {
            writeln!(
                w,
                "{}\t{}\t{}\t{}\t{}",
                a.start_us, a.http, a.latency_us, a.grpc_status, a.overall
            )
            .map_err(|e| format!("{path}: {e}"))?;
        }
        w.flush().map_err(|e| format!("{path}: {e}"))?;
    }

    let mut http: BTreeMap<String, u64> = BTreeMap::new();
    let mut grpc: BTreeMap<String, u64> = BTreeMap::new();
    let mut overall: BTreeMap<String, u64> = BTreeMap::new();
    for a in &tally.answers {
        *http.entry(a.http.to_string()).or_default() += 1;
        *grpc.entry(a.grpc_status.to_string()).or_default() += 1;
        let name = match a.overall {
            0 => "UNKNOWN",
            1 => "OK",
            2 => "OVER_LIMIT",
            _ => "undecoded",
        };
        *overall.entry(name.to_string()).or_default() += 1;
    }
    let mut lat: Vec<u64> = tally.answers.iter().map(|a| a.latency_us).collect();
    lat.sort_unstable();
    let n = lat.len() as u64;
    let mean = if n > 0 {
        lat.iter().sum::<u64>() as f64 / n as f64
    } else {
        0.0
    };
    let mut latency_us = latency::percentiles(&lat);
    latency_us.insert("mean".into(), mean.into());
    Ok(serde_json::json!({
        "tool": "rls_load",
        "addr": args.addr,
        "frames": args.frames,
        "distinct_bodies": shared.bodies.len(),
        "connections": args.connections,
        "concurrency": args.concurrency,
        "duration_s": args.duration.as_secs_f64(),
        "window_s": window_s,
        "answers": n,
        "stream_errors": tally.stream_errors,
        "first_error": tally.first_error,
        "req_per_s": n as f64 / window_s,
        "http_status": http,
        "grpc_status": grpc,
        "overall_code": overall,
        "latency_us": latency_us,
    }))
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rls_load: {e}");
            return ExitCode::FAILURE;
        }
    };
    // One thread, as h2load -t1.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rls_load: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rls_load: {e}");
            ExitCode::FAILURE
        }
    }
}

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
//!              [--log-file PATH] [--offset N] [--zipf S [--seed N]]
//!
//! Frames are sent in turn, or with `--zipf S` drawn at random with the Zipf law of
//! exponent `S` over the file's frames (frame `k`, counted from 0, has weight
//! `1/(k+1)^S`): over `distinct.bin`'s 100,000 descriptors, `--zipf 1.1` is a realistic
//! tenant mix in which a few keys carry most of the traffic and most keys are rare. The
//! draw is an exact inverse of the cumulative distribution (a table of one `f64` per
//! frame, a binary search per request), from a generator seeded by `--seed`, so two runs
//! send the same sequence.
//!
//! Output: one JSON object on stdout (counts, req/s, latency percentiles in µs from
//! per-stream HDR histograms, `latency.rs`); with `--log-file`, one line per request in
//! h2load's `--log-file` format (start time in µs since the epoch, HTTP status, µs until
//! the end of the response) plus two columns: grpc-status and overall_code (-1 when
//! absent). Only then are answers kept one by one: without it memory stays flat however
//! long the run.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[path = "latency.rs"]
mod latency;

use bytes::{Bytes, BytesMut};
use clap::builder::NonEmptyStringValueParser;
use clap::Parser;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse;
use hdrhistogram::Histogram;
use prost::Message;
use rand::{RngExt, SeedableRng};

const PATH: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// How long to wait for the streams in flight once no new request is started.
const DRAIN: Duration = Duration::from_secs(5);
/// Hard cap on requests of one run, whatever the flags say.
const MAX_REQUESTS_CAP: u64 = 50_000_000;
/// Hard cap on the run's duration, whatever the flags say.
const MAX_DURATION_CAP: Duration = Duration::from_secs(600);

/// A bounded HTTP/2 load generator for ShouldRateLimit over pre-encoded gRPC frames.
#[derive(Parser)]
#[command(name = "rls_load")]
struct Args {
    /// The server's gRPC address, host:port.
    #[arg(long, value_parser = NonEmptyStringValueParser::new())]
    addr: String,
    /// A file of concatenated gRPC frames (bench/frames.py), sent in turn.
    #[arg(long, value_parser = NonEmptyStringValueParser::new())]
    frames: String,
    /// Streams kept in flight (at least 1).
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// HTTP/2 connections the streams share; 0: min(concurrency, 2).
    #[arg(long, default_value_t = 0)]
    connections: usize,
    /// Seconds to start requests for (fractions allowed; at most 600).
    #[arg(long, default_value = "10", value_parser = seconds)]
    duration: Duration,
    /// Requests to start at most (at most 50,000,000).
    #[arg(long, default_value_t = 5_000_000)]
    max_requests: u64,
    /// Writes one line per answer there, in h2load's --log-file format plus two columns.
    #[arg(long)]
    log_file: Option<String>,
    /// Index of the first frame sent (modulo their number); frames in turn only.
    #[arg(long, default_value_t = 0)]
    offset: usize,
    /// Draws each request's frame with the Zipf law of this exponent (> 0) over the
    /// frames instead of sending them in turn.
    #[arg(long, value_parser = zipf_exponent)]
    zipf: Option<f64>,
    /// Seed of the `--zipf` draws.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// A Zipf exponent: a finite number above 0.
fn zipf_exponent(text: &str) -> Result<f64, String> {
    let s: f64 = text.parse().map_err(|e| format!("{text}: {e}"))?;
    if s.is_finite() && s > 0.0 {
        Ok(s)
    } else {
        Err(format!(
            "{text}: a Zipf exponent is a finite number above 0"
        ))
    }
}

/// The Zipf law over `n` ranks as its cumulative distribution: rank `k` (from 0) has
/// weight `1/(k+1)^s`; a uniform draw in [0, 1) maps to the first rank whose cumulative
/// share exceeds it.
struct ZipfTable {
    cumulative: Vec<f64>,
}

impl ZipfTable {
    fn new(n: usize, s: f64) -> ZipfTable {
        let mut cumulative = Vec::with_capacity(n);
        let mut sum = 0.0;
        for k in 1..=n {
            sum += (k as f64).powf(-s);
            cumulative.push(sum);
        }
        for c in &mut cumulative {
            *c /= sum;
        }
        ZipfTable { cumulative }
    }

    /// The rank of uniform draw `u` in [0, 1).
    fn rank(&self, u: f64) -> usize {
        self.cumulative
            .partition_point(|&c| c <= u)
            .min(self.cumulative.len() - 1)
    }
}

/// The least store writes any design could have made for the requests sent (issue 45):
/// a key needs at least one write in each window of a lease's lifetime (1 s, shardgate's
/// default) in which it is touched, so the floor is the number of distinct (frame, window)
/// pairs sent. Frames are keys: `distinct.bin` holds one bucket per frame.
struct Floor {
    started: Instant,
    touched: std::sync::Mutex<std::collections::HashSet<u64>>,
}

/// The floor's window: shardgate's lease lifetime (`engine/lease/options.rs`).
const FLOOR_WINDOW_MS: u128 = 1_000;

impl Floor {
    fn new(started: Instant) -> Floor {
        Floor {
            started,
            touched: std::sync::Mutex::new(std::collections::HashSet::new()),
        }
    }

    /// Frame `frame` sent now.
    fn touch(&self, frame: usize) {
        self.touch_at(frame, self.started.elapsed().as_millis());
    }

    fn touch_at(&self, frame: usize, at_ms: u128) {
        let window = (at_ms / FLOOR_WINDOW_MS) as u64;
        let pair = (frame as u64) << 32 | (window & 0xffff_ffff);
        self.touched.lock().expect("never poisoned").insert(pair);
    }

    fn writes(&self) -> usize {
        self.touched.lock().expect("never poisoned").len()
    }
}

/// Which frame each request sends.
enum Order {
    /// In turn from `--offset`.
    InTurn(AtomicUsize),
    /// Drawn by the Zipf law (the generator is locked per draw: one thread, no contention;
    /// boxed, as the generator's state is large).
    Zipf {
        table: ZipfTable,
        rng: Box<std::sync::Mutex<rand::rngs::StdRng>>,
    },
}

impl Order {
    fn next(&self, n: usize) -> usize {
        match self {
            Order::InTurn(next) => next.fetch_add(1, Ordering::Relaxed) % n,
            Order::Zipf { table, rng } => {
                let u: f64 = rng.lock().expect("never poisoned").random();
                table.rank(u)
            }
        }
    }

    fn describe(&self, exponent: Option<f64>) -> String {
        match (self, exponent) {
            (Order::Zipf { .. }, Some(s)) => format!("zipf({s})"),
            _ => "in turn".into(),
        }
    }
}

impl Args {
    /// The flags brought within the tool's bounds: the caps hold whatever was asked.
    fn bounded(mut self) -> Args {
        self.concurrency = self.concurrency.max(1);
        if self.connections == 0 {
            self.connections = self.concurrency.min(2);
        }
        self.connections = self.connections.clamp(1, self.concurrency);
        self.duration = self.duration.min(MAX_DURATION_CAP);
        self.max_requests = self.max_requests.min(MAX_REQUESTS_CAP);
        self
    }
}

/// A non-negative number of seconds, fractions allowed.
fn seconds(text: &str) -> Result<Duration, String> {
    let s: f64 = text.parse().map_err(|e| format!("{text}: {e}"))?;
    Duration::try_from_secs_f64(s).map_err(|e| format!("{text}: {e}"))
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

/// What one answer was: a line of `--log-file`.
struct Answer {
    start_us: u64,
    http: i32,
    latency_us: u64,
    grpc_status: i32,
    overall: i32,
}

/// The span the answers cover, in µs since the epoch: the measured window.
#[derive(Clone, Copy)]
struct Window {
    first_start_us: u64,
    last_end_us: u64,
}

impl Window {
    fn widen(self, other: Window) -> Window {
        Window {
            first_start_us: self.first_start_us.min(other.first_start_us),
            last_end_us: self.last_end_us.max(other.last_end_us),
        }
    }
}

/// What one stream saw (and, merged, the whole run): counts and a latency histogram, so
/// the run's memory does not grow with its length; every answer only for `--log-file`.
struct Tally {
    latency_us: Histogram<u64>,
    http: BTreeMap<i32, u64>,
    grpc: BTreeMap<i32, u64>,
    overall: BTreeMap<i32, u64>,
    window: Option<Window>,
    log: Option<Vec<Answer>>,
    stream_errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn new(keep_answers: bool) -> Tally {
        Tally {
            latency_us: latency::histogram(),
            http: BTreeMap::new(),
            grpc: BTreeMap::new(),
            overall: BTreeMap::new(),
            window: None,
            log: keep_answers.then(Vec::new),
            stream_errors: 0,
            first_error: None,
        }
    }

    fn count(&mut self, a: Answer) {
        latency::record(&mut self.latency_us, a.latency_us);
        *self.http.entry(a.http).or_default() += 1;
        *self.grpc.entry(a.grpc_status).or_default() += 1;
        *self.overall.entry(a.overall).or_default() += 1;
        let w = Window {
            first_start_us: a.start_us,
            last_end_us: a.start_us + a.latency_us,
        };
        self.window = Some(self.window.map_or(w, |v| v.widen(w)));
        if let Some(log) = &mut self.log {
            log.push(a);
        }
    }

    fn error(&mut self, e: String) {
        self.stream_errors += 1;
        self.first_error.get_or_insert(e);
    }

    /// Adds a stream's tally; its answers follow those already logged.
    fn merge(&mut self, t: Tally) -> Result<(), String> {
        self.latency_us
            .add(&t.latency_us)
            .map_err(|e| format!("merging latencies: {e:?}"))?;
        for (mine, theirs) in [
            (&mut self.http, t.http),
            (&mut self.grpc, t.grpc),
            (&mut self.overall, t.overall),
        ] {
            for (k, n) in theirs {
                *mine.entry(k).or_default() += n;
            }
        }
        self.window = match (self.window, t.window) {
            (Some(a), Some(b)) => Some(a.widen(b)),
            (a, b) => a.or(b),
        };
        if let (Some(mine), Some(theirs)) = (&mut self.log, t.log) {
            mine.extend(theirs);
        }
        self.stream_errors += t.stream_errors;
        if self.first_error.is_none() {
            self.first_error = t.first_error;
        }
        Ok(())
    }
}

struct Shared {
    bodies: Vec<Bytes>,
    order: Order,
    floor: Floor,
    issued: AtomicU64,
    max_requests: u64,
    deadline: Instant,
    stop: AtomicBool,
    uri: http::Uri,
    /// Whether the tallies keep every answer (`--log-file`).
    keep_answers: bool,
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
        let i = self.order.next(self.bodies.len());
        self.floor.touch(i);
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
    let mut tally = Tally::new(shared.keep_answers);
    while let Some(body) = shared.take() {
        match one_call(&mut send, &shared, body).await {
            Ok(a) => tally.count(a),
            Err(e) => {
                let fatal = e.is_io() || e.is_go_away();
                tally.error(e.to_string());
                if fatal {
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
        order: match args.zipf {
            Some(s) => Order::Zipf {
                table: ZipfTable::new(bodies.len(), s),
                rng: Box::new(std::sync::Mutex::new(rand::rngs::StdRng::seed_from_u64(
                    args.seed,
                ))),
            },
            None => Order::InTurn(AtomicUsize::new(args.offset % bodies.len())),
        },
        bodies,
        floor: Floor::new(started),
        issued: AtomicU64::new(0),
        max_requests: args.max_requests,
        deadline: started + args.duration,
        stop: AtomicBool::new(false),
        uri,
        keep_answers: args.log_file.is_some(),
    });
    let mut tasks = Vec::new();
    for i in 0..args.concurrency {
        let send = sends[i % sends.len()].clone();
        tasks.push(tokio::spawn(stream_slot(send, shared.clone())));
    }
    let mut tally = Tally::new(shared.keep_answers);
    let drain_until = shared.deadline + DRAIN;
    for t in tasks {
        let left = drain_until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, t).await {
            Ok(Ok(t)) => tally.merge(t)?,
            Ok(Err(e)) => return Err(format!("a stream task failed: {e}")),
            Err(_) => {
                shared.stop.store(true, Ordering::Relaxed);
                tally.error("drain timeout".into());
            }
        }
    }
    let elapsed = started.elapsed();
    // The measured window: from the first request to the last answer.
    let window_s = tally
        .window
        .map(|w| w.last_end_us.saturating_sub(w.first_start_us) as f64 / 1e6)
        .unwrap_or(elapsed.as_secs_f64())
        .max(1e-6);

    if let (Some(path), Some(answers)) = (&args.log_file, &tally.log) {
        let f = std::fs::File::create(path).map_err(|e| format!("{path}: {e}"))?;
        let mut w = std::io::BufWriter::new(f);
        for a in answers {
            writeln!(
                w,
                "{}\t{}\t{}\t{}\t{}",
                a.start_us, a.http, a.latency_us, a.grpc_status, a.overall
            )
            .map_err(|e| format!("{path}: {e}"))?;
        }
        w.flush().map_err(|e| format!("{path}: {e}"))?;
    }

    let by_number = |counts: &BTreeMap<i32, u64>| -> BTreeMap<String, u64> {
        counts.iter().map(|(k, n)| (k.to_string(), *n)).collect()
    };
    let mut overall: BTreeMap<String, u64> = BTreeMap::new();
    for (code, n) in &tally.overall {
        let name = match code {
            0 => "UNKNOWN",
            1 => "OK",
            2 => "OVER_LIMIT",
            _ => "undecoded",
        };
        *overall.entry(name.to_string()).or_default() += n;
    }
    let n = tally.latency_us.len();
    Ok(serde_json::json!({
        "tool": "rls_load",
        "addr": args.addr,
        "frames": args.frames,
        "distinct_bodies": shared.bodies.len(),
        "order": shared.order.describe(args.zipf),
        "connections": args.connections,
        "concurrency": args.concurrency,
        "duration_s": args.duration.as_secs_f64(),
        "window_s": window_s,
        "answers": n,
        "stream_errors": tally.stream_errors,
        "first_error": tally.first_error,
        "req_per_s": n as f64 / window_s,
        "http_status": by_number(&tally.http),
        "grpc_status": by_number(&tally.grpc),
        "overall_code": overall,
        "latency_us": latency::summary(&tally.latency_us),
        "floor": {
            "window_ms": FLOOR_WINDOW_MS as u64,
            "writes": shared.floor.writes(),
        },
    }))
}

fn main() -> ExitCode {
    // Bad flags: clap prints why and the usage, and exits with status 2.
    let args = Args::parse().bounded();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_counts_each_key_once_per_window() {
        let floor = Floor::new(Instant::now());
        for (frame, at_ms) in [
            (7, 0),
            (7, 999),
            (8, 500),
            (7, 1_000),
            (7, 1_999),
            (7, 5_000),
        ] {
            floor.touch_at(frame, at_ms);
        }
        // Key 7 in windows 0, 1 and 5; key 8 in window 0.
        assert_eq!(floor.writes(), 4);
    }

    #[test]
    fn zipf_draws_follow_the_law() {
        let table = ZipfTable::new(100_000, 1.1);
        assert_eq!(table.rank(0.0), 0);
        assert_eq!(table.rank(1.0 - f64::EPSILON), 99_999);
        // Rank 0's share is 1 / H(100000, 1.1), H ≈ 7.41; the first ten carry ≈ 36 %.
        let top = table.cumulative[0];
        assert!((0.13..0.14).contains(&top), "{top}");
        assert!((0.35..0.37).contains(&table.cumulative[9]));
        assert_eq!(table.rank(top - 1e-9), 0);
        assert_eq!(table.rank(top), 1);
    }
}

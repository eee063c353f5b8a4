//! In-process shardgate servers and request builders for the gRPC integration tests.
//!
//! A server is the real stack — `Config::from_yaml` → `MemoryStore` → `Engine` →
//! `RateLimiter` → `grpc::serve` on a loopback listener bound to port 0 — driven over a
//! real HTTP/2 connection by the generated Envoy client. Tests that check arithmetic
//! exactly run it on a [`ManualClock`] that only moves when the test says so.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use shardgate::config::Config;
use shardgate::engine::{
    Clock, Engine, EngineOptions, ManualClock, RandomDraw, SystemClock,
    UNLIMITED_PARTITION_WRITE_BUDGET,
};
use shardgate::server::grpc;
use shardgate::server::port_limits::PortLimits;
use shardgate::service::RateLimiter;
use shardgate::store::memory::MemoryStore;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tonic::transport::Channel;

/// An arbitrary fixed "now" for frozen-clock servers (epoch ms, November 2027).
pub const FROZEN_START_MS: i64 = 1_826_000_000_000;

/// A running in-process server; it stops when dropped.
pub struct TestServer {
    pub addr: SocketAddr,
    pub store: Arc<MemoryStore>,
    pub limiter: Arc<RateLimiter<MemoryStore>>,
    /// Set for frozen-clock servers.
    pub clock: Option<Arc<ManualClock>>,
    shutdown: Option<oneshot::Sender<()>>,
}

/// Engine options as `shardgate serve --store memory` uses them (unlimited partition
/// write budget: one process has no partitions to protect).
pub fn serve_defaults() -> EngineOptions {
    EngineOptions {
        partition_write_budget: UNLIMITED_PARTITION_WRITE_BUDGET,
        ..EngineOptions::default()
    }
}

impl TestServer {
    /// A server on the system clock, configured like `shardgate serve`.
    pub async fn start(yaml: &str) -> TestServer {
        Self::start_with(yaml, serve_defaults(), Arc::new(SystemClock), None).await
    }

    /// A server whose clock stands still at [`FROZEN_START_MS`] until [`Self::advance`].
    pub async fn start_frozen(yaml: &str) -> TestServer {
        let clock = Arc::new(ManualClock::new(FROZEN_START_MS));
        Self::start_with(yaml, serve_defaults(), clock.clone(), Some(clock)).await
    }

    /// A server on the system clock whose gRPC port has `limits`.
    pub async fn start_limited(yaml: &str, limits: PortLimits) -> TestServer {
        let engine = serve_defaults();
        Self::start_on(yaml, engine, Arc::new(SystemClock), None, limits).await
    }

    pub async fn start_with(
        yaml: &str,
        options: EngineOptions,
        clock: Arc<dyn Clock>,
        manual: Option<Arc<ManualClock>>,
    ) -> TestServer {
        Self::start_on(yaml, options, clock, manual, PortLimits::default()).await
    }

    async fn start_on(
        yaml: &str,
        options: EngineOptions,
        clock: Arc<dyn Clock>,
        manual: Option<Arc<ManualClock>>,
        limits: PortLimits,
    ) -> TestServer {
        let config = Config::from_yaml("test.yaml", yaml)
            .unwrap_or_else(|e| panic!("test config must be valid:\n{e}"));
        let store = Arc::new(MemoryStore::new());
        let engine = Arc::new(Engine::with_parts(
            store.clone(),
            options,
            clock,
            Arc::new(RandomDraw),
        ));
        let limiter = Arc::new(RateLimiter::new(Arc::new(config), engine));
        let (addr, shutdown) = serve_limited(limiter.clone(), limits).await;
        TestServer {
            addr,
            store,
            limiter,
            clock: manual,
            shutdown: Some(shutdown),
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn channel(&self) -> Channel {
        // The listener is bound before `serve` is spawned, so the connection is accepted
        // as soon as the server task runs: no readiness wait is needed.
        Channel::from_shared(self.url())
            .expect("valid uri")
            .connect()
            .await
            .expect("connect to the in-process server")
    }

    pub async fn client(&self) -> Rls {
        Rls(RateLimitServiceClient::new(self.channel().await))
    }

    /// Moves a frozen server's clock forward.
    pub fn advance(&self, ms: i64) {
        self.clock
            .as_ref()
            .expect("advance needs a frozen-clock server")
            .advance(ms);
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// Serves `limiter` over gRPC on a loopback port until the sender is dropped or sent to.
async fn serve<S: shardgate::store::BucketStore>(
    limiter: Arc<RateLimiter<S>>,
) -> (SocketAddr, oneshot::Sender<()>) {
    serve_limited(limiter, PortLimits::default()).await
}

/// [`serve`] with the port's `limits`.
async fn serve_limited<S: shardgate::store::BucketStore>(
    limiter: Arc<RateLimiter<S>>,
    limits: PortLimits,
) -> (SocketAddr, oneshot::Sender<()>) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let (tx, rx) = oneshot::channel::<()>();
    let options = grpc::PortOptions {
        limits,
        ..grpc::PortOptions::default()
    };
    tokio::spawn(grpc::serve_with(limiter, listener, options, async {
        let _ = rx.await;
    }));
    (addr, tx)
}

/// A running in-process server on any store (the gRPC surface over `RateLimiter`,
/// engine defaults as `serve` uses them for that store); it stops when dropped.
pub struct StoreServer<S: shardgate::store::BucketStore> {
    pub addr: SocketAddr,
    pub limiter: Arc<RateLimiter<S>>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl<S: shardgate::store::BucketStore> StoreServer<S> {
    pub async fn start(yaml: &str, store: Arc<S>, options: EngineOptions) -> StoreServer<S> {
        let config = Config::from_yaml("test.yaml", yaml)
            .unwrap_or_else(|e| panic!("test config must be valid:\n{e}"));
        let engine = Arc::new(Engine::new(store, options));
        let limiter = Arc::new(RateLimiter::new(Arc::new(config), engine));
        let (addr, shutdown) = serve(limiter.clone()).await;
        StoreServer {
            addr,
            limiter,
            shutdown: Some(shutdown),
        }
    }

    pub async fn client(&self) -> Rls {
        let channel = Channel::from_shared(format!("http://{}", self.addr))
            .expect("valid uri")
            .connect()
            .await
            .expect("connect to the in-process server");
        Rls(RateLimitServiceClient::new(channel))
    }
}

impl<S: shardgate::store::BucketStore> Drop for StoreServer<S> {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }
}

/// A thin client wrapper: every call has a deadline so that a hung server fails the test
/// instead of hanging it.
#[derive(Clone)]
pub struct Rls(pub RateLimitServiceClient<Channel>);

pub const CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

impl Rls {
    pub async fn call(
        &mut self,
        req: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        match tokio::time::timeout(CALL_TIMEOUT, self.0.should_rate_limit(req)).await {
            Ok(r) => r.map(tonic::Response::into_inner),
            Err(_) => panic!("ShouldRateLimit did not answer within {CALL_TIMEOUT:?}"),
        }
    }

    /// A call that must succeed.
    pub async fn ok(&mut self, req: RateLimitRequest) -> RateLimitResponse {
        let resp = self
            .call(req.clone())
            .await
            .unwrap_or_else(|s| panic!("ShouldRateLimit({req:?}) failed: {s:?}"));
        assert_eq!(
            resp.statuses.len(),
            req.descriptors.len(),
            "one status per request descriptor: {resp:?}"
        );
        resp
    }
}

/// Domain `d` with the request shapes of the load benchmark: one bucket (`tenant`), a
/// cascade pair (`tenant` + `api_key`), and `path` and `user` for a three-descriptor
/// request; every limit far above any load, so each steady decision is admitted.
pub const HOT_PATH_YAML: &str = r#"
domain: d
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000000000}
    descriptors:
      - key: api_key
        cascade: true
        rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
"#;

/// A descriptor from `(key, value)` entries.
pub fn desc(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_string(),
                value: (*v).to_string(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A descriptor with its own `hits_addend`.
pub fn desc_hits(entries: &[(&str, &str)], hits: u64) -> RateLimitDescriptor {
    RateLimitDescriptor {
        hits_addend: Some(UInt64Value { value: hits }),
        ..desc(entries)
    }
}

pub fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_string(),
        descriptors,
        hits_addend: 0,
    }
}

/// A one-descriptor request.
pub fn one(domain: &str, entries: &[(&str, &str)]) -> RateLimitRequest {
    request(domain, vec![desc(entries)])
}

pub fn code(c: i32) -> Code {
    Code::try_from(c).unwrap_or_else(|_| panic!("unknown code {c}"))
}

/// `duration_until_reset` in milliseconds (panics if absent).
pub fn reset_ms(s: &DescriptorStatus) -> i64 {
    let d = s
        .duration_until_reset
        .as_ref()
        .unwrap_or_else(|| panic!("status has no duration_until_reset: {s:?}"));
    assert!(
        d.nanos % 1_000_000 == 0 && d.nanos >= 0,
        "durations are whole milliseconds: {d:?}"
    );
    d.seconds * 1_000 + i64::from(d.nanos / 1_000_000)
}

/// The name reported in `current_limit` (panics if there is no limit).
pub fn limit_name(s: &DescriptorStatus) -> &str {
    &s.current_limit
        .as_ref()
        .unwrap_or_else(|| panic!("status has no current_limit: {s:?}"))
        .name
}

/// A log sink for a test's tracing subscriber: what it wrote, to assert on.
#[derive(Clone, Default)]
pub struct LogBuffer(pub Arc<std::sync::Mutex<Vec<u8>>>);

impl LogBuffer {
    /// The lines written since the last call.
    pub fn take(&self) -> String {
        String::from_utf8(std::mem::take(&mut *self.0.lock().unwrap())).unwrap()
    }
}

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogBuffer {
    type Writer = LogBuffer;
    fn make_writer(&'a self) -> LogBuffer {
        self.clone()
    }
}

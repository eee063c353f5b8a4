//! Allocation budget of one steady-state decision on the memory store, through the
//! service layer: counted per thread on a current-thread runtime, so the count is exact
//! and repeatable (unlike timings). Bounds here are regression guards for the hot path.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use common::server::{desc, HOT_PATH_YAML};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use shardgate::config::Config;
use shardgate::engine::{Engine, EngineOptions, LeaseOptions, UNLIMITED_PARTITION_WRITE_BUDGET};
use shardgate::service::wire::RequestView;
use shardgate::service::RateLimiter;
use shardgate::store::memory::MemoryStore;

struct CountingAlloc;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
    /// Heap bytes this thread holds (allocated minus freed).
    static LIVE_BYTES: Cell<isize> = const { Cell::new(0) };
}

fn add_live(bytes: isize) {
    // `try_with`: the allocator also runs while thread locals are torn down.
    let _ = LIVE_BYTES.try_with(|c| c.set(c.get() + bytes));
}

unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        add_live(layout.size() as isize);
        // SAFETY: forwards the caller's contract unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add_live(-(layout.size() as isize));
        // SAFETY: forwards the caller's contract unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        add_live(new_size as isize - layout.size() as isize);
        // SAFETY: forwards the caller's contract unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn live_bytes() -> isize {
    LIVE_BYTES.with(Cell::get)
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

/// Heap bytes one idle bucket (one item of one limit and `wcu`, entity `client=c0000042`)
/// costs in the memory store, made by real decisions: the store's maps grow in steps,
/// so this is measured at two sizes (just after a growth step and just before the next).
///
/// Measured (release): 215 bytes just after a growth step, 133 just before the next (a
/// map slot holds a 32-byte key and a 72-byte compact item; names and parameters are
/// shared). The target is 256 at every size.
#[test]
fn an_idle_bucket_heap_cost_is_bounded() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    for buckets in [60_000usize, 110_000] {
        let config = Config::from_yaml(
            "a.yaml",
            "domain: d\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 100}\n",
        )
        .unwrap();
        let store = Arc::new(MemoryStore::new());
        let engine = Arc::new(Engine::new(
            store.clone(),
            EngineOptions {
                partition_write_budget: UNLIMITED_PARTITION_WRITE_BUDGET,
                // The cache is bounded whatever the bucket count; leave it out.
                rejection_cache_ms: 0,
                ..EngineOptions::default()
            },
        ));
        let limiter = RateLimiter::new(Arc::new(config), engine);
        let request = |i: usize| RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![desc(&[("client", &format!("c{i:07}"))])],
            hits_addend: 0,
        };
        // Warm up whatever is allocated once (runtime, metrics), then count.
        rt.block_on(limiter.should_rate_limit(&request(usize::MAX)))
            .unwrap();
        let before = live_bytes();
        for i in 0..buckets {
            let r = rt.block_on(limiter.should_rate_limit(&request(i))).unwrap();
            assert_eq!(r.overall_code, Code::Ok as i32);
        }
        let per_bucket = (live_bytes() - before) as f64 / buckets as f64;
        assert_eq!(store.len(), buckets + 1);
        eprintln!("{buckets} idle buckets: {per_bucket:.0} heap bytes each");
        assert!(
            per_bucket <= 256.0,
            "{per_bucket:.0} heap bytes per idle bucket at {buckets} buckets"
        );
    }
}

/// The hot path's rules on a fresh memory store, with no write budget to double under, so
/// that repeated calls keep taking the fast path on one shard.
fn hot_path_limiter() -> RateLimiter<MemoryStore> {
    limiter_with(None)
}

/// [`hot_path_limiter`] with leases as given.
fn limiter_with(leases: Option<LeaseOptions>) -> RateLimiter<MemoryStore> {
    let config = Config::from_yaml("a.yaml", HOT_PATH_YAML).unwrap();
    let engine = Arc::new(Engine::new(
        Arc::new(MemoryStore::new()),
        EngineOptions {
            partition_write_budget: UNLIMITED_PARTITION_WRITE_BUDGET,
            leases,
            ..EngineOptions::default()
        },
    ));
    RateLimiter::new(Arc::new(config), engine)
}

/// Allocations of the 10th identical call (the bucket exists, everything is warm).
fn steady_allocations(descriptors: Vec<RateLimitDescriptor>) -> usize {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let limiter = hot_path_limiter();
    let request = RateLimitRequest {
        domain: "d".into(),
        descriptors,
        hits_addend: 0,
    };
    let view = RequestView::from(&request);
    let mut counted = 0;
    for _ in 0..10 {
        let before = allocations();
        // As the gRPC service calls it: the answer is the encoded reply (`should_rate_limit`
        // would add decoding it into prost's message).
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(1);
        let reply = rt
            .block_on(limiter.should_rate_limit_by(&view, deadline))
            .unwrap();
        counted = allocations() - before;
        assert_eq!(reply.overall(), Code::Ok);
        drop(reply);
    }
    counted
}

#[test]
fn allocation_counts() {
    let one = steady_allocations(vec![desc(&[("tenant", "acme")])]);
    let cascade = steady_allocations(vec![desc(&[("tenant", "acme"), ("api_key", "k1")])]);
    let three = steady_allocations(vec![
        desc(&[("tenant", "acme")]),
        desc(&[("path", "/a")]),
        desc(&[("user", "u1")]),
    ]);
    eprintln!("allocations per decision: one={one} cascade={cascade} three={three}");
    // Measured: 0, 0 and 4 in release, 1, 1 and 5 in a debug build (three or more buckets
    // allocate the concurrent join and the engine's answer; the answer is written into an
    // inline buffer, `reply.rs`); before the reply was encoded directly, 1, 1 and 5 in
    // release (the response's statuses); before the engine kept four buckets' draws
    // inline, 8 for three; before inline names and small vectors, 38, 62 and 91.
    assert!(one <= 1, "one descriptor: {one} allocations");
    assert!(cascade <= 1, "cascade pair: {cascade} allocations");
    assert!(three <= 5, "three descriptors: {three} allocations");
}

/// Allocations of `calls` calls each on a bucket never seen before (one descriptor, a
/// distinct `user`), after as many to warm the store's maps up.
fn new_bucket_allocations(limiter: &RateLimiter<MemoryStore>, calls: usize) -> usize {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let requests: Vec<RateLimitRequest> = (0..2 * calls)
        .map(|i| RateLimitRequest {
            domain: "d".into(),
            descriptors: vec![desc(&[("user", &format!("u{i}"))])],
            hits_addend: 0,
        })
        .collect();
    let views: Vec<RequestView<'_>> = requests.iter().map(RequestView::from).collect();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut call = |view: &RequestView<'_>| {
        let reply = rt
            .block_on(limiter.should_rate_limit_by(view, deadline))
            .unwrap();
        assert_eq!(reply.overall(), Code::Ok);
    };
    views[..calls].iter().for_each(&mut call);
    let before = allocations();
    views[calls..].iter().for_each(&mut call);
    allocations() - before
}

/// With leases on, a churn of buckets seen once costs the lease book no allocation: each
/// is only counted in its partition's demand sketch. Over 1,000 calls the leases-on engine
/// may allocate one more per call than the leases-off one (the engine's boxed lease
/// future, `acquire.rs`), no more. The book used to file an entry for every bucket it
/// saw, up to 10,000 (its wake-up channel an allocation each).
#[test]
fn a_churn_of_buckets_costs_the_lease_book_no_allocation() {
    const CALLS: usize = 1_000;
    let without = new_bucket_allocations(&limiter_with(None), CALLS);
    let with = new_bucket_allocations(&limiter_with(Some(LeaseOptions::default())), CALLS);
    eprintln!("allocations over {CALLS} new buckets: leases on {with}, off {without}");
    assert!(
        with <= without + CALLS + CALLS / 20,
        "leases on: {with}, off: {without}"
    );
}

/// Allocations of the 10th identical whole gRPC call through the rate-limit service, as
/// the port hands it a request from the connection: the body's frame read and checked,
/// the message read in place, the decision, the response encoded and framed with its
/// trailers, and the body collected. Only the socket and HTTP/2's own framing are left
/// out.
fn whole_call_allocations(descriptors: Vec<RateLimitDescriptor>) -> usize {
    use http_body_util::BodyExt;
    use prost::Message;
    use tower::Service;

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let limiter = Arc::new(hot_path_limiter());
    let mut service = shardgate::server::rls::Rls::new(limiter);
    let message = RateLimitRequest {
        domain: "d".into(),
        descriptors,
        hits_addend: 0,
    }
    .encode_to_vec();
    let mut frame = vec![0u8];
    frame.extend((message.len() as u32).to_be_bytes());
    frame.extend(message);
    let frame = bytes::Bytes::from(frame);
    let mut counted = 0;
    for _ in 0..10 {
        let request = http::Request::builder()
            .method("POST")
            .uri("/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(tonic::body::Body::new(http_body_util::Full::new(
                frame.clone(),
            )))
            .unwrap();
        let before = allocations();
        let (status, body) = rt.block_on(async {
            let response = service.call(request).await.unwrap();
            let (parts, body) = response.into_parts();
            (parts.status, body.collect().await.unwrap())
        });
        counted = allocations() - before;
        assert_eq!(status, http::StatusCode::OK);
        let trailers = body.trailers().expect("trailers").clone();
        assert_eq!(trailers.get("grpc-status").unwrap(), "0");
        let answer = body.to_bytes();
        let decoded =
            envoy_types::pb::envoy::service::ratelimit::v3::RateLimitResponse::decode(&answer[5..])
                .unwrap();
        assert_eq!(decoded.overall_code, Code::Ok as i32);
    }
    counted
}

/// What prost's generated decoder allocates for the same message (the server read
/// requests with it before `wire.rs`): a `String` per domain, key and value, a `Vec` per
/// list.
fn prost_decode_allocations(descriptors: Vec<RateLimitDescriptor>) -> usize {
    use prost::Message;
    let message = RateLimitRequest {
        domain: "d".into(),
        descriptors,
        hits_addend: 0,
    }
    .encode_to_vec();
    let before = allocations();
    let decoded = RateLimitRequest::decode(&message[..]).unwrap();
    let counted = allocations() - before;
    drop(decoded);
    counted
}

#[test]
fn whole_call_allocation_counts() {
    let one = || vec![desc(&[("tenant", "acme")])];
    let three = || {
        vec![
            desc(&[("tenant", "acme")]),
            desc(&[("path", "/a")]),
            desc(&[("user", "u1")]),
        ]
    };
    let (whole_one, whole_three) = (
        whole_call_allocations(one()),
        whole_call_allocations(three()),
    );
    let (prost_one, prost_three) = (
        prost_decode_allocations(one()),
        prost_decode_allocations(three()),
    );
    eprintln!(
        "allocations per whole call: one={whole_one} three={whole_three}; \
         prost's decode alone would add one={prost_one} three={prost_three}"
    );
    // Measured: 8 and 12 in release and debug builds alike (the call's boxed future, the
    // answer's framed message, its header map and trailers, the collected body; the
    // engine's part, as above; none for reading the request or encoding the answer); 15
    // and 19 while tonic's unary machinery ran the call (its request and metadata map,
    // codec buffers, encoder stream and boxed bodies), 16 and 20 before the answer was
    // encoded directly. prost's decoder adds 5 and 11 on top.
    assert!(whole_one <= 9, "one descriptor: {whole_one} allocations");
    assert!(
        whole_three <= 13,
        "three descriptors: {whole_three} allocations"
    );
    // The whole call costs less than the engine's part plus prost's decode plus tonic's
    // overhead would: reading the request in place allocates nothing, so three descriptors
    // cost only the engine's extra allocations over one.
    let engine_extra = steady_allocations(three()) - steady_allocations(one());
    assert_eq!(
        whole_three - whole_one,
        engine_extra,
        "reading more descriptors allocated"
    );
}

/// A subscriber at the default level (info), as the server runs: the `decision` span is
/// at debug, so it is disabled and costs no allocation over running with no subscriber.
#[test]
fn allocation_counts_with_logging_at_info() {
    let three = || {
        steady_allocations(vec![
            desc(&[("tenant", "acme")]),
            desc(&[("path", "/a")]),
            desc(&[("user", "u1")]),
        ])
    };
    let without = three();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("info")
        .with_writer(std::io::sink)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let with_info = three();
    eprintln!("allocations per decision: {without} without a subscriber, {with_info} at info");
    assert_eq!(with_info, without);
}

/// tonic boxes the future of every call, so its size is allocated and copied per request
/// (docs/architecture.md, "The hot path's shape"). Measured: 3,256 bytes on the memory
/// store and 4,360 on DynamoDB, in debug and release builds alike; before the cold paths
/// and the SDK's calls were boxed, 6,632 and 33,344. Later, in a debug build: 3,392 and
/// 3,664, then 3,544 and 3,816 with the `decision` span and its tally of engine calls;
/// 3,528 and 3,800 with the answer encoded in the future (`reply.rs`) and the traced path
/// boxed apart.
/// The bounds leave room for compiler changes and catch a large future inlined again.
#[tokio::test]
async fn a_decision_future_stays_small() {
    use shardgate::service::metrics::Metrics;
    use shardgate::store::metered::Metered;
    use shardgate::store::BucketStore;

    fn size<S: BucketStore>(store: S) -> usize {
        let metrics = Arc::new(Metrics::new());
        let store = Arc::new(Metered::new(Arc::new(store), metrics.clone()));
        let engine = Arc::new(Engine::new(store, EngineOptions::default()));
        let config = Config::from_yaml("a.yaml", HOT_PATH_YAML).unwrap();
        let limiter = RateLimiter::new(Arc::new(config), engine).with_metrics(metrics);
        let request = RateLimitRequest::default();
        let view = RequestView::from(&request);
        let future = limiter.should_rate_limit_by(&view, tokio::time::Instant::now());
        std::mem::size_of_val(&future)
    }
    let memory = size(MemoryStore::new());
    eprintln!("decision future: memory {memory} bytes");
    assert!(memory <= 6_000, "memory store: {memory} bytes");
    #[cfg(feature = "dynamodb")]
    {
        use shardgate::store::breaker::Breaker;
        use shardgate::store::detached::Detached;
        use shardgate::store::dynamodb::{DynamoOptions, DynamoStore};
        use std::time::Duration;
        // Builds a client only; nothing is sent.
        let dynamo = DynamoStore::connect(&DynamoOptions {
            table: "t".into(),
            namespace: "n".into(),
            endpoint: Some("http://127.0.0.1:9".into()),
            region: Some("us-east-1".into()),
            timeout: Duration::from_millis(10),
        })
        .await;
        // As the server stacks it: every call in a task of its own, behind the breaker.
        let breaker = Breaker::new(dynamo, 5, Duration::from_secs(1));
        let dynamodb = size(Detached::new(Arc::new(breaker)));
        eprintln!("decision future: DynamoDB {dynamodb} bytes");
        assert!(dynamodb <= 8_000, "DynamoDB: {dynamodb} bytes");
    }
}

//! The stores a server runs on, built from its options: the memory store with its
//! sweeper, DynamoDB and Redis behind a circuit breaker and detached calls, each with
//! the engine's options for it and the warm-up readiness waits for. Building only: the
//! serving is `serving.rs`'s.

use std::sync::Arc;
use std::time::Duration;

use super::{ServeError, ServeOptions};
#[cfg(feature = "dynamodb")]
use crate::engine::DEFAULT_PARTITION_WRITE_BUDGET;
use crate::engine::{
    Clock, EngineOptions, LeaseOptions, SystemClock, UNLIMITED_PARTITION_WRITE_BUDGET,
};
use crate::service::metrics::Metrics;
#[cfg(any(feature = "dynamodb", feature = "redis"))]
use crate::store::breaker::Breaker;
#[cfg(any(feature = "dynamodb", feature = "redis"))]
use crate::store::detached::Detached;
#[cfg(feature = "dynamodb")]
use crate::store::dynamodb::{DynamoOptions, DynamoStore};
use crate::store::memory::MemoryStore;
#[cfg(feature = "redis")]
use crate::store::redis::{RedisOptions, RedisStore, DEFAULT_KEY_WRITE_BUDGET};
#[cfg(any(feature = "dynamodb", feature = "redis"))]
use crate::store::BucketStore;

/// How often the memory store drops expired buckets (its bound needs no sweep: it is
/// kept as each item is written).
const EVICTION_INTERVAL: Duration = Duration::from_secs(10);

/// Consecutive store failures that open the circuit, and how long it stays open.
#[cfg(any(feature = "dynamodb", feature = "redis"))]
const BREAKER_THRESHOLD: u32 = 5;
#[cfg(any(feature = "dynamodb", feature = "redis"))]
const BREAKER_COOL_OFF: Duration = Duration::from_millis(500);

#[cfg(feature = "dynamodb")]
/// How long each start-up attempt to reach the store may take (credentials, a first call,
/// connections): far more than a call may take once serving.
const WARM_UP_PATIENCE: Duration = Duration::from_secs(10);

#[cfg(feature = "dynamodb")]
/// Connections opened to DynamoDB before serving (more are opened as calls need them).
const WARM_UP_CONNECTIONS: usize = 8;

/// A future that resolves once the store has answered (the server's warm-up).
pub(super) type WarmUp = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// What differs by store: the store, the engine's options for it, its name in the log,
/// and the warm-up the server waits for before it reports ready (`None`: ready at once).
pub(super) struct StoreSetup<S> {
    pub(super) store: Arc<S>,
    pub(super) engine: EngineOptions,
    pub(super) name: &'static str,
    pub(super) warm_up: Option<WarmUp>,
}

/// The memory store, its stats in the metrics, and the task that sweeps its expired
/// buckets every [`EVICTION_INTERVAL`] (to abort once the server has stopped).
pub(super) fn memory(
    max_bytes: u64,
    options: &ServeOptions,
    metrics: &Metrics,
) -> Result<(StoreSetup<MemoryStore>, tokio::task::JoinHandle<()>), ServeError> {
    let store = Arc::new(MemoryStore::with_max_bytes(max_bytes)?);
    {
        let store = store.clone();
        metrics.attach_memory_store(move || store.stats());
    }
    let budget = options
        .partition_write_budget
        .unwrap_or(UNLIMITED_PARTITION_WRITE_BUDGET);
    let sweeper = {
        let store = store.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(EVICTION_INTERVAL);
            loop {
                tick.tick().await;
                store.evict_expired(SystemClock.now_ms() / 1_000);
            }
        })
    };
    let setup = StoreSetup {
        store,
        engine: engine_options(budget, options.leases.unwrap_or(false)),
        name: "memory",
        warm_up: None,
    };
    Ok((setup, sweeper))
}

/// The DynamoDB table behind a breaker, its capacity and pressure in the metrics; ready
/// once it has answered.
#[cfg(feature = "dynamodb")]
pub(super) async fn dynamodb(
    dynamo: &DynamoOptions,
    options: &ServeOptions,
    metrics: &Metrics,
) -> StoreSetup<Detached<Breaker<DynamoStore>>> {
    let mut dynamo = dynamo.clone();
    dynamo.timeout = options.store_timeout;
    let breaker = Arc::new(Breaker::new(
        DynamoStore::connect(&dynamo).await,
        BREAKER_THRESHOLD,
        BREAKER_COOL_OFF,
    ));
    {
        let store = breaker.clone();
        metrics.attach_capacity(move || store.inner().ledger().totals());
    }
    let shared = SharedStore {
        name: "dynamodb",
        default_budget: DEFAULT_PARTITION_WRITE_BUDGET,
        warm_up: Box::pin(warm_up(breaker.clone())),
    };
    detached(breaker, shared, options, metrics)
}

/// Redis behind a breaker, its pressure and calls per node in the metrics; ready once it
/// has answered.
#[cfg(feature = "redis")]
pub(super) fn redis(
    redis: &RedisOptions,
    options: &ServeOptions,
    metrics: &Metrics,
) -> StoreSetup<Detached<Breaker<RedisStore>>> {
    let mut redis = redis.clone();
    redis.timeout = options.store_timeout;
    let store = RedisStore::new(redis);
    let urls: Vec<_> = store
        .options()
        .urls
        .iter()
        .map(|u| crate::store::redis::redact(u))
        .collect();
    tracing::info!(
        mode = match store.options().mode() {
            crate::store::redis::RedisMode::Single => "single",
            crate::store::redis::RedisMode::Cluster => "cluster",
            crate::store::redis::RedisMode::Sentinel { .. } => "sentinel",
        },
        urls = %urls.join(","),
        namespace = %store.options().namespace,
        "store: Redis"
    );
    let breaker = Arc::new(Breaker::new(store, BREAKER_THRESHOLD, BREAKER_COOL_OFF));
    {
        let store = breaker.clone();
        metrics.attach_redis_nodes(move || store.inner().node_operations());
    }
    let shared = SharedStore {
        name: "redis",
        default_budget: DEFAULT_KEY_WRITE_BUDGET,
        warm_up: Box::pin(redis_warm_up(breaker.clone())),
    };
    detached(breaker, shared, options, metrics)
}

/// What differs between the shared stores once behind their breaker.
#[cfg(any(feature = "dynamodb", feature = "redis"))]
struct SharedStore {
    /// Its name in the log.
    name: &'static str,
    /// The partition write budget unless `--partition-write-budget` says otherwise.
    default_budget: u64,
    /// Resolves once the store has answered.
    warm_up: WarmUp,
}

/// A shared store's setup: each call in a task of its own, so that a caller's deadline
/// never cancels a call mid-way (resolving credentials, opening a connection, loading a
/// script; see `detached.rs`), its pressure in the metrics, leases on unless told
/// otherwise, ready once it has answered.
#[cfg(any(feature = "dynamodb", feature = "redis"))]
fn detached<S: BucketStore>(
    breaker: Arc<Breaker<S>>,
    shared: SharedStore,
    options: &ServeOptions,
    metrics: &Metrics,
) -> StoreSetup<Detached<Breaker<S>>> {
    let store = Arc::new(Detached::new(breaker));
    metrics.attach_pressure(store.pressure().clone());
    let budget = options
        .partition_write_budget
        .unwrap_or(shared.default_budget);
    StoreSetup {
        store,
        engine: engine_options(budget, options.leases.unwrap_or(true)),
        name: shared.name,
        warm_up: Some(shared.warm_up),
    }
}

#[cfg(feature = "dynamodb")]
/// Resolves once DynamoDB has answered a first call (retried until it does, each attempt
/// under [`WARM_UP_PATIENCE`]), then closes the circuit the calls made meanwhile may have
/// opened.
async fn warm_up(store: Arc<Breaker<DynamoStore>>) {
    let (after, attempts) = until_answered(|| {
        let store = store.clone();
        async move {
            let inner = store.inner();
            inner.warm_up(WARM_UP_CONNECTIONS, WARM_UP_PATIENCE).await
        }
    })
    .await;
    store.close();
    tracing::info!(
        ?after,
        attempts,
        connections = WARM_UP_CONNECTIONS,
        "store answered: serving"
    );
}

#[cfg(feature = "redis")]
/// Resolves once Redis has answered a `PING` (the connections opened; retried each second
/// until it does), then closes the circuit the calls made meanwhile may have opened.
async fn redis_warm_up(store: Arc<Breaker<RedisStore>>) {
    let (after, attempts) = until_answered(|| {
        let store = store.clone();
        async move { store.inner().warm_up().await }
    })
    .await;
    store.close();
    tracing::info!(?after, attempts, "store answered: serving");
}

#[cfg(any(feature = "dynamodb", feature = "redis"))]
/// Runs `attempt` each second until it succeeds (each failure logged: health stays
/// `NOT_SERVING` meanwhile); returns how long that took and how many attempts.
async fn until_answered<F, Fut>(attempt: F) -> (Duration, u32)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), crate::store::StoreError>>,
{
    let started = std::time::Instant::now();
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match attempt().await {
            Ok(()) => return (started.elapsed(), attempts),
            Err(e) => {
                tracing::warn!(
                    error = %crate::support::text::with_causes(&e),
                    attempts,
                    "store not answering yet: health NOT_SERVING"
                );
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// The engine's options: `partition_write_budget`, and leases when `leases`.
fn engine_options(partition_write_budget: u64, leases: bool) -> EngineOptions {
    EngineOptions {
        partition_write_budget,
        leases: leases.then(|| LeaseOptions {
            panic_at_fetch: lease_task_panic_wanted(),
            ..LeaseOptions::default()
        }),
        ..EngineOptions::default()
    }
}

/// Whether a test asked the lease task to panic at its first fetch
/// (`SHARDGATE_DEBUG_LEASE_TASK_PANIC=1`), to see its supervision and alert end to end.
/// Debug builds only: a release binary never reads the variable.
fn lease_task_panic_wanted() -> bool {
    cfg!(debug_assertions)
        && std::env::var_os("SHARDGATE_DEBUG_LEASE_TASK_PANIC").is_some_and(|v| v == "1")
}

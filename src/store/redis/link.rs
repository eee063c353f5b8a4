//! Reaching Redis: the connection the options (`options.rs`) make — a few multiplexed
//! connections to one server, to the master Sentinel names, or one Cluster connection that
//! follows `MOVED`/`ASK` and the topology — and what a failed call does to it.
//!
//! Connecting is lazy: a server starts (health `NOT_SERVING`) before its Redis does, as
//! it does before DynamoDB answers. One connect runs at a time; after one fails, the next
//! is tried no sooner than [`RECONNECT_AFTER`] later (doubling while they keep failing, up
//! to [`MAX_RECONNECT_AFTER`]), and the calls meanwhile fail at once with its error: a
//! Redis that is down costs each call nothing but its `failure_mode`, and Redis sees one
//! connect at a time, never one per call. On connecting the server is checked
//! (`server.rs`): its version, and on one server that it is a primary and not a Cluster
//! node.
//!
//! A failover that keeps the address (a managed primary endpoint, a Kubernetes Service,
//! a Sentinel's new master): a write answered `READONLY` — at the top of a reply or inside
//! a batch's (`batch.rs` reports those) — means the connections reach a demoted primary.
//! They are dropped, and the link connects again at once in a task of its own (resolving
//! the address again), not in a request's call; until the address leads to the promoted
//! replica, connecting finds a replica and is refused, and is tried again after the
//! pause above. Under Sentinel every outage does the same (the Sentinels are asked again),
//! and so does the Sentinels naming another master than the one the connections reach
//! (`sentinel.rs` asks them, for the old master that keeps taking writes after a failover).
//! On a Cluster an outage has the slot map read again, and a redirection the Cluster client
//! gave up on (an `ASK` whose `ASKING` another call's command took) is followed
//! (`redirect.rs`). Each keyed call is counted on its node (`nodes.rs`) as it is sent.
//! Nothing here knows the item format.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{
    Cmd, ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisError, RedisResult, ServerErrorKind,
    Value,
};

use super::codec::slot;
use super::failure::{is_demoted, is_this_items};
use super::nodes::NodeOps;
use super::options::{sentinel_client, RedisMode, RedisOptions};
use super::redirect;
use super::scripts::Lua;
use super::sentinel::{self, Named};
use super::server::{self, Role};

/// The pause before connecting again after a connect failed or a failover dropped the
/// connections.
pub(super) const RECONNECT_AFTER: Duration = Duration::from_millis(100);

/// The longest pause between connects while they keep failing.
pub(super) const MAX_RECONNECT_AFTER: Duration = Duration::from_secs(1);

/// The open connections.
enum Open {
    Single {
        pool: Vec<ConnectionManager>,
        next: AtomicUsize,
        /// Under Sentinel, the master as the Sentinels named it when these connected.
        master: Option<Named>,
    },
    Cluster(ClusterConnection),
}

/// The last connect that failed: when, its error, and the pause before the next.
struct Failed {
    at: Instant,
    error: RedisError,
    pause: Duration,
}

/// A lazily opened connection to the configured Redis.
pub(super) struct Link {
    options: RedisOptions,
    open: ArcSwapOption<Open>,
    nodes: Arc<NodeOps>,
    /// One connect at a time; the calls that wait for it use what it opened.
    connecting: tokio::sync::Mutex<()>,
    /// The last connect, when it failed (cleared by one that succeeds).
    /// Poisoning is ignored: a panic while it was held leaves a plain value, still meaningful.
    failed: Mutex<Option<Failed>>,
    /// Whether the task that reconnects after a failover runs.
    reconnecting: AtomicBool,
    /// Whether the Sentinels are watched (`sentinel.rs`; started by the first connect).
    watching: AtomicBool,
    /// Itself, for that task.
    me: Weak<Link>,
}

impl Link {
    pub(super) fn new(options: RedisOptions) -> Arc<Link> {
        Arc::new_cyclic(|me| Link {
            options,
            open: ArcSwapOption::empty(),
            nodes: Arc::new(NodeOps::new()),
            connecting: tokio::sync::Mutex::new(()),
            failed: Mutex::new(None),
            reconnecting: AtomicBool::new(false),
            watching: AtomicBool::new(false),
            me: me.clone(),
        })
    }

    pub(super) fn options(&self) -> &RedisOptions {
        &self.options
    }

    pub(super) fn nodes(&self) -> &NodeOps {
        &self.nodes
    }

    /// The open connections, connecting first when there are none. Connecting is boxed:
    /// its future (TLS, Sentinel, Cluster set-up) is tens of kilobytes, and held inline
    /// it would make every call's future that large — copied on each move, once a call.
    async fn open(&self) -> RedisResult<Arc<Open>> {
        match self.open.load_full() {
            Some(open) => Ok(open),
            None => Box::pin(self.connect_once()).await,
        }
    }

    /// Connects unless another call did meanwhile; fails at once with the last connect's
    /// error while the reconnect task runs or a connect failed too recently.
    async fn connect_once(&self) -> RedisResult<Arc<Open>> {
        let _one = self.connecting.lock().await;
        if let Some(open) = self.open.load_full() {
            return Ok(open);
        }
        let pause = {
            let failed = self.failed.lock().unwrap_or_else(PoisonError::into_inner);
            match &*failed {
                Some(f) if self.reconnecting.load(Ordering::Acquire) => {
                    return Err(f.error.clone())
                }
                Some(f) if f.at.elapsed() < f.pause => return Err(f.error.clone()),
                Some(f) => (f.pause * 2).min(MAX_RECONNECT_AFTER),
                None => RECONNECT_AFTER,
            }
        };
        self.connect_now(pause).await
    }

    /// Connects (the caller holds `connecting`); on failure, the next connect waits
    /// `pause`.
    async fn connect_now(&self, pause: Duration) -> RedisResult<Arc<Open>> {
        match connect(&self.options, &self.nodes).await {
            Ok(open) => {
                let open = Arc::new(open);
                if let Open::Cluster(conn) = &*open {
                    self.nodes.keep_fresh(conn.clone(), Arc::downgrade(&open));
                }
                self.open.store(Some(open.clone()));
                *self.failed.lock().unwrap_or_else(PoisonError::into_inner) = None;
                self.watch_sentinels();
                Ok(open)
            }
            Err(error) => {
                tracing::debug!(%error, ?pause, "Redis connect failed");
                *self.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(Failed {
                    at: Instant::now(),
                    error: error.clone(),
                    pause,
                });
                Err(error)
            }
        }
    }

    /// Drops `failed` (when it is still the open one) and has a task of its own connect
    /// again, at once and then after each pause until it succeeds: no request's call
    /// pays for connecting, and those made meanwhile fail at once.
    fn drop_and_reconnect(&self, failed: &Arc<Open>) {
        let prev = self
            .open
            .compare_and_swap(&Some(failed.clone()), None::<Arc<Open>>);
        if !prev.as_ref().is_some_and(|p| Arc::ptr_eq(p, failed)) {
            return; // Another call dropped it first.
        }
        *self.failed.lock().unwrap_or_else(PoisonError::into_inner) = Some(Failed {
            at: Instant::now(),
            error: RedisError::from((
                ErrorKind::Io,
                "reconnecting",
                "the connections were dropped after a failover".to_string(),
            )),
            pause: RECONNECT_AFTER,
        });
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.reconnecting.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.me.clone();
        runtime.spawn(async move {
            let mut pause = RECONNECT_AFTER;
            loop {
                let Some(link) = me.upgrade() else { return };
                let done = {
                    let _one = link.connecting.lock().await;
                    link.open.load().is_some() || link.connect_now(pause).await.is_ok()
                };
                if done {
                    link.reconnecting.store(false, Ordering::Release);
                    return;
                }
                drop(link);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(MAX_RECONNECT_AFTER);
            }
        });
    }

    /// Under Sentinel, starts the watch of the master the Sentinels name (once).
    fn watch_sentinels(&self) {
        let RedisMode::Sentinel { master } = self.options.mode() else {
            return;
        };
        if self.watching.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let watch = sentinel::watch(
                self.me.clone(),
                self.options.clone(),
                master,
                |link: &Link, named| link.sentinels_name(named),
            );
            runtime.spawn(watch);
        }
    }

    /// The Sentinels name `named` as the master: if the open connections reach another
    /// (a failover they have not seen fail), they are dropped and the link connects to it.
    fn sentinels_name(&self, named: &Named) {
        let Some(open) = self.open.load_full() else {
            return;
        };
        if let Open::Single {
            master: Some(reached),
            ..
        } = &*open
        {
            if reached != named {
                tracing::warn!(
                    from = %reached,
                    to = %named,
                    "the Sentinels name another Redis master: connecting to it"
                );
                self.drop_and_reconnect(&open);
            }
        }
    }

    /// What a failed call on `failed` means for the connections: a demoted primary's
    /// `READONLY` (any mode but Cluster) or, under Sentinel, any outage, drops them and
    /// connects again; on a Cluster an outage has the slot map read again.
    fn after<T>(&self, failed: &Arc<Open>, result: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &result {
            let outage = !is_this_items(e);
            match self.options.mode() {
                RedisMode::Sentinel { .. } if outage => self.drop_and_reconnect(failed),
                RedisMode::Single if is_demoted(e) => self.drop_and_reconnect(failed),
                RedisMode::Cluster if outage => self.nodes.suspect(),
                _ => {}
            }
        }
        result
    }

    /// Runs `call`, a call of `lua` made by [`Lua::call`], on the node that holds its
    /// keys, the first of which is `key`; on `NOSCRIPT`, again with the script's body, on
    /// that node alone (`scripts.rs`).
    pub(super) async fn run(&self, key: &str, lua: &Lua, call: &Cmd) -> RedisResult<Value> {
        self.run_reporting(key, lua, call).await.0
    }

    /// As [`Link::run`], with a handle that [`Link::demoted`] takes when the answer holds
    /// a demoted primary's error inside it (a batch's).
    pub(super) async fn run_reporting(
        &self,
        key: &str,
        lua: &Lua,
        call: &Cmd,
    ) -> (RedisResult<Value>, Option<Served>) {
        let open = match self.open().await {
            Ok(open) => open,
            Err(e) => return (Err(e), None),
        };
        self.nodes.count(|| slot(key));
        let result = Box::pin(open.connection().send(call, Some(lua))).await;
        let result = self.after(&open, result);
        (result, Some(Served(open)))
    }

    /// A demoted primary's error found inside an answer the connections `served` gave:
    /// treated as if the call itself had failed so.
    pub(super) fn demoted(&self, served: &Served) {
        if !matches!(self.options.mode(), RedisMode::Cluster) {
            self.drop_and_reconnect(&served.0);
        }
    }

    /// Runs one command; on the node that holds `key` when it has one (counted there).
    pub(super) async fn query(&self, key: Option<&str>, cmd: &Cmd) -> RedisResult<Value> {
        let open = self.open().await?;
        if let Some(key) = key {
            self.nodes.count(|| slot(key));
        }
        let result = Box::pin(open.connection().send(cmd, None)).await;
        self.after(&open, result)
    }
}

/// The connections that answered a call (see [`Link::demoted`]).
pub(super) struct Served(Arc<Open>);

/// A handle on one of the open connections (cheap to clone: each multiplexes).
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Connection {
    async fn query(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        match self {
            Connection::Single(conn) => cmd.query_async(conn).await,
            Connection::Cluster(conn) => cmd.query_async(conn).await,
        }
    }

    /// `cmd`, a call of `lua` when it is a script: on `NOSCRIPT`, again with the script's
    /// body, to the same key (`scripts.rs`); on a Cluster, a redirection the client gave up
    /// on is followed (`redirect.rs`).
    async fn send(&mut self, cmd: &Cmd, lua: Option<&Lua>) -> RedisResult<Value> {
        let mut result = self.query(cmd).await;
        if let (Err(e), Some(lua)) = (&result, lua) {
            if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) {
                result = self.query(&lua.with_body(cmd)).await;
            }
        }
        match (result, self) {
            (Err(e), Connection::Cluster(conn)) if redirect::is_redirect(&e) => {
                redirect::follow(conn, cmd, lua, e).await
            }
            (result, _) => result,
        }
    }
}

impl Open {
    /// The next connection of the pool, or the Cluster's.
    #[expect(
        clippy::indexing_slicing,
        reason = "reduced modulo the pool's length; `pool()` opens at least one connection"
    )]
    fn connection(&self) -> Connection {
        match self {
            Open::Single { pool, next, .. } => {
                Connection::Single(pool[next.fetch_add(1, Ordering::Relaxed) % pool.len()].clone())
            }
            Open::Cluster(conn) => Connection::Cluster(conn.clone()),
        }
    }
}

/// A few multiplexed connections to the server `client` names, once it is found to be a
/// primary the scripts run on; `master`: the Sentinels' name for it.
async fn pool(
    client: redis::Client,
    options: &RedisOptions,
    master: Option<Named>,
) -> RedisResult<Open> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.timeout))
        .set_response_timeout(Some(options.timeout))
        // Reconnection is tried by the next call; never a long wait inside one.
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(100));
    let at = client.get_connection_info().addr().to_string();
    let mut first = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
    let found = server::check(&mut first, &at, Role::Primary).await?;
    if let Some(server) = found.first() {
        tracing::info!(node = %at, %server, "connected to Redis");
    }
    let mut pool = Vec::with_capacity(options.pool_size);
    pool.push(first);
    while pool.len() < options.pool_size {
        pool.push(ConnectionManager::new_with_config(client.clone(), config.clone()).await?);
    }
    Ok(Open::Single {
        pool,
        next: AtomicUsize::new(0),
        master,
    })
}

/// The master the Sentinels name for `master`: a client for it, and its address as they
/// gave it.
async fn sentinels_master(
    options: &RedisOptions,
    master: &str,
    certs: Option<redis::TlsCertificates>,
) -> RedisResult<(redis::Client, Option<Named>)> {
    let mut sentinels = sentinel_client(options, master, certs)?;
    let client = tokio::time::timeout(options.timeout, sentinels.async_get_client())
        .await
        .map_err(|_| {
            RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no Sentinel named the master in time",
            ))
        })?
        // Whether a Sentinel or the master it named failed (a certificate, a password),
        // the operator reads it as this lookup's: say so. An outage either way, never
        // one item's.
        .map_err(|e| {
            RedisError::from(std::io::Error::other(format!(
                "Sentinel lookup of master '{master}': {e}"
            )))
        })?;
    let named = match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            Some(Named {
                host: host.clone(),
                port: *port,
            })
        }
        _ => None,
    };
    Ok((client, named))
}

async fn connect(options: &RedisOptions, nodes: &NodeOps) -> RedisResult<Open> {
    let certs = options.certificates().map_err(|e| {
        RedisError::from((redis::ErrorKind::InvalidClientConfig, "TLS", e.to_string()))
    })?;
    match options.mode() {
        RedisMode::Single => {
            let url = options.urls.first().map(String::as_str).unwrap_or_default();
            let mut info = url.into_connection_info()?;
            if options.tls.skip_hostname_verification {
                let mut addr = info.addr().clone();
                addr.set_danger_accept_invalid_hostnames(true);
                info = info.set_addr(addr);
            }
            let client = match certs {
                Some(certs) => redis::Client::build_with_tls(info, certs)?,
                None => redis::Client::open(info)?,
            };
            let open = pool(client.clone(), options, None).await?;
            nodes.one_node(&client.get_connection_info().addr().to_string());
            Ok(open)
        }
        RedisMode::Sentinel { master } => {
            let (client, named) = sentinels_master(options, &master, certs).await?;
            let open = pool(client.clone(), options, named).await?;
            // The master as the Sentinels named it: after a failover, the promoted one.
            nodes.one_node(&client.get_connection_info().addr().to_string());
            Ok(open)
        }
        RedisMode::Cluster => {
            let mut builder = ClusterClientBuilder::new(options.urls.clone())
                .connection_timeout(options.timeout)
                .response_timeout(options.timeout)
                // Redirections and a failover's TRYAGAIN are retried, briefly: the
                // caller's deadline bounds the whole call anyway. A script sent again
                // after a lost connection may run twice: every script that gives
                // tokens back carries an operation id, and a second run answers as the
                // first (`lua/lib.lua`, `once`); a debit run twice takes twice, which
                // admits less, never more.
                .retries(3)
                .min_retry_wait(10)
                .max_retry_wait(100);
            if let Some(certs) = certs {
                builder = builder.certs(certs);
            }
            if options.tls.skip_hostname_verification {
                builder = builder.danger_accept_invalid_hostnames(true);
            }
            let mut conn = builder.build()?.get_async_connection().await?;
            let found = server::check(&mut conn, "the Cluster", Role::ClusterMaster).await?;
            if !found.is_empty() {
                let list: Vec<String> = found.iter().map(ToString::to_string).collect();
                tracing::info!(masters = %list.join(", "), "connected to the Redis Cluster");
            }
            // The slot map before the first call is counted; if it cannot be read now,
            // the refresher reads it at once (`suspect`) and calls count as `other`
            // meanwhile.
            if let Err(e) = nodes.refresh(&mut conn).await {
                tracing::debug!(error = %e, "Redis Cluster slot map not read");
                nodes.suspect();
            }
            Ok(Open::Cluster(conn))
        }
    }
}

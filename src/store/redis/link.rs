//! Reaching Redis: the options an operator gives (URLs, mode, TLS, pool, timeouts) and the
//! connection they make — a few multiplexed connections to one server, to the master
//! Sentinel names, or one Cluster connection that follows `MOVED`/`ASK` and the topology.
//! Connecting is lazy and retried by the call that needs it, so a server starts (health
//! `NOT_SERVING`) before its Redis does, as it does before DynamoDB answers. Under
//! Sentinel a call that fails as an outage drops the connections, and the next call asks
//! the Sentinels for the master again: after a failover it finds the promoted replica.
//! Sentinels reached over TLS (`rediss://`) mean the master is reached over TLS too, with
//! the same CA and client certificate: a deployment that encrypts one encrypts both.
//! Each keyed call is counted on its node (`nodes.rs`) as it is sent. Nothing here knows
//! the item format.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    ClientTlsConfig, ConnectionAddr, IntoConnectionInfo, RedisError, RedisResult, ScriptInvocation,
    TlsCertificates, TlsMode, Value,
};
use std::sync::Arc;
use thiserror::Error;

use super::codec::slot;
use super::nodes::NodeOps;

/// How the URLs are to be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedisMode {
    /// One server (a primary; `redis://`, `rediss://` or `unix://`).
    Single,
    /// A Redis Cluster: the URLs are seed nodes, the topology is discovered.
    Cluster,
    /// A primary watched by Sentinels: the URLs are the Sentinels', which name the
    /// master of this name.
    Sentinel { master: String },
}

/// TLS beyond what a `rediss://` URL says: the CA that signed the server's certificate,
/// and a client certificate when the server asks for one.
#[derive(Debug, Clone, Default)]
pub struct RedisTls {
    /// PEM CA bundle (else the system's roots).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate and key, both or neither.
    pub client_cert: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
    /// Accept a certificate whose name is not the host's (Cluster: node addresses are
    /// IPs its certificates seldom name).
    pub skip_hostname_verification: bool,
}

/// Where Redis is and how to reach it.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// `redis://[user:password@]host:port[/db]`, `rediss://…` (TLS) or `unix:///path`; for
    /// a Cluster, one or more seed nodes.
    pub urls: Vec<String>,
    /// `None`: a Cluster when several URLs are given, else one server.
    pub mode: Option<RedisMode>,
    /// Prefix of every key, so several deployments can share a Redis.
    pub namespace: String,
    /// Deadline of one store call (connecting included).
    pub timeout: Duration,
    /// Multiplexed connections to one server (each pipelines every call sent on it).
    pub pool_size: usize,
    pub tls: RedisTls,
    /// Under Sentinel, the master's own `user:password` or `password` (the Sentinels'
    /// are in their URLs).
    pub master_auth: Option<String>,
}

/// The Sentinels as [`RedisOptions::sentinels`] reads them.
struct Sentinels {
    addrs: Vec<ConnectionAddr>,
    user: Option<String>,
    password: Option<String>,
    tls: bool,
}

/// Connections kept to one server by default: two carry a 2-core server's load
/// (each pipelines), a few more spread a busier one over Redis's I/O threads.
pub const DEFAULT_POOL_SIZE: usize = 4;

/// What is wrong with the options (reported at start-up, before serving).
#[derive(Debug, Error)]
pub enum RedisConfigError {
    #[error("no Redis URL given (--redis-url)")]
    NoUrl,
    #[error("Redis URL '{url}': {reason}")]
    Url { url: String, reason: String },
    #[error("Redis TLS file {path}: {reason}")]
    TlsFile { path: String, reason: String },
    #[error("--redis-tls-client-cert and --redis-tls-client-key go together")]
    HalfClientCert,
    #[error("--redis-pool-size must be at least 1")]
    NoPool,
    #[error("--redis-mode sentinel needs the master's name (--redis-sentinel-master)")]
    NoSentinelMaster,
    #[error("--redis-mode sentinel: the Sentinels' URLs must be all rediss:// (TLS to the Sentinels and the master) or none")]
    MixedSentinelTls,
    #[error("--redis-mode sentinel: the Sentinels' URLs must carry the same user and password")]
    MixedSentinelAuth,
    #[error("--redis-tls-skip-hostname-verification cannot apply to the master a Sentinel names (its certificate must name the address the Sentinels give); drop it")]
    SentinelSkipHostname,
}

impl RedisOptions {
    pub fn mode(&self) -> RedisMode {
        self.mode.clone().unwrap_or(if self.urls.len() > 1 {
            RedisMode::Cluster
        } else {
            RedisMode::Single
        })
    }

    /// Checks what can be checked without connecting: each URL parses, the TLS files
    /// read, the pool is not empty.
    pub fn validate(&self) -> Result<(), RedisConfigError> {
        self.certificates().map(|_| ())?;
        if self.pool_size == 0 {
            return Err(RedisConfigError::NoPool);
        }
        if self.urls.is_empty() {
            return Err(RedisConfigError::NoUrl);
        }
        if self.mode()
            == (RedisMode::Sentinel {
                master: String::new(),
            })
        {
            return Err(RedisConfigError::NoSentinelMaster);
        }
        for url in &self.urls {
            redis::Client::open(url.as_str()).map_err(|e| RedisConfigError::Url {
                url: redact(url),
                reason: e.to_string(),
            })?;
        }
        if let RedisMode::Sentinel { .. } = self.mode() {
            self.sentinels()?;
        }
        Ok(())
    }

    /// Under Sentinel: the Sentinels' addresses, their one user and password, and whether
    /// they (and so the master) are reached over TLS. redis-rs's Sentinel client takes one
    /// set of credentials for all Sentinels, so URLs that disagree are refused rather than
    /// some of them silently sent another's password.
    fn sentinels(&self) -> Result<Sentinels, RedisConfigError> {
        let mut addrs = Vec::with_capacity(self.urls.len());
        let mut auth = None;
        for url in &self.urls {
            let info = url
                .as_str()
                .into_connection_info()
                .map_err(|e| RedisConfigError::Url {
                    url: redact(url),
                    reason: e.to_string(),
                })?;
            let settings = info.redis_settings();
            let this = (
                settings.username().map(str::to_string),
                settings.password().map(str::to_string),
            );
            if auth.get_or_insert_with(|| this.clone()) != &this {
                return Err(RedisConfigError::MixedSentinelAuth);
            }
            addrs.push(info.addr().clone());
        }
        let tls = addrs
            .iter()
            .filter(|a| matches!(a, ConnectionAddr::TcpTls { .. }))
            .count();
        if tls != 0 && tls != addrs.len() {
            return Err(RedisConfigError::MixedSentinelTls);
        }
        let tls = tls != 0;
        if tls && self.tls.skip_hostname_verification {
            // redis-rs builds the master's address itself from what the Sentinels say,
            // with no way to skip only the name check (its one switch also drops the
            // CA check): refused rather than silently not honoured.
            return Err(RedisConfigError::SentinelSkipHostname);
        }
        let (user, password) = auth.unwrap_or_default();
        Ok(Sentinels {
            addrs,
            user,
            password,
            tls,
        })
    }

    fn certificates(&self) -> Result<Option<TlsCertificates>, RedisConfigError> {
        let read = |p: &PathBuf| {
            std::fs::read(p).map_err(|e| RedisConfigError::TlsFile {
                path: p.display().to_string(),
                reason: e.to_string(),
            })
        };
        let client_tls = match (&self.tls.client_cert, &self.tls.client_key) {
            (Some(cert), Some(key)) => Some(ClientTlsConfig {
                client_cert: read(cert)?,
                client_key: read(key)?,
            }),
            (None, None) => None,
            _ => return Err(RedisConfigError::HalfClientCert),
        };
        let root_cert = self.tls.ca_file.as_ref().map(read).transpose()?;
        Ok(
            (client_tls.is_some() || root_cert.is_some()).then_some(TlsCertificates {
                client_tls,
                root_cert,
            }),
        )
    }
}

/// A URL with its password replaced, for messages and logs.
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_string(),
    }
}

/// The open connections.
enum Open {
    Single {
        pool: Vec<ConnectionManager>,
        next: AtomicUsize,
    },
    Cluster(ClusterConnection),
}

/// A lazily opened connection to the configured Redis.
pub(super) struct Link {
    options: RedisOptions,
    open: ArcSwapOption<Open>,
    nodes: Arc<NodeOps>,
    /// One call connects at a time; the others wait for it and use what it opened.
    connecting: tokio::sync::Mutex<()>,
}

impl Link {
    pub(super) fn new(options: RedisOptions) -> Link {
        Link {
            options,
            open: ArcSwapOption::empty(),
            nodes: Arc::new(NodeOps::new()),
            connecting: tokio::sync::Mutex::new(()),
        }
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

    /// Connects unless another call did meanwhile.
    async fn connect_once(&self) -> RedisResult<Arc<Open>> {
        let _one = self.connecting.lock().await;
        if let Some(open) = self.open.load_full() {
            return Ok(open);
        }
        let open = Arc::new(connect(&self.options, &self.nodes).await?);
        if let Open::Cluster(conn) = &*open {
            self.nodes.keep_fresh(conn.clone(), Arc::downgrade(&open));
        }
        self.open.store(Some(open.clone()));
        Ok(open)
    }

    /// Under Sentinel, drops `failed` after an outage so that the next call asks the
    /// Sentinels again (a failover moved the master, or it is down); on a Cluster, has
    /// the slot map read again (the topology may have moved).
    fn after<T>(&self, failed: &Arc<Open>, result: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &result {
            let outage = !super::failure::is_this_items(e);
            match self.options.mode() {
                RedisMode::Sentinel { .. } if outage => {
                    self.open
                        .compare_and_swap(&Some(failed.clone()), None::<Arc<Open>>);
                }
                RedisMode::Cluster if outage => self.nodes.suspect(),
                _ => {}
            }
        }
        result
    }

    /// Runs a script (`EVALSHA`, loading it on `NOSCRIPT`) on the node that holds its
    /// keys, the first of which is `key`.
    pub(super) async fn run(
        &self,
        key: &str,
        invocation: &ScriptInvocation<'_>,
    ) -> RedisResult<Value> {
        let open = self.open().await?;
        self.nodes.count(|| slot(key));
        let result = match open.connection() {
            Connection::Single(mut conn) => Box::pin(invocation.invoke_async(&mut conn)).await,
            Connection::Cluster(mut conn) => Box::pin(invocation.invoke_async(&mut conn)).await,
        };
        self.after(&open, result)
    }

    /// Runs one command; on the node that holds `key` when it has one (counted there).
    pub(super) async fn query(&self, key: Option<&str>, cmd: &redis::Cmd) -> RedisResult<Value> {
        let open = self.open().await?;
        if let Some(key) = key {
            self.nodes.count(|| slot(key));
        }
        let result = match open.connection() {
            Connection::Single(mut conn) => cmd.query_async(&mut conn).await,
            Connection::Cluster(mut conn) => cmd.query_async(&mut conn).await,
        };
        self.after(&open, result)
    }
}

/// A handle on one of the open connections (cheap to clone: each multiplexes).
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Open {
    /// The next connection of the pool, or the Cluster's.
    fn connection(&self) -> Connection {
        match self {
            Open::Single { pool, next } => {
                Connection::Single(pool[next.fetch_add(1, Ordering::Relaxed) % pool.len()].clone())
            }
            Open::Cluster(conn) => Connection::Cluster(conn.clone()),
        }
    }
}

/// A few multiplexed connections to the server `client` names.
async fn pool(client: redis::Client, options: &RedisOptions) -> RedisResult<Open> {
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.timeout))
        .set_response_timeout(Some(options.timeout))
        // Reconnection is tried by the next call; never a long wait inside one.
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(100));
    let mut pool = Vec::with_capacity(options.pool_size);
    for _ in 0..options.pool_size.max(1) {
        pool.push(ConnectionManager::new_with_config(client.clone(), config.clone()).await?);
    }
    Ok(Open::Single {
        pool,
        next: AtomicUsize::new(0),
    })
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
            let open = pool(client.clone(), options).await?;
            nodes.one_node(&client.get_connection_info().addr().to_string());
            Ok(open)
        }
        RedisMode::Sentinel { master } => {
            let mut sentinels = sentinel_client(options, &master, certs)?;
            let client = tokio::time::timeout(options.timeout, sentinels.async_get_client())
                .await
                .map_err(|_| {
                    RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "no Sentinel named the master in time",
                    ))
                })?
                // Whether a Sentinel or the master it named failed (a certificate, a
                // password), the operator reads it as this lookup's: say so. An outage
                // either way, never one item's.
                .map_err(|e| {
                    RedisError::from(std::io::Error::other(format!(
                        "Sentinel lookup of master '{master}': {e}"
                    )))
                })?;
            let open = pool(client.clone(), options).await?;
            // The master as the Sentinels named it: after a failover, the promoted one.
            nodes.one_node(&client.get_connection_info().addr().to_string());
            Ok(open)
        }
        RedisMode::Cluster => {
            let mut builder = ClusterClientBuilder::new(options.urls.clone())
                .connection_timeout(options.timeout)
                .response_timeout(options.timeout)
                // Redirections and a failover's TRYAGAIN are retried, briefly: the
                // caller's deadline bounds the whole call anyway.
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

/// The client that asks the Sentinels for `master` and connects to it: with the
/// Sentinels' credentials, the master's (`master_auth`), and over TLS to both when the
/// Sentinels' URLs are `rediss://`.
fn sentinel_client(
    options: &RedisOptions,
    master: &str,
    certs: Option<TlsCertificates>,
) -> RedisResult<SentinelClient> {
    let sentinels = options.sentinels().map_err(|e| {
        RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "Sentinel",
            e.to_string(),
        ))
    })?;
    let mut builder =
        SentinelClientBuilder::new(sentinels.addrs, master, SentinelServerType::Master)?;
    if let Some(user) = &sentinels.user {
        builder = builder.set_client_to_sentinel_username(user);
    }
    if let Some(password) = &sentinels.password {
        builder = builder.set_client_to_sentinel_password(password);
    }
    if let Some(auth) = &options.master_auth {
        match auth.split_once(':') {
            Some((user, pass)) => {
                if !user.is_empty() {
                    builder = builder.set_client_to_redis_username(user);
                }
                builder = builder.set_client_to_redis_password(pass);
            }
            None => builder = builder.set_client_to_redis_password(auth),
        }
    }
    if sentinels.tls {
        // `Secure`: the chain and the name are checked, against the CA given (else the
        // system's roots); the name is the address the Sentinels report for the master.
        builder = builder.set_client_to_redis_tls_mode(TlsMode::Secure);
        if let Some(certs) = certs {
            builder = builder
                .set_client_to_sentinel_certificates(certs.clone())
                .set_client_to_redis_certificates(certs);
        }
    }
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sentinel(urls: &[&str]) -> RedisOptions {
        RedisOptions {
            urls: urls.iter().map(|u| u.to_string()).collect(),
            mode: Some(RedisMode::Sentinel {
                master: "mymaster".into(),
            }),
            namespace: "t".into(),
            timeout: Duration::from_secs(1),
            pool_size: 1,
            tls: RedisTls::default(),
            master_auth: None,
        }
    }

    #[test]
    fn sentinels_over_tls_are_all_rediss_with_one_password() {
        let o = sentinel(&["rediss://:pw@s1:26379", "rediss://:pw@s2:26379"]);
        o.validate().unwrap();
        let s = o.sentinels().unwrap();
        assert!(s.tls);
        assert_eq!(s.password.as_deref(), Some("pw"));
        assert!(!sentinel(&["redis://s1:26379"]).sentinels().unwrap().tls);
        assert!(matches!(
            sentinel(&["rediss://s1:26379", "redis://s2:26379"]).validate(),
            Err(RedisConfigError::MixedSentinelTls)
        ));
        assert!(matches!(
            sentinel(&["redis://:a@s1:26379", "redis://:b@s2:26379"]).validate(),
            Err(RedisConfigError::MixedSentinelAuth)
        ));
    }

    #[test]
    fn skipping_the_name_check_is_refused_for_a_master_named_over_tls() {
        let mut o = sentinel(&["rediss://s1:26379"]);
        o.tls.skip_hostname_verification = true;
        let err = o.validate().unwrap_err();
        assert!(matches!(err, RedisConfigError::SentinelSkipHostname));
        assert!(err.to_string().len() < 200, "{err}");
        // Without TLS there is no name to check: nothing to refuse.
        let mut o = sentinel(&["redis://s1:26379"]);
        o.tls.skip_hostname_verification = true;
        o.validate().unwrap();
    }
}

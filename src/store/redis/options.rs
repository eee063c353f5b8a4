//! What an operator gives to reach Redis (URLs, mode, TLS, pool, timeouts), checked
//! before anything connects, and the Sentinel client those options make. Under Sentinel
//! with `rediss://` Sentinels the master is reached over TLS too, with the same CA and
//! client certificate: a deployment that encrypts one encrypts both. Must not: connect
//! (`link.rs` does) or know the item format.

use std::path::PathBuf;
use std::time::Duration;

use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    ClientTlsConfig, ConnectionAddr, IntoConnectionInfo, RedisError, RedisResult, TlsCertificates,
    TlsMode,
};
use thiserror::Error;

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
    /// Allow a `rediss://…#insecure` URL, which turns off every check of the server's
    /// certificate (chain and name): refused without this explicit switch, since the
    /// fragment is easy to carry over from a test setup unnoticed.
    pub allow_insecure: bool,
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
    #[error("Redis URL '{url}': '#insecure' turns off every check of the server's certificate; give its CA (--redis-tls-ca), or say so with --redis-tls-allow-insecure")]
    Insecure { url: String },
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
            let insecure = url::Url::parse(url).is_ok_and(|u| u.fragment() == Some("insecure"));
            if insecure && !self.tls.allow_insecure {
                return Err(RedisConfigError::Insecure { url: redact(url) });
            }
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

    pub(super) fn certificates(&self) -> Result<Option<TlsCertificates>, RedisConfigError> {
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

pub(super) fn sentinel_client(
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
    fn an_insecure_url_needs_its_own_switch() {
        let mut o = sentinel(&["rediss://:pw@redis:6379#insecure"]);
        o.mode = Some(RedisMode::Single);
        let err = o.validate().unwrap_err();
        assert!(matches!(err, RedisConfigError::Insecure { .. }), "{err}");
        assert!(!err.to_string().contains("pw"), "{err}");
        assert!(
            err.to_string().contains("--redis-tls-allow-insecure"),
            "{err}"
        );
        o.tls.allow_insecure = true;
        o.validate().unwrap();
        o.urls = vec!["rediss://redis:6379".into()];
        o.tls.allow_insecure = false;
        o.validate().unwrap();
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

//! Under Sentinel: a watch on the master the Sentinels name, so that the connections
//! follow a failover even when the master they reach never fails a call.
//!
//! Why a watch: Sentinel promotes the replica first and demotes the old master only once
//! it hears from it again and a grace period has passed (about 11 s after
//! `SENTINEL FAILOVER` on Redis 7.0, measured: the switch came 0.7 s after the promotion,
//! the demotion 10 s after that). Until then the old master takes every write as before,
//! so the connections to it see nothing wrong — and every debit they make there is lost
//! when it resyncs from the new master, whose buckets never saw it: those tokens are
//! admitted twice. So every [`WATCH_INTERVAL`] the store asks a Sentinel which master it
//! names (`SENTINEL get-master-addr-by-name`, on a connection kept for it), and when that
//! is not the server the connections reach, `link.rs` drops them and connects again.
//! What remains is Sentinel's own window, from the promotion to the switch, plus one
//! interval: asynchronous replication, which no client of Sentinel closes.
//!
//! Asked rather than subscribed (`+switch-master`): a question every interval needs no
//! resubscription after a lost connection and misses no message; it costs each server
//! two small commands a second on one Sentinel.
//!
//! Owns: the watch's connection to a Sentinel and its question. Must not: connect to the
//! master, or decide what a new master means for the connections (`link.rs` does, told
//! through a callback: this file knows nothing of the link).

use std::sync::Weak;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, RedisResult};

use super::options::{sentinel_client, RedisOptions};

/// How often the Sentinels are asked which master they name.
pub(super) const WATCH_INTERVAL: Duration = Duration::from_millis(500);

/// A master as the Sentinels name it: the address they report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Named {
    pub(super) host: String,
    pub(super) port: u16,
}

impl std::fmt::Display for Named {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// Asks the Sentinels of `options` which master they name for `master`, every
/// [`WATCH_INTERVAL`], and tells `owner` by `tell`, until `owner` is dropped.
pub(super) async fn watch<T>(
    owner: Weak<T>,
    options: RedisOptions,
    master: String,
    tell: impl Fn(&T, &Named),
) {
    let mut asking: Option<MultiplexedConnection> = None;
    loop {
        tokio::time::sleep(WATCH_INTERVAL).await;
        let Some(owner) = owner.upgrade() else { return };
        match named(&options, &master, &mut asking).await {
            Ok(Some(named)) => tell(&owner, &named),
            // No Sentinel knows the master: the connections' own failures will say so.
            Ok(None) => {}
            Err(error) => {
                tracing::debug!(%error, "Sentinel not asked which master it names");
                asking = None;
            }
        }
    }
}

/// The master a Sentinel names for `master`, over `asking` (connected first if need be).
async fn named(
    options: &RedisOptions,
    master: &str,
    asking: &mut Option<MultiplexedConnection>,
) -> RedisResult<Option<Named>> {
    let conn = match asking {
        Some(conn) => conn,
        None => {
            let certs = options.certificates().map_err(|e| {
                RedisError::from((ErrorKind::InvalidClientConfig, "TLS", e.to_string()))
            })?;
            let mut sentinels = sentinel_client(options, master, certs)?;
            let client =
                tokio::time::timeout(options.timeout, sentinels.async_get_sentinel_client())
                    .await
                    .map_err(|_| {
                        RedisError::from(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "no Sentinel answered in time",
                        ))
                    })??;
            let config = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(options.timeout))
                .set_response_timeout(Some(options.timeout));
            asking.insert(
                client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?,
            )
        }
    };
    let named: Option<(String, u16)> = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(master)
        .query_async(conn)
        .await?;
    Ok(named.map(|(host, port)| Named { host, port }))
}

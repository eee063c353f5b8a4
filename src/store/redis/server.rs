//! Which server the store reached, read once per connection (`INFO`), and whether its
//! scripts can run there (and, given one server's URL, whether it is a primary). They need Redis 6.0 or later (the oldest release tested:
//! `scripts/test` runs the store's conformance suite on 6.0.9, Debian's 7.0 and Valkey 9)
//! or any Valkey (its first release is 7.2); the scripts use nothing newer (the one
//! command of 7.0 they used, `PEXPIRETIME`, is `PTTL` arithmetic now). A server older
//! than that is refused when the store connects, with a message naming its version and
//! what is needed: the connection fails as an outage (health `NOT_SERVING`, each call its
//! rule's `failure_mode`, a warning each second while the server waits for its store),
//! never a store that answers its first calls and then fails every update.
//!
//! Owns: reading the version and judging it. Must not: connect (`link.rs` does) or know
//! the item format.

use redis::{ErrorKind, RedisError, RedisResult, Value};

/// The oldest Redis the scripts run on.
const MIN_REDIS: Version = Version(6, 0, 0);

/// A release number, `major.minor.patch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Version(pub u32, pub u32, pub u32);

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", self.0, self.1, self.2)
    }
}

impl Version {
    /// `6.0.9`, `7.2.4`, … (a missing part is 0; anything else is not a version).
    fn parse(text: &str) -> Option<Version> {
        let mut parts = text.trim().split('.').map(|p| p.parse::<u32>().ok());
        let major = parts.next()??;
        let minor = parts.next().unwrap_or(Some(0))?;
        let patch = parts.next().unwrap_or(Some(0))?;
        Some(Version(major, minor, patch))
    }
}

/// The server a connection reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Server {
    /// `Valkey` or `Redis` (what KeyDB and other compatible servers say they are).
    pub(super) product: &'static str,
    pub(super) version: Version,
}

impl std::fmt::Display for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.product, self.version)
    }
}

/// The server an `INFO server` answer describes (`None`: it names no version).
pub(super) fn parse(info: &str) -> Option<Server> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim_end().strip_prefix(name)?.strip_prefix(':'))
    };
    if let Some(v) = field("valkey_version") {
        return Some(Server {
            product: "Valkey",
            version: Version::parse(v)?,
        });
    }
    Some(Server {
        product: "Redis",
        version: Version::parse(field("redis_version")?)?,
    })
}

/// Whether the scripts run on `server`: the refusal's text when they do not.
pub(super) fn judge(server: &Server) -> Result<(), String> {
    if server.product == "Valkey" || server.version >= MIN_REDIS {
        return Ok(());
    }
    Err(format!(
        "{server} is too old for shardgate's scripts: they need Redis {}.{} or later, or Valkey 7.2 or later",
        MIN_REDIS.0, MIN_REDIS.1
    ))
}

/// What the store needs the server it connects to to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    /// One server (or the master a Sentinel names): a primary, not a Cluster node.
    Primary,
    /// A Cluster's masters, reached through the Cluster client.
    ClusterMaster,
}

/// Reads `INFO` on `conn` (on a Cluster, every master's) and refuses a server the scripts
/// cannot run on, or, for [`Role::Primary`], a replica (a demoted primary still behind
/// the address: writes would answer `READONLY`) or a Cluster node (its keys' slots
/// would answer `MOVED`). A server that does not answer `INFO` (renamed or forbidden by
/// a managed offering) is taken on trust, with a warning: its scripts then say for
/// themselves what they lack, as an outage.
pub(super) async fn check(
    conn: &mut impl redis::aio::ConnectionLike,
    at: &str,
    role: Role,
) -> RedisResult<Vec<Server>> {
    let answer = match redis::cmd("INFO").query_async::<Value>(conn).await {
        Ok(v) => v,
        Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => return Err(e),
        Err(e) => {
            tracing::warn!(error = %e, node = at, "Redis did not say its version (INFO); its scripts are not checked before use");
            return Ok(Vec::new());
        }
    };
    let mut servers = Vec::new();
    for (node, info) in infos(&answer, at) {
        let server = parse(&info).ok_or_else(|| refused(&node, "INFO names no version"))?;
        judge(&server).map_err(|why| refused(&node, &why))?;
        if role == Role::Primary {
            primary(&info).map_err(|why| refused(&node, &why))?;
        }
        servers.push(server);
    }
    Ok(servers)
}

/// Whether the server an `INFO` answer describes takes one server's writes: the refusal's
/// text when it is a replica or a Cluster node.
pub(super) fn primary(info: &str) -> Result<(), String> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim_end().strip_prefix(name)?.strip_prefix(':'))
    };
    if field("cluster_enabled") == Some("1") {
        return Err("a Redis Cluster node, given as one server's URL: use --redis-mode cluster (upstream: REDIS_TYPE=cluster) with the Cluster's nodes".into());
    }
    match field("role") {
        Some("master") | None => Ok(()),
        Some(role) => Err(format!(
            "a replica (role {role}), not the primary: writes need the primary (waiting for the address to lead to one)"
        )),
    }
}

/// Each node's `INFO` text: one answer on one server, a map of node to answer from a
/// Cluster's masters.
fn infos(answer: &Value, at: &str) -> Vec<(String, String)> {
    let text = |v: &Value| redis::from_redis_value_ref::<String>(v).ok();
    match answer {
        Value::Map(nodes) => nodes
            .iter()
            .filter_map(|(node, info)| Some((text(node)?, text(info)?)))
            .collect(),
        other => text(other)
            .map(|t| vec![(at.to_string(), t)])
            .unwrap_or_default(),
    }
}

fn refused(node: &str, why: &str) -> RedisError {
    RedisError::from((
        ErrorKind::InvalidClientConfig,
        "unsupported server",
        format!("{node}: {why}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_product_names_its_own_version() {
        let redis6 = parse("# Server\r\nredis_version:6.0.9\r\nredis_git_sha1:0\r\n").unwrap();
        assert_eq!(redis6.to_string(), "Redis 6.0.9");
        judge(&redis6).unwrap();
        let valkey = parse("redis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\n");
        assert_eq!(valkey.unwrap().to_string(), "Valkey 9.1.2");
        assert_eq!(parse("uptime:5\r\n"), None);
        assert_eq!(parse("redis_version:seven\r\n"), None);
    }

    #[test]
    fn a_server_older_than_the_scripts_is_refused_naming_both_versions() {
        let old = parse("redis_version:5.0.14\r\n").unwrap();
        let why = judge(&old).unwrap_err();
        assert!(
            why.contains("Redis 5.0.14") && why.contains("Redis 6.0"),
            "{why}"
        );
        assert!(why.contains("Valkey 7.2"), "{why}");
        judge(&parse("redis_version:7.0.15\r\n").unwrap()).unwrap();
        let e = refused("127.0.0.1:6379", &why);
        assert!(e.to_string().contains("127.0.0.1:6379"), "{e}");
        assert!(e.to_string().len() < 200, "{e}");
    }

    #[test]
    fn a_clusters_masters_are_each_read() {
        let answer = Value::Map(vec![
            (
                Value::SimpleString("a:1".into()),
                Value::BulkString(b"redis_version:7.0.15\r\n".to_vec()),
            ),
            (
                Value::SimpleString("b:2".into()),
                Value::BulkString(b"redis_version:6.0.9\r\n".to_vec()),
            ),
        ]);
        let got = infos(&answer, "seed");
        assert_eq!(got.len(), 2);
        assert_eq!(got[1].0, "b:2");
        let single = infos(&Value::BulkString(b"redis_version:6.0.9".to_vec()), "s:1");
        assert_eq!(
            single,
            vec![("s:1".to_string(), "redis_version:6.0.9".to_string())]
        );
    }

    #[test]
    fn one_servers_url_must_lead_to_a_primary_outside_a_cluster() {
        primary("redis_version:7.0.15\r\nrole:master\r\ncluster_enabled:0\r\n").unwrap();
        let replica = primary("role:slave\r\n").unwrap_err();
        assert!(replica.contains("replica"), "{replica}");
        let node = primary("role:master\r\ncluster_enabled:1\r\n").unwrap_err();
        assert!(node.contains("--redis-mode cluster"), "{node}");
    }
}

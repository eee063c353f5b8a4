//! envoyproxy/ratelimit's Redis settings (its `settings.go`), each honoured, mapped or
//! refused by name: a Deployment that ran upstream on Redis runs shardgate on the same
//! Redis with no other change (its counters are not ours: the buckets start full).
//!
//! Upstream's default backend is Redis, so `REDIS_URL` alone (or `BACKEND_TYPE=redis`)
//! selects the Redis store; without either the store stays the embedded one.

use super::go_values::{go_bool, go_duration};
use super::reader::Reader;
use crate::support::text::elide;

/// upstream's defaults (`REDIS_SOCKET_TYPE`, `REDIS_URL`): twemproxy's socket.
const DEFAULT_SOCKET_TYPE: &str = "unix";
const DEFAULT_URL: &str = "/var/run/nutcracker/ratelimit.sock";

/// Settings of upstream's Redis client that have no counterpart here, with why.
const IGNORED: &[(&str, &str)] = &[
    (
        "REDIS_PIPELINE_WINDOW",
        "calls pipeline on multiplexed connections",
    ),
    ("REDIS_PIPELINE_LIMIT", "unused upstream too"),
    (
        "REDIS_CLUSTER_PIPELINE_PARALLELISM",
        "each Cluster node is called in parallel",
    ),
    (
        "REDIS_POOL_ON_EMPTY_BEHAVIOR",
        "multiplexed connections never run out",
    ),
    (
        "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
        "health is NOT_SERVING until Redis answers, and the breaker reports outages",
    ),
    (
        "REDIS_STARTUP_INITIAL_INTERVAL",
        "Redis is tried every second until it answers, health NOT_SERVING meanwhile",
    ),
    (
        "REDIS_STARTUP_MAX_INTERVAL",
        "Redis is tried every second until it answers",
    ),
    (
        "REDIS_STARTUP_MAX_ELAPSED_TIME",
        "the server waits for Redis without exiting",
    ),
];

/// Reads the Redis settings: with Redis the backend, sets the Redis store's variables.
pub(super) fn redis(r: &mut Reader) {
    if !backend_is_redis(r) || !per_second_off(r) {
        return;
    }
    let Some(mode) = mode(r) else {
        return;
    };
    let Some(tls) = tls_on(r) else {
        return;
    };
    let Some(urls) = urls(r, mode, tls) else {
        return;
    };
    r.alias("SHARDGATE_STORE", "BACKEND_TYPE", "redis".into());
    r.alias("SHARDGATE_REDIS_URL", "REDIS_URL", urls.join(","));
    r.alias("SHARDGATE_REDIS_MODE", "REDIS_TYPE", mode.into());
    client_settings(r, tls);
}

/// Whether Redis is the backend (`BACKEND_TYPE=redis`, or unset with `REDIS_URL` given);
/// another backend is refused.
fn backend_is_redis(r: &mut Reader) -> bool {
    let backend = r.get("BACKEND_TYPE").map(str::to_ascii_lowercase);
    let url_given = r.env.contains_key("REDIS_URL");
    match backend.as_deref() {
        Some("redis") => {}
        None if url_given => {}
        None => return false,
        Some(other) => {
            r.refuse(format!(
                "BACKEND_TYPE={}: shardgate's shared stores are Redis and DynamoDB (--store)",
                elide(other, 32)
            ));
            return false;
        }
    }
    true
}

/// Whether `REDIS_PERSECOND` is off; on (a second Redis for per-second limits) is refused.
fn per_second_off(r: &mut Reader) -> bool {
    if r.get("REDIS_PERSECOND").and_then(go_bool) == Some(true) {
        r.refuse(
            "REDIS_PERSECOND=true: one store holds every bucket here (a per-second limit costs \
             no more than another); remove REDIS_PERSECOND_*"
                .into(),
        );
        return false;
    }
    true
}

/// `REDIS_TYPE` as our Redis mode; `None` when it is none of them (refused).
fn mode(r: &mut Reader) -> Option<&'static str> {
    let kind = r
        .get("REDIS_TYPE")
        .map(str::to_ascii_lowercase)
        .unwrap_or_else(|| "single".into());
    let mode = match kind.as_str() {
        "single" => "single",
        "cluster" => "cluster",
        "sentinel" => "sentinel",
        other => {
            r.refuse(format!(
                "REDIS_TYPE={}: not single, cluster or sentinel",
                elide(other, 32)
            ));
            return None;
        }
    };
    Some(mode)
}

/// `REDIS_TLS`; `None` when it is not a boolean (refused).
fn tls_on(r: &mut Reader) -> Option<bool> {
    Some(match r.get("REDIS_TLS").map(go_bool) {
        None => false,
        Some(Some(on)) => on,
        Some(None) => {
            r.refuse("REDIS_TLS: not a boolean".into());
            return None;
        }
    })
}

/// `REDIS_URL`'s addresses as our URLs, with `REDIS_AUTH` in them; with Sentinel, the
/// master's name and password set first. `None` when one cannot be followed (refused).
fn urls(r: &mut Reader, mode: &str, tls: bool) -> Option<Vec<String>> {
    let socket = r
        .get("REDIS_SOCKET_TYPE")
        .unwrap_or(DEFAULT_SOCKET_TYPE)
        .to_ascii_lowercase();
    let mut auth = r.get("REDIS_AUTH").filter(|a| !a.is_empty());
    let raw = r.get("REDIS_URL").unwrap_or(DEFAULT_URL);
    let mut addresses: Vec<&str> = raw
        .split(',')
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    if mode == "sentinel" {
        // upstream's form: the master's name, then the Sentinels' addresses; REDIS_AUTH
        // is the master's password, REDIS_SENTINEL_AUTH the Sentinels'.
        if addresses.len() < 2 {
            r.refuse(
                "REDIS_URL: with REDIS_TYPE=sentinel, the master's name then the Sentinels' \
                 addresses (mymaster,host:26379,...)"
                    .into(),
            );
            return None;
        }
        let master = addresses.remove(0);
        r.alias(
            "SHARDGATE_REDIS_SENTINEL_MASTER",
            "REDIS_URL",
            master.into(),
        );
        if let Some(master_auth) = auth {
            r.alias(
                "SHARDGATE_REDIS_MASTER_AUTH",
                "REDIS_AUTH",
                master_auth.into(),
            );
        }
        auth = r.get("REDIS_SENTINEL_AUTH").filter(|a| !a.is_empty());
    }
    let mut urls = Vec::new();
    for address in addresses {
        // Say what the user did not write: the socket type is upstream's default.
        if !r.env.contains_key("REDIS_SOCKET_TYPE") && !address.starts_with('/') {
            r.refuse(format!(
                "REDIS_URL={}: REDIS_SOCKET_TYPE is unset, and upstream's default is unix (a \
                 socket path); set REDIS_SOCKET_TYPE=tcp for a host:port",
                elide(address, 64)
            ));
            return None;
        }
        match url_of(address, &socket, tls, auth) {
            Ok(url) => urls.push(url),
            Err(e) => {
                r.refuse(format!("REDIS_URL: {e}"));
                return None;
            }
        }
    }
    if urls.is_empty() {
        r.refuse("REDIS_URL: no address".into());
        return None;
    }
    Some(urls)
}

/// The Redis client's settings once the store is Redis: pool size, timeout, TLS files and
/// hostname check, key prefix, and those with no counterpart (ignored).
fn client_settings(r: &mut Reader, tls: bool) {
    if let Some(size) = r.get("REDIS_POOL_SIZE") {
        match size.parse::<usize>() {
            Ok(n) if n > 0 => r.alias(
                "SHARDGATE_REDIS_POOL_SIZE",
                "REDIS_POOL_SIZE",
                n.to_string(),
            ),
            _ => r.refuse(format!(
                "REDIS_POOL_SIZE={}: not a positive number",
                elide(size, 32)
            )),
        }
    }
    if let Some(timeout) = r.get("REDIS_TIMEOUT") {
        match go_duration(timeout).filter(|d| !d.is_zero()) {
            Some(d) => r.alias(
                "SHARDGATE_STORE_TIMEOUT",
                "REDIS_TIMEOUT",
                humantime::format_duration(d).to_string(),
            ),
            None => r.refuse(format!(
                "REDIS_TIMEOUT={}: not a positive duration (e.g. 1s)",
                elide(timeout, 32)
            )),
        }
    }
    for (upstream, ours) in [
        ("REDIS_TLS_CACERT", "SHARDGATE_REDIS_TLS_CA"),
        ("REDIS_TLS_CLIENT_CERT", "SHARDGATE_REDIS_TLS_CLIENT_CERT"),
        ("REDIS_TLS_CLIENT_KEY", "SHARDGATE_REDIS_TLS_CLIENT_KEY"),
    ] {
        if let Some(path) = r.get(upstream).filter(|p| !p.is_empty()) {
            if tls {
                r.alias(ours, upstream, path.into());
            } else {
                r.refuse(format!("{upstream} is set but REDIS_TLS is not true"));
            }
        }
    }
    match r.get("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION").map(go_bool) {
        Some(Some(true)) => r.alias(
            "SHARDGATE_REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
            "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
            "true".into(),
        ),
        Some(None) => r.refuse("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION: not a boolean".into()),
        _ => {}
    }
    if let Some(prefix) = r.get("CACHE_KEY_PREFIX").filter(|p| !p.is_empty()) {
        r.alias("SHARDGATE_NAMESPACE", "CACHE_KEY_PREFIX", prefix.into());
    }
    r.ignore_with_reasons(IGNORED);
}

/// One of upstream's Redis addresses (`host:port` over TCP, a path over a Unix socket)
/// as a URL, with `REDIS_AUTH` (`password` or `user:password`) in it.
fn url_of(address: &str, socket: &str, tls: bool, auth: Option<&str>) -> Result<String, String> {
    // Everything but RFC 3986's unreserved characters.
    const USERINFO: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    let enc = |s: &str| percent_encoding::utf8_percent_encode(s, USERINFO).to_string();
    let userinfo = match auth.map(|a| a.split_once(':').unwrap_or(("", a))) {
        Some((user, pass)) => format!("{}:{}@", enc(user), enc(pass)),
        None => String::new(),
    };
    match socket {
        "tcp" => {
            if address.contains("://") {
                return Err(format!(
                    "{}: an address (host:port), not a URL",
                    elide(address, 64)
                ));
            }
            let scheme = if tls { "rediss" } else { "redis" };
            Ok(format!("{scheme}://{userinfo}{address}"))
        }
        "unix" => {
            if tls {
                return Err(
                    "TLS over a Unix socket (REDIS_TLS with REDIS_SOCKET_TYPE=unix)".into(),
                );
            }
            let mut url = format!("unix://{address}");
            if let Some((user, pass)) = auth.map(|a| a.split_once(':').unwrap_or(("", a))) {
                url.push_str(&format!("?pass={}", enc(pass)));
                if !user.is_empty() {
                    url.push_str(&format!("&user={}", enc(user)));
                }
            }
            Ok(url)
        }
        other => Err(format!(
            "REDIS_SOCKET_TYPE={}: not tcp or unix",
            elide(other, 32)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_env::env;
    use super::super::translate;
    use super::*;

    fn translated(vars: &[(&str, &str)]) -> super::super::Translation {
        translate(&env(vars))
    }

    fn set(t: &super::super::Translation, ours: &str) -> Option<String> {
        t.set
            .iter()
            .find(|a| a.ours == ours)
            .map(|a| a.value.clone())
    }

    #[test]
    fn a_cluster_with_tls_and_auth_maps_to_the_redis_store() {
        let t = translated(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "CLUSTER"),
            ("REDIS_URL", "n1:6379, n2:6379,n3:6379"),
            ("REDIS_AUTH", "svc:pw"),
            ("REDIS_TLS", "true"),
            ("REDIS_TLS_CACERT", "/ca.pem"),
            ("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true"),
            ("REDIS_POOL_SIZE", "10"),
            ("REDIS_TIMEOUT", "2s"),
            ("REDIS_PIPELINE_WINDOW", "150us"),
            ("CACHE_KEY_PREFIX", "edge"),
        ]);
        assert!(t.refused.is_empty(), "{:?}", t.refused);
        assert_eq!(set(&t, "SHARDGATE_STORE").as_deref(), Some("redis"));
        assert_eq!(
            set(&t, "SHARDGATE_REDIS_URL").as_deref(),
            Some("rediss://svc:pw@n1:6379,rediss://svc:pw@n2:6379,rediss://svc:pw@n3:6379")
        );
        assert_eq!(set(&t, "SHARDGATE_REDIS_MODE").as_deref(), Some("cluster"));
        assert_eq!(
            set(&t, "SHARDGATE_REDIS_TLS_CA").as_deref(),
            Some("/ca.pem")
        );
        assert_eq!(set(&t, "SHARDGATE_REDIS_POOL_SIZE").as_deref(), Some("10"));
        assert_eq!(set(&t, "SHARDGATE_STORE_TIMEOUT").as_deref(), Some("2s"));
        assert_eq!(set(&t, "SHARDGATE_NAMESPACE").as_deref(), Some("edge"));
        assert!(
            t.ignored
                .iter()
                .any(|i| i.starts_with("REDIS_PIPELINE_WINDOW (")),
            "{:?}",
            t.ignored
        );
        assert!(!t.read.contains(&"REDIS_PIPELINE_WINDOW".to_string()));
    }

    #[test]
    fn what_shardgate_cannot_follow_is_refused_by_name() {
        for (vars, named) in [
            (vec![("BACKEND_TYPE", "memcache")], "BACKEND_TYPE=memcache"),
            (
                vec![("REDIS_URL", "x:1"), ("REDIS_PERSECOND", "true")],
                "REDIS_PERSECOND",
            ),
            (
                vec![("REDIS_URL", "s1:26379"), ("REDIS_TYPE", "sentinel")],
                "the master's name then the Sentinels'",
            ),
            (
                vec![("REDIS_URL", "x:1"), ("REDIS_SOCKET_TYPE", "udp")],
                "REDIS_SOCKET_TYPE=udp",
            ),
            (
                vec![("REDIS_URL", "redis:6379")],
                "REDIS_URL=redis:6379: REDIS_SOCKET_TYPE is unset, and upstream's default is unix",
            ),
            (
                vec![
                    ("REDIS_URL", "x:1"),
                    ("REDIS_SOCKET_TYPE", "tcp"),
                    ("REDIS_TLS_CACERT", "/ca"),
                ],
                "REDIS_TLS is not true",
            ),
        ] {
            let t = translated(&vars);
            assert!(
                t.refused.iter().any(|r| r.contains(named)),
                "{named}: {:?}",
                t.refused
            );
        }
    }

    #[test]
    fn sentinel_takes_the_masters_name_first_and_two_passwords() {
        let t = translated(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_TYPE", "sentinel"),
            ("REDIS_URL", "mymaster,s1:26379,s2:26379"),
            ("REDIS_AUTH", "master-pw"),
            ("REDIS_SENTINEL_AUTH", "sentinel-pw"),
        ]);
        assert!(t.refused.is_empty(), "{:?}", t.refused);
        assert_eq!(set(&t, "SHARDGATE_REDIS_MODE").as_deref(), Some("sentinel"));
        assert_eq!(
            set(&t, "SHARDGATE_REDIS_SENTINEL_MASTER").as_deref(),
            Some("mymaster")
        );
        assert_eq!(
            set(&t, "SHARDGATE_REDIS_MASTER_AUTH").as_deref(),
            Some("master-pw")
        );
        assert_eq!(
            set(&t, "SHARDGATE_REDIS_URL").as_deref(),
            Some("redis://:sentinel-pw@s1:26379,redis://:sentinel-pw@s2:26379")
        );
        assert!(t.read.contains(&"REDIS_SENTINEL_AUTH".to_string()));
    }

    #[test]
    fn without_a_redis_backend_its_settings_are_ignored() {
        let t = translated(&[("REDIS_POOL_SIZE", "10")]);
        assert!(t.set.is_empty(), "{:?}", t.set);
        assert_eq!(t.ignored, ["REDIS_POOL_SIZE"]);
        // upstream's defaults: twemproxy's socket.
        let t = translated(&[("BACKEND_TYPE", "redis")]);
        assert_eq!(
            set(&t, "SHARDGATE_REDIS_URL").as_deref(),
            Some("unix:///var/run/nutcracker/ratelimit.sock")
        );
    }

    #[test]
    fn addresses_become_urls_with_their_credentials() {
        assert_eq!(
            url_of("redis:6379", "tcp", false, None).unwrap(),
            "redis://redis:6379"
        );
        assert_eq!(
            url_of("r:6380", "tcp", true, Some("u:p@ss")).unwrap(),
            "rediss://u:p%40ss@r:6380"
        );
        assert_eq!(
            url_of("r:1", "tcp", false, Some("secret")).unwrap(),
            "redis://:secret@r:1"
        );
        assert_eq!(
            url_of("/var/run/r.sock", "unix", false, Some("pw")).unwrap(),
            "unix:///var/run/r.sock?pass=pw"
        );
        assert!(url_of("/s", "unix", true, None).is_err());
        assert!(url_of("redis://x:1", "tcp", false, None).is_err());
        assert!(url_of("x:1", "udp", false, None).is_err());
    }
}

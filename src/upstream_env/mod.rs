//! envoyproxy/ratelimit's environment variables, read as aliases of ours, so that an
//! existing Deployment keeps working when its image is swapped for shardgate.
//!
//! Owns the translation only: a pure function from the process environment to the
//! `SHARDGATE_*` variables (and `RUST_LOG`) it implies, the upstream variables it cannot
//! honour, and the ones that would change behaviour in a way shardgate cannot follow
//! (refused, so the server does not start on the wrong assumption). Ours always win: a
//! `SHARDGATE_*` variable already set is never overwritten, and a flag beats both.
//! `main` applies the result before parsing its arguments and logs the ignored names
//! once. The table of what is honoured is in docs/configuration.md.
//!
//! This file reads the server's own settings (rules, ports, logs, switches, gRPC TLS);
//! `redis.rs` the Redis backend's, `xds.rs` the rule source's, `statsd.rs`,
//! `prometheus.rs` and `tracing.rs` the stats and span exports'.

mod prometheus;
mod redis;
mod statsd;
mod tracing;
mod xds;

use std::collections::{BTreeMap, BTreeSet};
use std::net::ToSocketAddrs;
use std::time::Duration;

/// What the environment implies.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Translation {
    /// Variables to set, in a stable order: `(our name, value, the upstream names it
    /// came from)`.
    pub set: Vec<Alias>,
    /// Upstream variables present that have no meaning here (logged once).
    pub ignored: Vec<String>,
    /// Upstream settings present that shardgate cannot follow; the server must not start.
    pub refused: Vec<String>,
    /// Upstream variables present that were read: honoured (as aliases or by what they
    /// say), or refused. Every upstream variable of a Deployment is here or in `ignored`:
    /// none passes unnoticed.
    pub read: Vec<String>,
}

/// One of our variables, set from upstream's.
#[derive(Debug, PartialEq, Eq)]
pub struct Alias {
    pub ours: &'static str,
    pub value: String,
    pub from: &'static str,
}

/// Upstream variables that configure what shardgate does differently or not at all
/// (its stats sinks when stats are disabled or a sink is off, caches, Memcached, xDS,
/// tracing, the forced close after a connection's age), and those of its Redis client when
/// Redis is not the backend. A variable some reader looked at is not ignored: it was
/// honoured or refused.
const IGNORED: &[&str] = &[
    "BACKEND_TYPE",
    "CACHE_KEY_PREFIX",
    "DEBUG_HOST",
    "DEBUG_PORT",
    "DISABLE_STATS",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "EXTRA_TAGS",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    // Envoy Gateway sets it beside GRPC_SERVER_TLS_CERT/_KEY, but upstream reads no such
    // variable (its client CA is GRPC_CLIENT_TLS_CACERT): clients are not asked for a
    // certificate, here as there.
    "GRPC_SERVER_TLS_CA_CERT",
    "GRPC_MAX_CONNECTION_AGE_GRACE",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "NEAR_LIMIT_RATIO",
    "RUNTIME_IGNOREDOTFILES",
    "RUNTIME_WATCH_ROOT",
    "STATS_FLUSH_INTERVAL",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "USE_DOG_STATSD",
    "USE_DOG_STATSD_MOGRIFIERS",
    "USE_PROMETHEUS",
    "USE_STATSD",
];

const IGNORED_PREFIXES: &[&str] = &[
    "MEMCACHE_",
    "PROMETHEUS_",
    "REDIS_",
    "STATSD_",
    "TRACING_",
    "XDS_CLIENT_",
    "CONFIG_GRPC_XDS_",
];

/// upstream's default rule root (`RUNTIME_ROOT`) and app directory.
const DEFAULT_RUNTIME_ROOT: &str = "/srv/runtime_data/current";
const DEFAULT_APP_DIRECTORY: &str = "config";

/// Translates `env` (the process environment).
pub fn translate(env: &BTreeMap<String, String>) -> Translation {
    let mut r = Reader {
        env,
        looked: BTreeSet::new(),
        t: Translation::default(),
    };
    rule_directory(&mut r);
    listen_addrs(&mut r);
    logging(&mut r);
    switches(&mut r);
    connection_age(&mut r);
    grpc_tls(&mut r);
    redis::redis(&mut r);
    let mut consumed = statsd::statsd(env, &mut r.t);
    consumed.extend(prometheus::prometheus(env, &mut r.t));
    consumed.extend(tracing::tracing(env, &mut r.t));
    // The OpenTelemetry SDK's own endpoint variables, which upstream's SDK reads too:
    // honoured as they are (the export reads them itself).
    for sdk in [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ] {
        r.get(sdk);
    }
    rule_source(&mut r);
    r.finish(&consumed)
}

/// The environment being read: what was looked up (each variable found is `read`
/// unless it ends up ignored), and the translation so far.
struct Reader<'a> {
    env: &'a BTreeMap<String, String>,
    looked: BTreeSet<String>,
    t: Translation,
}

impl<'a> Reader<'a> {
    fn get(&mut self, name: &str) -> Option<&'a str> {
        let value = self.env.get(name).map(String::as_str);
        if value.is_some() {
            self.looked.insert(name.to_string());
        }
        value
    }

    /// Sets `ours` from upstream's `from`, unless `ours` is set already (ours win).
    fn alias(&mut self, ours: &'static str, from: &'static str, value: String) {
        if !self.env.contains_key(ours) {
            self.t.set.push(Alias { ours, value, from });
        }
    }

    fn refuse(&mut self, why: String) {
        self.t.refused.push(why);
    }

    /// The variables no rule read that upstream has, named as ignored; `read` completed
    /// with what `consumed` names.
    fn finish(mut self, consumed: &[&str]) -> Translation {
        for name in self.env.keys() {
            let ignored = (IGNORED.contains(&name.as_str())
                || IGNORED_PREFIXES.iter().any(|p| name.starts_with(p)))
                && !consumed.contains(&name.as_str())
                && !self.looked.contains(name);
            if ignored {
                self.t.ignored.push(name.clone());
            }
        }
        let env = self.env;
        self.looked.extend(
            consumed
                .iter()
                .filter(|name| env.contains_key(**name))
                .map(|name| name.to_string()),
        );
        let ignored = &self.t.ignored;
        let read = self
            .looked
            .into_iter()
            .filter(|name| {
                !ignored
                    .iter()
                    .any(|i| i == name || i.starts_with(&format!("{name} ")))
            })
            .collect();
        self.t.read = read;
        self.t
    }
}

/// The rule directory: `RUNTIME_ROOT` / `RUNTIME_SUBDIRECTORY` / `RUNTIME_APPDIRECTORY`.
fn rule_directory(r: &mut Reader) {
    if r.get("RUNTIME_ROOT").is_none() && r.get("RUNTIME_SUBDIRECTORY").is_none() {
        return;
    }
    let mut path = std::path::PathBuf::from(r.get("RUNTIME_ROOT").unwrap_or(DEFAULT_RUNTIME_ROOT));
    if let Some(sub) = r.get("RUNTIME_SUBDIRECTORY") {
        path.push(sub);
    }
    path.push(
        r.get("RUNTIME_APPDIRECTORY")
            .unwrap_or(DEFAULT_APP_DIRECTORY),
    );
    r.alias(
        "SHARDGATE_CONFIG",
        "RUNTIME_ROOT",
        path.display().to_string(),
    );
    // What shardgate always does, and so honoured when asked for (Envoy Gateway asks for
    // both): dot files skipped (a ConfigMap volume's `..data` copies), the rule directory
    // itself watched. The other values stay named as ignored.
    for (name, ours) in [
        ("RUNTIME_IGNOREDOTFILES", true),
        ("RUNTIME_WATCH_ROOT", false),
    ] {
        if r.env.get(name).and_then(|v| go_bool(v)) == Some(ours) {
            r.get(name);
        }
    }
}

/// The two ports: `GRPC_HOST`/`GRPC_PORT` and `HOST`/`PORT`.
fn listen_addrs(r: &mut Reader) {
    for (host, port, ours, default_port) in [
        ("GRPC_HOST", "GRPC_PORT", "SHARDGATE_GRPC_ADDR", "8081"),
        ("HOST", "PORT", "SHARDGATE_HTTP_ADDR", "8080"),
    ] {
        if r.get(host).is_none() && r.get(port).is_none() {
            continue;
        }
        let h = r.get(host).unwrap_or("0.0.0.0");
        let p = r.get(port).unwrap_or(default_port);
        match listen_addr(h, p) {
            Ok(addr) => r.alias(ours, port, addr),
            Err(e) => r.refuse(format!("{host}/{port}: {e}")),
        }
    }
}

/// `LOG_LEVEL` (logrus' names) and `LOG_FORMAT`.
fn logging(r: &mut Reader) {
    if let Some(level) = r.get("LOG_LEVEL") {
        match log_filter(level) {
            Some(f) => r.alias("RUST_LOG", "LOG_LEVEL", f.to_string()),
            None => r.refuse(format!(
                "LOG_LEVEL={}: not a level (trace, debug, info, warn, error)",
                crate::support::text::elide(level, 64)
            )),
        }
    }
    if let Some(format) = r.get("LOG_FORMAT") {
        match format.to_ascii_lowercase().as_str() {
            f @ ("text" | "json") => r.alias("SHARDGATE_LOG_FORMAT", "LOG_FORMAT", f.into()),
            _ => r.refuse(format!(
                "LOG_FORMAT={}: not text or json",
                crate::support::text::elide(format, 64)
            )),
        }
    }
}

/// The boolean switches upstream's answers follow, and its header names.
fn switches(r: &mut Reader) {
    for (upstream, ours) in [
        ("SHADOW_MODE", "SHARDGATE_GLOBAL_SHADOW_MODE"),
        ("QUOTA_MODE", "SHARDGATE_GLOBAL_QUOTA_MODE"),
        ("MERGE_DOMAIN_CONFIG", "SHARDGATE_MERGE_DOMAIN_CONFIG"),
        (
            "RESPONSE_DYNAMIC_METADATA",
            "SHARDGATE_RESPONSE_DYNAMIC_METADATA",
        ),
        (
            "LIMIT_RESPONSE_HEADERS_ENABLED",
            "SHARDGATE_RATE_LIMIT_HEADERS",
        ),
    ] {
        if let Some(v) = r.get(upstream) {
            match go_bool(v) {
                Some(b) => r.alias(ours, upstream, b.to_string()),
                None => r.refuse(format!(
                    "{upstream}={}: not a boolean",
                    crate::support::text::elide(v, 64)
                )),
            }
        }
    }
    for (upstream, ours) in [
        ("LIMIT_LIMIT_HEADER", "SHARDGATE_LIMIT_HEADER"),
        ("LIMIT_REMAINING_HEADER", "SHARDGATE_REMAINING_HEADER"),
        ("LIMIT_RESET_HEADER", "SHARDGATE_RESET_HEADER"),
    ] {
        if let Some(v) = r.get(upstream) {
            r.alias(ours, upstream, v.to_string());
        }
    }
}

/// `GRPC_MAX_CONNECTION_AGE`, a Go duration.
fn connection_age(r: &mut Reader) {
    let Some(age) = r.get("GRPC_MAX_CONNECTION_AGE") else {
        return;
    };
    match go_duration(age) {
        Some(d) => r.alias(
            "SHARDGATE_GRPC_MAX_CONNECTION_AGE",
            "GRPC_MAX_CONNECTION_AGE",
            humantime::format_duration(d).to_string(),
        ),
        None => r.refuse(format!(
            "GRPC_MAX_CONNECTION_AGE={}: not a duration (e.g. 24h, 90m, 1h30m)",
            crate::support::text::elide(age, 64)
        )),
    }
}

/// TLS on the gRPC port, only when upstream would use it (`GRPC_SERVER_USE_TLS=true`).
fn grpc_tls(r: &mut Reader) {
    let tls_files = [
        "GRPC_SERVER_TLS_CERT",
        "GRPC_SERVER_TLS_KEY",
        "GRPC_CLIENT_TLS_CACERT",
    ];
    match r.get("GRPC_SERVER_USE_TLS").map(go_bool) {
        Some(Some(true)) => {
            for (upstream, ours) in tls_files.into_iter().zip([
                "SHARDGATE_TLS_CERT",
                "SHARDGATE_TLS_KEY",
                "SHARDGATE_TLS_CLIENT_CA",
            ]) {
                match r.get(upstream) {
                    Some(path) if !path.is_empty() => r.alias(ours, upstream, path.into()),
                    _ if upstream == "GRPC_CLIENT_TLS_CACERT" => {}
                    _ => r.refuse(format!("GRPC_SERVER_USE_TLS=true needs {upstream}")),
                }
            }
            if r.get("GRPC_CLIENT_TLS_SAN").is_some_and(|s| !s.is_empty()) {
                r.refuse(
                    "GRPC_CLIENT_TLS_SAN: client certificates are checked against \
                     GRPC_CLIENT_TLS_CACERT only; pinning a SAN is not supported"
                        .into(),
                );
            }
        }
        Some(None) => r.refuse("GRPC_SERVER_USE_TLS: not a boolean".into()),
        _ => {
            for name in tls_files.into_iter().chain(["GRPC_CLIENT_TLS_SAN"]) {
                if r.env.contains_key(name) {
                    r.t.ignored
                        .push(format!("{name} (GRPC_SERVER_USE_TLS is not true)"));
                }
            }
        }
    }
}

/// Where rules come from (`CONFIG_TYPE`, `xds.rs`) and the gRPC socket's kind
/// (`GRPC_UDS`: TCP only).
fn rule_source(r: &mut Reader) {
    xds::rule_source(r);
    if r.get("GRPC_UDS").is_some_and(|s| !s.is_empty()) {
        r.refuse("GRPC_UDS: shardgate listens on TCP only (GRPC_HOST/GRPC_PORT)".into());
    }
}

/// `host:port` as a socket address; a name is resolved (its first address), as
/// upstream's listener would.
fn listen_addr(host: &str, port: &str) -> Result<String, String> {
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{}: not a port", crate::support::text::elide(port, 32)))?;
    let mut addrs = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{}: {e}", crate::support::text::elide(host, 64)))?;
    addrs
        .next()
        .map(|a| a.to_string())
        .ok_or_else(|| format!("{}: no address", crate::support::text::elide(host, 64)))
}

/// upstream's (logrus) level names as a tracing filter.
fn log_filter(level: &str) -> Option<&'static str> {
    Some(match level.to_ascii_lowercase().as_str() {
        "trace" => "trace",
        "debug" => "debug",
        "info" => "info",
        "warn" | "warning" => "warn",
        "error" | "fatal" | "panic" => "error",
        _ => return None,
    })
}

/// A duration as Go's `time.ParseDuration` reads it, which upstream's settings use:
/// `0`, or decimal numbers each with a unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), as in
/// `24h`, `1.5h`, `1h30m`. A negative one is refused (it would mean "never" upstream, which
/// leaving the variable unset says).
fn go_duration(v: &str) -> Option<Duration> {
    if v == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = v.strip_prefix('+').unwrap_or(v);
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_len);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3_600.0,
            _ => return None,
        };
        if number.is_empty() || number == "." {
            return None;
        }
        total += number.parse::<f64>().ok()? * seconds;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// Go's `strconv.ParseBool`, which upstream's settings use.
fn go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn set(t: &Translation) -> Vec<(&str, &str)> {
        t.set.iter().map(|a| (a.ours, a.value.as_str())).collect()
    }

    #[test]
    fn tracing_is_exported_as_upstream_would_export_it() {
        // Envoy Gateway's tracing variables.
        let t = translate(&env(&[
            ("TRACING_ENABLED", "true"),
            ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
            ("TRACING_SERVICE_INSTANCE_ID", "pod 1"),
            ("TRACING_SAMPLING_RATE", "0.25"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"),
        ]));
        assert_eq!(
            set(&t),
            vec![
                ("SHARDGATE_OTLP_PROTOCOL", "http"),
                ("OTEL_SERVICE_NAME", "envoy-ratelimit"),
                (
                    "OTEL_RESOURCE_ATTRIBUTES",
                    "service.namespace=envoy-gateway-system,service.instance.id=pod%201"
                ),
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ]
        );
        assert!(t.ignored.is_empty() && t.refused.is_empty(), "{t:?}");

        // No endpoint: the SDK's default collector for the protocol, upstream's name.
        let t = translate(&env(&[
            ("TRACING_ENABLED", "1"),
            ("TRACING_EXPORTER_PROTOCOL", "GRPC"),
            ("TRACING_SAMPLING_RATE", "1"),
        ]));
        assert_eq!(
            set(&t),
            vec![
                ("SHARDGATE_OTLP_PROTOCOL", "grpc"),
                ("SHARDGATE_OTLP_ENDPOINT", "http://localhost:4317"),
                ("OTEL_SERVICE_NAME", "RateLimit"),
            ]
        );

        // Off: the TRACING_* names are only reported as ignored.
        let t = translate(&env(&[
            ("TRACING_ENABLED", "false"),
            ("TRACING_SERVICE_NAME", "x"),
        ]));
        assert!(t.set.is_empty() && t.ignored.len() == 2, "{t:?}");

        for (bad, named) in [
            (
                ("TRACING_EXPORTER_PROTOCOL", "thrift"),
                "TRACING_EXPORTER_PROTOCOL=thrift",
            ),
            (
                ("TRACING_SAMPLING_RATE", "1.5"),
                "TRACING_SAMPLING_RATE=1.5",
            ),
            (
                ("TRACING_SAMPLING_RATE", "NaN"),
                "TRACING_SAMPLING_RATE=NaN",
            ),
        ] {
            let t = translate(&env(&[("TRACING_ENABLED", "true"), bad]));
            assert_eq!(t.refused.len(), 1, "{t:?}");
            assert!(t.refused[0].contains(named), "{named}: {:?}", t.refused);
        }
    }

    #[test]
    fn statsd_is_sent_where_and_how_upstream_would_send_it() {
        // Envoy Gateway's generated Deployment: statsd_exporter beside it on 9125.
        let t = translate(&env(&[("USE_STATSD", "true"), ("STATSD_PORT", "9125")]));
        assert_eq!(
            set(&t),
            vec![
                ("SHARDGATE_STATSD_ADDR", "localhost:9125"),
                ("SHARDGATE_STATSD_PROTOCOL", "tcp"),
            ]
        );
        assert!(t.ignored.is_empty() && t.refused.is_empty(), "{t:?}");

        let t = translate(&env(&[
            ("USE_STATSD", "true"),
            ("STATSD_HOST", "::1"),
            ("STATSD_PROTOCOL", "UDP"),
            ("STATS_FLUSH_INTERVAL", "1m30s"),
            ("EXTRA_TAGS", "zone:eu,app:rl"),
        ]));
        assert_eq!(
            set(&t),
            vec![
                ("SHARDGATE_STATSD_ADDR", "[::1]:8125"),
                ("SHARDGATE_STATSD_PROTOCOL", "udp"),
                ("SHARDGATE_STATSD_FLUSH_INTERVAL", "1m 30s"),
                ("SHARDGATE_STATSD_TAGS", "zone:eu,app:rl"),
            ]
        );
        assert!(t.ignored.is_empty() && t.refused.is_empty(), "{t:?}");

        // Off: nothing is sent, which is what USE_STATSD=false asks (honoured); the
        // settings that then mean nothing are named as ignored.
        let t = translate(&env(&[("USE_STATSD", "false"), ("STATSD_PORT", "9125")]));
        assert!(t.set.is_empty(), "{t:?}");
        assert_eq!(t.read, ["USE_STATSD"]);
        assert_eq!(t.ignored, ["STATSD_PORT"]);
        // Stats disabled: both named as ignored.
        let t = translate(&env(&[("USE_STATSD", "true"), ("DISABLE_STATS", "true")]));
        assert!(t.set.is_empty(), "{t:?}");
        assert_eq!(t.ignored.len(), 2, "{t:?}");

        for (bad, named) in [
            (("STATSD_PORT", "eighty"), "STATSD_PORT=eighty"),
            (("STATSD_PROTOCOL", "quic"), "STATSD_PROTOCOL=quic"),
            (("STATS_FLUSH_INTERVAL", "0"), "STATS_FLUSH_INTERVAL=0"),
            (("EXTRA_TAGS", "novalue"), "'novalue'"),
            (("USE_DOG_STATSD", "true"), "USE_DOG_STATSD"),
        ] {
            let t = translate(&env(&[("USE_STATSD", "true"), bad]));
            assert_eq!(t.refused.len(), 1, "{t:?}");
            assert!(t.refused[0].contains(named), "{named}: {:?}", t.refused);
        }
        let t = translate(&env(&[("USE_STATSD", "maybe")]));
        assert_eq!(t.refused, vec!["USE_STATSD: not a boolean".to_string()]);
    }

    #[test]
    fn the_prometheus_port_is_served_where_upstream_would_serve_it() {
        // Envoy Gateway's generated Deployment.
        let t = translate(&env(&[
            ("USE_STATSD", "false"),
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", ":19001"),
            ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
        ]));
        assert_eq!(
            set(&t),
            vec![
                ("SHARDGATE_UPSTREAM_PROMETHEUS_ADDR", "0.0.0.0:19001"),
                (
                    "SHARDGATE_UPSTREAM_PROMETHEUS_MAPPING",
                    "/etc/statsd-exporter/conf.yaml"
                ),
            ]
        );
        assert!(t.ignored.is_empty() && t.refused.is_empty(), "{t:?}");
        assert_eq!(t.read.len(), 4, "{t:?}");

        // Upstream's defaults; its own mapping, in milliseconds when asked.
        let t = translate(&env(&[
            ("USE_PROMETHEUS", "1"),
            ("PROMETHEUS_ADDR", ""),
            ("PROMETHEUS_PATH", "/stats"),
            ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "true"),
        ]));
        assert_eq!(
            set(&t),
            vec![
                ("SHARDGATE_UPSTREAM_PROMETHEUS_ADDR", "0.0.0.0:9090"),
                ("SHARDGATE_UPSTREAM_PROMETHEUS_PATH", "/stats"),
                ("SHARDGATE_UPSTREAM_PROMETHEUS_RESPONSE_TIME_MS", "true"),
            ]
        );
        assert!(t.ignored.is_empty() && t.refused.is_empty(), "{t:?}");
        let t = translate(&env(&[
            ("USE_PROMETHEUS", "true"),
            ("PROMETHEUS_ADDR", "[::1]:9091"),
            ("PROMETHEUS_MAPPER_YAML", "/m.yaml"),
            ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "true"),
        ]));
        assert_eq!(
            set(&t)[0],
            ("SHARDGATE_UPSTREAM_PROMETHEUS_ADDR", "[::1]:9091")
        );
        // With a file of its own, upstream does not look at the millisecond switch.
        assert_eq!(
            t.ignored,
            ["PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS (PROMETHEUS_MAPPER_YAML is set: the file says the unit)"]
        );
        assert!(
            !t.read.iter().any(|r| r.starts_with("PROMETHEUS_RESPONSE")),
            "{t:?}"
        );

        // Off: USE_PROMETHEUS=false is what shardgate does; the rest means nothing.
        let t = translate(&env(&[
            ("USE_PROMETHEUS", "false"),
            ("PROMETHEUS_ADDR", ":1"),
        ]));
        assert!(t.set.is_empty(), "{t:?}");
        assert_eq!(
            (t.read, t.ignored),
            (
                vec!["USE_PROMETHEUS".to_string()],
                vec!["PROMETHEUS_ADDR".to_string()]
            )
        );
        // Stats disabled: upstream runs no sink; nothing is served.
        let t = translate(&env(&[
            ("USE_PROMETHEUS", "true"),
            ("DISABLE_STATS", "true"),
        ]));
        assert!(t.set.is_empty() && t.refused.is_empty(), "{t:?}");

        // One sink at a time, as upstream; and malformed values.
        for (bad, named) in [
            (
                ("USE_STATSD", "true"),
                "USE_STATSD=true and USE_PROMETHEUS=true",
            ),
            (("PROMETHEUS_ADDR", "19001"), "PROMETHEUS_ADDR=19001"),
            (("PROMETHEUS_ADDR", ":port"), "PROMETHEUS_ADDR=:port"),
            (("PROMETHEUS_PATH", "metrics"), "PROMETHEUS_PATH=metrics"),
            (
                ("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "yes"),
                "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS=yes",
            ),
        ] {
            let t = translate(&env(&[("USE_PROMETHEUS", "true"), bad]));
            assert_eq!(t.refused.len(), 1, "{t:?}");
            assert!(t.refused[0].contains(named), "{named}: {:?}", t.refused);
        }
        let t = translate(&env(&[("USE_PROMETHEUS", "sometimes")]));
        assert_eq!(t.refused, vec!["USE_PROMETHEUS: not a boolean".to_string()]);
    }

    #[test]
    fn an_upstream_deployment_maps_to_ours() {
        // The environment of upstream's example Deployment, with TLS and the switches.
        let t = translate(&env(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("GRPC_PORT", "9081"),
            ("PORT", "9080"),
            ("LOG_LEVEL", "debug"),
            ("LOG_FORMAT", "json"),
            ("SHADOW_MODE", "True"),
            ("MERGE_DOMAIN_CONFIG", "true"),
            ("RESPONSE_DYNAMIC_METADATA", "1"),
            ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
            ("LIMIT_RESET_HEADER", "X-Reset"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_SERVER_TLS_CERT", "/tls/cert.pem"),
            ("GRPC_SERVER_TLS_KEY", "/tls/key.pem"),
            ("USE_STATSD", "false"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "redis:6379"),
            ("BACKEND_TYPE", "redis"),
        ]));
        assert_eq!(
            set(&t),
            [
                ("SHARDGATE_CONFIG", "/data/ratelimit/config"),
                ("SHARDGATE_GRPC_ADDR", "0.0.0.0:9081"),
                ("SHARDGATE_HTTP_ADDR", "0.0.0.0:9080"),
                ("RUST_LOG", "debug"),
                ("SHARDGATE_LOG_FORMAT", "json"),
                ("SHARDGATE_GLOBAL_SHADOW_MODE", "true"),
                ("SHARDGATE_MERGE_DOMAIN_CONFIG", "true"),
                ("SHARDGATE_RESPONSE_DYNAMIC_METADATA", "true"),
                ("SHARDGATE_RATE_LIMIT_HEADERS", "true"),
                ("SHARDGATE_RESET_HEADER", "X-Reset"),
                ("SHARDGATE_TLS_CERT", "/tls/cert.pem"),
                ("SHARDGATE_TLS_KEY", "/tls/key.pem"),
                ("SHARDGATE_STORE", "redis"),
                ("SHARDGATE_REDIS_URL", "redis://redis:6379"),
                ("SHARDGATE_REDIS_MODE", "single"),
            ]
        );
        assert!(t.ignored.is_empty(), "{:?}", t.ignored);
        assert!(t.refused.is_empty(), "{:?}", t.refused);
        // The values shardgate does not follow stay named.
        let t = translate(&env(&[
            ("RUNTIME_ROOT", "/data"),
            ("RUNTIME_WATCH_ROOT", "true"),
            ("RUNTIME_IGNOREDOTFILES", "false"),
        ]));
        assert_eq!(t.ignored, ["RUNTIME_IGNOREDOTFILES", "RUNTIME_WATCH_ROOT"]);
    }

    #[test]
    fn ours_win_and_nothing_is_set_without_upstream_variables() {
        let t = translate(&env(&[
            ("GRPC_PORT", "9081"),
            ("SHARDGATE_GRPC_ADDR", "127.0.0.1:7000"),
            ("LOG_LEVEL", "warn"),
            ("RUST_LOG", "shardgate=trace"),
        ]));
        assert!(t.set.is_empty(), "{:?}", t.set);
        assert_eq!(translate(&env(&[("PATH", "/bin")])), Translation::default());
    }

    #[test]
    fn defaults_fill_what_upstream_leaves_out() {
        let t = translate(&env(&[
            ("RUNTIME_SUBDIRECTORY", "rl"),
            ("GRPC_HOST", "127.0.0.1"),
        ]));
        assert_eq!(
            set(&t),
            [
                ("SHARDGATE_CONFIG", "/srv/runtime_data/current/rl/config"),
                ("SHARDGATE_GRPC_ADDR", "127.0.0.1:8081"),
            ]
        );
    }

    #[test]
    fn settings_that_cannot_be_followed_are_refused_by_name() {
        let t = translate(&env(&[
            ("GRPC_PORT", "eighty"),
            ("LOG_LEVEL", "loud"),
            ("SHADOW_MODE", "yes"),
            ("GRPC_SERVER_USE_TLS", "true"),
            ("GRPC_CLIENT_TLS_SAN", "client.example"),
            ("CONFIG_TYPE", "GRPC_XDS_DELTA"),
            ("GRPC_UDS", "/tmp/rl.sock"),
        ]));
        let refused = t.refused.join("\n");
        for needle in [
            "GRPC_HOST/GRPC_PORT: eighty: not a port",
            "LOG_LEVEL=loud",
            "SHADOW_MODE=yes: not a boolean",
            "GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT",
            "GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_KEY",
            "GRPC_CLIENT_TLS_SAN",
            "CONFIG_TYPE=GRPC_XDS_DELTA",
            "GRPC_UDS",
        ] {
            assert!(refused.contains(needle), "{needle} not in:\n{refused}");
        }
    }

    #[test]
    fn the_connection_age_is_read_as_go_writes_durations() {
        let t = translate(&env(&[
            ("GRPC_MAX_CONNECTION_AGE", "1h30m"),
            ("GRPC_MAX_CONNECTION_AGE_GRACE", "1h"),
        ]));
        assert_eq!(set(&t), [("SHARDGATE_GRPC_MAX_CONNECTION_AGE", "1h 30m")]);
        assert_eq!(t.ignored, ["GRPC_MAX_CONNECTION_AGE_GRACE"]);
        let secs = Duration::from_secs_f64;
        for (go, want) in [
            ("24h", secs(86_400.0)),
            ("1.5h", secs(5_400.0)),
            ("90s", secs(90.0)),
            ("300ms", secs(0.3)),
            ("2m0.5s", secs(120.5)),
            ("+10m", secs(600.0)),
            ("0", secs(0.0)),
            ("0s", secs(0.0)),
            ("1µs", secs(1e-6)),
        ] {
            assert_eq!(go_duration(go), Some(want), "{go}");
        }
        for bad in ["", "24", "-1h", "1d", "h", "1..5s", ".s", "1h 30m", "ten"] {
            assert_eq!(go_duration(bad), None, "{bad:?}");
        }
        let t = translate(&env(&[("GRPC_MAX_CONNECTION_AGE", "1 day")]));
        assert!(t.refused[0].starts_with("GRPC_MAX_CONNECTION_AGE=1 day: not a duration"));
    }

    #[test]
    fn tls_files_without_use_tls_are_ignored_like_upstream() {
        let t = translate(&env(&[("GRPC_SERVER_TLS_CERT", "/c.pem")]));
        assert!(t.set.is_empty());
        assert_eq!(
            t.ignored,
            ["GRPC_SERVER_TLS_CERT (GRPC_SERVER_USE_TLS is not true)"]
        );
    }
}

//! envoyproxy/ratelimit's environment variables, read as aliases of ours, so that an
//! existing Deployment keeps working when its image is swapped for shardgate.
//!
//! Owns the translation only: a pure function from the process environment to the
//! `SHARDGATE_*` variables (and `RUST_LOG`) it implies, the upstream variables it cannot
//! honour, and the ones that would change behaviour in a way shardgate cannot follow
//! (refused, so the server does not start on the wrong assumption). Ours always win: a
//! `SHARDGATE_*` variable already set is never overwritten (where it disagrees with the
//! upstream one, that is remembered, to be said once at start), and a flag beats both.
//! Where upstream's environment is in use, upstream's defaults apply where ours differ
//! (statsd). `main` applies the result before parsing its arguments; `report.rs` logs it
//! once. The table of what is honoured is in docs/configuration.md.
//!
//! This file is the driver: the translation's shape and the order the readers run in.
//! `server.rs` reads the server's own settings (rules, ports, logs, switches, gRPC TLS),
//! `redis.rs` the Redis backend's, `xds.rs` the rule source's, `statsd.rs`,
//! `prometheus.rs` and `tracing.rs` the stats and span exports'; `reader.rs` remembers
//! what was looked at, `ignored.rs` names what is not, `go_values.rs` parses Go's
//! spellings of values, `report.rs` words the start-up log.

mod go_values;
mod ignored;
mod prometheus;
mod reader;
mod redis;
mod report;
mod server;
mod statsd;
#[cfg(test)]
mod test_env;
mod tracing;
mod translation;
mod xds;

use std::collections::BTreeMap;

use reader::Reader;
pub use report::log_start_up;
pub use translation::{Alias, Overridden, Translation};

/// Translates `env` (the process environment).
pub fn translate(env: &BTreeMap<String, String>) -> Translation {
    let mut r = Reader::new(env);
    server::rule_directory(&mut r);
    server::listen_addrs(&mut r);
    server::debug_port(&mut r);
    server::logging(&mut r);
    server::switches(&mut r);
    server::connection_age(&mut r);
    server::grpc_tls(&mut r);
    redis::redis(&mut r);
    // Upstream's environment is in use once one of its variables was honoured: then
    // its defaults apply where ours differ (statsd on).
    let upstream_in_use = !r.t.set.is_empty();
    let mut consumed = statsd::statsd(env, &mut r.t, upstream_in_use);
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
    // Where rules come from (`CONFIG_TYPE`), then the gRPC socket's kind.
    xds::rule_source(&mut r);
    server::grpc_socket(&mut r);
    r.finish(&consumed)
}

#[cfg(test)]
mod tests {
    use super::go_values::go_duration;
    use super::test_env::{env, set};
    use super::*;
    use std::time::Duration;

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
                ("RUST_LOG", "warn,shardgate=debug"),
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
        // Each disagreement is remembered, to be said once at start.
        let overridden: Vec<(&str, &str, &str, &str)> = t
            .overridden
            .iter()
            .map(|o| {
                (
                    o.ours,
                    o.ours_value.as_str(),
                    o.from,
                    o.upstream_value.as_str(),
                )
            })
            .collect();
        assert_eq!(
            overridden,
            [
                (
                    "SHARDGATE_GRPC_ADDR",
                    "127.0.0.1:7000",
                    "GRPC_PORT",
                    "0.0.0.0:9081"
                ),
                ("RUST_LOG", "shardgate=trace", "LOG_LEVEL", "warn"),
            ]
        );
        // Agreeing is not overriding.
        let t = translate(&env(&[
            ("GRPC_PORT", "9081"),
            ("SHARDGATE_GRPC_ADDR", "0.0.0.0:9081"),
        ]));
        assert!(t.set.is_empty() && t.overridden.is_empty(), "{t:?}");
        assert_eq!(translate(&env(&[("PATH", "/bin")])), Translation::default());
    }

    #[test]
    fn every_server_address_variable_is_honoured_or_named() {
        // A setting is named by the variable that gave it, never by an unset one.
        let t = translate(&env(&[
            ("RUNTIME_SUBDIRECTORY", "rl"),
            ("GRPC_HOST", "127.0.0.1"),
            ("PORT", "9080"),
            ("DEBUG_PORT", "6070"),
        ]));
        let from: Vec<(&str, &str, bool)> = t
            .set
            .iter()
            .filter(|a| !a.ours.starts_with("SHARDGATE_STATSD"))
            .map(|a| (a.ours, a.from, a.from_set))
            .collect();
        assert_eq!(
            from,
            [
                ("SHARDGATE_CONFIG", "RUNTIME_SUBDIRECTORY", true),
                ("SHARDGATE_GRPC_ADDR", "GRPC_HOST", true),
                ("SHARDGATE_HTTP_ADDR", "PORT", true),
            ]
        );
        assert_eq!(t.ignored.len(), 1, "{:?}", t.ignored);
        assert!(
            t.ignored[0].starts_with("DEBUG_PORT (") && t.ignored[0].contains("/rlconfig"),
            "{:?}",
            t.ignored
        );
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
                // USE_STATSD's default is true upstream.
                ("SHARDGATE_STATSD_ADDR", "localhost:8125"),
                ("SHARDGATE_STATSD_PROTOCOL", "tcp"),
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
            ("USE_STATSD", "false"),
        ]));
        assert_eq!(
            set(&t),
            [
                ("SHARDGATE_GRPC_MAX_CONNECTION_AGE", "1h 30m"),
                ("SHARDGATE_GRPC_MAX_CONNECTION_AGE_GRACE", "1h")
            ]
        );
        assert!(t.ignored.is_empty(), "{:?}", t.ignored);
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

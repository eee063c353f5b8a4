//! upstream's Prometheus sink settings (`USE_PROMETHEUS`, `PROMETHEUS_ADDR`,
//! `PROMETHEUS_PATH`, `PROMETHEUS_MAPPER_YAML`, `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`),
//! read as our upstream Prometheus port's, and upstream's rule that one stats sink runs at
//! a time. A translation only: the mapping file is not opened here (the server reads it
//! at start and stops on what it cannot follow).

use std::collections::BTreeMap;

use super::go_values::{go_bool, listen_addr};
use super::Translation;

/// upstream's default `PROMETHEUS_ADDR`.
const DEFAULT_ADDR: &str = ":9090";

/// upstream's Prometheus port: with `USE_PROMETHEUS=true` (and stats not disabled), on
/// `PROMETHEUS_ADDR` (`:9090`: every interface), at `PROMETHEUS_PATH` (`/metrics`), named
/// by `PROMETHEUS_MAPPER_YAML` or upstream's own mapping, whose response time
/// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS` keeps in milliseconds. Refused with
/// `USE_STATSD=true` beside it, as upstream stops then. Returns the upstream names read,
/// which are then not reported as ignored.
pub(super) fn prometheus(env: &BTreeMap<String, String>, t: &mut Translation) -> Vec<&'static str> {
    let get = |k: &str| env.get(k).map(String::as_str);
    let on = match get("USE_PROMETHEUS").map(go_bool) {
        Some(Some(on)) => on,
        Some(None) => {
            t.refused.push("USE_PROMETHEUS: not a boolean".into());
            return Vec::new();
        }
        None => false,
    };
    // Upstream runs no sink at all with stats disabled: nothing here is then read.
    if get("DISABLE_STATS").and_then(go_bool) == Some(true) {
        return Vec::new();
    }
    if !on {
        return vec!["USE_PROMETHEUS"];
    }
    if get("USE_STATSD").and_then(go_bool) == Some(true) {
        t.refused.push(
            "USE_STATSD=true and USE_PROMETHEUS=true: upstream runs one stats sink at a time \
             and stops on both; set one of them to false"
                .into(),
        );
        return vec!["USE_PROMETHEUS"];
    }
    let mut read = vec!["USE_PROMETHEUS"];
    read.extend(port(env, t));
    read.extend(mapping(env, t));
    read
}

/// `PROMETHEUS_ADDR` and `PROMETHEUS_PATH` (empty: upstream's defaults).
fn port(env: &BTreeMap<String, String>, t: &mut Translation) -> Vec<&'static str> {
    let non_empty = |k: &str| env.get(k).map(String::as_str).filter(|v| !v.is_empty());
    let (from, addr) = match non_empty("PROMETHEUS_ADDR") {
        Some(addr) => ("PROMETHEUS_ADDR", addr),
        None => ("USE_PROMETHEUS", DEFAULT_ADDR),
    };
    match go_listen_addr(addr) {
        Ok(addr) => t.alias(env, "SHARDGATE_UPSTREAM_PROMETHEUS_ADDR", from, addr),
        Err(e) => t.refused.push(format!(
            "PROMETHEUS_ADDR={}: {e}",
            crate::support::text::elide(addr, 64)
        )),
    }
    if let Some(path) = non_empty("PROMETHEUS_PATH") {
        if path.starts_with('/') {
            t.alias(
                env,
                "SHARDGATE_UPSTREAM_PROMETHEUS_PATH",
                "PROMETHEUS_PATH",
                path.into(),
            );
        } else {
            t.refused.push(format!(
                "PROMETHEUS_PATH={}: not a path (it starts with /)",
                crate::support::text::elide(path, 64)
            ));
        }
    }
    vec!["PROMETHEUS_ADDR", "PROMETHEUS_PATH"]
}

/// `PROMETHEUS_MAPPER_YAML` (empty: upstream's own mapping) and
/// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`, which only changes upstream's own mapping.
fn mapping(env: &BTreeMap<String, String>, t: &mut Translation) -> Vec<&'static str> {
    let file = env
        .get("PROMETHEUS_MAPPER_YAML")
        .filter(|path| !path.is_empty());
    if let Some(path) = file {
        t.alias(
            env,
            "SHARDGATE_UPSTREAM_PROMETHEUS_MAPPING",
            "PROMETHEUS_MAPPER_YAML",
            path.clone(),
        );
    }
    const MS: &str = "PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS";
    match env.get(MS).map(|v| (v, go_bool(v))) {
        Some((_, Some(true))) if file.is_some() => t.ignored.push(format!(
            "{MS} (PROMETHEUS_MAPPER_YAML is set: the file says the unit)"
        )),
        Some((_, Some(true))) => t.alias(
            env,
            "SHARDGATE_UPSTREAM_PROMETHEUS_RESPONSE_TIME_MS",
            MS,
            "true".into(),
        ),
        Some((_, Some(false))) | None => {}
        Some((v, None)) => t.refused.push(format!(
            "{MS}={}: not a boolean",
            crate::support::text::elide(v, 32)
        )),
    }
    vec!["PROMETHEUS_MAPPER_YAML", MS]
}

/// A Go listen address (`host:port`, `[v6]:port`, or `:port` for every interface) as a
/// socket address; a host name is resolved, as upstream's listener would.
fn go_listen_addr(addr: &str) -> Result<String, String> {
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| "not host:port (e.g. :19001)".to_string())?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    listen_addr(if host.is_empty() { "0.0.0.0" } else { host }, port)
}

#[cfg(test)]
mod tests {
    use super::super::test_env::{env, set};
    use super::super::translate;

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
}

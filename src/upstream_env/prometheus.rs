//! upstream's Prometheus sink settings (`USE_PROMETHEUS`, `PROMETHEUS_ADDR`,
//! `PROMETHEUS_PATH`, `PROMETHEUS_MAPPER_YAML`, `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`),
//! read as our upstream Prometheus port's, and upstream's rule that one stats sink runs at
//! a time. A translation only: the mapping file is not opened here (the server reads it
//! at start and stops on what it cannot follow).

use std::collections::BTreeMap;

use super::{go_bool, listen_addr, Alias, Translation};

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

/// Sets `ours` from upstream's `from`, unless `ours` is set already (ours win).
fn alias(
    env: &BTreeMap<String, String>,
    t: &mut Translation,
    ours: &'static str,
    from: &'static str,
    value: String,
) {
    if !env.contains_key(ours) {
        t.set.push(Alias { ours, value, from });
    }
}

/// `PROMETHEUS_ADDR` and `PROMETHEUS_PATH` (empty: upstream's defaults).
fn port(env: &BTreeMap<String, String>, t: &mut Translation) -> Vec<&'static str> {
    let non_empty = |k: &str| env.get(k).map(String::as_str).filter(|v| !v.is_empty());
    let (from, addr) = match non_empty("PROMETHEUS_ADDR") {
        Some(addr) => ("PROMETHEUS_ADDR", addr),
        None => ("USE_PROMETHEUS", DEFAULT_ADDR),
    };
    match go_listen_addr(addr) {
        Ok(addr) => alias(env, t, "SHARDGATE_UPSTREAM_PROMETHEUS_ADDR", from, addr),
        Err(e) => t.refused.push(format!(
            "PROMETHEUS_ADDR={}: {e}",
            crate::support::text::elide(addr, 64)
        )),
    }
    if let Some(path) = non_empty("PROMETHEUS_PATH") {
        if path.starts_with('/') {
            alias(
                env,
                t,
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
        alias(
            env,
            t,
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
        Some((_, Some(true))) => alias(
            env,
            t,
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

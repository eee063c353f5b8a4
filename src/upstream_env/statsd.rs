//! upstream's statsd settings (`USE_STATSD`, `STATSD_*`, `STATS_FLUSH_INTERVAL`,
//! `EXTRA_TAGS`, `DISABLE_STATS`), read as our statsd export's. A translation only.

use std::collections::BTreeMap;

use super::{go_bool, go_duration, Alias, Translation};

/// statsd as upstream sends it: with `USE_STATSD=true` (and stats not disabled), to
/// `STATSD_HOST:STATSD_PORT` (`localhost:8125`) over `STATSD_PROTOCOL` (its stats
/// library's default, TCP), every `STATS_FLUSH_INTERVAL`, `EXTRA_TAGS` on its names.
/// `USE_STATSD=false` is honoured as it is (shardgate sends no statsd unless asked); the
/// settings it leaves without meaning are then reported as ignored. Returns the upstream
/// names read, which are then not reported as ignored.
pub(super) fn statsd(env: &BTreeMap<String, String>, t: &mut Translation) -> Vec<&'static str> {
    let get = |k: &str| env.get(k).map(String::as_str);
    let alias = |t: &mut Translation, ours: &'static str, from: &'static str, value: String| {
        if !env.contains_key(ours) {
            t.set.push(Alias { ours, value, from });
        }
    };
    if get("USE_DOG_STATSD").and_then(go_bool) == Some(true) {
        t.refused.push(
            "USE_DOG_STATSD=true: shardgate sends plain statsd (USE_STATSD), not DogStatsD".into(),
        );
    }
    let on = match get("USE_STATSD").map(go_bool) {
        Some(Some(on)) => on,
        Some(None) => {
            t.refused.push("USE_STATSD: not a boolean".into());
            return Vec::new();
        }
        None => false,
    };
    if get("DISABLE_STATS").and_then(go_bool) == Some(true) {
        return Vec::new();
    }
    if !on {
        return vec!["USE_STATSD"];
    }
    let host = get("STATSD_HOST").unwrap_or("localhost");
    let port = get("STATSD_PORT").unwrap_or("8125");
    match port.parse::<u16>() {
        Ok(port) if host.contains(':') && !host.starts_with('[') => alias(
            t,
            "SHARDGATE_STATSD_ADDR",
            "USE_STATSD",
            format!("[{host}]:{port}"),
        ),
        Ok(port) => alias(
            t,
            "SHARDGATE_STATSD_ADDR",
            "USE_STATSD",
            format!("{host}:{port}"),
        ),
        Err(_) => t.refused.push(format!(
            "STATSD_PORT={}: not a port",
            crate::support::text::elide(port, 32)
        )),
    }
    match get("STATSD_PROTOCOL")
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None => alias(t, "SHARDGATE_STATSD_PROTOCOL", "USE_STATSD", "tcp".into()),
        Some(p @ ("tcp" | "udp")) => {
            alias(t, "SHARDGATE_STATSD_PROTOCOL", "STATSD_PROTOCOL", p.into())
        }
        Some(other) => t.refused.push(format!(
            "STATSD_PROTOCOL={}: not tcp or udp",
            crate::support::text::elide(other, 32)
        )),
    }
    if let Some(interval) = get("STATS_FLUSH_INTERVAL") {
        match go_duration(interval).filter(|d| !d.is_zero()) {
            Some(d) => alias(
                t,
                "SHARDGATE_STATSD_FLUSH_INTERVAL",
                "STATS_FLUSH_INTERVAL",
                humantime::format_duration(d).to_string(),
            ),
            None => t.refused.push(format!(
                "STATS_FLUSH_INTERVAL={}: not a positive duration (e.g. 10s)",
                crate::support::text::elide(interval, 64)
            )),
        }
    }
    if let Some(tags) = get("EXTRA_TAGS") {
        match crate::service::metrics::statsd::parse_tags(tags) {
            Ok(_) => alias(t, "SHARDGATE_STATSD_TAGS", "EXTRA_TAGS", tags.into()),
            Err(e) => t.refused.push(format!(
                "EXTRA_TAGS: {}",
                crate::support::text::elide(&e, 96)
            )),
        }
    }
    vec![
        "USE_STATSD",
        "STATSD_HOST",
        "STATSD_PORT",
        "STATSD_PROTOCOL",
        "STATS_FLUSH_INTERVAL",
        "EXTRA_TAGS",
        "DISABLE_STATS",
    ]
}

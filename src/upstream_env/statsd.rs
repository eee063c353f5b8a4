//! upstream's statsd settings (`USE_STATSD`, `STATSD_*`, `STATS_FLUSH_INTERVAL`,
//! `EXTRA_TAGS`, `DISABLE_STATS`), read as our statsd export's. A translation only.

use std::collections::BTreeMap;

use super::go_values::{go_bool, go_duration};
use super::Translation;

/// statsd as upstream sends it: with `USE_STATSD=true` (and stats not disabled), to
/// `STATSD_HOST:STATSD_PORT` (`localhost:8125`) over `STATSD_PROTOCOL` (its stats
/// library's default, TCP), every `STATS_FLUSH_INTERVAL`, `EXTRA_TAGS` on its names.
/// `USE_STATSD` unset is upstream's default, true, wherever upstream's environment is in
/// use (`upstream_in_use`: some other upstream variable was honoured) and its Prometheus
/// sink is not asked for: a Deployment whose dashboards read a statsd_exporter keeps them
/// fed (issue 48). Without upstream's environment shardgate sends no statsd unless asked.
/// `USE_STATSD=false` is honoured as it is; the settings it leaves without meaning are
/// then reported as ignored. Returns the upstream names read, which are then not reported
/// as ignored.
pub(super) fn statsd(
    env: &BTreeMap<String, String>,
    t: &mut Translation,
    upstream_in_use: bool,
) -> Vec<&'static str> {
    let get = |k: &str| env.get(k).map(String::as_str);
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
        None => {
            let prometheus = get("USE_PROMETHEUS").and_then(go_bool) == Some(true);
            upstream_in_use && !prometheus
        }
    };
    if get("DISABLE_STATS").and_then(go_bool) == Some(true) {
        return Vec::new();
    }
    if !on {
        return vec!["USE_STATSD"];
    }
    destination(env, t);
    flushes(env, t);
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

/// Where the stats go: `STATSD_HOST:STATSD_PORT` over `STATSD_PROTOCOL` (TCP unless set).
fn destination(env: &BTreeMap<String, String>, t: &mut Translation) {
    let get = |k: &str| env.get(k).map(String::as_str);
    let host = get("STATSD_HOST").unwrap_or("localhost");
    let port = get("STATSD_PORT").unwrap_or("8125");
    match port.parse::<u16>() {
        Ok(port) if host.contains(':') && !host.starts_with('[') => t.alias(
            env,
            "SHARDGATE_STATSD_ADDR",
            "USE_STATSD",
            format!("[{host}]:{port}"),
        ),
        Ok(port) => t.alias(
            env,
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
        None => t.alias(env, "SHARDGATE_STATSD_PROTOCOL", "USE_STATSD", "tcp".into()),
        Some(p @ ("tcp" | "udp")) => t.alias(
            env,
            "SHARDGATE_STATSD_PROTOCOL",
            "STATSD_PROTOCOL",
            p.into(),
        ),
        Some(other) => t.refused.push(format!(
            "STATSD_PROTOCOL={}: not tcp or udp",
            crate::support::text::elide(other, 32)
        )),
    }
}

/// How they are sent: every `STATS_FLUSH_INTERVAL`, with `EXTRA_TAGS` on their names.
fn flushes(env: &BTreeMap<String, String>, t: &mut Translation) {
    let get = |k: &str| env.get(k).map(String::as_str);
    if let Some(interval) = get("STATS_FLUSH_INTERVAL") {
        match go_duration(interval).filter(|d| !d.is_zero()) {
            Some(d) => t.alias(
                env,
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
            Ok(_) => t.alias(env, "SHARDGATE_STATSD_TAGS", "EXTRA_TAGS", tags.into()),
            Err(e) => t.refused.push(format!(
                "EXTRA_TAGS: {}",
                crate::support::text::elide(&e, 96)
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_env::{env, set};
    use super::super::translate;

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
    fn under_upstreams_environment_statsd_is_on_by_default_as_upstream_has_it() {
        // An upstream Deployment that never set USE_STATSD: upstream sends statsd to
        // localhost:8125, and so does shardgate, saying it came from the default.
        let t = translate(&env(&[
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("REDIS_URL", "r:6379"),
        ]));
        let statsd: Vec<_> = t
            .set
            .iter()
            .filter(|a| a.ours.starts_with("SHARDGATE_STATSD"))
            .map(|a| (a.ours, a.value.as_str(), a.from, a.from_set))
            .collect();
        assert_eq!(
            statsd,
            [
                (
                    "SHARDGATE_STATSD_ADDR",
                    "localhost:8125",
                    "USE_STATSD",
                    false
                ),
                ("SHARDGATE_STATSD_PROTOCOL", "tcp", "USE_STATSD", false),
            ]
        );
        // No upstream variable, or upstream's Prometheus sink instead: no statsd.
        assert!(translate(&env(&[("STATSD_PORT", "9125")])).set.is_empty());
        let t = translate(&env(&[
            ("REDIS_URL", "r:6379"),
            ("REDIS_SOCKET_TYPE", "tcp"),
            ("USE_PROMETHEUS", "true"),
        ]));
        assert!(
            !t.set.iter().any(|a| a.ours.starts_with("SHARDGATE_STATSD")),
            "{t:?}"
        );
    }
}

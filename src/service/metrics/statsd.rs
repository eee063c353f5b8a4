//! statsd export in envoyproxy/ratelimit's stat names, for deployments whose dashboards
//! read a statsd_exporter (Envoy Gateway runs one beside the rate-limit server).
//!
//! Owns the names, the deltas between two flushes, the line format, the packing of lines
//! into datagrams and the socket. It reads the same totals `/metrics` serves, once per
//! flush interval, in a task of its own: nothing here runs on a request's path, and a
//! statsd that is down or slow costs the requests nothing (a send that fails is logged,
//! at most once a minute, and its deltas are dropped, as a UDP loss would drop them).
//!
//! What is sent, every flush (upstream's names; the counters as deltas):
//! - `ratelimit.service.rate_limit.<stats key>.{total_hits,over_limit,near_limit,
//!   within_limit,shadow_mode}`, where the stats key is `<domain>.<key>_<value>…` as in
//!   `/metrics`' `key` label;
//! - `ratelimit.service.config_load_success`, `ratelimit.service.config_load_error`;
//! - `ratelimit_server.ShouldRateLimit.total_requests`, and the call latency as the timer
//!   `ratelimit_server.ShouldRateLimit.response_time` (ms). Latency is kept as a
//!   histogram, never per call: each bucket that moved is sent as one timer line at the
//!   bucket's upper bound with a sample rate of `1/count`, which a statsd_exporter
//!   observes `count` times.
//!
//! Extra tags (`EXTRA_TAGS`) are appended to the `ratelimit.` names as upstream's stats
//! library writes tags into a statsd name: `.__<tag>=<value>`, sorted by tag.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};

use super::Metrics;

/// How often upstream flushes its stats (`STATS_FLUSH_INTERVAL`'s default).
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(10);

/// The largest datagram sent: fits an Ethernet MTU after IP and UDP headers, so no
/// statsd line is lost to fragmentation.
const MAX_DATAGRAM_BYTES: usize = 1432;

/// The longest a TCP connect or write may take before the flush gives up on it.
const TCP_PATIENCE: Duration = Duration::from_secs(2);

/// How often a failing statsd is logged.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// Where and how stats are sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsdOptions {
    /// `host:port`, resolved again at every flush (a statsd behind a Service may move).
    pub addr: String,
    pub protocol: StatsdProtocol,
    pub flush_interval: Duration,
    /// Tags for the `ratelimit.` names, in the order given (sorted when written).
    pub tags: Vec<StatsdTag>,
}

/// The transport to statsd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsdProtocol {
    /// Datagrams of whole lines, at most [`MAX_DATAGRAM_BYTES`] each.
    Udp,
    /// One connection, kept; lines separated by newlines (upstream's default).
    Tcp,
}

/// One extra tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsdTag {
    pub name: String,
    pub value: String,
}

/// Parses `EXTRA_TAGS`' form, `name:value,name:value`.
pub fn parse_tags(text: &str) -> Result<Vec<StatsdTag>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once(':') {
            Some((name, value)) if !name.trim().is_empty() => Ok(StatsdTag {
                name: name.trim().to_string(),
                value: value.trim().to_string(),
            }),
            _ => Err(format!("statsd tag '{pair}' is not name:value")),
        })
        .collect()
}

/// Cumulative totals read at one flush.
#[derive(Debug, Default, Clone, PartialEq)]
pub(super) struct Reading {
    /// Counter name (upstream's, without tags) and its total since the start.
    pub(super) counters: Vec<(String, u64)>,
    /// The call latency histogram: (upper bound in seconds, count in that bucket).
    pub(super) latency: Vec<(f64, u64)>,
}

/// The previous flush's totals, to send deltas.
#[derive(Debug, Default)]
struct Deltas {
    counters: HashMap<String, u64>,
    latency: Vec<u64>,
}

impl Deltas {
    /// The lines for what moved since the previous reading (none for what did not).
    fn lines(&mut self, reading: &Reading, tags: &str) -> Vec<String> {
        let mut lines = Vec::new();
        for (name, total) in &reading.counters {
            let last = self.counters.insert(name.clone(), *total).unwrap_or(0);
            let delta = total.saturating_sub(last);
            if delta > 0 {
                let tags = if name.starts_with("ratelimit.") {
                    tags
                } else {
                    ""
                };
                lines.push(format!("{name}{tags}:{delta}|c"));
            }
        }
        self.latency.resize(reading.latency.len(), 0);
        let mut lower_bound = 0.0;
        for ((upper, total), last) in reading.latency.iter().zip(&mut self.latency) {
            let delta = total.saturating_sub(*last);
            *last = *total;
            // The `+Inf` bucket's calls took longer than the last finite bound.
            let at = if *upper == f64::MAX {
                lower_bound
            } else {
                *upper
            };
            lower_bound = at;
            if delta > 0 {
                let ms = at * 1_000.0;
                let line = if delta == 1 {
                    format!("{RESPONSE_TIME}:{ms}|ms")
                } else {
                    format!("{RESPONSE_TIME}:{ms}|ms|@{}", 1.0 / delta as f64)
                };
                lines.push(line);
            }
        }
        lines
    }
}

const RESPONSE_TIME: &str = "ratelimit_server.ShouldRateLimit.response_time";

/// Upstream's stats library's form of tags in a statsd name.
fn tag_suffix(tags: &[StatsdTag]) -> String {
    let mut sorted: Vec<&StatsdTag> = tags.iter().collect();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    sorted
        .iter()
        .map(|t| format!(".__{}={}", clean(&t.name), clean(&t.value)))
        .collect()
}

/// A name or value with the characters the statsd line format reserves replaced.
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            ':' | '|' | '@' | '\n' | '=' | ',' | '.' => '_',
            c => c,
        })
        .collect()
}

/// Whole lines packed into payloads of at most `max` bytes, newline-separated. A line
/// longer than `max` goes alone (the receiver may drop it; splitting it would corrupt it).
fn pack(lines: &[String], max: usize) -> Vec<Vec<u8>> {
    let mut payloads = Vec::new();
    let mut current: Vec<u8> = Vec::new();
    for line in lines {
        if !current.is_empty() && current.len() + 1 + line.len() > max {
            payloads.push(std::mem::take(&mut current));
        }
        if !current.is_empty() {
            current.push(b'\n');
        }
        current.extend_from_slice(line.as_bytes());
    }
    if !current.is_empty() {
        payloads.push(current);
    }
    payloads
}

/// The open transport.
enum Link {
    Udp(UdpSocket),
    Tcp(Option<TcpStream>),
}

impl Link {
    async fn send(&mut self, addr: &str, lines: &[String]) -> std::io::Result<()> {
        match self {
            Link::Udp(socket) => {
                let to = tokio::net::lookup_host(addr).await?.next().ok_or_else(|| {
                    std::io::Error::new(std::io::ErrorKind::NotFound, "no address")
                })?;
                for payload in pack(lines, MAX_DATAGRAM_BYTES) {
                    socket.send_to(&payload, to).await?;
                }
                Ok(())
            }
            Link::Tcp(stream) => {
                let mut text = lines.join("\n").into_bytes();
                text.push(b'\n');
                if stream.is_none() {
                    let connect = TcpStream::connect(addr);
                    *stream = Some(timeout(connect).await??);
                }
                let result = match stream.as_mut() {
                    Some(s) => timeout(s.write_all(&text)).await.and_then(|r| r),
                    None => Ok(()),
                };
                if result.is_err() {
                    // Reconnect at the next flush.
                    *stream = None;
                }
                result
            }
        }
    }
}

async fn timeout<T>(f: impl Future<Output = T>) -> std::io::Result<T> {
    tokio::time::timeout(TCP_PATIENCE, f)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "statsd timed out"))
}

/// Sends the stats every flush interval until `stopped` resolves, then once more.
pub async fn run(metrics: std::sync::Arc<Metrics>, options: StatsdOptions, stopped: impl Future) {
    let mut link = match options.protocol {
        StatsdProtocol::Tcp => Link::Tcp(None),
        StatsdProtocol::Udp => {
            let bind = if options.addr.starts_with('[') {
                "[::]:0"
            } else {
                "0.0.0.0:0"
            };
            match UdpSocket::bind(bind).await {
                Ok(socket) => Link::Udp(socket),
                Err(e) => {
                    tracing::error!(error = %e, "statsd: cannot open a UDP socket; no stats are sent");
                    return;
                }
            }
        }
    };
    let tags = tag_suffix(&options.tags);
    let mut deltas = Deltas::default();
    let mut warned: Option<Instant> = None;
    let mut tick = tokio::time::interval(options.flush_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    tokio::pin!(stopped);
    loop {
        let last = tokio::select! {
            _ = tick.tick() => false,
            _ = &mut stopped => true,
        };
        let lines = deltas.lines(&metrics.statsd_reading(), &tags);
        if !lines.is_empty() {
            if let Err(e) = link.send(&options.addr, &lines).await {
                if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                    tracing::warn!(addr = %options.addr, error = %e, "statsd: send failed; these stats are dropped");
                    warned = Some(Instant::now());
                }
            }
        }
        if last {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(counters: &[(&str, u64)], latency: &[(f64, u64)]) -> Reading {
        Reading {
            counters: counters.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
            latency: latency.to_vec(),
        }
    }

    #[test]
    fn counters_are_sent_as_deltas_and_only_when_they_moved() {
        let mut d = Deltas::default();
        let name = "ratelimit.service.rate_limit.d.user.total_hits";
        let first = d.lines(&reading(&[(name, 5)], &[]), "");
        assert_eq!(first, vec![format!("{name}:5|c")]);
        assert!(d.lines(&reading(&[(name, 5)], &[]), "").is_empty());
        let third = d.lines(&reading(&[(name, 12)], &[]), "");
        assert_eq!(third, vec![format!("{name}:7|c")]);
    }

    #[test]
    fn tags_go_on_the_ratelimit_names_in_upstreams_form_sorted() {
        let tags = parse_tags("zone:eu-1, app:rl").unwrap();
        let suffix = tag_suffix(&tags);
        assert_eq!(suffix, ".__app=rl.__zone=eu-1");
        let mut d = Deltas::default();
        let lines = d.lines(
            &reading(
                &[
                    ("ratelimit.service.config_load_success", 1),
                    ("ratelimit_server.ShouldRateLimit.total_requests", 3),
                ],
                &[],
            ),
            &suffix,
        );
        assert_eq!(
            lines,
            vec![
                "ratelimit.service.config_load_success.__app=rl.__zone=eu-1:1|c".to_string(),
                "ratelimit_server.ShouldRateLimit.total_requests:3|c".to_string(),
            ]
        );
        assert!(parse_tags("novalue").unwrap_err().contains("'novalue'"));
        assert!(parse_tags("").unwrap().is_empty());
        assert_eq!(clean("a.b:c|d"), "a_b_c_d");
    }

    #[test]
    fn latency_buckets_become_sampled_timer_lines() {
        let mut d = Deltas::default();
        let buckets = [(0.001, 4), (0.002, 1), (f64::MAX, 2)];
        let lines = d.lines(&reading(&[], &buckets), "");
        assert_eq!(
            lines,
            vec![
                format!("{RESPONSE_TIME}:1|ms|@0.25"),
                format!("{RESPONSE_TIME}:2|ms"),
                // Past the last bound: sent at the last bound, twice.
                format!("{RESPONSE_TIME}:2|ms|@0.5"),
            ]
        );
        let moved = [(0.001, 4), (0.002, 3), (f64::MAX, 2)];
        assert_eq!(
            d.lines(&reading(&[], &moved), ""),
            vec![format!("{RESPONSE_TIME}:2|ms|@0.5")]
        );
    }

    #[test]
    fn lines_are_packed_whole_into_datagrams() {
        let lines: Vec<String> = (0..100).map(|i| format!("name.{i:03}:1|c")).collect();
        let payloads = pack(&lines, 64);
        assert!(payloads.iter().all(|p| p.len() <= 64), "{payloads:?}");
        let rejoined: Vec<String> = payloads
            .iter()
            .flat_map(|p| {
                std::str::from_utf8(p)
                    .unwrap()
                    .lines()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(rejoined, lines);
        let long = vec!["x".repeat(100)];
        assert_eq!(pack(&long, 64), vec![long[0].clone().into_bytes()]);
    }
}

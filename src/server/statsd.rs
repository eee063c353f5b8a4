//! The statsd transport: the socket (UDP datagrams of whole lines, or one kept TCP
//! connection) and the flush timer. What is sent is the policy's
//! ([`StatsdLines`], `service/metrics/statsd.rs`); this file only carries it, in a task of
//! its own: a statsd that is down or slow costs the requests nothing. A send that fails
//! is logged (at most once a minute) and counted, and its deltas are kept for the next
//! one (`StatsdLines` moves its baseline only on success), which is tried again with
//! backoff (from [`RETRY_FIRST`] doubling to [`RETRY_MAX`]) rather than at the next tick
//! only: an exporter sidecar that starts after the server gets every count. Only the last
//! flush at shutdown can be lost, and its lines are counted as dropped.

use std::future::Future;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, UdpSocket};

use crate::service::metrics::statsd::{StatsdLines, StatsdTag};
use crate::service::metrics::Metrics;

/// How often upstream flushes its stats (`STATS_FLUSH_INTERVAL`'s default).
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(10);

/// The largest datagram sent: fits an Ethernet MTU after IP and UDP headers, so no
/// statsd line is lost to fragmentation.
const MAX_DATAGRAM_BYTES: usize = 1432;

/// The longest a TCP connect or write may take before the flush gives up on it.
const TCP_PATIENCE: Duration = Duration::from_secs(2);

/// The first wait before a failed flush is tried again.
const RETRY_FIRST: Duration = Duration::from_millis(250);

/// The longest wait between two tries while statsd cannot be reached.
const RETRY_MAX: Duration = Duration::from_secs(5);

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
    let mut lines = StatsdLines::new(&options.tags);
    let mut warned: Option<Instant> = None;
    let mut tick = tokio::time::interval(options.flush_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    tokio::pin!(stopped);
    // While statsd fails: when to try again, and the wait after that.
    let mut retry: Option<(tokio::time::Instant, Duration)> = None;
    loop {
        let retry_at = retry.map(|(at, _)| at);
        let last = tokio::select! {
            _ = tick.tick(), if retry.is_none() => false,
            _ = tokio::time::sleep_until(retry_at.unwrap_or_else(tokio::time::Instant::now)), if retry.is_some() => false,
            _ = &mut stopped => true,
        };
        let sent = lines.next(&metrics);
        let result = if sent.is_empty() {
            Ok(())
        } else {
            link.send(&options.addr, &sent).await
        };
        match result {
            Ok(()) => {
                lines.sent();
                retry = None;
            }
            Err(e) => {
                metrics.statsd_send_failed();
                if last {
                    metrics.statsd_dropped(sent.len());
                }
                if warned.is_none_or(|at| at.elapsed() >= WARN_EVERY) {
                    tracing::warn!(addr = %options.addr, error = %e, lines = sent.len(), "statsd: send failed; its counts are kept and sent again with backoff");
                    warned = Some(Instant::now());
                }
                let wait = retry.map_or(RETRY_FIRST, |(_, w)| (w * 2).min(RETRY_MAX));
                retry = Some((tokio::time::Instant::now() + wait, wait));
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

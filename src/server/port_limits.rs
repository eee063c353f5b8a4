//! The gRPC port's HTTP/2 limits, each set on purpose: what one connection and one call
//! may hold, how long a silent peer is kept, how long a connection lives. Sized for Envoy,
//! which sends every rate-limit call of a worker over one or a few long-lived connections,
//! many streams at a time, each request a message of a few hundred bytes sent with its
//! headers.
//!
//! It owns the values and their application to hyper's HTTP/2 server builder; it serves
//! nothing.

use std::time::Duration;

/// What operators tune (`serve --grpc-*` flags); the rest is fixed below.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortLimits {
    /// Streams (calls) one connection may have open at once; a stream past it is refused
    /// with REFUSED_STREAM. h2 holds a client to it from its first frame, before the
    /// client has read it: Envoy opens another connection once it knows the limit, but
    /// bursts on each new one before then, and answers the refused calls by its
    /// failure_mode (a low value: [`PortLimits::burst_warning`]).
    pub max_concurrent_streams: u32,
    /// How often an idle connection is pinged to notice a peer that vanished without
    /// closing it (`None`: never).
    pub keepalive_interval: Option<Duration>,
    /// How long a ping may go unanswered before the connection is closed.
    pub keepalive_timeout: Duration,
    /// After this long a connection is sent GOAWAY: its calls in flight finish, the client
    /// opens a new one (`None`: connections live as long as their clients keep them).
    /// Jittered by up to a tenth either way for each connection (`connection/ending.rs`).
    pub max_connection_age: Option<Duration>,
    /// How long an aged connection's calls may take after its GOAWAY before the
    /// connection is closed anyway (a call that streams, health `Watch` or reflection, is
    /// ended at the GOAWAY).
    pub max_connection_age_grace: Duration,
    /// How long a new connection's client has to send the HTTP/2 preface before it is
    /// closed (a TCP client that connects and says nothing holds a connection's state).
    pub preface_timeout: Duration,
    /// The largest request message accepted, in bytes: a larger one is refused as soon as
    /// its 5-byte prefix announces it.
    pub max_message_bytes: u32,
}

/// 1024 streams per connection: Envoy multiplexes a worker's calls on one connection, and
/// opens another when this many are in flight on it (its first burst on that one is not
/// held to it: [`PortLimits::burst_warning`]); generous (1024 calls in flight, each
/// within Envoy's 20 ms timeout), and it bounds what one connection can make the server
/// hold to 1024 calls' worth.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 1024;

/// Below this many streams per connection a burst is likely to meet the limit before the
/// client has read it: HTTP/2's own advice for the setting's least value (RFC 9113, 6.5.2).
pub const LEAST_ADVISED_STREAMS: u32 = 100;

/// A minute between pings of an idle connection: a dead peer's connection (a node gone
/// without a FIN) is noticed within 80 s, at the cost of one small frame a minute.
pub const DEFAULT_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(60);

/// 20 s for a ping's answer: far above any round trip, short enough to free a dead
/// connection's state soon after its ping.
pub const DEFAULT_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// 30 s for an aged connection's calls to finish after its GOAWAY: far more than a
/// rate-limit call takes (its store's deadline, `--store-timeout`, is a second by
/// default), so only a call stuck past every deadline is cut.
pub const DEFAULT_MAX_CONNECTION_AGE_GRACE: Duration = Duration::from_secs(30);

/// 10 s for a client's preface, as for a TLS handshake (`tls.rs`): a client sends it with
/// its first bytes.
pub const PREFACE_TIMEOUT: Duration = Duration::from_secs(10);

/// 64 KiB per request message: a rate-limit request is a few hundred bytes; this leaves
/// room for dozens of descriptors with long values, and caps what one call can make the
/// server buffer (at gRPC's customary 4 MiB, a connection's 1024 streams could hold 4 GiB).
pub const DEFAULT_MAX_MESSAGE_BYTES: u32 = 64 * 1024;

/// Streams the server may reset itself (for a malformed request, a flow-control breach,
/// a stream refused past the limit) on one connection before it sends GOAWAY
/// ENHANCE_YOUR_CALM: h2's own default, which tonic's server turns off; set here so that no
/// builder's default decides it. Without it, a client
/// provoking resets while not reading makes the server queue them without end
/// (RUSTSEC-2024-0003).
const MAX_LOCAL_ERROR_RESET_STREAMS: usize = 1024;

/// Streams a client may open and reset before the server has accepted them, past which it
/// sends GOAWAY: h2's default since the HTTP/2 Rapid Reset attack (CVE-2023-44487), set
/// here so that no dependency update changes it silently.
const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;

/// 16 KiB of request headers per stream: Envoy sends a few hundred bytes (path, content
/// type, `grpc-timeout`, tracing headers); it bounds the decoded headers a stream holds.
const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;

/// 16 KiB frames, the protocol's default and smallest maximum: requests and answers are
/// far smaller, and larger frames only let a peer make the server buffer more at once.
const MAX_FRAME_BYTES: u32 = 16 * 1024;

/// A stream may be sent 64 KiB ahead of the server's reading (about the protocol's
/// default): the body is read as it arrives, so a larger window would only let a client
/// send more to a stream whose reader is busy.
const STREAM_WINDOW_BYTES: u32 = 64 * 1024;

/// A connection may be sent 1 MiB ahead of the server's reading, across its streams
/// (hyper's default): a few thousand concurrent requests in flight without waiting for a
/// window update.
const CONNECTION_WINDOW_BYTES: u32 = 1024 * 1024;

impl Default for PortLimits {
    fn default() -> PortLimits {
        PortLimits {
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            keepalive_interval: Some(DEFAULT_KEEPALIVE_INTERVAL),
            keepalive_timeout: DEFAULT_KEEPALIVE_TIMEOUT,
            // Off: Envoy's connections are meant to live long, and the port ages every
            // connection by the same amount, so connections opened together (a fleet's
            // restart) would all reconnect together, again at every age.
            max_connection_age: None,
            max_connection_age_grace: DEFAULT_MAX_CONNECTION_AGE_GRACE,
            preface_timeout: PREFACE_TIMEOUT,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
        }
    }
}

impl PortLimits {
    /// Every HTTP/2 setting of the port on hyper's server builder. The port speaks
    /// HTTP/2 only: an HTTP/1 client's first bytes are not a connection preface, and the
    /// connection is closed. The connection's age is kept by its task (`connection.rs`).
    pub fn apply_http2<E>(&self, builder: &mut hyper::server::conn::http2::Builder<E>) {
        builder
            .max_concurrent_streams(self.max_concurrent_streams)
            .keep_alive_interval(self.keepalive_interval)
            .keep_alive_timeout(self.keepalive_timeout)
            .max_local_error_reset_streams(MAX_LOCAL_ERROR_RESET_STREAMS)
            .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESET_STREAMS)
            .max_header_list_size(MAX_HEADER_LIST_BYTES)
            .max_frame_size(MAX_FRAME_BYTES)
            .adaptive_window(false)
            .initial_stream_window_size(STREAM_WINDOW_BYTES)
            .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
            // gRPC has no use for a `date` header: 37 bytes and a clock read per answer.
            .auto_date_header(false);
    }

    /// What to tell an operator whose stream limit is below [`LEAST_ADVISED_STREAMS`]: a
    /// client sends its first calls on a new connection before it has read the limit, h2
    /// refuses those past it, and Envoy does not retry a refused rate-limit call (by hand,
    /// with tests/envoy/test_worker_connections.py's set-up: a limit of 8 had 73–140 of a
    /// 200-call burst from one Envoy worker refused). Spreading a worker's calls over connections
    /// is Envoy's to do, by capping its cluster's streams (docs/operations.md).
    pub fn burst_warning(&self) -> Option<String> {
        (self.max_concurrent_streams < LEAST_ADVISED_STREAMS).then(|| {
            format!(
                "--grpc-max-concurrent-streams {} is below {LEAST_ADVISED_STREAMS}: calls a \
                 client sends on a new connection before it reads the limit are refused past \
                 it, and Envoy answers them by its failure_mode; to spread an Envoy worker's \
                 calls over connections, set max_concurrent_streams in the cluster's \
                 http2_protocol_options instead",
                self.max_concurrent_streams
            )
        })
    }

    /// The message bound as a length.
    pub fn max_message_len(&self) -> usize {
        self.max_message_bytes as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_the_documented_ones() {
        let d = PortLimits::default();
        assert_eq!(d.max_concurrent_streams, 1024);
        assert_eq!(d.keepalive_interval, Some(Duration::from_secs(60)));
        assert_eq!(d.keepalive_timeout, Duration::from_secs(20));
        assert_eq!(d.max_connection_age, None);
        assert_eq!(d.max_connection_age_grace, Duration::from_secs(30));
        assert_eq!(d.preface_timeout, Duration::from_secs(10));
        assert_eq!(d.max_message_bytes, 65_536);
        assert_eq!(d.max_message_len(), 65_536);
        assert_eq!(d.burst_warning(), None);
    }

    #[test]
    fn a_limit_below_the_advised_least_is_warned_of_with_envoys_own_lever() {
        let at = |max_concurrent_streams| PortLimits {
            max_concurrent_streams,
            ..PortLimits::default()
        };
        assert_eq!(at(100).burst_warning(), None);
        let warning = at(99).burst_warning().expect("99 is below 100");
        assert!(
            warning.starts_with("--grpc-max-concurrent-streams 99 is below 100"),
            "{warning}"
        );
        assert!(warning.contains("http2_protocol_options"), "{warning}");
    }
}

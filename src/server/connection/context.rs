//! What a connection's calls know of it ([`ConnectionContext`]): its number and its
//! client's address (for the logs), a count of its calls (for request ids), whether it is
//! closing (for calls that would stream on), and the metrics. Data only; the connection's
//! life is `mod.rs`' and `drive.rs`'.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use tokio::sync::watch;

use crate::service::metrics::Metrics;

/// Connections numbered in the order they were accepted, for the logs.
static CONNECTIONS: AtomicU64 = AtomicU64::new(0);

/// One connection, as its calls see it: who it is with, and whether it is closing.
#[derive(Debug)]
pub struct ConnectionContext {
    /// The connection's number in this process (from 1).
    pub id: u64,
    /// The client's address, when the socket still knows it.
    pub peer: Option<SocketAddr>,
    /// Calls started on it so far: a call's number, for a request id.
    calls: AtomicU64,
    /// Turns true when the connection starts closing (GOAWAY sent): a call that would
    /// otherwise stream on (health `Watch`, reflection) ends then.
    closing: watch::Receiver<bool>,
    pub metrics: Arc<Metrics>,
}

impl ConnectionContext {
    /// The next call's number on this connection (from 1).
    pub fn next_call(&self) -> u64 {
        self.calls.fetch_add(1, Relaxed) + 1
    }

    /// A signal that turns true when the connection starts closing.
    pub fn closing(&self) -> watch::Receiver<bool> {
        self.closing.clone()
    }
}

/// A connection that can say who is on its other end.
pub trait Peer {
    fn peer(&self) -> Option<SocketAddr>;
}

impl Peer for tokio::net::TcpStream {
    fn peer(&self) -> Option<SocketAddr> {
        self.peer_addr().ok()
    }
}

/// A new connection's context, and the sender that tells its calls it is closing.
pub(super) fn context(
    io: &impl Peer,
    metrics: &Arc<Metrics>,
) -> (Arc<ConnectionContext>, watch::Sender<bool>) {
    let (streams_end, closing) = watch::channel(false);
    let context = ConnectionContext {
        id: CONNECTIONS.fetch_add(1, Relaxed) + 1,
        peer: io.peer(),
        calls: AtomicU64::new(0),
        closing,
        metrics: metrics.clone(),
    };
    (Arc::new(context), streams_end)
}

/// A connection's context for unit tests of what runs in it.
#[cfg(test)]
pub(crate) fn test_context(metrics: Arc<Metrics>) -> Arc<ConnectionContext> {
    struct Nobody;
    impl Peer for Nobody {
        fn peer(&self) -> Option<SocketAddr> {
            None
        }
    }
    context(&Nobody, &metrics).0
}

//! Accepting the gRPC port's connections, plain or before TLS, so that a failed accept
//! never spins. When the process is out of file descriptors (EMFILE, or the system's:
//! ENFILE) or memory for a socket, the pending connection stays in the listen queue and
//! the listener stays readable: retried at once, as tonic's accept loop does with an
//! error from its incoming stream, each attempt fails again and a core spins until a
//! descriptor frees. Here a failure pauses accepting — 5 ms, doubling to 1 s while it
//! lasts, back to 5 ms after the next success — and is counted
//! (`shardgate_grpc_accept_failures_total`) and logged at warn at most once per 10 s.
//!
//! It yields accepted sockets (with `TCP_NODELAY` set) and never an error; what is
//! spoken on them is not its concern.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures::Stream;
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;

use super::socket::no_delay;
use crate::service::metrics::Metrics;
use crate::support::throttle::LogThrottle;

/// The first pause after a failed accept.
const FIRST_PAUSE: Duration = Duration::from_millis(5);

/// The longest pause: a freed descriptor is used within a second.
const LONGEST_PAUSE: Duration = Duration::from_secs(1);

/// At most one log line per interval.
const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The connections of a listener, as a stream that pauses after a failed accept.
pub struct Accepting {
    listener: TcpListener,
    /// Set while accepting is paused.
    pause: Option<Pin<Box<Sleep>>>,
    /// The next pause's length.
    next_pause: Duration,
    metrics: Arc<Metrics>,
    log: LogThrottle,
}

impl Accepting {
    pub fn new(listener: TcpListener, metrics: Arc<Metrics>) -> Accepting {
        Accepting {
            listener,
            pause: None,
            next_pause: FIRST_PAUSE,
            metrics,
            log: LogThrottle::new(LOG_INTERVAL),
        }
    }

    fn failed(&mut self, error: &io::Error) {
        let pause = self.next_pause;
        self.metrics.grpc_accept_failed();
        if let Some(suppressed) = self.log.admit() {
            tracing::warn!(
                %error,
                ?pause,
                similar_failures_not_logged = suppressed,
                "gRPC port: accepting a connection failed; pausing before the next attempt"
            );
        }
        self.pause = Some(Box::pin(tokio::time::sleep(pause)));
        self.next_pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

impl Stream for Accepting {
    type Item = io::Result<TcpStream>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(pause) = &mut this.pause {
                ready!(pause.as_mut().poll(cx));
                this.pause = None;
            }
            match ready!(this.listener.poll_accept(cx)) {
                Ok((tcp, _peer)) => {
                    this.next_pause = FIRST_PAUSE;
                    no_delay(&tcp);
                    return Poll::Ready(Some(Ok(tcp)));
                }
                Err(e) => this.failed(&e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_a_second() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let mut accepting = Accepting::new(listener, Arc::new(Metrics::new()));
            let error = io::Error::from_raw_os_error(24); // EMFILE
            let mut pauses = Vec::new();
            for _ in 0..10 {
                accepting.failed(&error);
                pauses.push(accepting.next_pause);
            }
            let ms = |n| Duration::from_millis(n);
            assert_eq!(
                pauses,
                [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000].map(ms)
            );
            assert!(accepting.pause.is_some());
        });
    }
}

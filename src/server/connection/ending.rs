//! When a connection ends without its client asking: gracefully (GOAWAY, its calls
//! finish) when the server shuts down or the connection reaches its age, then at once if
//! its calls are still not done `--grpc-max-connection-age-grace` after its age; at once
//! if its client sends no HTTP/2 preface in time.
//!
//! A connection's age is jittered by up to a tenth either way (as grpc-go does), so that
//! connections opened together — a fleet of Envoys started or reconnected at once — do not
//! all reconnect together again at every age.

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use tokio::sync::watch;

use super::watched::Preface;
use crate::server::port_limits::PortLimits;
use crate::service::metrics::ConnectionClose;

/// How a connection is to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Close {
    /// GOAWAY: the calls in flight finish, no new one starts.
    Graceful,
    /// Now, whatever is in flight.
    Now(ConnectionClose),
}

/// The phases of a connection's end.
enum Phase {
    Open,
    /// Closing gracefully, to be closed at once after the grace, if any.
    Closing(Option<Duration>),
    Done,
}

/// What ends the connection, in order: [`Close::Graceful`] at shutdown (`closing`
/// changes) or at its jittered age; then [`Close::Now`] at the end of the age's grace.
/// [`Close::Now`] first if no preface has arrived within `limits.preface_timeout`.
pub(super) fn ending<'a>(
    closing: &'a mut watch::Receiver<()>,
    limits: &PortLimits,
    preface: Arc<Preface>,
) -> impl Stream<Item = Close> + 'a {
    let age = limits.max_connection_age.map(jittered);
    let grace = limits.max_connection_age_grace;
    let preface_timeout = limits.preface_timeout;
    futures::stream::unfold((Phase::Open, closing), move |(phase, closing)| {
        let preface = preface.clone();
        async move {
            match phase {
                Phase::Open => {
                    let (close, grace) = tokio::select! {
                        _ = closing.changed() => (Close::Graceful, None),
                        _ = aged(age) => (Close::Graceful, Some(grace)),
                        _ = no_preface(preface_timeout, &preface) => {
                            (Close::Now(ConnectionClose::NoPreface), None)
                        }
                    };
                    let next = match close {
                        Close::Graceful => Phase::Closing(grace),
                        Close::Now(_) => Phase::Done,
                    };
                    Some((close, (next, closing)))
                }
                Phase::Closing(Some(grace)) => {
                    tokio::time::sleep(grace).await;
                    let close = Close::Now(ConnectionClose::AgeGrace);
                    Some((close, (Phase::Done, closing)))
                }
                Phase::Closing(None) | Phase::Done => None,
            }
        }
    })
    .fuse()
}

/// `age`, give or take up to a tenth, drawn for each connection.
fn jittered(age: Duration) -> Duration {
    age.mul_f64(rand::random_range(0.9..=1.1))
}

/// Resolves after `age`, never without one.
async fn aged(age: Option<Duration>) {
    match age {
        Some(age) => tokio::time::sleep(age).await,
        None => std::future::pending().await,
    }
}

/// Resolves if the preface has not arrived after `timeout`; never once it has.
async fn no_preface(timeout: Duration, preface: &Preface) {
    tokio::time::sleep(timeout).await;
    if preface.seen() {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_are_jittered_within_a_tenth() {
        let age = Duration::from_secs(100);
        let drawn: Vec<Duration> = (0..200).map(|_| jittered(age)).collect();
        assert!(drawn
            .iter()
            .all(|d| *d >= Duration::from_secs(90) && *d <= Duration::from_secs(110)));
        let distinct: std::collections::BTreeSet<_> = drawn.iter().collect();
        assert!(distinct.len() > 100, "drawn apart: {}", distinct.len());
    }
}

//! The gRPC port's connections, each served by one task that runs its own calls. hyper
//! would spawn every HTTP/2 stream (call) as a task of its own; here the connection's
//! executor ([`calls::Calls`]) only queues them, and the connection's task polls them
//! itself between reading the socket and writing it (`drive.rs`).
//!
//! Why: Envoy sends a worker's calls over one or a few connections, a burst of calls per
//! read. Spawned, each call's answer woke the connection's task, and tokio's multi-thread
//! scheduler runs a task woken by the running one next (its LIFO slot): the connection
//! wrote each answer alone, a `writev` per call, and each spawn woke another worker. Run
//! inside the connection's task, the calls of one read are decided one after another and
//! their answers leave in one write (bench/README.md, "One task per connection"). A call
//! that waits for its store parks only itself; the connection keeps reading and writing.
//! A connection busy past its task's budget per wake shares its waiting calls with the
//! runtime's idle workers (`drive.rs`, `budget.rs`, `lanes.rs`; the wakes: `wakes.rs`),
//! so one connection can use every core. A panic in one call ends that call alone (`calls.rs`).
//!
//! It owns the accept loop, each connection's life (its age with its jitter and grace, the
//! time its client has to send the HTTP/2 preface, a graceful close on shutdown:
//! `ending.rs`), what the server sends counted (`watched.rs`) and the wait for every
//! connection at the end. It knows neither TLS (it takes any stream of connections) nor
//! what is served on them.

mod budget;
mod calls;
mod context;
mod drive;
mod ending;
mod lanes;
#[cfg(test)]
mod tests;
mod wakes;
mod watched;

use std::cell::RefCell;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tonic::body::Body;
use tonic::codegen::http::{Request, Response};
use tracing::Instrument;

use self::calls::Calls;
use self::context::context;
#[cfg(test)]
pub(crate) use self::context::test_context;
pub use self::context::{ConnectionContext, Peer};
use self::watched::Watched;
use super::port_limits::PortLimits;
use crate::service::metrics::Metrics;

/// What the port serves on a connection: gRPC calls, one service for the connection.
pub trait PortService<B>:
    tower::Service<
        Request<Body>,
        Response = Response<B>,
        Error = std::convert::Infallible,
        Future: Send + 'static,
    > + Send
    + 'static
{
}

impl<S, B> PortService<B> for S where
    S: tower::Service<
            Request<Body>,
            Response = Response<B>,
            Error = std::convert::Infallible,
            Future: Send + 'static,
        > + Send
        + 'static
{
}

/// An answer's body, as hyper sends it.
pub trait PortBody:
    http_body::Body<Data = bytes::Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
    + Send
    + 'static
{
}

impl<B> PortBody for B where
    B: http_body::Body<Data = bytes::Bytes, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
        + Send
        + 'static
{
}

/// Serves HTTP/2 on every connection `incoming` yields until `shutdown` resolves, each
/// with the service `make` builds for it; then stops accepting (the listening socket is
/// closed as `incoming` is dropped), closes each connection gracefully (its calls in
/// flight finish, the client is sent GOAWAY) and returns when all are closed.
pub async fn serve<I, IO, M, S, B>(
    incoming: I,
    make: M,
    limits: PortLimits,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()>,
) where
    I: Stream<Item = io::Result<IO>>,
    IO: AsyncRead + AsyncWrite + Peer + Unpin + Send + 'static,
    M: Fn(Arc<ConnectionContext>) -> S,
    S: PortService<B>,
    B: PortBody,
{
    let (closing_tx, closing_rx) = watch::channel(());
    {
        // Dropped when accepting stops: the listening socket closes then, so new
        // clients are refused at once rather than left waiting through the drain.
        let mut incoming = pin!(incoming);
        let mut shutdown = pin!(shutdown);
        loop {
            let io = tokio::select! {
                _ = &mut shutdown => break,
                io = incoming.next() => io,
            };
            match io {
                Some(Ok(io)) => {
                    let (context, streams_end) = context(&io, &metrics);
                    let service = make(context.clone());
                    let span = connection_span(&context);
                    let closing = closing_rx.clone();
                    let served = served(io, service, limits.clone(), closing, context, streams_end);
                    tokio::spawn(served.instrument(span));
                }
                // The accepting streams pause and count their failures themselves.
                Some(Err(_)) => continue,
                None => break,
            }
        }
    }
    let _ = closing_tx.send(());
    drop(closing_rx);
    // Every connection's task holds a receiver until it ends.
    closing_tx.closed().await;
}

/// The span every log line of a connection's calls is in: its number and its peer.
fn connection_span(context: &ConnectionContext) -> tracing::Span {
    match context.peer {
        Some(peer) => tracing::info_span!("grpc_connection", connection = context.id, %peer),
        None => tracing::info_span!("grpc_connection", connection = context.id),
    }
}

/// One connection: HTTP/2 with the port's limits, until the client closes it, its age
/// (and grace) is reached, its client sends no preface in time, or `closing` changes
/// (then gracefully).
async fn served<IO, S, B>(
    io: IO,
    service: S,
    limits: PortLimits,
    mut closing: watch::Receiver<()>,
    context: Arc<ConnectionContext>,
    streams_end: watch::Sender<bool>,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: PortService<B>,
    B: PortBody,
{
    let metrics = context.metrics.clone();
    metrics.port().connection_opened();
    let calls = Calls::new(context);
    let builder = http2_builder(&limits, calls.clone());
    let service = PerConnection(RefCell::new(service));
    let (io, preface) = Watched::new(io, metrics.clone());
    let connection = pin!(builder.serve_connection(TokioIo::new(io), service));
    // `closing` is borrowed, not moved in: the receiver must live until the connection's
    // last call has finished, as `serve` counts the connections by their receivers (it is
    // dropped when this function returns).
    let ending = pin!(ending::ending(&mut closing, &limits, preface.clone()));
    let closed = drive::drive(connection, calls, ending, &preface, &streams_end).await;
    if let Some(why) = closed {
        metrics.port().closed_by_server(why);
        tracing::debug!(reason = ?why, "gRPC connection closed by the server");
    }
    metrics.port().connection_closed();
}

/// The port's service as hyper calls it, one for the connection. hyper_util's adapter
/// (`TowerToHyperService`) cloned the service for every call — the port's handles to the
/// limiter and to tonic's router, reference counts both workers write — because a tower
/// service is called through `&mut`; the connection's task is the only caller here, so a
/// `RefCell` lends it. Not `poll_ready`'d: the port's services are always ready (the
/// rate-limit route, and tonic's router, which is axum's).
struct PerConnection<S>(RefCell<S>);

impl<S, B> hyper::service::Service<Request<Incoming>> for PerConnection<S>
where
    S: tower::Service<Request<Body>, Response = Response<B>, Error = Infallible>,
{
    type Response = Response<B>;
    type Error = Infallible;
    type Future = S::Future;

    fn call(&self, request: Request<Incoming>) -> S::Future {
        self.0.borrow_mut().call(request.map(Body::new))
    }
}

/// hyper's HTTP/2 server with every limit of the port, its calls queued on `calls`.
fn http2_builder(limits: &PortLimits, calls: Calls) -> http2::Builder<Calls> {
    let mut builder = http2::Builder::new(calls);
    builder.timer(TokioTimer::new());
    limits.apply_http2(&mut builder);
    builder
}

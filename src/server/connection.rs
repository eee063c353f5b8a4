//! The gRPC port's connections, each served by one task that runs its own calls. hyper
//! would spawn every HTTP/2 stream (call) as a task of its own; here the connection's
//! executor ([`Calls`]) only queues them, and the connection's task polls them itself
//! between reading the socket and writing it.
//!
//! Why: Envoy sends a worker's calls over one or a few connections, a burst of calls per
//! read. Spawned, each call's answer woke the connection's task, and tokio's multi-thread
//! scheduler runs a task woken by the running one next (its LIFO slot): the connection
//! wrote each answer alone, a `writev` per call, and each spawn woke another worker. Run
//! inside the connection's task, the calls of one read are decided one after another and
//! their answers leave in one write (bench/README.md, "One task per connection"). A call
//! that waits for its store parks only itself; the connection keeps reading and writing.
//! What this gives up: one connection's calls share one thread at a time. Envoy opens a
//! connection per worker, so its workers' calls still spread over the cores.
//!
//! It owns the accept loop, each connection's life (its age, a graceful close on
//! shutdown) and the wait for every connection at the end. It knows neither TLS (it
//! takes any stream of connections) nor what is served on them.

use std::future::{poll_fn, Future};
use std::io;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use futures::stream::FuturesUnordered;
use futures::task::AtomicWaker;
use futures::{Stream, StreamExt};
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tonic::body::Body;
use tonic::codegen::http::{Request, Response};

use super::port_limits::PortLimits;

/// One call (hyper's stream task), boxed so that one queue holds every kind.
type Call = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Rounds of reading, deciding and writing one wake-up may run before the task yields,
/// so that a connection that always has work cannot keep its thread from the others.
const ROUNDS_PER_WAKE: usize = 8;

/// hyper's executor for one connection: the calls it is given wait here for the
/// connection's task, which polls them ([`drive`]).
#[derive(Clone, Default)]
struct Calls {
    /// Filled by hyper while the connection is polled, emptied by the same task right
    /// after: never contended (the lock only makes the executor `Sync`, as hyper needs).
    queued: Arc<Mutex<Vec<Call>>>,
}

impl<F> hyper::rt::Executor<F> for Calls
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, call: F) {
        self.queued.lock().push(Box::pin(call));
    }
}

/// What the port serves on a connection: gRPC calls, the service cloned for each.
pub trait PortService<B>:
    tower::Service<
        Request<Body>,
        Response = Response<B>,
        Error = std::convert::Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S, B> PortService<B> for S where
    S: tower::Service<
            Request<Body>,
            Response = Response<B>,
            Error = std::convert::Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
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

/// Serves HTTP/2 on every connection `incoming` yields until `shutdown` resolves; then
/// stops accepting, closes each connection gracefully (its calls in flight finish, the
/// client is sent GOAWAY) and returns when all are closed.
pub async fn serve<I, IO, S, B>(
    incoming: I,
    service: S,
    limits: PortLimits,
    shutdown: impl Future<Output = ()>,
) where
    I: Stream<Item = io::Result<IO>>,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
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
                    let service = service.clone();
                    tokio::spawn(one(io, service, limits.clone(), closing_rx.clone()));
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

/// One connection: HTTP/2 with the port's limits, until the client closes it, its age is
/// reached, or `closing` changes (then gracefully).
async fn one<IO, S, B>(io: IO, service: S, limits: PortLimits, mut closing: watch::Receiver<()>)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: PortService<B>,
    B: PortBody,
{
    let calls = Calls::default();
    let builder = http2_builder(&limits, calls.clone());
    let service = TowerToHyperService::new(tower::ServiceExt::map_request(
        service,
        |r: Request<Incoming>| r.map(Body::new),
    ));
    let connection = pin!(builder.serve_connection(TokioIo::new(io), service));
    // `closing` is borrowed, not moved in: the receiver must live until the connection's
    // last call has finished, as `serve` counts the connections by their receivers (it is
    // dropped when this function returns).
    let ending = pin!(async {
        tokio::select! {
            _ = closing.changed() => {}
            _ = aged(limits.max_connection_age) => {}
        }
    });
    drive(connection, calls, ending).await;
}

/// Resolves after `age`, never without one.
async fn aged(age: Option<Duration>) {
    match age {
        Some(age) => tokio::time::sleep(age).await,
        None => std::future::pending().await,
    }
}

/// The connection and its calls, polled in turn until the connection is closed and its
/// last call has ended (answered, or dropped by hyper when its stream was reset: a
/// connection gone resets them all). When `ending` resolves the connection is closed
/// gracefully: the calls in flight are answered first.
async fn drive<IO, S, B>(
    mut connection: Pin<&mut http2::Connection<TokioIo<IO>, S, Calls>>,
    calls: Calls,
    mut ending: Pin<&mut impl Future<Output = ()>>,
) where
    IO: AsyncRead + AsyncWrite + Unpin,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut running: FuturesUnordered<Call> = FuturesUnordered::new();
    let mut open = true;
    let mut ended = false;
    let wakes = Arc::new(ConnectionWakes::default());
    let task_waker = Waker::from(wakes.clone());
    let ending_wake = EndingWake::new(&wakes);
    poll_fn(|cx| {
        wakes.task.register(cx.waker());
        if open && !ended && ending_wake.resolved(ending.as_mut()) {
            connection.as_mut().graceful_shutdown();
            ended = true;
        }
        wakes.inside.store(true, SeqCst);
        let mut done = None;
        let mut inner = Context::from_waker(&task_waker);
        for _ in 0..ROUNDS_PER_WAKE {
            wakes.again.store(false, SeqCst);
            let mut moved = false;
            // Read what arrived (queuing its calls) and write what is ready.
            if open {
                if let Poll::Ready(result) = connection.as_mut().poll(&mut inner) {
                    open = false;
                    if let Err(e) = result {
                        tracing::debug!(error = %e, "gRPC connection ended with an error");
                    }
                }
            }
            {
                let mut queued = calls.queued.lock();
                moved |= !queued.is_empty();
                running.extend(queued.drain(..));
            }
            // Decide every call that can go on; their answers wait for the next write.
            while let Poll::Ready(Some(())) = running.poll_next_unpin(&mut inner) {
                moved = true;
            }
            if !open && running.is_empty() {
                done = Some(Poll::Ready(()));
                break;
            }
            if !moved && !wakes.again.load(SeqCst) {
                done = Some(Poll::Pending);
                break;
            }
        }
        wakes.inside.store(false, SeqCst);
        match done {
            Some(Poll::Ready(())) => Poll::Ready(()),
            // A wake that came as the rounds ended is this task's to answer.
            Some(Poll::Pending) if !wakes.again.swap(false, SeqCst) => Poll::Pending,
            // Rounds spent with work left (or a late wake): the task goes to the back of
            // the queue.
            _ => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    })
    .await
}

/// The waker the connection and its calls are polled with. h2 wakes the connection's
/// task whenever a call has an answer to write, and a call's stream is woken when the
/// connection has written; the task polls both in turn anyway, so a wake while it is
/// running ([`inside`](Self::inside)) only asks for one more round. Passed on to the
/// scheduler instead, each would schedule the task once more after every call (and, on
/// the multi-thread scheduler, wake a parked worker to steal it: a `futex` and a context
/// switch per call). A wake from outside (the socket ready, a store's answer) wakes the
/// task.
#[derive(Default)]
struct ConnectionWakes {
    /// Set while the connection's task is polling.
    inside: AtomicBool,
    /// A wake came: the connection must be polled again.
    again: AtomicBool,
    /// The connection's task.
    task: AtomicWaker,
}

impl Wake for ConnectionWakes {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // `again` before `inside`, and the task clears `inside` before it reads `again`:
        // whichever order the two threads run in, one of them wakes the task.
        self.again.store(true, SeqCst);
        if !self.inside.load(SeqCst) {
            self.task.wake();
        }
    }
}

/// The waker `ending` (shutdown, the connection's age) is polled with: it marks that
/// `ending` has something to say and wakes the connection's task, which polls `ending`
/// only then (and once at the start), not on every wake of the task: most wakes are
/// reads and answers.
struct EndingWake {
    fired: AtomicBool,
    wakes: Arc<ConnectionWakes>,
}

impl EndingWake {
    fn new(wakes: &Arc<ConnectionWakes>) -> Arc<EndingWake> {
        Arc::new(EndingWake {
            fired: AtomicBool::new(true),
            wakes: wakes.clone(),
        })
    }

    /// Whether `ending` has resolved: polled only if its waker fired since last asked.
    fn resolved(self: &Arc<Self>, ending: Pin<&mut impl Future<Output = ()>>) -> bool {
        if !self.fired.swap(false, SeqCst) {
            return false;
        }
        let waker = Waker::from(self.clone());
        ending.poll(&mut Context::from_waker(&waker)).is_ready()
    }
}

impl Wake for EndingWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, SeqCst);
        self.wakes.task.wake();
    }
}

/// hyper's HTTP/2 server with every limit of the port, its calls queued on `calls`.
fn http2_builder(limits: &PortLimits, calls: Calls) -> http2::Builder<Calls> {
    let mut builder = http2::Builder::new(calls);
    builder.timer(TokioTimer::new());
    limits.apply_http2(&mut builder);
    builder
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use bytes::Bytes;
    use http_body_util::Full;
    use tokio::io::{DuplexStream, ReadBuf};

    use super::*;

    /// The server's end of the connection, counting the writes that reach the socket.
    struct CountingWrites {
        io: DuplexStream,
        writes: Arc<AtomicUsize>,
    }

    impl AsyncRead for CountingWrites {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.io).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for CountingWrites {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let written = Pin::new(&mut self.io).poll_write(cx, buf);
            if matches!(written, Poll::Ready(Ok(_))) {
                self.writes.fetch_add(1, Ordering::SeqCst);
            }
            written
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.io).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.io).poll_shutdown(cx)
        }
    }

    fn answer(
        _: Request<Body>,
    ) -> std::future::Ready<Result<Response<Full<Bytes>>, std::convert::Infallible>> {
        std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(b"ok")))))
    }

    /// Sends `n` requests in one write and waits for every answer.
    async fn burst(client: &mut h2::client::SendRequest<Bytes>, n: usize) {
        let mut answers = Vec::new();
        for _ in 0..n {
            let request = Request::post("/s/m").body(()).unwrap();
            let (answer, _) = client.send_request(request, true).unwrap();
            answers.push(answer);
        }
        for answer in answers {
            let mut body = answer.await.unwrap().into_body();
            while let Some(chunk) = body.data().await {
                chunk.unwrap();
            }
        }
    }

    /// A burst of calls read at once is answered in one write, on the multi-thread
    /// scheduler (one worker, so that no other thread can take a call): spawned as hyper
    /// does, each call's answer woke the connection's task, which ran next and wrote that
    /// answer alone.
    #[test]
    fn a_burst_read_at_once_is_answered_in_one_write() {
        let server = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        let writes = Arc::new(AtomicUsize::new(0));
        let (_closing_tx, closing_rx) = watch::channel(());
        server.spawn(one(
            CountingWrites {
                io: server_io,
                writes: writes.clone(),
            },
            tower::service_fn(answer),
            PortLimits::default(),
            closing_rx,
        ));
        let client = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        client.block_on(async {
            let (mut send, connection) = h2::client::handshake(client_io).await.unwrap();
            tokio::spawn(connection);
            // Settings exchanged and acknowledged, the connection idle.
            burst(&mut send, 1).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            let before = writes.load(Ordering::SeqCst);
            burst(&mut send, 32).await;
            let taken = writes.load(Ordering::SeqCst) - before;
            assert!(
                taken <= 2,
                "32 answers took {taken} writes, where one burst should take one"
            );
        });
    }

    /// A call that waits (for its store) parks only itself: the connection's other calls
    /// are answered meanwhile. When the client goes away, the connection's task ends and
    /// the waiting call is dropped with its stream, as hyper does with a reset stream (the
    /// store's own writes are not dropped with it: `store/detached.rs`).
    #[test]
    fn a_waiting_call_holds_up_neither_the_others_nor_the_end() {
        let server = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (client_io, server_io) = tokio::io::duplex(1 << 20);
        let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
        let release_rx = Arc::new(Mutex::new(Some(release_rx)));
        let service = tower::service_fn(move |request: Request<Body>| {
            let waiting = (request.uri().path() == "/s/wait")
                .then(|| release_rx.lock().take())
                .flatten();
            async move {
                if let Some(release) = waiting {
                    let _ = release.await;
                }
                Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from_static(
                    b"ok",
                ))))
            }
        });
        let (_closing_tx, closing_rx) = watch::channel(());
        let ended = server.spawn(one(server_io, service, PortLimits::default(), closing_rx));
        let client = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        client.block_on(async {
            let (mut send, connection) = h2::client::handshake(client_io).await.unwrap();
            let connection = tokio::spawn(connection);
            let waiting = Request::post("/s/wait").body(()).unwrap();
            let (waiting, _) = send.send_request(waiting, true).unwrap();
            burst(&mut send, 8).await;
            assert!(!release_tx.is_closed(), "the waiting call is still running");
            // The client leaves with its call unanswered.
            drop(waiting);
            drop(send);
            connection.abort();
        });
        drop(client);
        server.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), ended)
                .await
                .expect("the connection's task ends when its client has gone")
                .unwrap();
        });
        assert!(release_tx.is_closed(), "the waiting call was dropped");
    }
}

//! The connection's task against a real HTTP/2 client (the `h2` crate) over an in-memory
//! pipe: batching, a call that waits, a call that panics, the budgets, a spread busy
//! connection, the preface timeout and wakes from other threads.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};
use tokio::sync::watch;
use tonic::body::Body;
use tonic::codegen::http::{Request, Response};

use super::*;

/// The server's end of the connection, counting the writes that reach the socket (and,
/// if given, noting at each write how many calls had been decided by then).
struct CountingWrites {
    io: DuplexStream,
    writes: Arc<AtomicUsize>,
    decided: Option<DecidedAtWrites>,
}

/// The count of calls decided, and its value at each write.
type DecidedAtWrites = (Arc<AtomicUsize>, Arc<Mutex<Vec<usize>>>);

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
            if let Some((decided, at_writes)) = &self.decided {
                at_writes.lock().push(decided.load(Ordering::SeqCst));
            }
        }
        written
    }

    /// A vectored write counts as one write, of its first non-empty slice.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let first = bufs
            .iter()
            .find(|b| !b.is_empty())
            .map_or(&[][..], |b| &**b);
        self.poll_write(cx, first)
    }

    /// Vectored, as a TCP socket is.
    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl Peer for CountingWrites {
    fn peer(&self) -> Option<SocketAddr> {
        None
    }
}

impl Peer for DuplexStream {
    fn peer(&self) -> Option<SocketAddr> {
        None
    }
}

type Answer = Result<Response<Full<Bytes>>, std::convert::Infallible>;

fn ok() -> Answer {
    Ok(Response::new(Full::new(Bytes::from_static(b"ok"))))
}

fn answer(_: Request<Body>) -> std::future::Ready<Answer> {
    std::future::ready(ok())
}

/// One connection served as the port serves it, on the current runtime: the task, the
/// metrics, and the sender that starts a graceful close.
struct Served {
    ended: tokio::task::JoinHandle<()>,
    metrics: Arc<Metrics>,
    _closing: watch::Sender<()>,
}

fn serve_one<IO, S, B>(io: IO, service: S, limits: PortLimits) -> Served
where
    IO: AsyncRead + AsyncWrite + Peer + Unpin + Send + 'static,
    S: PortService<B>,
    B: PortBody,
{
    let metrics = Arc::new(Metrics::new());
    let (closing_tx, closing_rx) = watch::channel(());
    let (context, streams_end) = context(&io, &metrics);
    let ended = tokio::spawn(served(
        io,
        service,
        limits,
        closing_rx,
        context,
        streams_end,
    ));
    Served {
        ended,
        metrics,
        _closing: closing_tx,
    }
}

fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .unwrap()
}

fn client_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Sends `n` requests to `path` in one write; the answers' status codes in order (`None`:
/// the stream was reset).
async fn burst_to(
    client: &mut h2::client::SendRequest<Bytes>,
    path: &str,
    n: usize,
) -> Vec<Option<u16>> {
    let mut answers = Vec::new();
    for _ in 0..n {
        let request = Request::post(path).body(()).unwrap();
        let (answer, _) = client.send_request(request, true).unwrap();
        answers.push(answer);
    }
    let mut statuses = Vec::new();
    for answer in answers {
        let Ok(answer) = answer.await else {
            statuses.push(None);
            continue;
        };
        let status = answer.status().as_u16();
        let mut body = answer.into_body();
        let mut whole = true;
        while let Some(chunk) = body.data().await {
            whole &= chunk.is_ok();
        }
        statuses.push(whole.then_some(status));
    }
    statuses
}

async fn burst(client: &mut h2::client::SendRequest<Bytes>, n: usize) {
    let statuses = burst_to(client, "/s/m", n).await;
    assert!(statuses.iter().all(|s| *s == Some(200)), "{statuses:?}");
}

/// The writes a burst of 32 calls read at once is answered in, each answer's body
/// `body_bytes` long, on the multi-thread scheduler (one worker, so that no other thread
/// can take a call), over a socket that writes vectored as TCP does.
fn writes_for_a_burst(body_bytes: usize) -> usize {
    let server = runtime(1);
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let writes = Arc::new(AtomicUsize::new(0));
    let io = CountingWrites {
        io: server_io,
        writes: writes.clone(),
        decided: None,
    };
    let body = Bytes::from(vec![b'x'; body_bytes]);
    let service = tower::service_fn(move |_: Request<Body>| {
        std::future::ready(Answer::Ok(Response::new(Full::new(body.clone()))))
    });
    let _served = server.block_on(async { serve_one(io, service, PortLimits::default()) });
    client_runtime().block_on(async {
        let (mut send, connection) = h2::client::handshake(client_io).await.unwrap();
        tokio::spawn(connection);
        // Settings exchanged and acknowledged, the connection idle.
        burst(&mut send, 1).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let before = writes.load(Ordering::SeqCst);
        burst(&mut send, 32).await;
        writes.load(Ordering::SeqCst) - before
    })
}

/// A burst of calls read at once is answered in a few writes, not one per answer: spawned
/// as hyper does, each call's answer woke the connection's task, which ran next and wrote
/// that answer alone. Answers over 256 bytes too (16 descriptors' statuses are ~360): told
/// that the socket writes vectored, h2 wrote each of those in a `writev` of its own. A
/// round decides for about 100 µs before its answers are written (`budget.rs`), and this
/// unoptimised build's calls cost several µs each, so the 32 answers leave in a few
/// rounds' writes; one write per answer would be 32.
#[test]
fn a_burst_read_at_once_is_answered_in_a_few_writes() {
    let small = writes_for_a_burst(2);
    let large = writes_for_a_burst(400);
    assert!(
        small <= 16 && large <= 16,
        "32 answers took {small} writes (2-byte answers) and {large} (400-byte), \
         where each round's answers should leave in one"
    );
}

/// A call that waits (for its store) parks only itself: the connection's other calls
/// are answered meanwhile. When the client goes away, the connection's task ends and
/// the waiting call is dropped with its stream, as hyper does with a reset stream (the
/// store's own writes are not dropped with it: `store/detached.rs`).
#[test]
fn a_waiting_call_holds_up_neither_the_others_nor_the_end() {
    let server = runtime(1);
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
            ok()
        }
    });
    let served = server.block_on(async { serve_one(server_io, service, PortLimits::default()) });
    client_runtime().block_on(async {
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
    server.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), served.ended)
            .await
            .expect("the connection's task ends when its client has gone")
            .unwrap();
    });
    assert!(release_tx.is_closed(), "the waiting call was dropped");
    assert_eq!(served.metrics.port().connections(), 0);
}

/// A call whose answer panics (here: the service's future, with nothing nearer the call
/// to catch it) has its stream reset; the 499 other calls in flight on the connection
/// are answered, the connection stays open, and the panic is counted once.
#[test]
fn a_panicking_call_resets_its_stream_alone() {
    let server = runtime(2);
    let (client_io, server_io) = tokio::io::duplex(1 << 22);
    let service = tower::service_fn(|request: Request<Body>| async move {
        if request.uri().path() == "/s/panic" {
            panic!("a test call's panic");
        }
        ok()
    });
    let limits = PortLimits::default();
    let served = server.block_on(async { serve_one(server_io, service, limits) });
    client_runtime().block_on(async {
        let (mut send, connection) = h2::client::handshake(client_io).await.unwrap();
        tokio::spawn(connection);
        let mut answers = Vec::new();
        for i in 0..500 {
            let path = if i == 250 { "/s/panic" } else { "/s/m" };
            let request = Request::post(path).body(()).unwrap();
            answers.push(send.send_request(request, true).unwrap().0);
        }
        let mut reset = 0;
        let mut answered = 0;
        for answer in answers {
            match answer.await {
                Ok(a) if a.status() == 200 => answered += 1,
                _ => reset += 1,
            }
        }
        assert_eq!((answered, reset), (499, 1));
        // The connection is still open: another burst is answered on it.
        burst(&mut send, 10).await;
        assert!(!served.ended.is_finished(), "the connection stays open");
        assert_eq!(served.metrics.port().connections(), 1);
    });
    assert_eq!(served.metrics.port().panics(), 1);
}

/// The first answers of a burst of 1024 calls are written before the last calls of the
/// burst are decided (one worker: nothing is spread). Seen from the server's side: at each
/// write to the socket, how many calls had been decided.
#[test]
fn the_first_answer_of_a_burst_does_not_wait_for_the_burst() {
    let server = runtime(1);
    let (client_io, server_io) = tokio::io::duplex(1 << 22);
    let decided = Arc::new(AtomicUsize::new(0));
    let at_writes = Arc::new(Mutex::new(Vec::new()));
    let io = CountingWrites {
        io: server_io,
        writes: Arc::default(),
        decided: Some((decided.clone(), at_writes.clone())),
    };
    let counted = decided.clone();
    let service = tower::service_fn(move |_: Request<Body>| {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            ok()
        }
    });
    let _served = server.block_on(async { serve_one(io, service, PortLimits::default()) });
    client_runtime().block_on(async {
        let (send, connection) = h2::client::handshake(client_io).await.unwrap();
        tokio::spawn(connection);
        let mut send = send.ready().await.unwrap();
        burst(&mut send, 1).await;
        let before = decided.load(Ordering::SeqCst);
        at_writes.lock().clear();
        burst(&mut send, 1024).await;
        let first = at_writes
            .lock()
            .iter()
            .copied()
            .find(|&n| n > before)
            .expect("answers were written");
        assert!(
            first - before <= drive::CALLS_PER_ROUND,
            "{} calls were decided before the first answer was written",
            first - before
        );
    });
}

/// The most of a busy connection's costly calls (each spins ~300 µs) that ran at the same
/// moment, over bursts of 64, until two did or `bursts` ran. Decided in the connection's
/// task alone, calls never overlap, whichever thread the task is on.
fn overlap_of_costly_calls(workers: usize, bursts: usize) -> usize {
    let server = runtime(workers);
    let (client_io, server_io) = tokio::io::duplex(1 << 22);
    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let (now, peak) = (running.clone(), most.clone());
    let service = tower::service_fn(move |_: Request<Body>| {
        let (now, peak) = (now.clone(), peak.clone());
        async move {
            let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(at_once, Ordering::SeqCst);
            let until = std::time::Instant::now() + Duration::from_micros(300);
            while std::time::Instant::now() < until {
                std::hint::spin_loop();
            }
            now.fetch_sub(1, Ordering::SeqCst);
            ok()
        }
    });
    let _served = server.block_on(async { serve_one(server_io, service, PortLimits::default()) });
    client_runtime().block_on(async {
        let (mut send, connection) = h2::client::handshake(client_io).await.unwrap();
        tokio::spawn(connection);
        for _ in 0..bursts {
            burst(&mut send, 64).await;
            if most.load(Ordering::SeqCst) >= 2 {
                break;
            }
        }
    });
    most.load(Ordering::SeqCst)
}

/// One connection's costly calls run on both workers of a two-worker runtime at once; on
/// one worker, one at a time.
#[test]
fn a_busy_connection_s_calls_spread_over_the_workers() {
    assert!(overlap_of_costly_calls(2, 50) >= 2);
    assert_eq!(overlap_of_costly_calls(1, 3), 1);
}

/// While a lane and the connection's task decide a long burst of costly calls (each spins
/// ~300 µs) on both workers, a call the client sends once the burst's first answer has
/// come, over TCP, is read (handed to the service) well before the burst is done: with
/// both workers busy, tokio polls the socket's readiness only when a worker runs out of
/// tasks, and the connection saw its client's next calls only when the burst was over.
#[test]
fn a_busy_connection_reads_its_client_s_next_call_before_its_burst_is_done() {
    let server = runtime(2);
    let decided = Arc::new(AtomicUsize::new(0));
    let late_read_at = Arc::new(AtomicUsize::new(usize::MAX));
    let (counted, late) = (decided.clone(), late_read_at.clone());
    let service = tower::service_fn(move |request: Request<Body>| {
        if request.uri().path() == "/s/late" {
            late.store(counted.load(Ordering::SeqCst), Ordering::SeqCst);
        }
        let counted = counted.clone();
        async move {
            let until = std::time::Instant::now() + Duration::from_micros(300);
            while std::time::Instant::now() < until {
                std::hint::spin_loop();
            }
            counted.fetch_add(1, Ordering::SeqCst);
            ok()
        }
    });
    let listener = server
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let address = listener.local_addr().unwrap();
    let _served = server.spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        crate::server::socket::no_delay(&socket);
        serve_one(socket, service, PortLimits::default())
            .ended
            .await
    });
    client_runtime().block_on(async {
        let socket = tokio::net::TcpStream::connect(address).await.unwrap();
        socket.set_nodelay(true).unwrap();
        let (send, connection) = h2::client::handshake(socket).await.unwrap();
        tokio::spawn(connection);
        let mut send = send.ready().await.unwrap();
        burst(&mut send, 1).await;
        let before = decided.load(Ordering::SeqCst);
        let mut answers = Vec::new();
        for _ in 0..64 {
            let request = Request::post("/s/m").body(()).unwrap();
            answers.push(send.send_request(request, true).unwrap().0);
        }
        let mut answers = answers.into_iter();
        answers.next().unwrap().await.unwrap();
        let request = Request::post("/s/late").body(()).unwrap();
        let late_answer = send.send_request(request, true).unwrap().0;
        for answer in answers.chain([late_answer]) {
            assert_eq!(answer.await.unwrap().status(), 200);
        }
        let at = late_read_at.load(Ordering::SeqCst) - before;
        assert!(
            at < 40,
            "the late call was read when {at} of the burst's 64 were decided"
        );
    });
}

/// A client that never sends the HTTP/2 preface is closed after the time it is given,
/// and counted.
#[test]
fn a_silent_client_is_closed_after_the_preface_timeout() {
    let server = runtime(1);
    let (client_io, server_io) = tokio::io::duplex(1 << 16);
    let limits = PortLimits {
        preface_timeout: Duration::from_millis(200),
        ..PortLimits::default()
    };
    server.block_on(async {
        let served = serve_one(server_io, tower::service_fn(answer), limits);
        tokio::time::timeout(Duration::from_secs(10), served.ended)
            .await
            .expect("closed after the preface timeout")
            .unwrap();
        let page = served.metrics.render();
        assert!(
            page.contains(
                "shardgate_grpc_connections_closed_by_server_total{reason=\"no_preface\"} 1"
            ),
            "{page}"
        );
    });
    drop(client_io);
}

/// Calls answered from tasks on other workers (as a store's answer arrives) while the
/// connection is busy with others: every call of every burst is answered, none lost to
/// a wake that came while the connection's task was running. Bounded: 40 bursts of 256.
#[test]
fn answers_from_other_threads_are_never_lost() {
    let server = runtime(2);
    let (client_io, server_io) = tokio::io::duplex(1 << 22);
    let service = tower::service_fn(|request: Request<Body>| async move {
        if request.uri().path() == "/s/remote" {
            let (tx, rx) = tokio::sync::oneshot::channel();
            tokio::spawn(async move {
                tokio::task::yield_now().await;
                let _ = tx.send(());
            });
            let _ = rx.await;
        }
        ok()
    });
    let _served = server.block_on(async { serve_one(server_io, service, PortLimits::default()) });
    client_runtime().block_on(async {
        let (mut send, connection) = h2::client::handshake(client_io).await.unwrap();
        tokio::spawn(connection);
        for round in 0..40 {
            let mut answers = Vec::new();
            for i in 0..256 {
                let path = if i % 2 == 0 { "/s/remote" } else { "/s/m" };
                let request = Request::post(path).body(()).unwrap();
                answers.push(send.send_request(request, true).unwrap().0);
            }
            let all = futures::future::join_all(answers);
            let answered = tokio::time::timeout(Duration::from_secs(20), all)
                .await
                .unwrap_or_else(|_| panic!("round {round}: a call was never answered"));
            assert!(answered
                .iter()
                .all(|a| a.as_ref().is_ok_and(|a| a.status() == 200)));
        }
    });
}

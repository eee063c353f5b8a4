//! A TCP forwarder on loopback standing between the store and a Redis, as a cloud
//! provider's primary endpoint or a Kubernetes Service does: each connection it accepts
//! goes to the target of the moment, and moving the target leaves the connections made
//! before where they were (a failover behind a stable address). It can also cut one
//! call's answer: armed with a marker, it forwards the next request holding the marker,
//! then drops the server's answer and closes that connection, so the call ran but its
//! caller never hears it. And it can play a slow server: every answer held back a set
//! time (a delay line: each chunk leaves that long after it came, in order), and it
//! counts the connections open through it at once, and the most since asked.

use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

#[derive(Default)]
struct State {
    target: AtomicU16,
    /// The marker of the request whose answer is to be cut (once).
    armed: Mutex<Option<Vec<u8>>>,
    /// Answers cut so far.
    cut: AtomicUsize,
    /// Connections accepted so far.
    accepted: AtomicUsize,
    /// Connections open now, and the most open at once since [`Proxy::reset_peak`].
    open: AtomicUsize,
    peak: AtomicUsize,
    /// How long each answer is held back, in ms.
    delay_ms: AtomicU64,
}

/// Counts one open connection while it lives.
struct OpenGuard(Arc<State>);

impl OpenGuard {
    fn new(state: Arc<State>) -> OpenGuard {
        let now = state.open.fetch_add(1, Ordering::SeqCst) + 1;
        state.peak.fetch_max(now, Ordering::SeqCst);
        OpenGuard(state)
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The forwarder; it stops with the test's runtime.
pub struct Proxy {
    pub port: u16,
    state: Arc<State>,
}

impl Proxy {
    /// Listens on a free loopback port, forwarding to `target`.
    pub async fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Proxy::serve(listener, target)
    }

    /// Listens on `port` (e.g. one a Redis announces), forwarding to `target`.
    pub async fn start_on(port: u16, target: u16) -> Proxy {
        let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        Proxy::serve(listener, target)
    }

    fn serve(listener: TcpListener, target: u16) -> Proxy {
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(State::default());
        state.target.store(target, Ordering::SeqCst);
        let shared = state.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                shared.accepted.fetch_add(1, Ordering::SeqCst);
                let state = shared.clone();
                tokio::spawn(async move {
                    let _open = OpenGuard::new(state.clone());
                    let target = state.target.load(Ordering::SeqCst);
                    if let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await {
                        pump(client, server, state).await;
                    }
                });
            }
        });
        Proxy { port, state }
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// New connections go to `target` from now on; open ones stay where they are.
    pub fn set_target(&self, target: u16) {
        self.state.target.store(target, Ordering::SeqCst);
    }

    /// Cuts the answer to the next request that holds `marker`.
    pub fn cut_answer_to(&self, marker: &[u8]) {
        *self.state.armed.lock().unwrap() = Some(marker.to_vec());
    }

    /// Answers cut so far.
    pub fn answers_cut(&self) -> usize {
        self.state.cut.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.state.accepted.load(Ordering::SeqCst)
    }

    /// Connections open through it now.
    pub fn open(&self) -> usize {
        self.state.open.load(Ordering::SeqCst)
    }

    /// The most connections open at once since the last [`Proxy::reset_peak`].
    pub fn peak(&self) -> usize {
        self.state.peak.load(Ordering::SeqCst)
    }

    /// Starts a new count of the most open at once, from those open now.
    pub fn reset_peak(&self) {
        self.state.peak.store(self.open(), Ordering::SeqCst);
    }

    /// Holds back every answer `delay` from now on (zero: none); what was held back
    /// already leaves when it was due, answers keeping their order.
    pub fn delay_answers(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.state.delay_ms.store(ms, Ordering::SeqCst);
    }
}

/// Copies both ways until either side closes, or until an armed request's answer comes
/// (then it is dropped, and both sides closed).
async fn pump(client: TcpStream, server: TcpStream, state: Arc<State>) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let cut_next = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cut_flag = cut_next.clone();
    let requests_state = state.clone();
    let requests = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match client_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            {
                let mut armed = requests_state.armed.lock().unwrap();
                if let Some(marker) = armed.as_ref() {
                    if buf[..n]
                        .windows(marker.len())
                        .any(|w| w == marker.as_slice())
                    {
                        *armed = None;
                        cut_flag.store(true, Ordering::SeqCst);
                    }
                }
            }
            if server_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    // Answers go through a delay line: read as they come, each written when due.
    let (line, mut due) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let answers_state = state.clone();
    let read_answers = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match server_rx.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if cut_next.load(Ordering::SeqCst) {
                answers_state.cut.fetch_add(1, Ordering::SeqCst);
                return;
            }
            let delay = answers_state.delay_ms.load(Ordering::SeqCst);
            let at = Instant::now() + Duration::from_millis(delay);
            if line.send((at, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    let write_answers = async move {
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if client_tx.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    // The server closing (or an answer cut) ends the line once what it holds is out.
    let answers = async move {
        tokio::join!(read_answers, write_answers);
    };
    // Whichever ends first ends the connection: both halves are dropped.
    tokio::select! {
        _ = requests => {}
        _ = answers => {}
    }
}

//! TLS on the gRPC port (rustls): a certificate chain and key, optionally a client CA that
//! every client certificate must chain to (mTLS). The files are re-read when their content
//! changes (a certificate rotation, a Kubernetes secret swap); each new connection uses the
//! latest valid set, and an unreadable or invalid set keeps the previous one.
//!
//! A refused handshake is otherwise silent (the client sees an alert or a closed
//! connection, the server nothing), so each one is counted by reason
//! ([`HandshakeFailure`], `shardgate_tls_handshake_failures_total`) and logged at warn,
//! at most once per 10 s per reason: a misconfigured client retries fast, and a port scan
//! or a TCP health check must not flood the log.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;
use tokio_stream::StreamExt;

use super::accept::Accepting;
use crate::service::metrics::Metrics;
use crate::support::throttle::LogThrottle;

/// How long a client may take to complete its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes in progress at once (`shardgate_tls_handshakes_in_progress`): past it, new connections wait in the listen queue
/// until one ends (completed, refused, or timed out), so that a flood of clients that
/// connect and stall cannot make the server hold an unbounded number of half-open TLS
/// sessions. Far above what a fleet of Envoys reconnecting at once needs (a handshake
/// takes a millisecond of CPU).
pub const MAX_HANDSHAKES: usize = 1024;

/// At most one log line per reason in this interval.
const FAILURE_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Where the TLS material is.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Check client certificates against this CA (mTLS).
    pub client_ca: Option<PathBuf>,
    /// With `client_ca`: a client may also connect without a certificate (one it presents
    /// must still be issued by the CA). Envoy Gateway's `GRPC_SERVER_TLS_CA_CERT`: its
    /// proxies present one, and upstream, which reads no such variable, never asked.
    pub client_cert_optional: bool,
}

/// Why TLS material could not be used; names the file.
#[derive(Debug, Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("TLS configuration rejected: {0}")]
    Config(String),
}

fn file_error(path: &Path, reason: impl std::fmt::Display) -> TlsError {
    TlsError::File {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

/// Builds a server configuration from the files (ALPN `h2`, as gRPC requires).
pub fn load(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
        .map_err(|e| file_error(&files.cert, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| file_error(&files.cert, e))?;
    if certs.is_empty() {
        return Err(file_error(&files.cert, "no certificate found"));
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| file_error(&files.key, e))?;
    // Explicit provider: the dependency graph carries more than one rustls backend.
    let builder = ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| TlsError::Config(e.to_string()))?;
    let builder = match &files.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca).map_err(|e| file_error(ca, e))? {
                roots
                    .add(cert.map_err(|e| file_error(ca, e))?)
                    .map_err(|e| file_error(ca, e))?;
            }
            if roots.is_empty() {
                return Err(file_error(ca, "no CA certificate found"));
            }
            let verifier = WebPkiClientVerifier::builder(Arc::new(roots));
            let verifier = if files.client_cert_optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier.build().map_err(|e| file_error(ca, e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// The content of every file, to notice a change whatever way it was made.
fn fingerprint(files: &TlsFiles) -> Vec<Option<Vec<u8>>> {
    std::iter::once(&files.cert)
        .chain(std::iter::once(&files.key))
        .chain(files.client_ca.iter())
        .map(|p| std::fs::read(p).ok())
        .collect()
}

/// The TLS configuration in force, kept current by a background task.
pub struct TlsState {
    current: Arc<ArcSwap<ServerConfig>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsState {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsState {
    /// Loads the files (an error here stops start-up) and re-reads them every `poll`.
    pub fn start(files: TlsFiles, poll: Duration) -> Result<TlsState, TlsError> {
        let current = Arc::new(ArcSwap::new(load(&files)?));
        let task = {
            let current = current.clone();
            tokio::spawn(async move {
                let mut seen = fingerprint(&files);
                loop {
                    tokio::time::sleep(poll).await;
                    let now = fingerprint(&files);
                    if now == seen {
                        continue;
                    }
                    seen = now;
                    match load(&files) {
                        Ok(config) => {
                            current.store(config);
                            tracing::info!(cert = %files.cert.display(), "TLS certificates reloaded");
                        }
                        Err(e) => tracing::error!(
                            error = %e,
                            "TLS certificates not reloaded; the previous ones stay in use"
                        ),
                    }
                }
            })
        };
        Ok(TlsState { current, task })
    }

    /// Takes the TCP connections `accepting` yields and yields those whose TLS handshake
    /// completes (a handshake never blocks accepting, but at most [`MAX_HANDSHAKES`] run
    /// at once; a failed accept pauses it, see `accept.rs`). Accepting stops, and the
    /// listener is closed, as soon as the stream returned is dropped. Refused handshakes are counted in `metrics` and logged (see the
    /// module comment).
    pub fn incoming(
        &self,
        mut accepting: Accepting,
        metrics: Arc<Metrics>,
    ) -> ReceiverStream<io::Result<TlsConn>> {
        let (tx, rx) = mpsc::channel(128);
        let current = self.current.clone();
        let failures = Arc::new(FailureLog::new(metrics));
        let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
        tokio::spawn(async move {
            loop {
                // When the port stops accepting (shutdown), `rx` is dropped: this task
                // ends at once, and with it the listener, so a new client is refused
                // rather than accepted and left without a handshake.
                let slot = tokio::select! {
                    _ = tx.closed() => return,
                    slot = handshakes.clone().acquire_owned() => slot,
                };
                let Ok(slot) = slot else { return };
                let tcp = tokio::select! {
                    _ = tx.closed() => return,
                    tcp = accepting.next() => tcp,
                };
                let Some(Ok(tcp)) = tcp else { return };
                // A peer gone already still counts, as a failed handshake (`io`).
                let peer = tcp
                    .peer_addr()
                    .unwrap_or_else(|_| std::net::SocketAddr::from(([0, 0, 0, 0], 0)));
                let acceptor = TlsAcceptor::from(current.load_full());
                let tx = tx.clone();
                let failures = failures.clone();
                let port = failures.metrics.clone();
                port.port().handshake_started();
                tokio::spawn(async move {
                    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
                    let done = handshake.await;
                    port.port().handshake_ended();
                    drop(slot);
                    match done {
                        Ok(Ok(stream)) => {
                            let _ = tx.send(Ok(TlsConn(stream))).await;
                        }
                        Ok(Err(e)) => failures.record(peer, HandshakeFailure::of(&e), &e),
                        Err(_) => failures.record(
                            peer,
                            HandshakeFailure::Timeout,
                            &format_args!("no handshake within {HANDSHAKE_TIMEOUT:?}"),
                        ),
                    }
                });
            }
        });
        ReceiverStream::new(rx)
    }
}

/// Why a TLS handshake failed: the `reason` label of
/// `shardgate_tls_handshake_failures_total`, a fixed set so the series stay few.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// The client's certificate does not verify against the client CA (another CA's, an
    /// X.509 v1 certificate, expired, not for client authentication, ...).
    ClientCertRejected,
    /// mTLS is on and the client sent no certificate.
    NoClientCert,
    /// The client sent a TLS alert: most often it refused the server's certificate.
    PeerAlert,
    /// Not TLS, or TLS the server does not speak (plain text on the TLS port, no common
    /// version or cipher suite, a malformed message).
    Protocol,
    /// The handshake did not complete within [`HANDSHAKE_TIMEOUT`].
    Timeout,
    /// The connection failed or closed during the handshake (a reset, a TCP probe that
    /// connects and leaves).
    Io,
    /// Any other rustls error.
    Other,
}

impl HandshakeFailure {
    pub const ALL: [HandshakeFailure; 7] = [
        HandshakeFailure::ClientCertRejected,
        HandshakeFailure::NoClientCert,
        HandshakeFailure::PeerAlert,
        HandshakeFailure::Protocol,
        HandshakeFailure::Timeout,
        HandshakeFailure::Io,
        HandshakeFailure::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            HandshakeFailure::ClientCertRejected => "client_cert_rejected",
            HandshakeFailure::NoClientCert => "no_client_cert",
            HandshakeFailure::PeerAlert => "peer_alert",
            HandshakeFailure::Protocol => "protocol",
            HandshakeFailure::Timeout => "timeout",
            HandshakeFailure::Io => "io",
            HandshakeFailure::Other => "other",
        }
    }

    /// The reason of a failed `accept`: tokio-rustls returns rustls's error inside an
    /// `io::Error`; anything else is the connection's own failure.
    pub fn of(e: &io::Error) -> HandshakeFailure {
        let Some(tls) = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        else {
            return HandshakeFailure::Io;
        };
        match tls {
            rustls::Error::NoCertificatesPresented => HandshakeFailure::NoClientCert,
            rustls::Error::InvalidCertificate(_) => HandshakeFailure::ClientCertRejected,
            rustls::Error::AlertReceived(_) => HandshakeFailure::PeerAlert,
            rustls::Error::InappropriateMessage { .. }
            | rustls::Error::InappropriateHandshakeMessage { .. }
            | rustls::Error::InvalidMessage(_)
            | rustls::Error::PeerIncompatible(_)
            | rustls::Error::PeerMisbehaved(_)
            | rustls::Error::NoApplicationProtocol
            | rustls::Error::DecryptError => HandshakeFailure::Protocol,
            _ => HandshakeFailure::Other,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Counts and logs refused handshakes: one throttle per reason, so a flood of one kind
/// (probes) does not hide the first line of another (a client whose certificate expired).
struct FailureLog {
    metrics: Arc<Metrics>,
    throttles: [LogThrottle; HandshakeFailure::ALL.len()],
}

impl FailureLog {
    fn new(metrics: Arc<Metrics>) -> FailureLog {
        FailureLog {
            metrics,
            throttles: std::array::from_fn(|_| LogThrottle::new(FAILURE_LOG_INTERVAL)),
        }
    }

    fn record(
        &self,
        peer: std::net::SocketAddr,
        reason: HandshakeFailure,
        error: &dyn std::fmt::Display,
    ) {
        self.metrics.tls_handshake_failed(reason.label());
        // One throttle per kind (`throttles` has `ALL.len()` of them): never `None`.
        let throttle = self.throttles.get(reason.index());
        if let Some(suppressed) = throttle.and_then(LogThrottle::admit) {
            tracing::warn!(
                %peer,
                reason = reason.label(),
                error = %error,
                similar_failures_not_logged = suppressed,
                "TLS handshake failed"
            );
        }
    }
}

/// One accepted TLS connection.
pub struct TlsConn(TlsStream<TcpStream>);

impl super::connection::Peer for TlsConn {
    fn peer(&self) -> Option<std::net::SocketAddr> {
        self.0.get_ref().0.peer_addr().ok()
    }
}

impl AsyncRead for TlsConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

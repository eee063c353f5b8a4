//! TLS on the gRPC port (rustls): a certificate chain and key, optionally a client CA that
//! every client certificate must chain to (mTLS). The files are re-read when their content
//! changes (a certificate rotation, a Kubernetes secret swap); each new connection uses the
//! latest valid set, and an unreadable or invalid set keeps the previous one.

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
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;
use tokio_stream::wrappers::ReceiverStream;

/// Where the TLS material is.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Require client certificates issued by this CA (mTLS).
    pub client_ca: Option<PathBuf>,
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
            let verifier = WebPkiClientVerifier::builder(Arc::new(roots))
                .build()
                .map_err(|e| file_error(ca, e))?;
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

    /// Accepts TCP connections on `listener` and yields those whose TLS handshake
    /// completes (a handshake never blocks the accept loop).
    pub fn incoming(&self, listener: TcpListener) -> ReceiverStream<io::Result<TlsConn>> {
        let (tx, rx) = mpsc::channel(128);
        let current = self.current.clone();
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                super::socket::no_delay(&tcp);
                let acceptor = TlsAcceptor::from(current.load_full());
                let tx = tx.clone();
                tokio::spawn(async move {
                    let handshake =
                        tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp));
                    match handshake.await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send(Ok(TlsConn(stream))).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        ReceiverStream::new(rx)
    }
}

/// One accepted TLS connection.
pub struct TlsConn(TlsStream<TcpStream>);

impl tonic::transport::server::Connected for TlsConn {
    type ConnectInfo = Option<std::net::SocketAddr>;

    fn connect_info(&self) -> Self::ConnectInfo {
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

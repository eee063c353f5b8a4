//! A TLS shardgate server on a loopback port and the certificates for it (made with
//! rcgen for each test), for the TLS tests.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use shardgate::config::Config;
use shardgate::engine::{Engine, EngineOptions};
use shardgate::server::grpc;
use shardgate::server::tls::{TlsFiles, TlsState};
use shardgate::service::metrics::Metrics;
use shardgate::service::RateLimiter;
use shardgate::store::memory::MemoryStore;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// A CA and a certificate it signed.
pub struct Pki {
    pub ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    pub fn new(name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, format!("{name} test CA"));
        let key = KeyPair::generate().unwrap();
        let ca = params.self_signed(&key).unwrap();
        Pki {
            ca_pem: ca.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// (certificate PEM, key PEM) for these names.
    pub fn leaf(&self, names: &[&str]) -> (String, String) {
        let params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

pub fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    // Write then rename, as a certificate rotation would.
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &p).unwrap();
    p
}

pub struct Running {
    pub port: u16,
    /// The server's metrics, as its /metrics would show them.
    pub metrics: Arc<Metrics>,
    _tls: Arc<TlsState>,
}

/// A memory-store server over TLS on a loopback port, certificates polled every 100 ms.
pub async fn start(files: TlsFiles) -> Running {
    let config = Config::from_yaml(
        "limits.yaml",
        "domain: tls\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100}\n",
    )
    .unwrap();
    let engine = Arc::new(Engine::new(
        Arc::new(MemoryStore::new()),
        EngineOptions::default(),
    ));
    let limiter = Arc::new(RateLimiter::new(Arc::new(config), engine));
    let metrics = limiter.metrics().clone();
    let tls = Arc::new(TlsState::start(files, Duration::from_millis(100)).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(grpc::serve_tls(
        limiter,
        listener,
        tls.clone(),
        std::future::pending(),
    ));
    Running {
        port,
        metrics,
        _tls: tls,
    }
}

pub fn request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "tls".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".into(),
                value: "v".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// One call over a fresh connection; `Err` if the connection or the call failed.
pub async fn call(port: u16, ca_pem: &str, identity: Option<(&str, &str)>) -> Result<(), String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let channel = Channel::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    RateLimitServiceClient::new(channel)
        .should_rate_limit(request())
        .await
        .map(|_| ())
        .map_err(|e| format!("call: {e:?}"))
}

/// A server over mutual TLS and the two CAs around it; the certificate files live as long
/// as this does (the server re-reads them).
pub struct MutualTls {
    pub server: Running,
    /// Signed the server's certificate (for `localhost` and `127.0.0.1`): clients trust it.
    pub server_pki: Pki,
    /// The CA the server requires client certificates from.
    pub client_pki: Pki,
    _dir: tempfile::TempDir,
}

/// A memory-store server that requires a client certificate from [`MutualTls::client_pki`].
pub async fn start_mutual() -> MutualTls {
    start_mutual_with(false).await
}

/// [`start_mutual`], or with `optional`, a server that also serves clients presenting no
/// certificate (one presented is still checked against the client CA).
pub async fn start_mutual_with(optional: bool) -> MutualTls {
    let dir = tempfile::tempdir().unwrap();
    let server_pki = Pki::new("server");
    let client_pki = Pki::new("client");
    let (cert, key) = server_pki.leaf(&["localhost", "127.0.0.1"]);
    let files = TlsFiles {
        cert: write(dir.path(), "tls.crt", &cert),
        key: write(dir.path(), "tls.key", &key),
        client_ca: Some(write(dir.path(), "client-ca.crt", &client_pki.ca_pem)),
        client_cert_optional: optional,
    };
    MutualTls {
        server: start(files).await,
        server_pki,
        client_pki,
        _dir: dir,
    }
}

//! TLS on the gRPC port: mutual TLS refuses clients without a certificate from the
//! configured CA and answers those with one; certificates are re-read when they change.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use shardgate::config::Config;
use shardgate::engine::{Engine, EngineOptions};
use shardgate::service::grpc;
use shardgate::service::tls::{TlsFiles, TlsState};
use shardgate::service::RateLimiter;
use shardgate::store::memory::MemoryStore;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

/// A CA and a certificate it signed.
struct Pki {
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new(name: &str) -> Pki {
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
    fn leaf(&self, names: &[&str]) -> (String, String) {
        let params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    // Write then rename, as a certificate rotation would.
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &p).unwrap();
    p
}

struct Running {
    port: u16,
    _tls: Arc<TlsState>,
}

async fn start(files: TlsFiles) -> Running {
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
    let tls = Arc::new(TlsState::start(files, Duration::from_millis(100)).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(grpc::serve_tls(
        limiter,
        listener,
        tls.clone(),
        std::future::pending(),
    ));
    Running { port, _tls: tls }
}

fn request() -> RateLimitRequest {
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
async fn call(port: u16, ca_pem: &str, identity: Option<(&str, &str)>) -> Result<(), String> {
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

#[tokio::test]
async fn mutual_tls_refuses_clients_without_a_valid_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let server_pki = Pki::new("server");
    let client_pki = Pki::new("client");
    let (cert, key) = server_pki.leaf(&["localhost", "127.0.0.1"]);
    let files = TlsFiles {
        cert: write(dir.path(), "tls.crt", &cert),
        key: write(dir.path(), "tls.key", &key),
        client_ca: Some(write(dir.path(), "client-ca.crt", &client_pki.ca_pem)),
    };
    let server = start(files).await;

    let (ccert, ckey) = client_pki.leaf(&["client-1"]);
    call(server.port, &server_pki.ca_pem, Some((&ccert, &ckey)))
        .await
        .expect("a client with a certificate from the client CA gets answers");

    let refused = call(server.port, &server_pki.ca_pem, None).await;
    assert!(
        refused.is_err(),
        "a client without a certificate must be refused"
    );

    let stranger = Pki::new("stranger");
    let (scert, skey) = stranger.leaf(&["client-2"]);
    let refused = call(server.port, &server_pki.ca_pem, Some((&scert, &skey))).await;
    assert!(
        refused.is_err(),
        "a certificate from another CA must be refused"
    );

    // Plain text on the TLS port gets no answer either.
    let plain = async {
        let mut c =
            RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", server.port)).await?;
        c.should_rate_limit(request()).await.map_err(Into::into)
    };
    let plain: Result<_, Box<dyn std::error::Error>> =
        tokio::time::timeout(Duration::from_secs(5), plain)
            .await
            .unwrap_or_else(|_| Err("timed out".into()));
    assert!(plain.is_err(), "plain text must be refused");
}

#[tokio::test]
async fn server_only_tls_serves_any_client_that_trusts_it() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("server");
    let (cert, key) = pki.leaf(&["localhost"]);
    let files = TlsFiles {
        cert: write(dir.path(), "tls.crt", &cert),
        key: write(dir.path(), "tls.key", &key),
        client_ca: None,
    };
    let server = start(files).await;
    call(server.port, &pki.ca_pem, None)
        .await
        .expect("no client certificate needed");
    let other = Pki::new("other");
    assert!(
        call(server.port, &other.ca_pem, None).await.is_err(),
        "the client must verify the server"
    );
}

#[tokio::test]
async fn certificates_are_reread_when_they_change() {
    let dir = tempfile::tempdir().unwrap();
    let old = Pki::new("old");
    let (cert, key) = old.leaf(&["localhost"]);
    let files = TlsFiles {
        cert: write(dir.path(), "tls.crt", &cert),
        key: write(dir.path(), "tls.key", &key),
        client_ca: None,
    };
    let server = start(files).await;
    call(server.port, &old.ca_pem, None).await.unwrap();

    let new = Pki::new("new");
    let (cert, key) = new.leaf(&["localhost"]);
    write(dir.path(), "tls.key", &key);
    write(dir.path(), "tls.crt", &cert);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if call(server.port, &new.ca_pem, None).await.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new certificate was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        call(server.port, &old.ca_pem, None).await.is_err(),
        "the old certificate is gone"
    );

    // A broken rotation keeps the certificate in force.
    write(dir.path(), "tls.crt", "not a certificate");
    tokio::time::sleep(Duration::from_millis(400)).await;
    call(server.port, &new.ca_pem, None)
        .await
        .expect("still served with the last good certificate");
}

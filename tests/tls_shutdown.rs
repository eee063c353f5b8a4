//! With TLS, the listening socket closes when shutdown starts: a new client is refused at
//! once (before, the accepting task kept the listener until its next accept, and a client
//! that connected was left without a TLS answer for the whole grace), while a call in
//! flight on an open connection still finishes.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::held::Held;
use common::tls::{request, write, Pki};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use shardgate::config::Config;
use shardgate::engine::{Engine, EngineOptions};
use shardgate::server::grpc;
use shardgate::server::tls::{TlsFiles, TlsState};
use shardgate::service::RateLimiter;
use tonic::transport::{Certificate, Channel, ClientTlsConfig};

const RULES: &str =
    "domain: tls\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 100}\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tls_listener_refuses_new_clients_at_shutdown_while_calls_finish() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new("server");
    let (cert, key) = pki.leaf(&["localhost"]);
    let files = TlsFiles {
        cert: write(dir.path(), "tls.crt", &cert),
        key: write(dir.path(), "tls.key", &key),
        client_ca: None,
        client_cert_optional: false,
    };
    let (store, release) = Held::new();
    let store = Arc::new(store);
    let config = Config::from_yaml("limits.yaml", RULES).unwrap();
    let engine = Arc::new(Engine::new(store.clone(), EngineOptions::default()));
    let limiter = Arc::new(RateLimiter::new(Arc::new(config), engine));
    let tls = Arc::new(TlsState::start(files, Duration::from_secs(60)).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(grpc::serve_tls(limiter, listener, tls, async {
        let _ = stop_rx.await;
    }));

    // A call in flight: it waits in the store until released.
    let tls_config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&pki.ca_pem))
        .domain_name("localhost");
    let channel = Channel::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(tls_config)
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = RateLimitServiceClient::new(channel);
    let in_flight = tokio::spawn(async move { client.should_rate_limit(request()).await });
    let patience = Instant::now() + Duration::from_secs(10);
    while store.calls.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(Instant::now() < patience, "the call reached the store");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Shutdown: within a second, a new TCP connection is refused.
    stop_tx.send(()).unwrap();
    let stopped = Instant::now();
    let refused = loop {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Err(_) => break stopped.elapsed(),
            Ok(_) if stopped.elapsed() > Duration::from_secs(5) => {
                panic!("a new client was still accepted 5 s after shutdown began")
            }
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    assert!(
        refused < Duration::from_secs(1),
        "refused after {refused:?}"
    );

    // The call in flight finishes, answered.
    release.send(true).unwrap();
    let answered = tokio::time::timeout(Duration::from_secs(10), in_flight)
        .await
        .expect("the call in flight finished")
        .unwrap();
    assert!(answered.is_ok(), "{answered:?}");
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .expect("the port stopped once its calls were done")
        .unwrap();
}

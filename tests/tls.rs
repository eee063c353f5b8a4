//! TLS on the gRPC port: mutual TLS refuses clients without a certificate from the
//! configured CA and answers those with one (with the certificate optional, those without
//! one too, never those with another CA's); certificates are re-read when they change.
//! (Refused handshakes' counters and log lines: `tls_handshake_failures.rs`.)

mod common;

use std::time::{Duration, Instant};

use common::tls::{call, request, start, start_mutual, start_mutual_with, write, MutualTls, Pki};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use shardgate::server::tls::TlsFiles;

#[tokio::test]
async fn mutual_tls_refuses_clients_without_a_valid_certificate() {
    let MutualTls {
        server,
        server_pki,
        client_pki,
        ..
    } = &start_mutual().await;

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

/// Envoy Gateway's `GRPC_SERVER_TLS_CA_CERT` (`--tls-client-cert-optional`): a client
/// without a certificate is served, one with a certificate from the CA too, and one with a
/// certificate from another CA is refused.
#[tokio::test]
async fn an_optional_client_certificate_is_still_checked() {
    let MutualTls {
        server,
        server_pki,
        client_pki,
        ..
    } = &start_mutual_with(true).await;

    call(server.port, &server_pki.ca_pem, None)
        .await
        .expect("a client without a certificate is served");
    let (ccert, ckey) = client_pki.leaf(&["client-1"]);
    call(server.port, &server_pki.ca_pem, Some((&ccert, &ckey)))
        .await
        .expect("a client with a certificate from the client CA is served");

    let stranger = Pki::new("stranger");
    let (scert, skey) = stranger.leaf(&["client-2"]);
    let refused = call(server.port, &server_pki.ca_pem, Some((&scert, &skey))).await;
    assert!(
        refused.is_err(),
        "a certificate from another CA must be refused, optional or not"
    );
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
        client_cert_optional: false,
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
        client_cert_optional: false,
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

/// The cap on TLS handshakes under way: clients that connect and never send a ClientHello
/// hold at most `MAX_HANDSHAKES` of them (the gauge shows it); the next client waits in the
/// listen queue, not refused, and gets its handshake as soon as one of them leaves.
#[tokio::test]
async fn stalled_clients_hold_at_most_the_handshake_cap_and_the_next_gets_in_when_one_leaves() {
    use shardgate::server::tls::MAX_HANDSHAKES;
    let MutualTls {
        server,
        server_pki,
        client_pki,
        ..
    } = &start_mutual().await;
    let handshakes = || server.metrics.port().handshakes();
    let mut stalled = Vec::with_capacity(MAX_HANDSHAKES + 8);
    // A few past the cap: they wait in the listen queue.
    for _ in 0..MAX_HANDSHAKES + 8 {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", server.port))
            .await
            .expect("a TCP connection (raise `ulimit -n` past 2,100 if this fails)");
        stalled.push(tcp);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while handshakes() < MAX_HANDSHAKES as i64 {
        assert!(Instant::now() < deadline, "{} handshakes", handshakes());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (ccert, ckey) = client_pki.leaf(&["client-1"]);
    let port = server.port;
    let ca = server_pki.ca_pem.clone();
    let client = tokio::spawn(async move { call(port, &ca, Some((&ccert, &ckey))).await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(handshakes(), MAX_HANDSHAKES as i64, "never past the cap");
    assert!(
        !client.is_finished(),
        "a client past the cap waits for a slot"
    );

    // The stalled clients leave (each handshake ends as `io`): the queue moves on.
    stalled.clear();
    let answered = tokio::time::timeout(Duration::from_secs(5), client)
        .await
        .expect("the waiting client got in once slots were free")
        .unwrap();
    answered.expect("and its call was answered");
    let deadline = Instant::now() + Duration::from_secs(5);
    while handshakes() != 0 {
        assert!(
            Instant::now() < deadline,
            "{} handshakes left",
            handshakes()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

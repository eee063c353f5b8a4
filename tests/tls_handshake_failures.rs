//! Refused TLS handshakes: each is counted in `shardgate_tls_handshake_failures_total`
//! under its reason, and logged at warn with the peer's address, one line per reason per
//! 10 s.

mod common;

use std::time::{Duration, Instant};

use common::server::LogBuffer;
use common::tls::{call, start_mutual, MutualTls, Pki};
use shardgate::service::metrics::Metrics;

/// `shardgate_tls_handshake_failures_total` by reason, as /metrics shows it.
fn handshake_failures(metrics: &Metrics) -> std::collections::BTreeMap<String, u64> {
    let prefix = "shardgate_tls_handshake_failures_total{reason=\"";
    metrics
        .render()
        .lines()
        .filter_map(|line| line.strip_prefix(prefix))
        .map(|rest| {
            let (reason, value) = rest.split_once("\"} ").expect("a labelled counter line");
            (reason.to_string(), value.trim().parse().unwrap())
        })
        .collect()
}

/// Waits (bounded) until the count of `reason` is above `before`'s, then returns every
/// count: the handshake's task records its failure after the client has already seen it.
async fn counted(
    metrics: &Metrics,
    before: &std::collections::BTreeMap<String, u64>,
    reason: &str,
) -> std::collections::BTreeMap<String, u64> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = handshake_failures(metrics);
        if now.get(reason) > before.get(reason) {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "no {reason} failure counted: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A raw TCP client that sends `bytes` (if any) and closes; returns its own address.
async fn raw_client(port: u16, bytes: &[u8]) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let local = tcp.local_addr().unwrap();
    if !bytes.is_empty() {
        tcp.write_all(bytes).await.unwrap();
        // The server answers with an alert or closes; either ends the read.
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut sink)).await;
    }
    local
}

// The only test of this binary, on a current-thread runtime (the default): the server's
// tasks run on this thread, under the test's log subscriber, and no other test's server
// logs into it.
#[tokio::test]
async fn refused_handshakes_are_counted_by_reason_and_logged() {
    let log = LogBuffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(log.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let MutualTls {
        server,
        server_pki,
        client_pki,
        ..
    } = &start_mutual().await;
    let reason =
        |m: &std::collections::BTreeMap<String, u64>, r: &str| m.get(r).copied().unwrap_or(0);

    // A good client moves no counter.
    let (ccert, ckey) = client_pki.leaf(&["client-1"]);
    call(server.port, &server_pki.ca_pem, Some((&ccert, &ckey)))
        .await
        .unwrap();
    let before = handshake_failures(&server.metrics);
    assert!(before.is_empty(), "{before:?}");

    // No client certificate.
    assert!(call(server.port, &server_pki.ca_pem, None).await.is_err());
    let after = counted(&server.metrics, &before, "no_client_cert").await;
    assert_eq!(reason(&after, "client_cert_rejected"), 0, "{after:?}");

    // A certificate from another CA.
    let before = after;
    let stranger = Pki::new("stranger");
    let (scert, skey) = stranger.leaf(&["client-2"]);
    assert!(call(server.port, &server_pki.ca_pem, Some((&scert, &skey)))
        .await
        .is_err());
    let after = counted(&server.metrics, &before, "client_cert_rejected").await;
    assert_eq!(
        reason(&after, "no_client_cert"),
        reason(&before, "no_client_cert"),
        "{after:?}"
    );

    // Plain text (an HTTP/2 preface) on the TLS port.
    let before = after;
    let plain = raw_client(server.port, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
    let after = counted(&server.metrics, &before, "protocol").await;
    assert_eq!(reason(&after, "protocol"), 1, "{after:?}");

    // A second one within 10 s is counted but not logged (one line per reason).
    let before = after;
    let plain_again = raw_client(server.port, b"GET / HTTP/1.1\r\n\r\n").await;
    let after = counted(&server.metrics, &before, "protocol").await;
    assert_eq!(reason(&after, "protocol"), 2, "{after:?}");

    // A connection closed before any byte. (The refused tonic clients above may have left
    // a connection of their own closing mid-handshake too: `io` is counted, not exact.)
    let before = after;
    raw_client(server.port, b"").await;
    counted(&server.metrics, &before, "io").await;

    let text = log.take();
    let lines = |r: &str| {
        text.lines()
            .filter(|l| {
                l.contains("TLS handshake failed") && l.contains(&format!("reason=\"{r}\""))
            })
            .collect::<Vec<_>>()
    };
    for r in ["no_client_cert", "client_cert_rejected", "protocol", "io"] {
        let found = lines(r);
        assert_eq!(found.len(), 1, "one line for {r}:\n{text}");
        assert!(found[0].contains(" WARN "), "{}", found[0]);
        assert!(found[0].contains("peer=127.0.0.1:"), "{}", found[0]);
        assert!(
            found[0].contains("similar_failures_not_logged=0"),
            "{}",
            found[0]
        );
    }
    assert!(
        lines("protocol")[0].contains(&format!("peer={plain}")),
        "{text}"
    );
    assert!(!text.contains(&format!("peer={plain_again}")), "{text}");
}

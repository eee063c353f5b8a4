//! Rules over xDS (issue 30): the subscription against a test control plane of our own.
//! A push is applied whole and ACKed with its version; a bad one is NACKed with the last
//! good version and its errors, the rules in force kept; the stream comes back after the
//! control plane closes it or goes away, asking for the last version applied; and a server
//! started with `--xds-server` answers by the pushed rules, its readiness waiting for the
//! first push.

mod common;

use std::time::Duration;

use common::control_plane::ControlPlane;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use shardgate::config::xds::RATE_LIMIT_CONFIG_TYPE;
use shardgate::config::LoadOptions;
use shardgate::server::xds::{subscribe, Push, XdsOptions, XdsTls};
use tokio::sync::mpsc;

fn rules(domain: &str, per_minute: u32) -> RateLimitConfig {
    RateLimitConfig {
        name: domain.into(),
        domain: domain.into(),
        descriptors: vec![RateLimitDescriptor {
            key: "user".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Minute as i32,
                requests_per_unit: per_minute,
                ..Default::default()
            }),
            ..Default::default()
        }],
    }
}

fn options(plane: &ControlPlane) -> XdsOptions {
    XdsOptions {
        server: plane.url(),
        node_id: "envoy-ratelimit".into(),
        start_without_rules: false,
        tls: XdsTls::default(),
    }
}

/// The subscription running, its pushes' outcomes on a channel.
fn subscribed(options: XdsOptions) -> (tokio::task::JoinHandle<()>, mpsc::UnboundedReceiver<Push>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(subscribe(
        options,
        LoadOptions::default(),
        move |_, push| {
            let _ = tx.send(push);
        },
    ));
    (task, rx)
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Push>) -> Push {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("a push within 10 s")
        .expect("the subscription runs")
}

#[tokio::test]
async fn pushes_are_acked_a_bad_one_nacked_and_the_good_rules_kept() {
    let mut plane = ControlPlane::start(None).await;
    let (task, mut pushes) = subscribed(options(&plane));

    let first = plane.request().await;
    assert_eq!(first.type_url, RATE_LIMIT_CONFIG_TYPE);
    assert_eq!(first.node.as_ref().unwrap().id, "envoy-ratelimit");
    assert_eq!(
        (first.version_info.as_str(), first.response_nonce.as_str()),
        ("", "")
    );

    plane.push("v1", "n1", &[rules("edge", 10)]).await;
    let config = next(&mut pushes).await.expect("v1 applies");
    assert!(config.domain("edge").is_some());
    let ack = plane.request().await;
    assert_eq!(
        (ack.version_info.as_str(), ack.response_nonce.as_str()),
        ("v1", "n1")
    );
    assert!(ack.error_detail.is_none(), "{ack:?}");

    // A key-only node with no limit and no children is an error, as in a file.
    let mut bad = rules("edge", 10);
    bad.descriptors[0].rate_limit = Some(RateLimitPolicy {
        unit: RateLimitUnit::Unknown as i32,
        requests_per_unit: 5,
        ..Default::default()
    });
    plane.push("v2", "n2", &[bad]).await;
    let errors = next(&mut pushes).await.expect_err("v2 is refused");
    assert!(errors.contains("xds:edge"), "{errors}");
    let nack = plane.request().await;
    assert_eq!(
        (nack.version_info.as_str(), nack.response_nonce.as_str()),
        ("v1", "n2")
    );
    let detail = nack.error_detail.expect("the NACK says why");
    assert_eq!(detail.code, 3);
    assert!(detail.message.contains("unit"), "{}", detail.message);

    plane
        .push("v3", "n3", &[rules("edge", 20), rules("api", 5)])
        .await;
    let config = next(&mut pushes).await.expect("v3 applies");
    assert_eq!(config.domains().count(), 2);
    assert_eq!(plane.request().await.version_info, "v3");
    task.abort();
}

#[tokio::test]
async fn the_stream_comes_back_asking_for_the_last_version_applied() {
    let mut plane = ControlPlane::start(None).await;
    let (task, mut pushes) = subscribed(options(&plane));
    plane.request().await;
    plane.push("v1", "n1", &[rules("edge", 10)]).await;
    next(&mut pushes).await.unwrap();
    plane.request().await;

    // The control plane ends the stream: a new one asks for v1.
    plane.close_stream();
    let again = plane.request().await;
    assert_eq!(again.version_info, "v1");
    assert_eq!(again.response_nonce, "");
    assert_eq!(plane.streams(), 2);

    // The control plane goes away and comes back on the same port.
    let addr = plane.stop();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut plane = ControlPlane::start(Some(addr)).await;
    let back = plane.request().await;
    assert_eq!(back.version_info, "v1");
    plane.push("v2", "n9", &[rules("edge", 99)]).await;
    next(&mut pushes).await.unwrap();
    assert_eq!(plane.request().await.version_info, "v2");
    task.abort();
}

/// `shardgate serve` with these arguments and environment, on free loopback ports.
struct Served {
    child: std::process::Child,
    http: u16,
}

impl Served {
    fn start(args: &[&str], env: &[(&str, String)]) -> Served {
        let free = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        };
        let (grpc, http) = (free(), free());
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_shardgate"))
            .arg("serve")
            .args(args)
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k.to_string(), v.clone())))
            .env("SHARDGATE_GRPC_ADDR", format!("127.0.0.1:{grpc}"))
            .env("SHARDGATE_HTTP_ADDR", format!("127.0.0.1:{http}"))
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .unwrap();
        Served { child, http }
    }

    /// `(status, body)` of one HTTP request to the server's HTTP port.
    fn http(&self, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.http)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let status = out.split_whitespace().nth(1)?.parse().ok()?;
        let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
        Some((status, body))
    }

    fn ready(&self) -> bool {
        self.http("GET", "/healthcheck", "")
            .is_some_and(|(s, _)| s == 200)
    }

    fn ask(&self, user: &str) -> String {
        let body = format!(
            r#"{{"domain":"edge","descriptors":[{{"entries":[{{"key":"user","value":"{user}"}}]}}]}}"#
        );
        let (_, answer) = self.http("POST", "/json", &body).expect("answered");
        let v: serde_json::Value = serde_json::from_str(&answer).expect(&answer);
        v["overallCode"].as_str().unwrap_or_default().to_string()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "{what} within 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_server_on_xds_is_ready_with_its_first_push_and_answers_by_the_pushed_rules() {
    let mut plane = ControlPlane::start(None).await;
    let server = Served::start(&["--xds-server", &plane.url(), "--xds-node-id", "n1"], &[]);
    let first = plane.request().await;
    assert_eq!(first.node.unwrap().id, "n1");
    // No rules yet: not ready (readiness waits for the first push).
    until("the HTTP port", || {
        server.http("GET", "/healthcheck", "").is_some()
    })
    .await;
    assert!(!server.ready(), "ready before any rules");

    plane.push("1", "a", &[rules("edge", 2)]).await;
    until("ready after the first push", || server.ready()).await;
    assert_eq!(plane.request().await.version_info, "1");
    let answers: Vec<String> = (0..3).map(|_| server.ask("alice")).collect();
    assert_eq!(answers, ["OK", "OK", "OVER_LIMIT"]);
    let (_, rlconfig) = server.http("GET", "/rlconfig", "").unwrap();
    assert!(rlconfig.contains("edge"), "{rlconfig}");

    // A new push replaces the rules: 2/min becomes 100/min for a fresh user.
    plane.push("2", "b", &[rules("edge", 100)]).await;
    assert_eq!(plane.request().await.version_info, "2");
    until("the new rules", || server.ask("bob") == "OK").await;
    let answers: Vec<String> = (0..5).map(|_| server.ask("carol")).collect();
    assert!(answers.iter().all(|a| a == "OK"), "{answers:?}");

    // The operator's page says which push is in force, and which one was refused.
    let mut bad = rules("edge", 10);
    bad.descriptors[0].rate_limit = Some(RateLimitPolicy {
        unit: RateLimitUnit::Unknown as i32,
        requests_per_unit: 5,
        ..Default::default()
    });
    plane.push("3", "c", &[bad]).await;
    let nack = plane.request().await;
    assert_eq!(nack.version_info, "2", "{nack:?}");
    let (status, state) = server.http("GET", "/ui/state", "").unwrap();
    assert_eq!(status, 200, "{state}");
    let state: serde_json::Value = serde_json::from_str(&state).unwrap();
    let events = &state["config"]["events"];
    let (source, refused) = (&events["source"], &events["rejected"]["source"]);
    let plane_url = plane.url();
    assert_eq!(
        source,
        &format!("xDS {plane_url}, version \"2\""),
        "{events}"
    );
    assert_eq!(
        refused,
        &format!("xDS {plane_url}, version \"3\""),
        "{events}"
    );
    assert!(
        events["rejected"]["error"]
            .as_str()
            .unwrap()
            .contains("unit"),
        "{events}"
    );
}

#[tokio::test]
async fn envoy_gateways_environment_starts_without_rules_and_subscribes_as_its_node() {
    let mut plane = ControlPlane::start(None).await;
    let server = Served::start(
        &[],
        &[
            ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
            ("CONFIG_GRPC_XDS_SERVER_URL", plane.addr.to_string()),
            ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".into()),
            ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()),
            ("RUNTIME_ROOT", "/nonexistent".into()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ],
    );
    // Ready before any push, as upstream with FORCE_START_WITHOUT_INITIAL_CONFIG.
    until("ready without rules", || server.ready()).await;
    let first = plane.request().await;
    assert_eq!(first.node.unwrap().id, "envoy-ratelimit");
    plane.push("7", "x", &[rules("edge", 1)]).await;
    assert_eq!(plane.request().await.version_info, "7");
    until("the pushed rule", || server.ask("dave") == "OVER_LIMIT").await;
}

/// A control plane speaking mutual TLS as Envoy Gateway's does (its certificate names
/// `envoy-gateway`, clients need one from its CA), and options that subscribe to it with a
/// client certificate from files in `dir`: the CA and the leaf, to rotate it.
async fn mutual_tls_plane(dir: &std::path::Path) -> (ControlPlane, XdsOptions, common::tls::Pki) {
    use tonic::transport::{Certificate, Identity, ServerTlsConfig};
    let pki = common::tls::Pki::new("control plane");
    let (server_cert, server_key) = pki.leaf(&["envoy-gateway"]);
    let (client_cert, client_key) = pki.leaf(&["envoy-ratelimit"]);
    let write = |name: &str, text: &str| common::tls::write(dir, name, text);
    let (ca, cert, key) = (
        write("ca.crt", &pki.ca_pem),
        write("tls.crt", &client_cert),
        write("tls.key", &client_key),
    );
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&server_cert, &server_key))
        .client_ca_root(Certificate::from_pem(&pki.ca_pem));
    let plane = ControlPlane::start_with(None, Some(tls)).await;
    // The certificate names envoy-gateway (the Service's name), not the loopback address.
    let mut with_cert = options(&plane);
    with_cert.server = format!("https://{}", plane.addr);
    with_cert.tls = XdsTls {
        ca: Some(ca),
        cert: Some(cert),
        key: Some(key),
        server_name: Some("envoy-gateway".into()),
        ..XdsTls::default()
    };
    (plane, with_cert, pki)
}

#[tokio::test]
async fn mutual_tls_to_the_control_plane_as_envoy_gateways_certificates_set_it_up() {
    let dir = tempfile::tempdir().unwrap();
    let (mut plane, with_cert, _pki) = mutual_tls_plane(dir.path()).await;
    let (task, mut pushes) = subscribed(with_cert.clone());
    plane.request().await;
    plane.push("1", "a", &[rules("edge", 1)]).await;
    next(&mut pushes).await.expect("applied over mutual TLS");
    assert_eq!(plane.request().await.version_info, "1");
    task.abort();

    // Without a client certificate the control plane never sees a request.
    let mut without = with_cert;
    without.tls.cert = None;
    without.tls.key = None;
    let streams = plane.streams();
    let (task, _pushes) = subscribed(without);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        plane.streams(),
        streams,
        "no stream without a client certificate"
    );
    task.abort();
}

#[tokio::test]
async fn a_rotated_client_certificate_is_used_without_waiting_for_the_stream_to_fail() {
    let dir = tempfile::tempdir().unwrap();
    let (mut plane, mut rotating, pki) = mutual_tls_plane(dir.path()).await;
    rotating.tls.rotation_check = Duration::from_millis(200);
    let write = |name: &str, text: &str| common::tls::write(dir.path(), name, text);
    let (task, mut pushes) = subscribed(rotating);
    plane.request().await;
    plane.push("1", "a", &[rules("edge", 1)]).await;
    next(&mut pushes).await.expect("applied");
    assert_eq!(plane.request().await.version_info, "1");
    // Unchanged files keep the stream: several checks pass, no new stream.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(plane.streams(), 1);

    // cert-manager writes a new certificate and key (same CA) while the stream is open.
    let (new_cert, new_key) = pki.leaf(&["envoy-ratelimit"]);
    write("tls.key", &new_key);
    write("tls.crt", &new_cert);
    // The stream is opened again, with the new certificate, asking for the version in
    // force; nothing was applied or refused meanwhile.
    let resumed = tokio::time::timeout(Duration::from_secs(10), plane.request())
        .await
        .expect("a new stream within 10 s");
    assert_eq!(resumed.version_info, "1");
    assert_eq!(plane.streams(), 2);
    let certs = plane.client_certs();
    assert!(
        certs[0].is_some() && certs[1].is_some(),
        "mutual TLS both times"
    );
    assert_ne!(
        certs[0], certs[1],
        "the second stream presented the new certificate"
    );
    assert!(pushes.try_recv().is_err(), "no push came in between");
    task.abort();
}

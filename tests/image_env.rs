//! The image under Envoy Gateway's environment (issue 48, item 1): the binary run as the
//! image runs it — the Dockerfile's own `ENV` lines, read from the Dockerfile — under Envoy
//! Gateway's generated Deployment's environment (`tests/fixtures/envoy-gateway`, its
//! `default` variant) answers by the rules its control plane pushes over mutual TLS, never
//! by a rule directory of the image's, on the ports upstream's variables name. (Istio's
//! environment, on rule files, is `tests/python/test_image_dropin.py`'s.)
//!
//! Only what this machine cannot have is replaced: the certificate files (a test CA's,
//! in a temporary directory), the control plane's address, the statsd_exporter mapping's
//! path, free ports for GRPC_PORT/PORT/PROMETHEUS_ADDR, and the Redis store (the variant's
//! `REDIS_*` are dropped: the embedded store, this test being about where the rules come
//! from).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::control_plane::ControlPlane;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};

/// Every variable the Dockerfile's `ENV` instructions set (none, today: any of ours would
/// shadow upstream's).
fn image_env() -> BTreeMap<String, String> {
    let dockerfile = include_str!("../Dockerfile");
    let mut env = BTreeMap::new();
    let mut in_env = false;
    for line in dockerfile.lines() {
        let body = match line.strip_prefix("ENV ") {
            Some(rest) => rest,
            None if in_env && line.starts_with(char::is_whitespace) => line,
            None => {
                in_env = false;
                continue;
            }
        };
        for pair in body.split_whitespace() {
            if let Some((k, v)) = pair.split_once('=') {
                env.insert(k.to_string(), v.to_string());
            }
        }
        in_env = body.trim_end().ends_with('\\');
    }
    env
}

#[derive(serde::Deserialize)]
struct Variant {
    env: BTreeMap<String, String>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `(status, body)` of one HTTP/1.1 request to `port`.
fn http(port: u16, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
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
    Some((status, out.split_once("\r\n\r\n")?.1.to_string()))
}

struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "{what} within 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn the_image_under_envoy_gateways_environment_answers_by_the_pushed_rules() {
    assert!(
        !image_env()
            .keys()
            .any(|k| k.starts_with("SHARDGATE_") || k == "RUST_LOG"),
        "the image shadows upstream's variables: {:?}",
        image_env()
    );
    let dir = tempfile::tempdir().unwrap();
    let pki = common::tls::Pki::new("envoy gateway");
    let (server_cert, server_key) = pki.leaf(&["envoy-gateway", "127.0.0.1"]);
    let (client_cert, client_key) = pki.leaf(&["envoy-ratelimit"]);
    let write = |name: &str, text: &str| common::tls::write(dir.path(), name, text);
    write("ca.crt", &pki.ca_pem);
    write("tls.crt", &client_cert);
    write("tls.key", &client_key);
    let tls = tonic::transport::ServerTlsConfig::new()
        .identity(tonic::transport::Identity::from_pem(
            &server_cert,
            &server_key,
        ))
        .client_ca_root(tonic::transport::Certificate::from_pem(&pki.ca_pem));
    let mut plane = ControlPlane::start_with(None, Some(tls)).await;

    let variants: BTreeMap<String, Variant> =
        serde_saphyr::from_str(include_str!("fixtures/envoy-gateway/deployment-env.yaml")).unwrap();
    let (grpc, http_port, prometheus) = (free_port(), free_port(), free_port());
    let mapping = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/envoy-gateway/statsd_conf.yaml"
    );
    let certs = dir.path().display().to_string();
    let mut env = image_env();
    for (k, v) in &variants["default"].env {
        if k.starts_with("REDIS_") {
            continue;
        }
        let v = match k.as_str() {
            "CONFIG_GRPC_XDS_SERVER_URL" => plane.addr.to_string(),
            "PROMETHEUS_ADDR" => format!(":{prometheus}"),
            "PROMETHEUS_MAPPER_YAML" => mapping.to_string(),
            _ => v.replace("/certs", &certs),
        };
        env.insert(k.clone(), v);
    }
    env.insert("GRPC_PORT".into(), grpc.to_string());
    env.insert("PORT".into(), http_port.to_string());
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_shardgate"))
        .arg("serve")
        .env_clear()
        .envs(&env)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    let _server = Killed(child);

    // Ready before any push (FORCE_START_WITHOUT_INITIAL_CONFIG), subscribed as its node.
    until("the HTTP port on PORT", || {
        http(http_port, "GET", "/healthcheck", "").is_some_and(|(s, _)| s == 200)
    })
    .await;
    let first = tokio::time::timeout(Duration::from_secs(20), plane.request())
        .await
        .expect("a subscription over mutual TLS");
    assert_eq!(first.node.unwrap().id, "envoy-ratelimit");
    // No rules of the image's: its example's domain is not served.
    let (_, rlconfig) = http(http_port, "GET", "/rlconfig", "").unwrap();
    assert!(!rlconfig.contains("edge"), "{rlconfig}");

    let rules = RateLimitConfig {
        name: "default/eg/http".into(),
        domain: "default/eg/http".into(),
        descriptors: vec![RateLimitDescriptor {
            key: "x-user-id".into(),
            rate_limit: Some(RateLimitPolicy {
                unit: RateLimitUnit::Minute as i32,
                requests_per_unit: 1,
                ..Default::default()
            }),
            ..Default::default()
        }],
    };
    plane.push("1", "a", &[rules]).await;
    assert_eq!(plane.request().await.version_info, "1");
    let ask = || {
        let body = r#"{"domain":"default/eg/http","descriptors":[{"entries":[{"key":"x-user-id","value":"u1"}]}]}"#;
        let (_, answer) = http(http_port, "POST", "/json", body).expect("answered");
        let v: serde_json::Value = serde_json::from_str(&answer).expect(&answer);
        v["overallCode"].as_str().unwrap_or_default().to_string()
    };
    until("the pushed rule in force", || {
        http(http_port, "GET", "/rlconfig", "").is_some_and(|(_, t)| t.contains("x-user-id"))
    })
    .await;
    assert_eq!([ask(), ask()], ["OK", "OVER_LIMIT"]);
    // And upstream's Prometheus port where PROMETHEUS_ADDR says.
    let (status, _) = http(prometheus, "GET", "/metrics", "").expect("the Prometheus port");
    assert_eq!(status, 200);
}

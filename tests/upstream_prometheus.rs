//! envoyproxy/ratelimit's Prometheus port, as Envoy Gateway's Deployment asks for it: the
//! `shardgate` binary started with upstream's environment only (`USE_PROMETHEUS=true`,
//! `PROMETHEUS_ADDR`, `PROMETHEUS_MAPPER_YAML` = Envoy Gateway's mapping file), a scripted
//! set of calls (within and over a limit, a shadow-mode rule, a two-key descriptor that
//! only the file's regex mappings name), then the scrape: every metric name, label and
//! value as Envoy Gateway's dashboards read them, and the page accepted by `promtool check
//! metrics`. A mapping file shardgate cannot follow stops the start, naming what.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::server::{code, desc, one, request, Rls};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

const EG_MAPPING: &str = "tests/fixtures/envoy-gateway/statsd_conf.yaml";

const RULES: &str = r#"
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: path
    value: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: tenant
    value: acme
    descriptors:
      - key: api
        rate_limit: {unit: hour, requests_per_unit: 10}
"#;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The rule directory upstream's variables point at: `ROOT/ratelimit/config`.
fn rule_root(dir: &Path) -> PathBuf {
    let config = dir.join("ratelimit").join("config");
    std::fs::create_dir_all(&config).expect("rule directory");
    std::fs::write(config.join("edge.yaml"), RULES).expect("rules written");
    dir.to_path_buf()
}

/// `shardgate` as upstream's image runs it (`serve`, configured by upstream's variables
/// alone), on free loopback ports.
struct Server {
    child: Child,
    grpc: u16,
    http: u16,
    prometheus: u16,
}

impl Server {
    fn start(root: &Path, mapper: &Path) -> Server {
        let (grpc, http, prometheus) = (free_port(), free_port(), free_port());
        let child = upstream_command(
            root,
            &[
                ("GRPC_HOST", "127.0.0.1".into()),
                ("GRPC_PORT", grpc.to_string()),
                ("HOST", "127.0.0.1".into()),
                ("PORT", http.to_string()),
                ("USE_STATSD", "false".into()),
                ("USE_PROMETHEUS", "true".into()),
                ("PROMETHEUS_ADDR", format!("127.0.0.1:{prometheus}")),
                ("PROMETHEUS_MAPPER_YAML", mapper.display().to_string()),
            ],
        )
        .stderr(Stdio::inherit())
        .spawn()
        .expect("shardgate starts");
        Server {
            child,
            grpc,
            http,
            prometheus,
        }
    }

    async fn ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while get(self.http, "/healthcheck").is_none_or(|(status, _, _)| status != 200) {
            if let Ok(Some(exit)) = self.child.try_wait() {
                panic!("shardgate exited before it was ready: {exit}");
            }
            assert!(Instant::now() < deadline, "shardgate not ready within 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn client(&self) -> Rls {
        let channel =
            tonic::transport::Channel::from_shared(format!("http://127.0.0.1:{}", self.grpc))
                .expect("a URI")
                .connect()
                .await
                .expect("the gRPC port answers");
        Rls(RateLimitServiceClient::new(channel))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn upstream_command(root: &Path, env: &[(&str, String)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_shardgate"));
    command
        .arg("serve")
        .env_clear()
        .env("RUNTIME_ROOT", root)
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("LOG_LEVEL", "warn")
        .envs(env.iter().map(|(k, v)| (k.to_string(), v.clone())))
        .stdout(Stdio::null());
    command
}

/// `(status, content type, body)` of a GET on a loopback port.
fn get(port: u16, path: &str) -> Option<(u16, String, String)> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let content_type = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-type")
                .then(|| value.trim().to_string())
        })
        .unwrap_or_default();
    Some((status, content_type, body.to_string()))
}

/// The page's samples, `name{labels}` → value.
fn samples(page: &str) -> BTreeMap<String, f64> {
    page.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l
                .rsplit_once(' ')
                .unwrap_or_else(|| panic!("a sample: {l}"));
            let value = value.parse().unwrap_or_else(|_| panic!("a value: {l}"));
            (series.to_string(), value)
        })
        .collect()
}

#[tokio::test]
async fn envoy_gateways_scrape_reads_upstreams_names_labels_and_values() {
    let dir = tempfile::tempdir().unwrap();
    let root = rule_root(dir.path());
    let mapper = Path::new(env!("CARGO_MANIFEST_DIR")).join(EG_MAPPING);
    let mut server = Server::start(&root, &mapper);
    server.ready().await;
    let mut rls = server.client().await;

    // 2 an hour: two within (the second at the limit: near), one over.
    let user = one("edge", &[("user", "alice")]);
    for want in [Code::Ok, Code::Ok, Code::OverLimit] {
        assert_eq!(code(rls.ok(user.clone()).await.overall_code), want);
    }
    // Shadow mode: the second is over, counted so, and let through.
    let shadow = one("edge", &[("path", "shadow")]);
    for _ in 0..2 {
        assert_eq!(code(rls.ok(shadow.clone()).await.overall_code), Code::Ok);
    }
    // Two keys: only the mapping file's regexes name these.
    let two_keys = request("edge", vec![desc(&[("tenant", "acme"), ("api", "v1")])]);
    assert_eq!(code(rls.ok(two_keys).await.overall_code), Code::Ok);

    let (status, content_type, page) =
        get(server.prometheus, "/metrics").expect("the Prometheus port answers");
    assert_eq!(status, 200, "{page}");
    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let mut got = samples(&page);

    // The timer: Envoy Gateway's mapping has no scale, so its "seconds" histogram holds
    // milliseconds, as upstream's does under that file; six calls, on the default buckets.
    let rt = "ratelimit_service_response_time_seconds";
    let method = "grpc_method=\"ShouldRateLimit\"";
    let mut previous = 0.0;
    for le in [
        "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1", "2.5", "5", "10", "+Inf",
    ] {
        let bucket = got
            .remove(&format!("{rt}_bucket{{{method},le=\"{le}\"}}"))
            .unwrap_or_else(|| panic!("bucket {le} in\n{page}"));
        assert!(
            bucket >= previous && bucket <= 6.0,
            "le={le}: {bucket}\n{page}"
        );
        previous = bucket;
    }
    assert_eq!(previous, 6.0, "every call in +Inf\n{page}");
    assert_eq!(got.remove(&format!("{rt}_count{{{method}}}")), Some(6.0));
    let sum = got.remove(&format!("{rt}_sum{{{method}}}")).expect("a sum");
    assert!(sum > 0.0, "{sum}");

    // Everything else, exactly: counters that never moved are not there (upstream flushes
    // only counters that moved).
    let hits = "ratelimit_service_rate_limit";
    let one_key = |key: &str| format!("domain=\"edge\",key1=\"{key}\"");
    let acme = "domain=\"edge\",key1=\"tenant_acme\",key2=\"api\"";
    let expected: BTreeMap<String, f64> = [
        ("ratelimit_service_config_load_success".to_string(), 1.0),
        (format!("ratelimit_service_total_requests{{{method}}}"), 6.0),
        (format!("{hits}_total_hits{{{}}}", one_key("user")), 3.0),
        (format!("{hits}_within_limit{{{}}}", one_key("user")), 2.0),
        (format!("{hits}_near_limit{{{}}}", one_key("user")), 1.0),
        (format!("{hits}_over_limit{{{}}}", one_key("user")), 1.0),
        (
            format!("{hits}_total_hits{{{}}}", one_key("path_shadow")),
            2.0,
        ),
        (
            format!("{hits}_within_limit{{{}}}", one_key("path_shadow")),
            1.0,
        ),
        (
            format!("{hits}_near_limit{{{}}}", one_key("path_shadow")),
            1.0,
        ),
        (
            format!("{hits}_over_limit{{{}}}", one_key("path_shadow")),
            1.0,
        ),
        (
            format!("{hits}_shadow_mode{{{}}}", one_key("path_shadow")),
            1.0,
        ),
        (format!("{hits}_total_hits{{{acme}}}"), 1.0),
        (format!("{hits}_within_limit{{{acme}}}"), 1.0),
    ]
    .into_iter()
    .collect();
    assert_eq!(got, expected, "\n{page}");

    // Only the configured path is served.
    assert_eq!(get(server.prometheus, "/").map(|r| r.0), Some(404));
    promtool_accepts(&page);
}

/// `promtool check metrics` finds no error in `page`. Its only lint allowed is the one
/// upstream's own names draw: counters named without a `_total` suffix.
fn promtool_accepts(page: &str) {
    let promtool = std::env::var("PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let child = Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!(
                "SKIPPED promtool check metrics: no `{promtool}` on PATH (Debian's `prometheus` package; .ci/run installs it)"
            );
            return;
        }
        Err(e) => panic!("{promtool}: {e}"),
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(page.as_bytes())
        .expect("the page written to promtool");
    let out = child.wait_with_output().expect("promtool ran");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // 0: clean; 3: lint problems only; anything else (1) is an error reading the page.
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "promtool: {:?}\n{report}\n{page}",
        out.status
    );
    for problem in report.lines().filter(|l| !l.trim().is_empty()) {
        assert!(
            problem.ends_with("counter metrics should have \"_total\" suffix"),
            "promtool: {problem}\n{page}"
        );
    }
}

#[test]
fn a_mapping_file_shardgate_cannot_follow_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = rule_root(dir.path());
    let mapper = dir.path().join("conf.yaml");
    let eg = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(EG_MAPPING))
        .expect("the fixture");
    // Envoy Gateway's file with one key statsd_exporter reads and shardgate does not do.
    std::fs::write(
        &mapper,
        eg.replacen(
            "    match_metric_type: counter\n",
            "    match_metric_type: counter\n    ttl: 10m\n",
            1,
        ),
    )
    .expect("mapping written");
    let mut child = upstream_command(
        &root,
        &[
            ("GRPC_HOST", "127.0.0.1".into()),
            ("GRPC_PORT", free_port().to_string()),
            ("HOST", "127.0.0.1".into()),
            ("PORT", free_port().to_string()),
            ("USE_PROMETHEUS", "true".into()),
            ("PROMETHEUS_ADDR", format!("127.0.0.1:{}", free_port())),
            ("PROMETHEUS_MAPPER_YAML", mapper.display().to_string()),
        ],
    )
    .stderr(Stdio::piped())
    .spawn()
    .expect("shardgate starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("shardgate kept running on a mapping it cannot follow");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("stderr read");
    assert!(!status.success(), "{stderr}");
    let line = format!(
        "statsd mapping file {}: mapping 11 (\"ratelimit.service.call.should_rate_limit.*\"): `ttl` is not supported by shardgate",
        mapper.display()
    );
    assert!(stderr.contains(&line), "{line:?} not in:\n{stderr}");
}

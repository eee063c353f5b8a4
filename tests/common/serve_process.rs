//! A `shardgate serve` process of the test's own (the binary cargo built for the tests),
//! its log in a file, and what a test reads of it from outside as an operator would:
//! `/healthcheck`, gRPC health, `/metrics`, its log, and its resident memory
//! (`/proc/PID/status`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// A `shardgate serve` process, killed when dropped.
pub struct ServeProcess {
    pub grpc: u16,
    pub http: u16,
    pub log: PathBuf,
    pub child: std::process::Child,
}

impl ServeProcess {
    /// `shardgate serve` on `rules` (one file each, in a directory of `dir`) with `args`
    /// and nothing of the test's environment but `env` (a `SHARDGATE_*` variable of the
    /// caller's would win over upstream's).
    pub fn start(
        dir: &Path,
        name: &str,
        rules: &[&str],
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let config = dir.join(format!("{name}-rules"));
        std::fs::create_dir_all(&config).unwrap();
        for (i, text) in rules.iter().enumerate() {
            std::fs::write(config.join(format!("rules{i}.yaml")), text).unwrap();
        }
        let (grpc, http) = (free_port(), free_port());
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_shardgate"))
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--http-addr", &format!("127.0.0.1:{http}")])
            .args(args)
            .env_clear()
            .envs(env.iter().copied())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("shardgate starts");
        ServeProcess {
            grpc,
            http,
            log,
            child,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics, with its log, if the process has exited.
    pub fn assert_running(&mut self) {
        if let Ok(Some(exit)) = self.child.try_wait() {
            panic!("shardgate exited ({exit}):\n{}", self.log());
        }
    }

    /// One `GET` on the HTTP port: its status and body (`None`: not listening yet).
    pub fn http_get(&self, path: &str) -> Option<(u16, String)> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.http)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let status = out.split(' ').nth(1)?.parse().ok()?;
        let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        Some((status, body.to_string()))
    }

    /// The status of `GET /healthcheck` (`None`: not listening yet).
    pub fn health(&self) -> Option<u16> {
        self.http_get("/healthcheck").map(|(status, _)| status)
    }

    /// gRPC health of `service` (`""`: the server's readiness).
    pub async fn grpc_health(&self, service: &str) -> Option<ServingStatus> {
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", self.grpc))
                .ok()?
                .connect()
                .await
                .ok()?;
        let mut client = HealthClient::new(channel);
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: service.into(),
        });
        request.set_timeout(Duration::from_secs(5));
        let status = client.check(request).await.ok()?.into_inner().status;
        ServingStatus::try_from(status).ok()
    }

    /// Waits until it is serving (its store answered), within `patience`.
    pub async fn ready_within(&mut self, patience: Duration) {
        let deadline = Instant::now() + patience;
        while self.health() != Some(200) {
            self.assert_running();
            assert!(Instant::now() < deadline, "not serving:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until it is serving (its store answered).
    pub async fn ready(&mut self) {
        self.ready_within(Duration::from_secs(30)).await;
    }

    /// Waits until it listens (serving or not).
    pub async fn listening(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.health().is_none() {
            self.assert_running();
            assert!(Instant::now() < deadline, "not listening:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn client(&self) -> RateLimitServiceClient<tonic::transport::Channel> {
        RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", self.grpc))
            .await
            .expect("the gRPC port answers")
    }

    /// `GET /metrics`: the text exposition.
    pub fn metrics(&self) -> String {
        let (status, body) = self.http_get("/metrics").expect("the HTTP port answers");
        assert_eq!(status, 200, "{body}");
        body
    }

    /// Its resident memory (`VmRSS`), in KiB.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("the process's status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }

    /// The error of a `--log-format json` server's first "store not answering yet"
    /// warning; it must not exit meanwhile.
    pub async fn store_warning(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        let line = loop {
            if let Some(line) = self
                .log()
                .lines()
                .find(|l| l.contains("store not answering yet"))
            {
                break line.to_string();
            }
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "a store not answering yet is no reason to exit:\n{}",
                self.log()
            );
            assert!(Instant::now() < deadline, "no warning:\n{}", self.log());
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let line: serde_json::Value = serde_json::from_str(&line).expect("a JSON log line");
        line["fields"]["error"]
            .as_str()
            .expect("the error")
            .to_string()
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sum of the samples of `name` (exactly: `name` then `{` or a space) whose labels
/// include every `label="value"` of `labels`, in a text exposition.
pub fn metric_sum(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A free loopback port for a server the test starts (a `shardgate serve`, a
/// `redis-server`), not handed out before in this process: one of
/// `SHARDGATE_TEST_PORTS=LOW-HIGH` (a machine shared by several test runs, each given a
/// range), else of 20000 up to the kernel's ephemeral range. Not the kernel's own pick
/// (`bind(":0")`): that port is also the one the kernel gives the next outgoing
/// connection, and a test's client connecting elsewhere in the moment between the pick
/// and the server's bind took it (CI saw a `redis-server` fail to listen so). The scan
/// starts at an offset drawn from the process id, so two test processes at once rarely
/// meet.
pub fn free_port() -> u16 {
    let (low, high) = std::env::var("SHARDGATE_TEST_PORTS")
        .ok()
        .and_then(|r| {
            let (low, high) = r.split_once('-')?;
            Some((low.parse::<u16>().ok()?, high.parse::<u16>().ok()?))
        })
        .unwrap_or_else(|| (20_000, ephemeral_low().saturating_sub(1)));
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
    let span = u32::from(high.saturating_sub(low)) + 1;
    let offset = std::process::id() % span;
    let port = (0..span)
        .map(|i| low + ((offset + i) % span) as u16)
        .find(|p| !handed_out.contains(p) && std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port left in the test port range");
    handed_out.push(port);
    port
}

/// The first port of the kernel's ephemeral range (Linux's default when unreadable).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .filter(|low: &u16| *low > 21_000)
        .unwrap_or(32_768)
}

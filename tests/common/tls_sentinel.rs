//! `scripts/redis-local sentinel-tls` for tests: a master, its replica and a Sentinel on
//! TLS ports only, with certificates of the test's own CA, and `redis-cli` over TLS to
//! any of them.

use std::time::Duration;

/// `scripts/redis-local sentinel-tls`: a master, its replica and a Sentinel on TLS ports
/// only, with certificates of the test's own CA; stopped when dropped (the script stops
/// its servers on TERM).
pub struct TlsSentinel {
    pub sentinel: u16,
    pub master: u16,
    pub replica: u16,
    pub ca: std::path::PathBuf,
    /// A client certificate the CA signed (and its key), for when the servers require one.
    pub client: ClientCertificate,
    /// The servers' own certificate: redis-cli presents it as its client certificate.
    pub server: ClientCertificate,
    /// Holds the certificates the servers read.
    _dir: tempfile::TempDir,
    script: std::process::Child,
}

/// A PEM certificate and its key, as files.
pub struct ClientCertificate {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

impl ClientCertificate {
    pub fn cert(&self) -> &str {
        self.cert.to_str().unwrap()
    }

    pub fn key(&self) -> &str {
        self.key.to_str().unwrap()
    }
}

impl TlsSentinel {
    /// `clients`: the servers' `tls-auth-clients`, `optional` or `yes` (a client
    /// certificate required of every client).
    pub fn start(clients: &str) -> TlsSentinel {
        let pki = super::tls::Pki::new("redis-sentinel");
        // The name the master's certificate must carry is the address the Sentinel
        // reports for it.
        let (cert, key_pem) = pki.leaf(&["127.0.0.1", "localhost"]);
        let (client_cert, client_key) = pki.leaf(&["shardgate"]);
        let dir = tempfile::tempdir().unwrap();
        let ca = super::tls::write(dir.path(), "ca.pem", &pki.ca_pem);
        let server = ClientCertificate {
            cert: super::tls::write(dir.path(), "redis.pem", &cert),
            key: super::tls::write(dir.path(), "redis-key.pem", &key_pem),
        };
        let client = ClientCertificate {
            cert: super::tls::write(dir.path(), "client.pem", &client_cert),
            key: super::tls::write(dir.path(), "client-key.pem", &client_key),
        };
        let (master, replica, sentinel) = (
            super::redis::free_port(),
            super::redis::free_port(),
            super::redis::free_port(),
        );
        let mut script =
            std::process::Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/redis-local"))
                .arg("sentinel-tls")
                .args([master, replica, sentinel].map(|p| p.to_string()))
                .arg(dir.path())
                .arg(clients)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::inherit())
                .spawn()
                .expect("scripts/redis-local");
        // Its stdout says `ready` once the replica has synced and the Sentinel sees it.
        let stdout = script.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if line == "ready" {
                    let _ = tx.send(());
                }
            }
        });
        let started = TlsSentinel {
            sentinel,
            master,
            replica,
            ca,
            client,
            server,
            _dir: dir,
            script,
        };
        rx.recv_timeout(Duration::from_secs(60))
            .expect("scripts/redis-local sentinel-tls did not say ready");
        started
    }

    /// `redis-cli` over TLS to `port`; its output.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = std::process::Command::new("redis-cli")
            .args(["--tls", "--cacert"])
            .arg(&self.ca)
            .arg("--cert")
            .arg(&self.server.cert)
            .arg("--key")
            .arg(&self.server.key)
            .args(["-p", &port.to_string()])
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for TlsSentinel {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .arg(self.script.id().to_string())
            .status();
        let _ = self.script.wait();
    }
}

/// `EVALSHA` calls in an `INFO commandstats` answer (0 when none has run).
pub fn evalsha_calls(info: &str) -> u64 {
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .map_or(0, |l| l.split(',').next().unwrap().parse().unwrap())
}

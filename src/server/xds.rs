//! Rules over xDS: a state-of-the-world ADS subscription to
//! `ratelimit.config.ratelimit.v3.RateLimitConfig`, as envoyproxy/ratelimit's xDS provider
//! makes it to Envoy Gateway's control plane (`CONFIG_TYPE=GRPC_XDS_SOTW`).
//!
//! Each push carries every resource; it is loaded as files holding them would be
//! (`config/xds.rs`) and either applied whole — then ACKed with its version — or refused
//! whole — NACKed with the last good version and the errors' text, the rules in force
//! kept. The stream is opened again after any failure, with a backoff from half a second
//! up to [`MAX_BACKOFF`], asking for the last version applied; meanwhile the last good
//! rules keep serving. TLS (and a client certificate) to the control plane is read from
//! its files at each connection, and read again every [`ROTATION_CHECK`] while a stream
//! is open: when they changed, the stream is opened again with them.
//!
//! This file owns the stream only: what a push means is `config/xds.rs`'s, what applying
//! one does is the caller's (`serve/tasks.rs`).

use std::path::PathBuf;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::rpc::Status;
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitConfig;
use prost::Message;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::config::xds::{from_resources, RATE_LIMIT_CONFIG_TYPE};
use crate::config::{Config, LoadOptions};
use crate::support::text::elide;

/// Where the control plane is and who this server is to it.
#[derive(Debug, Clone)]
pub struct XdsOptions {
    /// `http://host:port`, or `https://host:port` for TLS.
    pub server: String,
    /// The node id the control plane knows this server by (upstream's default:
    /// `default`; Envoy Gateway sets `envoy-ratelimit`).
    pub node_id: String,
    /// Start serving (and report ready) before the first push, with no rules, as
    /// upstream's `FORCE_START_WITHOUT_INITIAL_CONFIG`; else readiness waits for it.
    pub start_without_rules: bool,
    pub tls: XdsTls,
}

/// TLS to the control plane beyond what an `https://` URL says.
#[derive(Debug, Clone)]
pub struct XdsTls {
    /// PEM CA bundle of the control plane's certificate (else the system's roots).
    pub ca: Option<PathBuf>,
    /// PEM client certificate and key, both or neither.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The name the control plane's certificate must carry, when not the URL's host
    /// (upstream's `CONFIG_GRPC_XDS_SERVER_TLS_SAN`).
    pub server_name: Option<String>,
    /// How often the files are read again while a stream is open: when they changed
    /// (cert-manager rotates Envoy Gateway's before they expire), the stream is closed
    /// and opened again with them, asking for the version in force.
    pub rotation_check: Duration,
}

impl Default for XdsTls {
    fn default() -> Self {
        XdsTls {
            ca: None,
            cert: None,
            key: None,
            server_name: None,
            rotation_check: ROTATION_CHECK,
        }
    }
}

/// How often an open stream's TLS files are read again by default.
pub const ROTATION_CHECK: Duration = Duration::from_secs(10);

/// The TLS files' contents a connection was made with (`None` where there is no file).
#[derive(Debug, PartialEq, Eq)]
struct TlsFiles(Vec<Option<Vec<u8>>>);

impl TlsFiles {
    /// The files now; `None` if one named cannot be read (mid-rotation, say: the stream
    /// in use is kept rather than traded for one that cannot connect).
    fn read(tls: &XdsTls) -> Option<TlsFiles> {
        [&tls.ca, &tls.cert, &tls.key]
            .into_iter()
            .map(|p| match p {
                Some(p) => std::fs::read(p).ok().map(Some),
                None => Some(None),
            })
            .collect::<Option<Vec<_>>>()
            .map(TlsFiles)
    }
}

/// The longest wait before the stream is opened again.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// The first wait before the stream is opened again.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// Largest push read (tonic's default is 4 MiB; a large gateway's rules can pass it).
const MAX_PUSH_BYTES: usize = 64 << 20;

/// Most bytes of the errors' text sent back in a NACK.
const NACK_DETAIL_BYTES: usize = 4_096;

/// What one push came to: the rules to apply, or why none were (errors' text).
pub type Push = Result<Config, String>;

/// Subscribes for ever: `on_push` is called with each push's version and outcome, in
/// order. Returns only if `on_push`'s owner drops the runtime.
pub async fn subscribe(
    options: XdsOptions,
    load: LoadOptions,
    mut on_push: impl FnMut(&str, Push),
) {
    let mut applied = String::new();
    let mut backoff = FIRST_BACKOFF;
    loop {
        match session(&options, &load, &mut applied, &mut on_push).await {
            Ok(SessionEnd::AfterPush) => backoff = FIRST_BACKOFF,
            Ok(SessionEnd::BeforePush) => {}
            Err(reason) => {
                tracing::warn!(server = %options.server, %reason, retry_in = ?backoff, "xDS stream failed; the rules in force stay");
            }
        }
        tokio::time::sleep(jittered(backoff)).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// A wait of `backoff` with its upper half drawn at random ("equal jitter"): a fleet
/// whose control plane restarted does not reconnect in lockstep, and no server waits
/// less than half the backoff.
fn jittered(backoff: Duration) -> Duration {
    use rand::RngExt;
    let half = backoff / 2;
    half + half.mul_f64(rand::rng().random::<f64>())
}

/// Whether a session got a push before it ended.
enum SessionEnd {
    AfterPush,
    BeforePush,
}

/// One stream, until it fails or the control plane closes it.
async fn session(
    options: &XdsOptions,
    load: &LoadOptions,
    applied: &mut String,
    on_push: &mut impl FnMut(&str, Push),
) -> Result<SessionEnd, String> {
    // Read before connecting: a change in between is seen at the first check.
    let used = tls_files_in_use(options);
    let channel = connect(options).await?;
    let mut client =
        AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(MAX_PUSH_BYTES);
    let (requests, outgoing) = tokio::sync::mpsc::channel(4);
    requests
        .send(request(options, applied, "", None))
        .await
        .map_err(|_| "the request stream closed".to_string())?;
    let mut responses = client
        .stream_aggregated_resources(ReceiverStream::new(outgoing))
        .await
        .map_err(|s| status_text(&s))?
        .into_inner();
    let mut progress = SessionEnd::BeforePush;
    let mut check = tokio::time::interval_at(
        tokio::time::Instant::now() + options.tls.rotation_check,
        options.tls.rotation_check,
    );
    loop {
        let message = tokio::select! {
            m = responses.message() => m,
            _ = check.tick(), if used.is_some() => {
                if let Some(now) = TlsFiles::read(&options.tls) {
                    if Some(&now) != used.as_ref() {
                        tracing::info!(server = %options.server, "xDS TLS files changed: the stream is opened again with them");
                        return Ok(progress);
                    }
                }
                continue;
            }
        };
        let response = match message {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(progress),
            Err(s) => return Err(status_text(&s)),
        };
        progress = SessionEnd::AfterPush;
        let (response, push) = compile_off_the_workers(response, load).await;
        let answer = reply(options, &response, &push, applied);
        on_push(&response.version_info, push);
        requests
            .send(answer)
            .await
            .map_err(|_| "the request stream closed".to_string())?;
    }
}

/// The TLS files the stream is opened with, when TLS to the control plane names any
/// (`None`: nothing to watch for rotation).
fn tls_files_in_use(options: &XdsOptions) -> Option<TlsFiles> {
    let tls_on = options.server.starts_with("https://")
        && [&options.tls.ca, &options.tls.cert, &options.tls.key]
            .iter()
            .any(|p| p.is_some());
    if tls_on {
        TlsFiles::read(&options.tls)
    } else {
        None
    }
}

/// A request for the rules as this node: `version` the last applied, `nonce` the
/// response answered (ACK), `error` why it was refused (NACK).
fn request(
    options: &XdsOptions,
    version: &str,
    nonce: &str,
    error: Option<Status>,
) -> DiscoveryRequest {
    DiscoveryRequest {
        version_info: version.to_string(),
        node: Some(Node {
            id: options.node_id.clone(),
            ..Default::default()
        }),
        type_url: RATE_LIMIT_CONFIG_TYPE.to_string(),
        response_nonce: nonce.to_string(),
        error_detail: error,
        ..Default::default()
    }
}

/// The answer to a push: an ACK of its version once applied (`applied` moves to it), or
/// a NACK with the errors' text and the version in force.
fn reply(
    options: &XdsOptions,
    response: &DiscoveryResponse,
    push: &Push,
    applied: &mut String,
) -> DiscoveryRequest {
    match push {
        Ok(config) => {
            tracing::info!(version = %response.version_info, domains = config.domains().count(), "xDS rules pushed");
            *applied = response.version_info.clone();
            request(options, applied, &response.nonce, None)
        }
        Err(errors) => {
            tracing::error!(version = %response.version_info, %errors, "xDS rules refused (NACK); the rules in force stay");
            request(
                options,
                applied,
                &response.nonce,
                Some(Status {
                    // INVALID_ARGUMENT
                    code: 3,
                    message: elide(errors, NACK_DETAIL_BYTES).into_owned(),
                    details: Vec::new(),
                }),
            )
        }
    }
}

/// A gRPC status as the reason a stream failed: its code and (elided) message.
fn status_text(s: &tonic::Status) -> String {
    format!("{}: {}", s.code(), elide(s.message(), 256))
}

/// [`rules`] on a blocking thread, as a file reload is: a large push's decode and
/// compile (regexes, every rule's matcher) would otherwise hold a runtime worker and the
/// calls queued on it. A panic while compiling is that push's refusal (NACKed, counted),
/// never the end of the subscription.
async fn compile_off_the_workers(
    response: DiscoveryResponse,
    load: &LoadOptions,
) -> (DiscoveryResponse, Push) {
    let load = load.clone();
    let version = response.version_info.clone();
    let nonce = response.nonce.clone();
    match tokio::task::spawn_blocking(move || {
        let push = rules(&response, &load);
        (response, push)
    })
    .await
    {
        Ok(compiled) => compiled,
        Err(e) => {
            tracing::error!(%version, error = %e, "compiling the xDS push panicked");
            let answered = DiscoveryResponse {
                version_info: version,
                nonce,
                ..Default::default()
            };
            (
                answered,
                Err(format!("the push could not be compiled: {e}")),
            )
        }
    }
}

/// The rules a response carries, or why there are none.
fn rules(response: &DiscoveryResponse, load: &LoadOptions) -> Push {
    if response.type_url != RATE_LIMIT_CONFIG_TYPE {
        return Err(format!(
            "resources of type {}, not {RATE_LIMIT_CONFIG_TYPE}",
            elide(&response.type_url, 128)
        ));
    }
    let mut resources = Vec::with_capacity(response.resources.len());
    for (i, any) in response.resources.iter().enumerate() {
        if any.type_url != RATE_LIMIT_CONFIG_TYPE {
            return Err(format!(
                "resource {i} is a {}, not a RateLimitConfig",
                elide(&any.type_url, 128)
            ));
        }
        let config = RateLimitConfig::decode(any.value.as_slice())
            .map_err(|e| format!("resource {i} does not decode: {e}"))?;
        resources.push(config);
    }
    from_resources(&resources, load).map_err(|errors| errors.to_string())
}

async fn connect(options: &XdsOptions) -> Result<Channel, String> {
    let mut endpoint = Endpoint::from_shared(options.server.clone())
        .map_err(|e| format!("xDS server {}: {e}", elide(&options.server, 128)))?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    if options.server.starts_with("https://") {
        let read = |p: &PathBuf| {
            std::fs::read(p).map_err(|e| format!("xDS TLS file {}: {e}", p.display()))
        };
        let mut tls = ClientTlsConfig::new();
        if let Some(ca) = &options.tls.ca {
            tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
        } else {
            tls = tls.with_native_roots();
        }
        if let Some(name) = &options.tls.server_name {
            tls = tls.domain_name(name.clone());
        }
        match (&options.tls.cert, &options.tls.key) {
            (Some(cert), Some(key)) => {
                tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
            }
            (None, None) => {}
            _ => {
                return Err(
                    "an xDS client certificate needs its key, and the key its certificate".into(),
                )
            }
        }
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| format!("xDS TLS: {e}"))?;
    }
    endpoint
        .connect()
        .await
        .map_err(|e| format!("cannot connect to {}: {e}", elide(&options.server, 128)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backoff_is_jittered_within_its_upper_half() {
        let backoff = Duration::from_secs(8);
        let waits: Vec<Duration> = (0..200).map(|_| jittered(backoff)).collect();
        assert!(waits.iter().all(|w| *w >= backoff / 2 && *w <= backoff));
        let distinct: std::collections::BTreeSet<_> = waits.iter().collect();
        assert!(
            distinct.len() > 100,
            "{} distinct waits of 200",
            distinct.len()
        );
    }
}

//! envoyproxy/ratelimit's Prometheus port (`--ratelimit-compat-prometheus-addr`, upstream's
//! `USE_PROMETHEUS`): one path, `/metrics` by default, serving its statsd stats as a
//! statsd_exporter mapping file names them, so that what scraped upstream's port (Envoy
//! Gateway's `:19001/metrics`) keeps working. Owns the listener, the route and reading
//! the mapping file; what the page says is the policy's
//! (`service/metrics/statsd_prometheus.rs`), and which mapping applies the mapping's
//! (`service/metrics/statsd_mapping.rs`). It decides nothing else.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tokio::net::TcpListener;

use crate::service::metrics::statsd_mapping::StatsdMapping;
use crate::service::metrics::statsd_prometheus::CONTENT_TYPE;
use crate::service::metrics::Metrics;

/// Where and how the port serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamPrometheusOptions {
    pub addr: SocketAddr,
    /// The one path served (upstream's `PROMETHEUS_PATH`, `/metrics` by default); any
    /// other is 404.
    pub path: String,
    pub mapping: MappingSource,
}

/// Which mapping names the stats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MappingSource {
    /// A statsd_exporter mapping file (upstream's `PROMETHEUS_MAPPER_YAML`).
    File(PathBuf),
    /// Upstream's built-in mapping; the response time in milliseconds instead of seconds
    /// with `response_time_ms` (upstream's `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS`).
    UpstreamDefault { response_time_ms: bool },
}

impl MappingSource {
    /// The mapping, read and checked; the error is one line that names the file.
    pub fn load(&self) -> Result<StatsdMapping, String> {
        match self {
            MappingSource::File(path) => {
                let named = |e: String| format!("{}: {e}", path.display());
                let text = std::fs::read_to_string(path).map_err(|e| named(e.to_string()))?;
                StatsdMapping::from_yaml(&text).map_err(named)
            }
            MappingSource::UpstreamDefault { response_time_ms } => {
                Ok(StatsdMapping::upstream_default(*response_time_ms))
            }
        }
    }
}

/// What the handler needs.
#[derive(Clone)]
struct Port {
    metrics: Arc<Metrics>,
    mapping: Arc<StatsdMapping>,
    path: Arc<str>,
}

/// The port's one route. The path is compared as it is, not parsed as a route pattern,
/// so any path an operator writes is served as written.
pub fn router(metrics: Arc<Metrics>, mapping: Arc<StatsdMapping>, path: &str) -> Router {
    Router::new().fallback(page).with_state(Port {
        metrics,
        mapping,
        path: path.into(),
    })
}

/// Serves the port on `listener` until `shutdown` resolves.
pub async fn serve(
    metrics: Arc<Metrics>,
    mapping: Arc<StatsdMapping>,
    path: String,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(metrics, mapping, &path))
        .with_graceful_shutdown(shutdown)
        .await
}

async fn page(State(port): State<Port>, uri: Uri) -> Response {
    if uri.path() != &*port.path {
        return (StatusCode::NOT_FOUND, "404 page not found\n").into_response();
    }
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        port.metrics.render_statsd_mapped(&port.mapping),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapping_file_that_cannot_be_read_or_is_wrong_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.yaml");
        let e = MappingSource::File(missing.clone()).load().unwrap_err();
        assert!(e.starts_with(&missing.display().to_string()), "{e}");
        let wrong = dir.path().join("wrong.yaml");
        std::fs::write(&wrong, "mappings:\n  - {match: a.b, name: x, ttl: 1m}\n").unwrap();
        let e = MappingSource::File(wrong.clone()).load().unwrap_err();
        assert_eq!(
            e,
            format!(
                "{}: mapping 1 (\"a.b\"): `ttl` is not supported by shardgate",
                wrong.display()
            )
        );
        assert!(MappingSource::UpstreamDefault {
            response_time_ms: true
        }
        .load()
        .is_ok());
    }
}

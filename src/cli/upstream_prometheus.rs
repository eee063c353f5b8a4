//! `serve`'s arguments for the envoyproxy/ratelimit compatible Prometheus port (upstream's
//! own, `USE_PROMETHEUS`): where it listens, its path, its statsd_exporter mapping. The
//! flags are `--ratelimit-compat-prometheus-*`; their first names,
//! `--upstream-prometheus-*`, read as Envoy's upstream (a backend) and are kept as aliases,
//! as are the `SHARDGATE_UPSTREAM_PROMETHEUS_*` variables. Parsing only; the port is
//! `server/upstream_prometheus.rs`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use shardgate::server::upstream_prometheus::{MappingSource, UpstreamPrometheusOptions};

/// The port, off unless `--ratelimit-compat-prometheus-addr` is given.
#[derive(Args)]
pub(crate) struct UpstreamPrometheusArgs {
    /// Also serve an envoyproxy/ratelimit compatible Prometheus port here (its
    /// USE_PROMETHEUS): its
    /// statsd stats as a statsd_exporter mapping names them. HOST:PORT, or Go's :PORT for
    /// every interface. /metrics on the HTTP port stays as it is.
    #[arg(
        long = "ratelimit-compat-prometheus-addr",
        alias = "upstream-prometheus-addr",
        value_name = "ADDR",
        env = "SHARDGATE_UPSTREAM_PROMETHEUS_ADDR",
        value_parser = listen_addr
    )]
    pub(crate) upstream_prometheus_addr: Option<SocketAddr>,
    /// The path that port serves (any other is 404).
    #[arg(
        long = "ratelimit-compat-prometheus-path",
        alias = "upstream-prometheus-path",
        value_name = "PATH",
        env = "SHARDGATE_UPSTREAM_PROMETHEUS_PATH",
        default_value = "/metrics",
        value_parser = http_path,
        requires = "upstream_prometheus_addr"
    )]
    pub(crate) upstream_prometheus_path: String,
    /// The statsd_exporter mapping file (YAML) that names the stats (default:
    /// envoyproxy/ratelimit's own mapping). What shardgate cannot follow in it stops the
    /// start, named.
    #[arg(
        long = "ratelimit-compat-prometheus-mapping",
        alias = "upstream-prometheus-mapping",
        value_name = "YAML",
        env = "SHARDGATE_UPSTREAM_PROMETHEUS_MAPPING",
        requires = "upstream_prometheus_addr"
    )]
    pub(crate) upstream_prometheus_mapping: Option<PathBuf>,
    /// With the default mapping: the response time histogram in milliseconds, not seconds
    /// (envoyproxy/ratelimit's PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS).
    #[arg(
        long = "ratelimit-compat-prometheus-response-time-ms",
        alias = "upstream-prometheus-response-time-ms",
        env = "SHARDGATE_UPSTREAM_PROMETHEUS_RESPONSE_TIME_MS"
    )]
    pub(crate) upstream_prometheus_response_time_ms: bool,
}

impl UpstreamPrometheusArgs {
    /// The port, when `--ratelimit-compat-prometheus-addr` is given; an error for a combination
    /// that would leave a setting without effect.
    pub(crate) fn options(&self) -> Result<Option<UpstreamPrometheusOptions>, String> {
        let ms = self.upstream_prometheus_response_time_ms;
        let Some(addr) = self.upstream_prometheus_addr else {
            return match ms {
                true => Err(
                    "--ratelimit-compat-prometheus-response-time-ms needs --ratelimit-compat-prometheus-addr"
                        .into(),
                ),
                false => Ok(None),
            };
        };
        let mapping = match (&self.upstream_prometheus_mapping, ms) {
            (Some(_), true) => {
                return Err("--ratelimit-compat-prometheus-response-time-ms applies to the default mapping only, not with --ratelimit-compat-prometheus-mapping".into())
            }
            (Some(path), false) => MappingSource::File(path.clone()),
            (None, response_time_ms) => MappingSource::UpstreamDefault { response_time_ms },
        };
        Ok(Some(UpstreamPrometheusOptions {
            addr,
            path: self.upstream_prometheus_path.clone(),
            mapping,
        }))
    }
}

/// A listen address: `HOST:PORT` with an IP host, or Go's `:PORT` for every interface
/// (IPv4's `0.0.0.0`, as upstream's other ports are read).
pub(crate) fn listen_addr(text: &str) -> Result<SocketAddr, String> {
    let text = text.trim();
    let full = match text.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => text.to_string(),
    };
    full.parse().map_err(|_| {
        format!("'{text}' is not an address (try 0.0.0.0:19001, [::1]:19001 or :19001)")
    })
}

/// An absolute URL path: `/` then printable ASCII without spaces, `?` or `#`.
fn http_path(text: &str) -> Result<String, String> {
    let ok = text.starts_with('/')
        && text
            .chars()
            .all(|c| c.is_ascii_graphic() && c != '?' && c != '#');
    if ok {
        Ok(text.to_string())
    } else {
        Err(format!(
            "'{}' is not a path (it starts with /; no spaces, ? or #)",
            shardgate::support::text::elide(text, 64)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gos_port_only_form_listens_everywhere() {
        assert_eq!(listen_addr(":19001"), Ok("0.0.0.0:19001".parse().unwrap()));
        assert_eq!(
            listen_addr("127.0.0.1:9090"),
            Ok("127.0.0.1:9090".parse().unwrap())
        );
        assert_eq!(listen_addr("[::1]:9090"), Ok("[::1]:9090".parse().unwrap()));
        for bad in [":", ":x", "localhost:9090", "9090", ""] {
            let e = listen_addr(bad).unwrap_err();
            assert!(e.contains(&format!("'{bad}'")), "{bad}: {e}");
        }
    }

    #[test]
    fn paths_are_absolute() {
        assert_eq!(http_path("/metrics"), Ok("/metrics".to_string()));
        assert_eq!(http_path("/a/b-c_d.e"), Ok("/a/b-c_d.e".to_string()));
        for bad in ["metrics", "", "/a b", "/a?b", "/é"] {
            assert!(http_path(bad).is_err(), "{bad}");
        }
    }

    fn args(addr: bool, mapping: bool, ms: bool) -> UpstreamPrometheusArgs {
        UpstreamPrometheusArgs {
            upstream_prometheus_addr: addr.then(|| "127.0.0.1:1".parse().unwrap()),
            upstream_prometheus_path: "/metrics".into(),
            upstream_prometheus_mapping: mapping.then(|| "m.yaml".into()),
            upstream_prometheus_response_time_ms: ms,
        }
    }

    #[test]
    fn the_port_is_off_unless_an_address_is_given_and_the_ms_switch_needs_the_default() {
        assert_eq!(args(false, false, false).options(), Ok(None));
        let options = args(true, false, true).options().unwrap().unwrap();
        assert_eq!(
            options.mapping,
            MappingSource::UpstreamDefault {
                response_time_ms: true
            }
        );
        let options = args(true, true, false).options().unwrap().unwrap();
        assert_eq!(options.mapping, MappingSource::File("m.yaml".into()));
        assert!(args(true, true, true).options().is_err());
        assert!(args(false, false, true).options().is_err());
    }
}

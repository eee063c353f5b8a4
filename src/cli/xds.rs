//! `serve`'s arguments for rules pushed over xDS instead of read from files.

use std::path::PathBuf;

use clap::Args;
use shardgate::server::xds::{XdsOptions, XdsTls};

/// Where the rules come from when not from `--config`.
#[derive(Args)]
pub(crate) struct XdsArgs {
    /// An xDS control plane that pushes the rules (`RateLimitConfig` resources, as Envoy
    /// Gateway's does): `http://host:port`, or `https://host:port` for TLS. Replaces
    /// `--config`.
    #[arg(long, env = "SHARDGATE_XDS_SERVER")]
    pub(crate) xds_server: Option<String>,
    /// The node id this server subscribes as.
    #[arg(long, env = "SHARDGATE_XDS_NODE_ID", default_value = "default")]
    pub(crate) xds_node_id: String,
    /// Serve (and report ready) before the first push, with no rules; else readiness
    /// waits for it.
    #[arg(long, env = "SHARDGATE_XDS_START_WITHOUT_RULES")]
    pub(crate) xds_start_without_rules: bool,
    /// PEM CA bundle of the control plane's certificate (default: system roots).
    #[arg(long, env = "SHARDGATE_XDS_TLS_CA")]
    pub(crate) xds_tls_ca: Option<PathBuf>,
    /// PEM client certificate for the control plane (with --xds-tls-client-key).
    #[arg(
        long,
        env = "SHARDGATE_XDS_TLS_CLIENT_CERT",
        requires = "xds_tls_client_key"
    )]
    pub(crate) xds_tls_client_cert: Option<PathBuf>,
    /// PEM key of --xds-tls-client-cert.
    #[arg(
        long,
        env = "SHARDGATE_XDS_TLS_CLIENT_KEY",
        requires = "xds_tls_client_cert"
    )]
    pub(crate) xds_tls_client_key: Option<PathBuf>,
    /// The name the control plane's certificate must carry, when not the URL's host.
    #[arg(long, env = "SHARDGATE_XDS_TLS_SERVER_NAME")]
    pub(crate) xds_tls_server_name: Option<String>,
}

impl XdsArgs {
    /// The subscription, when `--xds-server` is given.
    pub(crate) fn options(&self) -> Option<XdsOptions> {
        let server = self.xds_server.clone()?;
        Some(XdsOptions {
            server,
            node_id: self.xds_node_id.clone(),
            start_without_rules: self.xds_start_without_rules,
            tls: XdsTls {
                ca: self.xds_tls_ca.clone(),
                cert: self.xds_tls_client_cert.clone(),
                key: self.xds_tls_client_key.clone(),
                server_name: self.xds_tls_server_name.clone(),
                ..XdsTls::default()
            },
        })
    }
}

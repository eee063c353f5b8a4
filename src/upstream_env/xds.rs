//! upstream's rule source settings: `CONFIG_TYPE=GRPC_XDS_SOTW` and its
//! `CONFIG_GRPC_XDS_*` (how Envoy Gateway's generated Deployment gets its rules), read as
//! our `--xds-*` flags; `FILE` (the default) leaves the rule directory in charge.

use super::go_values::go_bool;
use super::reader::Reader;
use crate::support::text::elide;

/// upstream's defaults.
const DEFAULT_SERVER: &str = "localhost:18000";
const DEFAULT_NODE_ID: &str = "default";

/// Settings of upstream's xDS client with no counterpart here, with why.
const IGNORED: &[(&str, &str)] = &[
    (
        "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL",
        "the stream is opened again after 0.5 s, doubling up to 10 s",
    ),
    (
        "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL",
        "the stream is opened again after 0.5 s, doubling up to 10 s",
    ),
    (
        "XDS_CLIENT_BACKOFF_MAX_INTERVAL",
        "the stream is opened again after 0.5 s, doubling up to 10 s",
    ),
    (
        "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
        "the stream is opened again after 0.5 s, doubling up to 10 s",
    ),
    (
        "XDS_CLIENT_BACKOFF_JITTER",
        "the stream is opened again after 0.5 s, doubling up to 10 s",
    ),
    (
        "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
        "pushes of up to 64 MiB are read",
    ),
];

/// upstream's TLS files for the control plane and the flags they become (read only with
/// `CONFIG_GRPC_XDS_SERVER_USE_TLS=true`).
const TLS_FILES: &[(&str, &str)] = &[
    ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "SHARDGATE_XDS_TLS_CA"),
    (
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        "SHARDGATE_XDS_TLS_CLIENT_CERT",
    ),
    (
        "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        "SHARDGATE_XDS_TLS_CLIENT_KEY",
    ),
    (
        "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
        "SHARDGATE_XDS_TLS_SERVER_NAME",
    ),
];

/// `CONFIG_TYPE` and, for xDS, where the control plane is.
pub(super) fn rule_source(r: &mut Reader) {
    match r.get("CONFIG_TYPE").map(str::to_ascii_uppercase).as_deref() {
        None | Some("FILE") => return,
        Some("GRPC_XDS_SOTW") => {}
        Some(other) => {
            r.refuse(format!(
                "CONFIG_TYPE={}: not FILE or GRPC_XDS_SOTW",
                elide(other, 64)
            ));
            return;
        }
    }
    let tls = match r.get("CONFIG_GRPC_XDS_SERVER_USE_TLS").map(go_bool) {
        None => false,
        Some(Some(on)) => on,
        Some(None) => {
            r.refuse("CONFIG_GRPC_XDS_SERVER_USE_TLS: not a boolean".into());
            return;
        }
    };
    let address = r
        .get("CONFIG_GRPC_XDS_SERVER_URL")
        .unwrap_or(DEFAULT_SERVER);
    if address.contains("://") {
        r.refuse(format!(
            "CONFIG_GRPC_XDS_SERVER_URL={}: an address (host:port), not a URL",
            elide(address, 64)
        ));
        return;
    }
    let scheme = if tls { "https" } else { "http" };
    r.alias(
        "SHARDGATE_XDS_SERVER",
        "CONFIG_TYPE",
        format!("{scheme}://{address}"),
    );
    let node = r.get("CONFIG_GRPC_XDS_NODE_ID").unwrap_or(DEFAULT_NODE_ID);
    r.alias(
        "SHARDGATE_XDS_NODE_ID",
        "CONFIG_GRPC_XDS_NODE_ID",
        node.into(),
    );
    tls_files(r, tls);
    match r.get("FORCE_START_WITHOUT_INITIAL_CONFIG").map(go_bool) {
        Some(Some(on)) => r.alias(
            "SHARDGATE_XDS_START_WITHOUT_RULES",
            "FORCE_START_WITHOUT_INITIAL_CONFIG",
            on.to_string(),
        ),
        Some(None) => r.refuse("FORCE_START_WITHOUT_INITIAL_CONFIG: not a boolean".into()),
        None => {}
    }
    for refused in [
        "CONFIG_GRPC_XDS_NODE_METADATA",
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
    ] {
        if r.get(refused).is_some_and(|v| !v.is_empty()) {
            r.refuse(format!(
                "{refused}: not sent to the control plane (only the node id is)"
            ));
        }
    }
    r.ignore_with_reasons(IGNORED);
}

/// The control plane's TLS files, each set one an alias with `tls` on, else ignored.
fn tls_files(r: &mut Reader, tls: bool) {
    for &(upstream, ours) in TLS_FILES {
        if let Some(v) = r.get(upstream).filter(|v| !v.is_empty()) {
            if tls {
                r.alias(ours, upstream, v.into());
            } else {
                r.t.ignored.push(format!(
                    "{upstream} (CONFIG_GRPC_XDS_SERVER_USE_TLS is not true)"
                ));
            }
        }
    }
}

//! upstream's settings of the server itself: the rule directory, the two ports, logs,
//! the answer switches and header names, the gRPC connection age and TLS, and the gRPC
//! socket's kind. Translation only, through the `Reader`.

use super::go_values::{go_bool, go_duration, listen_addr, log_filter};
use super::reader::Reader;

/// upstream's default rule root (`RUNTIME_ROOT`) and app directory.
const DEFAULT_RUNTIME_ROOT: &str = "/srv/runtime_data/current";
const DEFAULT_APP_DIRECTORY: &str = "config";
/// The rule directory: `RUNTIME_ROOT` / `RUNTIME_SUBDIRECTORY` / `RUNTIME_APPDIRECTORY`.
pub(super) fn rule_directory(r: &mut Reader) {
    if r.get("RUNTIME_ROOT").is_none() && r.get("RUNTIME_SUBDIRECTORY").is_none() {
        return;
    }
    let mut path = std::path::PathBuf::from(r.get("RUNTIME_ROOT").unwrap_or(DEFAULT_RUNTIME_ROOT));
    if let Some(sub) = r.get("RUNTIME_SUBDIRECTORY") {
        path.push(sub);
    }
    path.push(
        r.get("RUNTIME_APPDIRECTORY")
            .unwrap_or(DEFAULT_APP_DIRECTORY),
    );
    // Named by the variable that is set (RUNTIME_ROOT unset: upstream's default root).
    let from = if r.env.contains_key("RUNTIME_ROOT") {
        "RUNTIME_ROOT"
    } else {
        "RUNTIME_SUBDIRECTORY"
    };
    r.alias("SHARDGATE_CONFIG", from, path.display().to_string());
    // What shardgate always does, and so honoured when asked for (Envoy Gateway asks for
    // both): dot files skipped (a ConfigMap volume's `..data` copies), the rule directory
    // itself watched. The other values stay named as ignored.
    for (name, ours) in [
        ("RUNTIME_IGNOREDOTFILES", true),
        ("RUNTIME_WATCH_ROOT", false),
    ] {
        if r.env.get(name).and_then(|v| go_bool(v)) == Some(ours) {
            r.get(name);
        }
    }
}

/// The two ports: `GRPC_HOST`/`GRPC_PORT` and `HOST`/`PORT`.
pub(super) fn listen_addrs(r: &mut Reader) {
    for (host, port, ours, default_port) in [
        ("GRPC_HOST", "GRPC_PORT", "SHARDGATE_GRPC_ADDR", "8081"),
        ("HOST", "PORT", "SHARDGATE_HTTP_ADDR", "8080"),
    ] {
        if r.get(host).is_none() && r.get(port).is_none() {
            continue;
        }
        let h = r.get(host).unwrap_or("0.0.0.0");
        let p = r.get(port).unwrap_or(default_port);
        let from = if r.env.contains_key(port) { port } else { host };
        match listen_addr(h, p) {
            Ok(addr) => r.alias(ours, from, addr),
            Err(e) => r.refuse(format!("{host}/{port}: {e}")),
        }
    }
}

/// upstream's debug port (`DEBUG_HOST`/`DEBUG_PORT`, 6070): its `/rlconfig` is on our HTTP
/// port, its `/stats` is `/metrics` there, its pprof has no counterpart. Named as ignored,
/// with where to look instead.
pub(super) fn debug_port(r: &mut Reader) {
    r.ignore_with_reasons(&[
        (
            "DEBUG_PORT",
            "no debug port: /rlconfig and /metrics are on the HTTP port, PORT",
        ),
        (
            "DEBUG_HOST",
            "no debug port: /rlconfig and /metrics are on the HTTP port, HOST",
        ),
    ]);
}

/// `LOG_LEVEL` (logrus' names), shardgate's own level (the crates it uses stay at warn),
/// and `LOG_FORMAT`.
pub(super) fn logging(r: &mut Reader) {
    if let Some(level) = r.get("LOG_LEVEL") {
        match log_filter(level) {
            Some(f) => r.alias("RUST_LOG", "LOG_LEVEL", f.to_string()),
            None => r.refuse(format!(
                "LOG_LEVEL={}: not a level (trace, debug, info, warn, error)",
                crate::support::text::elide(level, 64)
            )),
        }
    }
    if let Some(format) = r.get("LOG_FORMAT") {
        match format.to_ascii_lowercase().as_str() {
            f @ ("text" | "json") => r.alias("SHARDGATE_LOG_FORMAT", "LOG_FORMAT", f.into()),
            _ => r.refuse(format!(
                "LOG_FORMAT={}: not text or json",
                crate::support::text::elide(format, 64)
            )),
        }
    }
}

/// The boolean switches upstream's answers follow, and its header names.
pub(super) fn switches(r: &mut Reader) {
    for (upstream, ours) in [
        ("SHADOW_MODE", "SHARDGATE_GLOBAL_SHADOW_MODE"),
        ("QUOTA_MODE", "SHARDGATE_GLOBAL_QUOTA_MODE"),
        ("MERGE_DOMAIN_CONFIG", "SHARDGATE_MERGE_DOMAIN_CONFIG"),
        (
            "RESPONSE_DYNAMIC_METADATA",
            "SHARDGATE_RESPONSE_DYNAMIC_METADATA",
        ),
        (
            "LIMIT_RESPONSE_HEADERS_ENABLED",
            "SHARDGATE_RATE_LIMIT_HEADERS",
        ),
    ] {
        if let Some(v) = r.get(upstream) {
            match go_bool(v) {
                Some(b) => r.alias(ours, upstream, b.to_string()),
                None => r.refuse(format!(
                    "{upstream}={}: not a boolean",
                    crate::support::text::elide(v, 64)
                )),
            }
        }
    }
    for (upstream, ours) in [
        ("LIMIT_LIMIT_HEADER", "SHARDGATE_LIMIT_HEADER"),
        ("LIMIT_REMAINING_HEADER", "SHARDGATE_REMAINING_HEADER"),
        ("LIMIT_RESET_HEADER", "SHARDGATE_RESET_HEADER"),
    ] {
        if let Some(v) = r.get(upstream) {
            r.alias(ours, upstream, v.to_string());
        }
    }
}

/// `GRPC_MAX_CONNECTION_AGE` and `GRPC_MAX_CONNECTION_AGE_GRACE`, Go durations.
pub(super) fn connection_age(r: &mut Reader) {
    for (upstream, ours) in [
        (
            "GRPC_MAX_CONNECTION_AGE",
            "SHARDGATE_GRPC_MAX_CONNECTION_AGE",
        ),
        (
            "GRPC_MAX_CONNECTION_AGE_GRACE",
            "SHARDGATE_GRPC_MAX_CONNECTION_AGE_GRACE",
        ),
    ] {
        let Some(value) = r.get(upstream) else {
            continue;
        };
        match go_duration(value) {
            Some(d) => r.alias(ours, upstream, humantime::format_duration(d).to_string()),
            None => r.refuse(format!(
                "{upstream}={}: not a duration (e.g. 24h, 90m, 1h30m)",
                crate::support::text::elide(value, 64)
            )),
        }
    }
}

/// TLS on the gRPC port, only when upstream would use it (`GRPC_SERVER_USE_TLS=true`).
pub(super) fn grpc_tls(r: &mut Reader) {
    match r.get("GRPC_SERVER_USE_TLS").map(go_bool) {
        Some(Some(true)) => {
            for file in GRPC_TLS_FILES {
                match r.get(file.upstream) {
                    Some(path) if !path.is_empty() => {
                        r.alias(file.ours, file.upstream, path.into())
                    }
                    _ if !file.required => {}
                    _ => r.refuse(format!("GRPC_SERVER_USE_TLS=true needs {}", file.upstream)),
                }
            }
            server_ca_cert(r);
            if r.get("GRPC_CLIENT_TLS_SAN").is_some_and(|s| !s.is_empty()) {
                r.refuse(
                    "GRPC_CLIENT_TLS_SAN: client certificates are checked against \
                     GRPC_CLIENT_TLS_CACERT only; pinning a SAN is not supported"
                        .into(),
                );
            }
        }
        Some(None) => r.refuse("GRPC_SERVER_USE_TLS: not a boolean".into()),
        _ => {
            let names = GRPC_TLS_FILES.iter().map(|file| file.upstream);
            let others = ["GRPC_SERVER_TLS_CA_CERT", "GRPC_CLIENT_TLS_SAN"];
            for name in names.chain(others) {
                if r.env.contains_key(name) {
                    r.t.ignored
                        .push(format!("{name} (GRPC_SERVER_USE_TLS is not true)"));
                }
            }
        }
    }
}

/// Envoy Gateway's `GRPC_SERVER_TLS_CA_CERT`, set beside the server's pair: upstream reads
/// no such variable (its client CA is `GRPC_CLIENT_TLS_CACERT`, which makes a certificate
/// required), while Envoy Gateway's proxies present one issued by that CA. shardgate checks
/// a certificate a client presents against it, and serves one that presents none, as
/// upstream does (`--tls-client-cert-optional`). `GRPC_CLIENT_TLS_CACERT` wins when both
/// are set.
fn server_ca_cert(r: &mut Reader) {
    let Some(ca) = r.get("GRPC_SERVER_TLS_CA_CERT").filter(|ca| !ca.is_empty()) else {
        return;
    };
    let client_ca = r
        .get("GRPC_CLIENT_TLS_CACERT")
        .is_some_and(|c| !c.is_empty());
    if client_ca || r.env.contains_key("SHARDGATE_TLS_CLIENT_CA") {
        r.t.ignored.push(
            "GRPC_SERVER_TLS_CA_CERT (the client CA is already set: certificates required)".into(),
        );
        return;
    }
    r.alias(
        "SHARDGATE_TLS_CLIENT_CA",
        "GRPC_SERVER_TLS_CA_CERT",
        ca.into(),
    );
    r.alias(
        "SHARDGATE_TLS_CLIENT_CERT_OPTIONAL",
        "GRPC_SERVER_TLS_CA_CERT",
        "true".into(),
    );
}

/// One of upstream's gRPC TLS files and the variable it becomes.
struct GrpcTlsFile {
    upstream: &'static str,
    ours: &'static str,
    /// Whether `GRPC_SERVER_USE_TLS=true` is refused without it (the client CA is not:
    /// without it, clients are not asked for a certificate).
    required: bool,
}

/// upstream's gRPC TLS files, in the order they are read.
const GRPC_TLS_FILES: &[GrpcTlsFile] = &[
    GrpcTlsFile {
        upstream: "GRPC_SERVER_TLS_CERT",
        ours: "SHARDGATE_TLS_CERT",
        required: true,
    },
    GrpcTlsFile {
        upstream: "GRPC_SERVER_TLS_KEY",
        ours: "SHARDGATE_TLS_KEY",
        required: true,
    },
    GrpcTlsFile {
        upstream: "GRPC_CLIENT_TLS_CACERT",
        ours: "SHARDGATE_TLS_CLIENT_CA",
        required: false,
    },
];

/// The gRPC socket's kind (`GRPC_UDS`: TCP only).
pub(super) fn grpc_socket(r: &mut Reader) {
    if r.get("GRPC_UDS").is_some_and(|s| !s.is_empty()) {
        r.refuse("GRPC_UDS: shardgate listens on TCP only (GRPC_HOST/GRPC_PORT)".into());
    }
}

//! Envoy Gateway's generated rate-limit Deployment, variable by variable (issue 30, item 5):
//! every variant of its environment (`tests/fixtures/envoy-gateway/deployment-env.yaml`,
//! taken from Envoy Gateway's own expected output) goes through the translation `main`
//! applies, and no upstream variable in it passes unnoticed — each is read (honoured or
//! refused with a message) or named as ignored. For the default Deployment each
//! variable's fate is spelled out, so that a change of one is a change of this table.

use std::collections::BTreeMap;

use shardgate::upstream_env::{translate, Translation};

#[derive(serde::Deserialize)]
struct Variant {
    command: Vec<String>,
    env: BTreeMap<String, String>,
}

fn variants() -> BTreeMap<String, Variant> {
    let text = include_str!("fixtures/envoy-gateway/deployment-env.yaml");
    serde_saphyr::from_str(text).expect("the fixture parses")
}

/// What became of one variable.
#[derive(Debug, PartialEq, Eq)]
enum Fate {
    /// Read and followed.
    Honoured,
    /// Read; the server does not start, with a message naming it.
    Refused,
    /// Named in the start-up warning as having no effect here.
    Ignored,
    /// Nowhere: the case this test exists to rule out.
    Unnoticed,
}

fn fate(t: &Translation, name: &str) -> Fate {
    let ignored = t
        .ignored
        .iter()
        .any(|i| i == name || i.starts_with(&format!("{name} ")));
    if t.refused.iter().any(|r| r.contains(name)) {
        Fate::Refused
    } else if t.read.iter().any(|r| r == name) {
        Fate::Honoured
    } else if ignored {
        Fate::Ignored
    } else {
        Fate::Unnoticed
    }
}

/// Upstream's variables are upper case; a user's own extra variables (`env_a` in the
/// `extension-env` variant) are none of its business.
fn upstreams(env: &BTreeMap<String, String>) -> impl Iterator<Item = &String> {
    env.keys().filter(|k| {
        k.chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
    })
}

#[test]
fn no_variable_of_any_variant_passes_unnoticed() {
    let variants = variants();
    assert!(variants.len() >= 8, "{} variants", variants.len());
    for (name, variant) in &variants {
        assert_eq!(variant.command, ["/bin/ratelimit"], "{name}");
        let t = translate(&variant.env);
        for var in upstreams(&variant.env) {
            assert_ne!(fate(&t, var), Fate::Unnoticed, "{name}: {var} in {t:#?}");
        }
    }
}

#[test]
fn the_default_deployment_variable_by_variable() {
    let variants = variants();
    let t = translate(&variants["default"].env);
    let expected = [
        ("RUNTIME_ROOT", Fate::Honoured),
        ("RUNTIME_SUBDIRECTORY", Fate::Honoured),
        // Dot files skipped, the rule directory itself watched: what shardgate does.
        ("RUNTIME_IGNOREDOTFILES", Fate::Honoured),
        ("RUNTIME_WATCH_ROOT", Fate::Honoured),
        ("LOG_LEVEL", Fate::Honoured),
        // No statsd: what shardgate does unless asked.
        ("USE_STATSD", Fate::Honoured),
        // Rules over xDS, from Envoy Gateway's control plane, over mutual TLS.
        ("CONFIG_TYPE", Fate::Honoured),
        ("CONFIG_GRPC_XDS_SERVER_URL", Fate::Honoured),
        ("CONFIG_GRPC_XDS_NODE_ID", Fate::Honoured),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", Fate::Honoured),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", Fate::Honoured),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", Fate::Honoured),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", Fate::Honoured),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", Fate::Honoured),
        ("GRPC_SERVER_USE_TLS", Fate::Honoured),
        ("GRPC_SERVER_TLS_CERT", Fate::Honoured),
        ("GRPC_SERVER_TLS_KEY", Fate::Honoured),
        // Not a variable upstream reads: a client certificate presented is checked
        // against it, none is required (Envoy Gateway's proxies present one).
        ("GRPC_SERVER_TLS_CA_CERT", Fate::Honoured),
        // Redis, as upstream: the Redis store on the same Redis.
        ("REDIS_SOCKET_TYPE", Fate::Honoured),
        ("REDIS_URL", Fate::Honoured),
        // Upstream's Prometheus port, named by Envoy Gateway's mapping file.
        ("USE_PROMETHEUS", Fate::Honoured),
        ("PROMETHEUS_ADDR", Fate::Honoured),
        ("PROMETHEUS_MAPPER_YAML", Fate::Honoured),
    ];
    let env = &variants["default"].env;
    let listed: Vec<&str> = expected.iter().map(|(n, _)| *n).collect();
    for var in upstreams(env) {
        assert!(listed.contains(&var.as_str()), "{var} has no expected fate");
    }
    for (var, want) in expected {
        assert!(
            env.contains_key(var),
            "{var} is not in the default Deployment"
        );
        assert_eq!(fate(&t, var), want, "{var} in {t:#?}");
    }
}

#[test]
fn the_server_ca_checks_client_certificates_without_requiring_one() {
    let variants = variants();
    let t = translate(&variants["default"].env);
    let set: BTreeMap<&str, &str> = t.set.iter().map(|a| (a.ours, a.value.as_str())).collect();
    assert_eq!(set.get("SHARDGATE_TLS_CLIENT_CA"), Some(&"/certs/ca.crt"));
    assert_eq!(set.get("SHARDGATE_TLS_CLIENT_CERT_OPTIONAL"), Some(&"true"));

    // Upstream's own client CA makes a certificate required, and wins.
    let mut env = variants["default"].env.clone();
    env.insert("GRPC_CLIENT_TLS_CACERT".into(), "/certs/clients.crt".into());
    let t = translate(&env);
    let set: BTreeMap<&str, &str> = t.set.iter().map(|a| (a.ours, a.value.as_str())).collect();
    assert_eq!(
        set.get("SHARDGATE_TLS_CLIENT_CA"),
        Some(&"/certs/clients.crt")
    );
    assert_eq!(set.get("SHARDGATE_TLS_CLIENT_CERT_OPTIONAL"), None);
    assert_eq!(fate(&t, "GRPC_SERVER_TLS_CA_CERT"), Fate::Ignored, "{t:#?}");
}

#[test]
fn the_default_deployment_subscribes_to_its_control_plane_over_mutual_tls() {
    let variants = variants();
    let t = translate(&variants["default"].env);
    assert!(t.refused.is_empty(), "{:?}", t.refused);
    let set: BTreeMap<&str, &str> = t.set.iter().map(|a| (a.ours, a.value.as_str())).collect();
    assert_eq!(
        set.get("SHARDGATE_XDS_SERVER"),
        Some(&"https://envoy-gateway:18001")
    );
    assert_eq!(set.get("SHARDGATE_XDS_NODE_ID"), Some(&"envoy-ratelimit"));
    assert_eq!(set.get("SHARDGATE_XDS_TLS_CA"), Some(&"/certs/ca.crt"));
    assert_eq!(
        set.get("SHARDGATE_XDS_TLS_CLIENT_CERT"),
        Some(&"/certs/tls.crt")
    );
    assert_eq!(
        set.get("SHARDGATE_XDS_TLS_CLIENT_KEY"),
        Some(&"/certs/tls.key")
    );
    assert_eq!(set.get("SHARDGATE_XDS_START_WITHOUT_RULES"), Some(&"true"));
    assert_eq!(set.get("SHARDGATE_STORE"), Some(&"redis"));
}

#[test]
fn the_prometheus_deployments_serve_upstreams_port_with_envoy_gateways_mapping() {
    let variants = variants();
    let mut serving = 0;
    for (name, variant) in &variants {
        let prometheus = variant.env.get("USE_PROMETHEUS").map(String::as_str) == Some("true");
        let statsd = variant.env.get("USE_STATSD").map(String::as_str) == Some("true");
        let t = translate(&variant.env);
        let set: BTreeMap<&str, &str> = t.set.iter().map(|a| (a.ours, a.value.as_str())).collect();
        if prometheus && statsd {
            // Upstream stops on two sinks at once (`override-env`, `redis-tls-settings`
            // set both): so does shardgate, naming both.
            assert_eq!(fate(&t, "USE_PROMETHEUS"), Fate::Refused, "{name}");
            assert_eq!(fate(&t, "USE_STATSD"), Fate::Refused, "{name}");
            continue;
        }
        if !prometheus {
            assert!(
                !set.keys()
                    .any(|k| k.starts_with("SHARDGATE_UPSTREAM_PROMETHEUS")),
                "{name}: {set:?}"
            );
            continue;
        }
        serving += 1;
        assert_eq!(
            set.get("SHARDGATE_UPSTREAM_PROMETHEUS_ADDR"),
            Some(&"0.0.0.0:19001"),
            "{name}"
        );
        assert_eq!(
            set.get("SHARDGATE_UPSTREAM_PROMETHEUS_MAPPING"),
            Some(&"/etc/statsd-exporter/conf.yaml"),
            "{name}"
        );
        // Upstream's default path, ours too: not set.
        assert_eq!(
            set.get("SHARDGATE_UPSTREAM_PROMETHEUS_PATH"),
            None,
            "{name}"
        );
        for var in [
            "USE_PROMETHEUS",
            "PROMETHEUS_ADDR",
            "PROMETHEUS_MAPPER_YAML",
        ] {
            assert_eq!(fate(&t, var), Fate::Honoured, "{name}: {var}");
        }
    }
    assert!(serving >= 6, "{serving} variants serve the port");
}

#[test]
fn the_disable_prometheus_deployment_serves_no_upstream_port_and_no_statsd() {
    let variants = variants();
    let t = translate(&variants["disable-prometheus"].env);
    assert!(t.refused.is_empty(), "{:?}", t.refused);
    assert!(
        !t.set
            .iter()
            .any(|a| a.ours.starts_with("SHARDGATE_UPSTREAM_PROMETHEUS")
                || a.ours.starts_with("SHARDGATE_STATSD")),
        "{:?}",
        t.set
    );
    assert_eq!(fate(&t, "USE_STATSD"), Fate::Honoured);
    assert!(!variants["disable-prometheus"]
        .env
        .contains_key("USE_PROMETHEUS"));
}

#[test]
fn the_statsd_sidecar_deployment_sends_statsd_over_tcp_to_the_sidecar() {
    let variants = variants();
    let t = translate(&variants["statsd-sidecar"].env);
    let set: BTreeMap<&str, &str> = t.set.iter().map(|a| (a.ours, a.value.as_str())).collect();
    assert_eq!(
        set.get("SHARDGATE_STATSD_ADDR"),
        Some(&"localhost:9125"),
        "{t:#?}"
    );
    assert_eq!(set.get("SHARDGATE_STATSD_PROTOCOL"), Some(&"tcp"), "{t:#?}");
    assert_eq!(fate(&t, "STATSD_PORT"), Fate::Honoured);
}

#[test]
fn the_tracing_deployments_export_over_their_collectors_protocol() {
    let variants = variants();
    for name in ["enable-tracing", "enable-tracing-custom"] {
        let t = translate(&variants[name].env);
        let set: BTreeMap<&str, &str> = t.set.iter().map(|a| (a.ours, a.value.as_str())).collect();
        // Upstream's default transport; the endpoint is the SDK's variable, read as is.
        assert_eq!(set.get("SHARDGATE_OTLP_PROTOCOL"), Some(&"http"), "{name}");
        assert_eq!(
            set.get("OTEL_SERVICE_NAME"),
            Some(&"envoy-ratelimit"),
            "{name}"
        );
        let attributes = set
            .get("OTEL_RESOURCE_ATTRIBUTES")
            .copied()
            .unwrap_or_default();
        assert!(
            attributes.contains("service.namespace=envoy-gateway-system")
                && attributes.contains("service.instance.id=envoy-ratelimit-"),
            "{name}: {attributes}"
        );
        for var in [
            "TRACING_ENABLED",
            "TRACING_SERVICE_NAME",
            "TRACING_SAMPLING_RATE",
        ] {
            assert_eq!(fate(&t, var), Fate::Honoured, "{name}: {var}");
        }
    }
    // A rate below 1 samples by trace id, following the caller's decision.
    let custom = translate(&variants["enable-tracing-custom"].env);
    let sampler = custom
        .set
        .iter()
        .find(|a| a.ours == "OTEL_TRACES_SAMPLER_ARG")
        .map(|a| a.value.as_str());
    assert_eq!(sampler, Some("0.6"));
}

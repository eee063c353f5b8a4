//! Rules pushed over xDS (`ratelimit.config.ratelimit.v3.RateLimitConfig`, what Envoy
//! Gateway's control plane sends envoyproxy/ratelimit): each resource written as the
//! document a rule file would hold for it, then loaded exactly as files are — the same
//! validation, every error, the same compiled config. Pure: the stream that carries the
//! resources is the transport's (`server/xds.rs`).
//!
//! A resource becomes one document named `xds:{name}`, in JSON (which the YAML loader
//! reads as it is), pretty-printed so that an error's line points into it.

use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use serde_json::{json, Map};

use super::{Config, ConfigErrors, LoadOptions};

/// The type URL of the resources the rules come in.
pub const RATE_LIMIT_CONFIG_TYPE: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// The config these resources make, as files holding them would (`options`: how several
/// documents of one domain combine).
pub fn from_resources(
    resources: &[RateLimitConfig],
    options: &LoadOptions,
) -> Result<Config, ConfigErrors> {
    let docs: Vec<(String, String)> = resources.iter().map(document).collect();
    Config::from_documents_with(&docs, options)
}

/// `(name, text)` of the document `config` stands for.
#[expect(clippy::expect_used, reason = "JSON values only")]
pub fn document(config: &RateLimitConfig) -> (String, String) {
    let doc = json!({
        "domain": config.domain,
        "descriptors": config.descriptors.iter().map(descriptor).collect::<Vec<_>>(),
    });
    let name = if config.name.is_empty() {
        format!("xds:{}", config.domain)
    } else {
        format!("xds:{}", config.name)
    };
    (
        name,
        serde_json::to_string_pretty(&doc).expect("JSON values only"),
    )
}

fn descriptor(d: &RateLimitDescriptor) -> serde_json::Value {
    let mut out = Map::new();
    out.insert("key".into(), d.key.clone().into());
    if !d.value.is_empty() {
        out.insert("value".into(), d.value.clone().into());
    }
    if let Some(policy) = &d.rate_limit {
        out.insert("rate_limit".into(), rate_limit(policy));
    }
    for (flag, on) in [
        ("shadow_mode", d.shadow_mode),
        ("detailed_metric", d.detailed_metric),
        ("quota_mode", d.quota_mode),
    ] {
        if on {
            out.insert(flag.into(), true.into());
        }
    }
    if let Some(metadata) = &d.metadata {
        out.insert("metadata".into(), structure(metadata));
    }
    if !d.descriptors.is_empty() {
        out.insert(
            "descriptors".into(),
            d.descriptors.iter().map(descriptor).collect(),
        );
    }
    out.into()
}

fn rate_limit(p: &RateLimitPolicy) -> serde_json::Value {
    let mut out = Map::new();
    if p.unlimited {
        out.insert("unlimited".into(), true.into());
    } else {
        // An unknown unit is left out: validation names it missing, as a file's would be.
        let unit = match RateLimitUnit::try_from(p.unit) {
            Ok(RateLimitUnit::Second) => Some("second"),
            Ok(RateLimitUnit::Minute) => Some("minute"),
            Ok(RateLimitUnit::Hour) => Some("hour"),
            Ok(RateLimitUnit::Day) => Some("day"),
            Ok(RateLimitUnit::Week) => Some("week"),
            Ok(RateLimitUnit::Month) => Some("month"),
            Ok(RateLimitUnit::Year) => Some("year"),
            Ok(RateLimitUnit::Unknown) | Err(_) => None,
        };
        if let Some(unit) = unit {
            out.insert("unit".into(), unit.into());
        }
        out.insert("requests_per_unit".into(), p.requests_per_unit.into());
    }
    if !p.name.is_empty() {
        out.insert("name".into(), p.name.clone().into());
    }
    if !p.replaces.is_empty() {
        out.insert(
            "replaces".into(),
            p.replaces
                .iter()
                .map(|r| json!({ "name": r.name }))
                .collect(),
        );
    }
    out.into()
}

fn structure(s: &Struct) -> serde_json::Value {
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), value(v)))
        .collect::<Map<_, _>>()
        .into()
}

fn value(v: &Value) -> serde_json::Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => serde_json::Value::Null,
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::StructValue(s)) => structure(s),
        Some(Kind::ListValue(l)) => l.values.iter().map(value).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitReplace;

    fn policy(unit: RateLimitUnit, rpu: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit: rpu,
            ..Default::default()
        })
    }

    fn resource() -> RateLimitConfig {
        RateLimitConfig {
            name: "default/eg/http".into(),
            domain: "default/eg/http".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "rule-0-match-0".into(),
                value: "rule-0-match-0".into(),
                descriptors: vec![RateLimitDescriptor {
                    key: "x-user-id".into(),
                    rate_limit: policy(RateLimitUnit::Hour, 3),
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
    }

    #[test]
    fn a_resource_loads_as_the_file_holding_it_would() {
        let config = from_resources(&[resource()], &LoadOptions::default()).unwrap();
        let domain = config.domain("default/eg/http").expect("the domain");
        assert_eq!(&*domain.name, "default/eg/http");
        let same = Config::from_yaml(
            "file.yaml",
            "domain: default/eg/http\ndescriptors:\n  - key: rule-0-match-0\n    value: rule-0-match-0\n    descriptors:\n      - key: x-user-id\n        rate_limit: {unit: hour, requests_per_unit: 3}\n",
        )
        .unwrap();
        let entries = [("rule-0-match-0", "rule-0-match-0"), ("x-user-id", "u1")];
        let pushed = domain.match_descriptor(&entries).expect("a rule");
        let written = same
            .domain("default/eg/http")
            .unwrap()
            .match_descriptor(&entries)
            .unwrap();
        assert_eq!(pushed.limit, written.limit);
        assert_eq!(pushed.stats_key, written.stats_key);
        assert_eq!(pushed.levels, written.levels);
    }

    #[test]
    fn a_bad_resource_is_refused_with_every_error_naming_it() {
        let mut bad = resource();
        bad.descriptors[0].descriptors[0].rate_limit = Some(RateLimitPolicy {
            unit: RateLimitUnit::Unknown as i32,
            requests_per_unit: 3,
            name: "n".into(),
            replaces: vec![RateLimitReplace {
                name: "nowhere".into(),
            }],
            ..Default::default()
        });
        let errors = from_resources(&[bad], &LoadOptions::default())
            .unwrap_err()
            .to_string();
        assert!(errors.contains("xds:default/eg/http"), "{errors}");
        assert!(errors.contains("unit"), "{errors}");
    }

    #[test]
    fn unlimited_metadata_and_flags_carry_over() {
        let mut r = resource();
        let leaf = &mut r.descriptors[0].descriptors[0];
        leaf.rate_limit = Some(RateLimitPolicy {
            unlimited: true,
            ..Default::default()
        });
        leaf.shadow_mode = true;
        leaf.metadata = Some(Struct {
            fields: [(
                "team".to_string(),
                Value {
                    kind: Some(Kind::StringValue("a".into())),
                },
            )]
            .into_iter()
            .collect(),
        });
        let (_, text) = document(&r);
        assert!(text.contains("\"unlimited\": true"), "{text}");
        assert!(text.contains("\"shadow_mode\": true"), "{text}");
        assert!(text.contains("\"team\": \"a\""), "{text}");
        from_resources(&[r], &LoadOptions::default()).unwrap();
    }
}

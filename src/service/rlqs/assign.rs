//! What a rule means to an RLQS bucket: allow all, deny all, or a limit to share
//! ([`Kind`]), and an assignment as Envoy's `BucketAction` says it ([`Assignment`],
//! [`action`]). Never the `requests_per_time_unit` strategy: Envoy 1.40's filter does not
//! enforce it (it lets every request through), so a limit is always a token bucket.
//!
//! Decides nothing about shares (`share.rs`) and keeps no state (`stream.rs`).

use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::r#type::v3::{RateLimitStrategy, TokenBucket};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    AbandonAction, BucketAction as Action, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::BucketId;
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};

use super::share::Bucket;
use crate::config::{Rule, RuleLimit};

/// What a bucket's rule asks of RLQS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// No rule matches, the rule is `unlimited`, or it is in shadow mode (never denies).
    AllowAll,
    /// `requests_per_unit: 0` with no burst: nothing is ever admitted.
    DenyAll,
    /// A limit of `tokens` per `period` with `burst`, to share among the Envoys.
    Limited {
        tokens: u64,
        period: Duration,
        burst: u64,
    },
}

/// The kind of `rule` (none: no rule matches). Only a rule's first limit is shared: its
/// further limits (`rate_limits:`) and a cascade parent are not applied under RLQS.
pub fn kind(rule: Option<&Rule>) -> Kind {
    let Some(rule) = rule else {
        return Kind::AllowAll;
    };
    if rule.shadow_mode {
        return Kind::AllowAll;
    }
    match &rule.limit {
        RuleLimit::Unlimited => Kind::AllowAll,
        RuleLimit::Limited(limit) if limit.requests_per_unit == 0 => Kind::DenyAll,
        RuleLimit::Limited(limit) => Kind::Limited {
            tokens: u64::from(limit.requests_per_unit),
            period: Duration::from_secs(limit.period_seconds()),
            burst: limit.capacity().max(1),
        },
    }
}

/// An assignment sent for a bucket, by kind (the `kind` label of the metrics).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Assignment {
    AllowAll,
    DenyAll,
    TokenBucket(Bucket),
    Abandon,
}

impl Assignment {
    pub fn label(&self) -> &'static str {
        match self {
            Assignment::AllowAll => "allow_all",
            Assignment::DenyAll => "deny_all",
            Assignment::TokenBucket(_) => "token_bucket",
            Assignment::Abandon => "abandon",
        }
    }
}

/// `assignment` for the bucket of `entries`, valid for `ttl`, as Envoy reads it.
pub fn action(entries: &[(String, String)], assignment: Assignment, ttl: Duration) -> BucketAction {
    let bucket_id = Some(BucketId {
        bucket: entries.iter().cloned().collect(),
    });
    let strategy = match assignment {
        Assignment::Abandon => {
            return BucketAction {
                bucket_id,
                bucket_action: Some(Action::AbandonAction(AbandonAction {})),
            }
        }
        Assignment::AllowAll => Strategy::BlanketRule(BlanketRule::AllowAll as i32),
        Assignment::DenyAll => Strategy::BlanketRule(BlanketRule::DenyAll as i32),
        Assignment::TokenBucket(b) => Strategy::TokenBucket(TokenBucket {
            max_tokens: b.max_tokens,
            tokens_per_fill: Some(UInt32Value {
                value: b.tokens_per_fill,
            }),
            fill_interval: Some(pb_duration(b.fill_interval)),
        }),
    };
    BucketAction {
        bucket_id,
        bucket_action: Some(Action::QuotaAssignmentAction(QuotaAssignmentAction {
            assignment_time_to_live: Some(pb_duration(ttl)),
            rate_limit_strategy: Some(RateLimitStrategy {
                strategy: Some(strategy),
            }),
        })),
    }
}

fn pb_duration(d: Duration) -> PbDuration {
    PbDuration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: d.subsec_nanos() as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const RULES: &str = "domain: d\ndescriptors:\n  - key: tenant\n    value: acme\n    rate_limit: {unit: second, requests_per_unit: 50}\n  - key: tenant\n    value: banned\n    rate_limit: {unit: second, requests_per_unit: 0}\n  - key: tenant\n    value: free\n    rate_limit: {unlimited: true}\n";

    fn kind_of(value: &str) -> Kind {
        let config = Config::from_yaml("rules.yaml", RULES).unwrap();
        let domain = config.domain("d").unwrap();
        kind(domain.match_descriptor(&[("tenant", value)]).map(|r| &**r))
    }

    #[test]
    fn each_rule_has_its_kind() {
        let fifty = Kind::Limited {
            tokens: 50,
            period: Duration::from_secs(1),
            burst: 50,
        };
        assert_eq!(kind_of("acme"), fifty);
        assert_eq!(kind_of("banned"), Kind::DenyAll);
        assert_eq!(kind_of("free"), Kind::AllowAll);
        assert_eq!(kind_of("nobody"), Kind::AllowAll);
    }

    #[test]
    fn a_token_bucket_is_never_requests_per_time_unit() {
        let b = Bucket {
            max_tokens: 5,
            tokens_per_fill: 5,
            fill_interval: Duration::from_millis(1500),
        };
        let entries = [("tenant".to_string(), "acme".to_string())];
        let a = action(&entries, Assignment::TokenBucket(b), Duration::from_secs(3));
        let Some(Action::QuotaAssignmentAction(q)) = a.bucket_action else {
            panic!("not an assignment: {a:?}");
        };
        let strategy = q.rate_limit_strategy.and_then(|s| s.strategy);
        let Some(Strategy::TokenBucket(t)) = strategy else {
            panic!("not a token bucket: {strategy:?}");
        };
        assert_eq!(
            t.fill_interval.map(|d| (d.seconds, d.nanos)),
            Some((1, 500_000_000))
        );
        assert_eq!(q.assignment_time_to_live.map(|d| d.seconds), Some(3));
        assert_eq!(a.bucket_id.unwrap().bucket["tenant"], "acme");
    }
}

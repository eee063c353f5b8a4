//! The start-up report of the translation, logged once by `serve`: each upstream
//! variable honoured (with the value it gave, secrets hidden), each one of ours that wins
//! over an upstream variable saying otherwise, and the upstream variables ignored. Owns
//! the wording and what is safe to print; deciding is the translators'.

use super::{Alias, Overridden, Translation};

/// Logs `t` (at info for what is honoured, warn for what is overridden or ignored).
pub fn log_start_up(t: &Translation) {
    for alias in &t.set {
        tracing::info!(
            from = %source(alias),
            to = alias.ours,
            value = %shown(alias.ours, &alias.value),
            "envoyproxy/ratelimit variable honoured"
        );
    }
    for o in &t.overridden {
        tracing::warn!(
            wins = o.ours,
            value = %shown(o.ours, &o.ours_value),
            over = o.from,
            which_says = %shown(o.ours, &o.upstream_value),
            "{}",
            overridden_message(o)
        );
    }
    if !t.ignored.is_empty() {
        tracing::warn!(
            ignored = %t.ignored.join(", "),
            "envoyproxy/ratelimit variables with no meaning in shardgate (docs/configuration.md, \"Environment\")"
        );
    }
}

/// The one line saying which of two disagreeing variables is followed.
pub fn overridden_message(o: &Overridden) -> String {
    format!(
        "{} is set and wins over envoyproxy/ratelimit's {} (unset {} to follow {})",
        o.ours, o.from, o.ours, o.from
    )
}

/// Where an alias's value came from: the variable, or its default when it is unset.
pub fn source(alias: &Alias) -> String {
    if alias.from_set {
        alias.from.to_string()
    } else {
        format!("{} unset (upstream's default)", alias.from)
    }
}

/// A value as it may be printed: a password in a Redis URL is masked, a password
/// variable's value is not shown at all.
pub fn shown(ours: &str, value: &str) -> String {
    if ours.contains("AUTH") || ours.contains("PASSWORD") {
        return "(hidden)".into();
    }
    if ours.ends_with("REDIS_URL") {
        return value
            .split(',')
            .map(crate::support::text::without_password)
            .collect::<Vec<_>>()
            .join(",");
    }
    value.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_not_printed() {
        assert_eq!(
            shown("SHARDGATE_REDIS_URL", "redis://:pw@a:1,rediss://u:p@b:2"),
            "redis://***@a:1,rediss://***@b:2"
        );
        assert_eq!(shown("SHARDGATE_REDIS_URL", "redis://a:1"), "redis://a:1");
        assert_eq!(shown("SHARDGATE_REDIS_MASTER_AUTH", "pw"), "(hidden)");
        assert_eq!(shown("SHARDGATE_CONFIG", "/data"), "/data");
    }
}

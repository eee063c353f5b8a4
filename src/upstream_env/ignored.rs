//! The upstream variables shardgate does not read, by name and by prefix: what
//! `Reader::finish` names as ignored when no reader looked at them. Data only.

/// Upstream variables that configure what shardgate does differently or not at all
/// (its stats sinks when stats are disabled or a sink is off, caches, Memcached, xDS,
/// tracing), and those of its Redis client when
/// Redis is not the backend. A variable some reader looked at is not ignored: it was
/// honoured or refused.
const IGNORED: &[&str] = &[
    "BACKEND_TYPE",
    "CACHE_KEY_PREFIX",
    "DISABLE_STATS",
    "EXPIRATION_JITTER_MAX_SECONDS",
    "EXTRA_TAGS",
    "FORCE_START_WITHOUT_INITIAL_CONFIG",
    "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
    "LOCAL_CACHE_SIZE_IN_BYTES",
    "NEAR_LIMIT_RATIO",
    "RUNTIME_IGNOREDOTFILES",
    "RUNTIME_WATCH_ROOT",
    "STATS_FLUSH_INTERVAL",
    "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT",
    "USE_DOG_STATSD",
    "USE_DOG_STATSD_MOGRIFIERS",
    "USE_PROMETHEUS",
    "USE_STATSD",
];

/// Prefixes of upstream variables that are ignored unless some reader looked at them.
const IGNORED_PREFIXES: &[&str] = &[
    "MEMCACHE_",
    "PROMETHEUS_",
    "REDIS_",
    "STATSD_",
    "TRACING_",
    "XDS_CLIENT_",
    "CONFIG_GRPC_XDS_",
];

/// Whether `name` is an upstream variable with no meaning here (by name or by prefix).
pub(super) fn is_ignored(name: &str) -> bool {
    IGNORED.contains(&name) || IGNORED_PREFIXES.iter().any(|p| name.starts_with(p))
}

//! Values written as envoyproxy/ratelimit (a Go program) reads them: `strconv.ParseBool`,
//! `time.ParseDuration`, listen addresses, logrus' level names. Parsing only: which
//! variable a value came from, and what to say when it is wrong, are the translators'.

use std::net::ToSocketAddrs;
use std::time::Duration;

/// `host:port` as a socket address; a name is resolved (its first address), as
/// upstream's listener would.
pub(super) fn listen_addr(host: &str, port: &str) -> Result<String, String> {
    let port: u16 = port
        .parse()
        .map_err(|_| format!("{}: not a port", crate::support::text::elide(port, 32)))?;
    let mut addrs = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("{}: {e}", crate::support::text::elide(host, 64)))?;
    addrs
        .next()
        .map(|a| a.to_string())
        .ok_or_else(|| format!("{}: no address", crate::support::text::elide(host, 64)))
}

/// upstream's (logrus) level names as a tracing filter: the level is shardgate's own, the
/// crates it uses stay at warn (upstream's debug log is its own lines, not its
/// dependencies' frame traces).
pub(super) fn log_filter(level: &str) -> Option<&'static str> {
    Some(match level.to_ascii_lowercase().as_str() {
        "trace" => "warn,shardgate=trace",
        "debug" => "warn,shardgate=debug",
        "info" => "warn,shardgate=info",
        "warn" | "warning" => "warn",
        "error" | "fatal" | "panic" => "error",
        _ => return None,
    })
}

/// A duration as Go's `time.ParseDuration` reads it, which upstream's settings use:
/// `0`, or decimal numbers each with a unit (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), as in
/// `24h`, `1.5h`, `1h30m`. A negative one is refused (it would mean "never" upstream, which
/// leaving the variable unset says).
pub(super) fn go_duration(v: &str) -> Option<Duration> {
    if v == "0" {
        return Some(Duration::ZERO);
    }
    let mut rest = v.strip_prefix('+').unwrap_or(v);
    if rest.is_empty() {
        return None;
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, tail) = rest.split_at(number_len);
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_len);
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3_600.0,
            _ => return None,
        };
        if number.is_empty() || number == "." {
            return None;
        }
        total += number.parse::<f64>().ok()? * seconds;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).ok()
}

/// Go's `strconv.ParseBool`, which upstream's settings use.
pub(super) fn go_bool(v: &str) -> Option<bool> {
    match v {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

//! What a failed Redis call means, and whose failure it is: this request's (an item of
//! another type under its key, a value that is not ours: [`StoreError::Corrupt`]), or the
//! store's (everything else: connection loss, timeouts, `LOADING`, `BUSY`, `TRYAGAIN`,
//! `CLUSTERDOWN`, `MASTERDOWN`, a failover's `READONLY`, `OOM`, refused authentication:
//! [`StoreError::Unavailable`], the only kind the circuit breaker counts). `MOVED` and
//! `ASK` never get here: the Cluster client follows them.

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::store::{Cause, StoreError};
use crate::support::text::elide;

/// Most bytes of a Redis error text carried into a [`StoreError`].
const REASON_BYTES: usize = 256;

/// Whose failure `err` is, for the item under `key` (the Redis key).
pub(super) fn classify(key: &str, err: &RedisError) -> StoreError {
    let reason = elide(&err.to_string(), REASON_BYTES).into_owned();
    let key = key.to_string();
    // The client's text already holds the reply; an I/O error under it is kept.
    let source = std::error::Error::source(err).map(Cause::of);
    if is_this_items(err) {
        StoreError::Corrupt {
            key,
            reason,
            source,
        }
    } else {
        StoreError::Unavailable {
            key,
            reason,
            source,
        }
    }
}

/// The error a script reported as text (`CODE detail`, as Redis writes an error line)
/// for one of the items it touched, read as the client reads an error reply, so that
/// [`classify`] judges it as it judges any other.
pub(super) fn reported(text: &str) -> RedisError {
    let line: String = text
        .chars()
        .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
        .collect();
    match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()) {
        Ok(redis::Value::ServerError(e)) => e.into(),
        _ => RedisError::from((ErrorKind::Parse, "a script's unreadable error", line)),
    }
}

/// What a script meets only on an item's own values, as Redis words it on every version
/// (6.x wraps a script's error in `ERR Error running script … @user_script: …`, 7.x and
/// Valkey keep the inner code): another type under the key, a field that is not an
/// integer, a sum leaving 64 bits, and Lua's own complaint about a value it cannot add or
/// compare. An allow-list, not the word `user_script` (which every error raised inside a
/// script carries, a command the server lacks or refuses included): whatever is not on
/// it is the server's, counted by the breaker.
const ITEM_ERRORS: [&str; 5] = [
    "WRONGTYPE",
    "hash value is not an integer",
    "increment or decrement would overflow",
    "attempt to perform arithmetic on",
    "attempt to compare",
];

/// Whether the error is about the one item the call touched (its type or its values),
/// so that it is that request's answer and never trips the breaker for everyone.
pub(super) fn is_this_items(err: &RedisError) -> bool {
    if err.code() == Some("WRONGTYPE") {
        return true;
    }
    match err.kind() {
        // A reply the scripts never make: the item under the key is not ours.
        ErrorKind::Parse | ErrorKind::UnexpectedReturnType => true,
        ErrorKind::Server(ServerErrorKind::ResponseError) => {
            // `ERR`: a script that stopped on this item's values is the item's; any other
            // `ERR` (too many clients, a command unknown to this server or refused by
            // its ACL) is the server's.
            let detail = err.detail().unwrap_or_default();
            ITEM_ERRORS.iter().any(|e| detail.contains(e))
        }
        _ => false,
    }
}

/// Whether the error is a demoted primary's (`READONLY`): a write reached a replica, as
/// after a failover behind an address that did not move. Redis 7 and Valkey refuse the
/// script with it; Redis 6 runs the script and its first write fails with it inside.
pub(super) fn is_demoted(err: &RedisError) -> bool {
    err.code() == Some("READONLY") || err.detail().is_some_and(|d| d.contains("READONLY"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: &str, detail: &str) -> RedisError {
        // As the client parses a server's error line.
        let line = format!("-{code} {detail}\r\n");
        match redis::parse_redis_value(line.as_bytes()) {
            Ok(redis::Value::ServerError(e)) => e.into(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn failover_loading_and_busy_are_the_stores() {
        for (code, detail) in [
            ("LOADING", "Redis is loading the dataset in memory"),
            ("BUSY", "Redis is busy running a script"),
            ("TRYAGAIN", "Multiple keys request during rehashing of slot"),
            ("CLUSTERDOWN", "The cluster is down"),
            ("READONLY", "You can't write against a read only replica."),
            ("MASTERDOWN", "Link with MASTER is down"),
            ("OOM", "command not allowed when used memory > 'maxmemory'."),
            ("ERR", "max number of clients reached"),
            ("NOAUTH", "Authentication required."),
        ] {
            let e = classify("k", &server(code, detail));
            assert!(e.is_fault(), "{code}: {e}");
        }
    }

    #[test]
    fn a_wrong_type_or_a_bad_value_is_that_requests() {
        for (code, detail) in [
            (
                "WRONGTYPE",
                "Operation against a key holding the wrong kind of value",
            ),
            (
                "ERR",
                "Error running script (call to f_x): @user_script:1: ERR hash value is not an integer",
            ),
            (
                "ERR",
                "Error running script (call to f_x): @user_script:12: @user_script: 12: WRONGTYPE Operation against a key holding the wrong kind of value",
            ),
        ] {
            let e = classify("k", &server(code, detail));
            assert!(!e.is_fault(), "{code}: {e}");
            assert!(matches!(e, StoreError::Corrupt { .. }), "{e}");
        }
    }

    #[test]
    fn an_error_a_script_reports_as_text_is_judged_as_a_reply() {
        let item = classify("k", &reported("WRONGTYPE Operation against a key"));
        assert!(matches!(item, StoreError::Corrupt { .. }), "{item:?}");
        let script = classify("k", &reported("ERR user_script:9: attempt to compare"));
        assert!(matches!(script, StoreError::Corrupt { .. }), "{script:?}");
        // Raised inside a script but not by an item: the server's, whatever it carries.
        for text in [
            "ERR user_script:1: Unknown Redis command called from Lua script",
            "ERR Error running script (call to f_1): @user_script:84: @user_script: 84: Unknown Redis command called from Lua script",
            "NOPERM this user has no permissions to run the 'hset' command",
            "ERR user_script:7: attempt to concatenate a nil value",
        ] {
            let e = classify("k", &reported(text));
            assert!(matches!(e, StoreError::Unavailable { .. }), "{text}: {e:?}");
        }
        let full = classify(
            "k",
            &reported("OOM command not allowed\r\nwhen used memory"),
        );
        assert!(matches!(full, StoreError::Unavailable { .. }), "{full:?}");
    }

    #[test]
    fn a_demoted_primary_is_known_at_the_top_or_inside_a_script() {
        assert!(is_demoted(&server(
            "READONLY",
            "You can't write against a read only replica."
        )));
        assert!(is_demoted(&server(
            "ERR",
            "Error running script (call to f_1): @user_script:9: @user_script: 9: -READONLY You can't write against a read only replica."
        )));
        assert!(is_demoted(&reported(
            "READONLY You can't write against a read only replica."
        )));
        assert!(!is_demoted(&server("OOM", "command not allowed")));
    }

    #[test]
    fn a_long_server_message_is_cut() {
        let e = classify("k", &server("ERR", &"x".repeat(10_000)));
        assert!(e.to_string().len() < 600, "{}", e.to_string().len());
    }
}

//! A Redis Cluster's redirections followed where the Cluster client gives up on them.
//!
//! redis-rs (1.8) follows an `ASK` by sending `ASKING` to the node it names, waiting for
//! that answer, and only then sending the command, on the one connection every call to that
//! node shares. Another call's command sent in between takes the one-time flag `ASKING`
//! set, and the command then reaches the importing node without it: that node answers
//! `MOVED` back to the migrating node, which answers `ASK` again. Under load on a slot being
//! migrated a call bounces so until the client's retries run out, and the store fails it
//! (tests/redis_failover.rs: 252 of 640 calls on a key mid-migration, before this;
//! tests/python/test_redis_cluster_failover.py: a hot bucket's calls during a migration).
//!
//! Such a call is sent again here, at most [`MAX_HOPS`] times, to the node the
//! redirection names, as one pipeline: `ASKING` then the command. One pipeline is one
//! write on the connection, so no other call's command comes between them; and the client
//! redirects a pipeline whole, so when the node named (the slot's owner, by a `MOVED`)
//! answers `ASK`, the pair reaches the importing node together. `ASKING` does nothing on
//! a node that owns the slot, which is what a `MOVED` names (an importing node owns it only
//! once `SETSLOT … NODE` ends the import); only the importing node an `ASK` names serves
//! the key because of it, as the Cluster's protocol has it — never one reached by a stale
//! route or at random (a script there would create the item beside the one still on the
//! old node). A redirection is answered before the command runs, so nothing here runs a
//! script twice. A script new to the node (`NOSCRIPT`) is sent again with its body.
//!
//! Owns: those resends. Must not: decide anything about the item, or retry any other error
//! (the client's retries, and the store's deadline, are the caller's).

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use super::scripts::Lua;

/// Redirections followed for one call after the client's own: a migration needs two
/// (`MOVED` to the migrating node, `ASK` to the importing one); the rest is for a
/// topology that moves again meanwhile.
pub(super) const MAX_HOPS: usize = 4;

/// Whether the client gave `error` up as a redirection (`MOVED` or `ASK`).
pub(super) fn is_redirect(error: &RedisError) -> bool {
    error.redirect_node().is_some()
}

/// Sends `cmd` (a call of `lua`, when a script) where the redirection `error` points, and
/// on through the redirections that answer, at most [`MAX_HOPS`] of them; any other answer
/// is the call's.
pub(super) async fn follow(
    conn: &mut ClusterConnection,
    cmd: &Cmd,
    lua: Option<&Lua>,
    mut error: RedisError,
) -> RedisResult<Value> {
    for _ in 0..MAX_HOPS {
        let Some((host, port)) = target(&error) else {
            return Err(error);
        };
        let mut result = asking(conn, &host, port, cmd).await;
        if let (Err(e), Some(lua)) = (&result, lua) {
            if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) {
                result = asking(conn, &host, port, &lua.with_body(cmd)).await;
            }
        }
        match result {
            Err(e) if is_redirect(&e) => error = e,
            answered => return answered,
        }
    }
    Err(error)
}

/// The node a redirection names, `(host, port)`.
fn target(error: &RedisError) -> Option<(String, u16)> {
    let (node, _slot) = error.redirect_node()?;
    let (host, port) = node.rsplit_once(':')?;
    Some((host.to_string(), port.parse().ok()?))
}

/// `ASKING` and `cmd` in one pipeline to the node at `host:port`: `cmd`'s answer.
async fn asking(
    conn: &mut ClusterConnection,
    host: &str,
    port: u16,
    cmd: &Cmd,
) -> RedisResult<Value> {
    let node = SingleNodeRoutingInfo::ByAddress {
        host: host.to_string(),
        port,
    };
    let mut pipe = redis::pipe();
    pipe.cmd("ASKING").add_command(cmd.clone());
    let mut replies = conn.route_pipeline(pipe, 0, 2, node).await?;
    let reply = replies
        .pop()
        .filter(|_| replies.len() == 1)
        .ok_or_else(|| {
            RedisError::from((
                ErrorKind::Client,
                "ASKING and a command answered another count of replies",
            ))
        })?;
    reply.extract_error()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(line: &str) -> RedisError {
        match redis::parse_redis_value(format!("-{line}\r\n").as_bytes()) {
            Ok(Value::ServerError(e)) => e.into(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_redirection_names_its_node_and_nothing_else_is_one() {
        let moved = server("MOVED 1859 127.0.0.1:20107");
        assert!(is_redirect(&moved));
        assert_eq!(target(&moved), Some(("127.0.0.1".into(), 20107)));
        let ask = server("ASK 7 10.0.0.2:6380");
        assert_eq!(target(&ask), Some(("10.0.0.2".into(), 6380)));
        for other in ["TRYAGAIN Multiple keys", "CLUSTERDOWN The cluster is down"] {
            let e = server(other);
            assert!(!is_redirect(&e), "{other}");
            assert_eq!(target(&e), None);
        }
    }
}

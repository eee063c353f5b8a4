//! The store's server-side scripts (`lua/`), each prefixed with what they share
//! (`lua/lib.lua`), and how a call of one is sent: `EVALSHA` of its hash, and on
//! `NOSCRIPT` (a restarted server, a promoted replica, a node new to a Cluster) `EVAL` of
//! its body, sent to the same key — so on a Cluster only the key's own node is asked,
//! which runs the call and keeps the script for the next `EVALSHA`. Never `SCRIPT LOAD`,
//! which a Cluster client sends to every node and which fails when any of them does.
//! Owns only their text and the command: what they take and answer is `args.rs`'s and
//! their callers'.

use std::sync::LazyLock;

use redis::{Arg, Cmd};

/// One script: its text and the SHA-1 Redis knows it by.
pub(super) struct Lua {
    body: &'static str,
    hash: String,
}

impl Lua {
    fn new(body: &'static str) -> Lua {
        Lua {
            hash: redis::Script::new(body).get_hash().to_string(),
            body,
        }
    }

    /// `EVALSHA` of this script over `keys`; the caller adds the arguments.
    pub(super) fn call<K: AsRef<str>>(&self, keys: &[K]) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.hash).arg(keys.len());
        for k in keys {
            cmd.arg(k.as_ref());
        }
        cmd
    }

    /// `sent` (an `EVALSHA` of this script made by [`Lua::call`]) as `EVAL` of its body:
    /// the same keys and arguments, for a server that does not know the hash.
    pub(super) fn with_body(&self, sent: &Cmd) -> Cmd {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(self.body);
        for a in sent.args_iter().skip(2) {
            if let Arg::Simple(bytes) = a {
                cmd.arg(bytes);
            }
        }
        cmd
    }
}

macro_rules! script {
    ($file:literal) => {
        LazyLock::new(|| Lua::new(concat!(include_str!("lua/lib.lua"), include_str!($file))))
    };
}

/// One debit (`store.rs`).
pub(super) static DEBIT: LazyLock<Lua> = script!("lua/debit.lua");
/// Several debits on one server, each as `DEBIT` would (`batch.rs`).
pub(super) static DEBITS: LazyLock<Lua> = script!("lua/debits.lua");
/// A credit under its guard.
pub(super) static CREDIT: LazyLock<Lua> = script!("lua/credit.lua");
/// The writes of a slow pass, on one node.
pub(super) static COMMIT: LazyLock<Lua> = script!("lua/commit.lua");
/// Undoing one slot's part of a commit over several (`spread.rs`).
pub(super) static UNDO: LazyLock<Lua> = script!("lua/undo.lua");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_sent_again_with_its_body_keeps_its_keys_and_arguments() {
        let mut sent = DEBIT.call(&["k1", "k2"]);
        sent.arg("a").arg(7);
        let eval = DEBIT.with_body(&sent);
        let words: Vec<Vec<u8>> = eval
            .args_iter()
            .map(|a| match a {
                Arg::Simple(b) => b.to_vec(),
                _ => panic!("only plain arguments"),
            })
            .collect();
        assert_eq!(words[0], b"EVAL");
        assert!(words[1].starts_with(b"-- shardgate's Redis store"));
        let rest: Vec<&[u8]> = words[2..].iter().map(Vec::as_slice).collect();
        assert_eq!(rest, [&b"2"[..], b"k1", b"k2", b"a", b"7"]);
        let hash: Vec<u8> = match sent.args_iter().nth(1) {
            Some(Arg::Simple(b)) => b.to_vec(),
            _ => Vec::new(),
        };
        assert_eq!(hash.len(), 40, "a SHA-1 in hex");
    }
}

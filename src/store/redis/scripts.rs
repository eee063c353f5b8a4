//! The store's server-side scripts (`lua/`), each prefixed with what they share
//! (`lua/lib.lua`), loaded on first use and sent by `EVALSHA` (loaded again on `NOSCRIPT`).
//! Owns only their text: what they take and answer is `codec.rs`'s and their callers'.

use std::sync::LazyLock;

use redis::Script;

macro_rules! script {
    ($file:literal) => {
        LazyLock::new(|| Script::new(concat!(include_str!("lua/lib.lua"), include_str!($file))))
    };
}

/// One debit (`store.rs`).
pub(super) static DEBIT: LazyLock<Script> = script!("lua/debit.lua");
/// Several debits on one server, each as `DEBIT` would (`batch.rs`).
pub(super) static DEBITS: LazyLock<Script> = script!("lua/debits.lua");
/// A credit under its guard.
pub(super) static CREDIT: LazyLock<Script> = script!("lua/credit.lua");
/// The writes of a slow pass, on one node.
pub(super) static COMMIT: LazyLock<Script> = script!("lua/commit.lua");
/// Undoing one slot's part of a commit over several (`spread.rs`).
pub(super) static UNDO: LazyLock<Script> = script!("lua/undo.lua");

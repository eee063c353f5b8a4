//! The Redis store (Redis or Valkey: one server, or a Cluster): bucket items as hashes,
//! shared by a fleet of servers, the store most of Envoy's rate limiting already runs on.
//!
//! Each contract primitive is one server-side script (`lua/`, sent by `EVALSHA`, and by
//! `EVAL` of its body on `NOSCRIPT`), so each is one round trip and atomic on its node: the
//! fast path's debit, a credit under its guard, a commit of every write of a slow pass.
//! A read is one `HGETALL` per item, sent together (they pipeline on the connection).
//! Every script checks all its conditions before its first write, so a refused call
//! writes nothing; the size of an item a commit's update leaves (refused past DynamoDB's
//! 400 KB, as every store refuses it) is measured once written and undone in the same
//! script. Expiry is the key's own: `EXPIREAT` the item's `ttl`, moved only
//! later, as the `ttl` field is.
//!
//! Atomic commits need the items on one node: always so on one server, and on a Cluster
//! when they share a slot. A commit over several slots (a cascade, a slow pass over
//! several shards) is made item by item; see `spread.rs` for how, and why that admits no
//! more than one atomic commit would.
//!
//! On one server (standalone or Sentinel's master), debits waiting at the same time go
//! together in one script (`batch.rs`), each answered as if alone: Redis's cost per
//! debit is mostly the call around it.
//!
//! `store.rs` holds the contract's calls; `options.rs` what an operator gives, `link.rs`
//! reaching Redis, `sentinel.rs` the master the Sentinels name (watched, so that a
//! failover is followed even when the old master still answers), `server.rs` which
//! server it is (refused when the scripts cannot run there), `codec.rs` the item format, `args.rs` and `commit_args.rs` the scripts'
//! arguments, `scripts.rs` the scripts, `batch.rs` debits sent together, `failure.rs`
//! what Redis's errors mean, `nodes.rs` the count of calls per node, `redirect.rs` a
//! Cluster's redirections the client gave up on. None decides anything about limits.

mod args;
mod batch;
mod codec;
mod commit_args;
mod failure;
mod link;
mod nodes;
mod options;
mod redirect;
mod scripts;
mod sentinel;
mod server;
mod spread;
mod store;

pub use options::{redact, RedisConfigError, RedisMode, RedisOptions, RedisTls, DEFAULT_POOL_SIZE};
pub use store::{RedisStore, DEFAULT_KEY_WRITE_BUDGET};

//! The acquire algorithm: one all-or-nothing decision over several buckets. Every step is
//! a method of [`Deciding`] (the request and the engine it runs on, `state.rs`, with the
//! per-request state types); read in this order:
//!
//! 1. `decide.rs`, the driver. Rejection cache first (`cached.rs`): a fresh image proving
//!    every shard of some bucket short refuses with no store call.
//! 2. Fast path (`decide.rs`): one conditional debit per bucket, concurrently, on a drawn
//!    shard; on shard 0 it carries the item a create would write (`pass::seed_item`), which
//!    a store that can creates and debits in the same call when the shard is missing.
//! 3. Each refused debit is classified from its old image and resolved on its own
//!    (`resolve.rs`): fast rejection when a refill would not help, `wcu` projection and
//!    doubling, retry on up to two other shards, or a slow path on a chosen shard.
//! 4. Slow path (`slow.rs`, planned by the pure `pass.rs`): one read of every unresolved
//!    bucket, refill in memory, one atomic commit under the `rf` lock with additive
//!    deltas (creates are conditional), and the consumption-only retry when a lock or a
//!    create race is lost.
//! 5. If anything refuses, debits already applied are refunded (`refund.rs`): nothing is
//!    taken.
//!
//! What a decision reports is built in `outcome.rs`; `peek.rs` answers without writing.
//! The engine's public calls (`Engine::acquire`, `peek`, `refund`) and the lease
//! answers in front of this algorithm are in `instance.rs` and `lease/`.

mod cached;
mod decide;
mod outcome;
mod pass;
mod peek;
mod refund;
mod resolve;
mod slow;
mod split;
mod state;

pub(crate) use state::Deciding;
pub use state::CONTENTION_RETRY_MS;

//! Token leases: a bucket hot in this process is answered from memory, out of a block of
//! tokens taken from one of its shards in advance by the same conditional debit any
//! request makes. Tokens leave the bucket before they are used, so a lease can never
//! admit more than the bucket holds; what is not used within the lease's lifetime goes
//! back to the shard (never above its share), and at shutdown everything does.
//!
//! This module owns when to lease, how much, and the return: `leasing.rs` does the work,
//! `options.rs` says how, `book/` keeps the leases and the demand, `size.rs` is the
//! arithmetic. It makes no decision a debit would not (a lease is a debit). On the request path it waits on the store only to give back a
//! lease too short for a request, before the store decides it, and for a move of its
//! bucket's tokens already under way (a fetch or a return, whose tokens the store would
//! not see yet) — each at most a quarter of what is left of the caller's deadline
//! ([`WAIT_SHARE_OF_DEADLINE`](leasing::WAIT_SHARE_OF_DEADLINE)), then the store decides as it would without leases.
//!
//! Fetches and returns run in one task of the server's ([`Engine::run_leases`](crate::engine::Engine::run_leases)), which
//! is supervised: if it dies, leasing turns off and what it held goes back.

mod book;
mod leasing;
mod options;
mod size;

pub(crate) use book::LeaseBook;
pub use book::{BucketLeases, HeldTokens, TrackedBucket};
pub(crate) use leasing::Leasing;
pub use options::LeaseOptions;

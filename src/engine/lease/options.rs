//! How leases are taken ([`LeaseOptions`]): their lifetime, the rate from which a bucket
//! is leased, their size against a shard's share, and how long a request waits for one.

/// How leases are taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseOptions {
    /// How long a granted block may sit before its rest goes back (ms). A second: long
    /// enough that a hot bucket costs about two writes a second per server (a grant each
    /// half-lifetime, see `size::needs_top_up`) whatever its rate, short enough that the
    /// tokens a server stops using reach the other servers within about a second.
    pub lifetime_ms: i64,
    /// Decisions per second on one bucket, in this process, from which it is leased:
    /// below it a lease would answer too few requests to save writes.
    pub hot_rate: u32,
    /// A lease is at most `1/share_divisor` of its shard's share: several servers can
    /// each hold one, and a server that goes quiet or crashes strands little.
    pub share_divisor: i64,
    /// The longest a request on a bucket whose lease is being fetched or given back waits
    /// for that store call before going to the store itself (ms), when its caller set no
    /// deadline. With a deadline it waits at most a [`WAIT_SHARE_OF_DEADLINE`]th of what
    /// is left of it: a fetch is a whole decision (a slow path, a retry, a doubling) and
    /// may take longer than the caller allows, while the store decides the request as it
    /// would without leases in the time that remains.
    pub wait_ms: u64,
    /// A fault for tests of a running server: the lease task panics at its first fetch,
    /// so that its supervision (leasing off, leases given back, the death counted and
    /// alerted on) can be seen end to end. Only debug builds set it
    /// (`SHARDGATE_DEBUG_LEASE_TASK_PANIC`, read in `server/serve/stores.rs`).
    pub panic_at_fetch: bool,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            lifetime_ms: 1_000,
            hot_rate: 20,
            share_divisor: 8,
            wait_ms: 1_000,
            panic_at_fetch: false,
        }
    }
}

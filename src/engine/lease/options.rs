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
    /// below it a lease would answer too few requests to save writes. By default the
    /// break-even rate of the lifetime ([`break_even_rate`]).
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

/// Store writes one lease costs over its lifetime at a steady rate: its grant, the top-up
/// fetched once it is half used (`size::needs_top_up`), and the return of its rest when
/// the bucket cools. Each request it answers saves the one write the store would have
/// made for it.
pub const WRITES_PER_LEASE_LIFETIME: u32 = 3;

/// How far above its true rate a bucket may be measured: its rate comes from one demand
/// window (250 ms) of a few requests, and a burst of a few within one window doubles a
/// lukewarm bucket's reading. A lease is taken from twice the break-even rate, so that a
/// bucket measured twice too fast still pays for its lease.
pub const RATE_MARGIN: u32 = 2;

/// The rate (decisions per second) from which a lease of `lifetime_ms` saves writes,
/// with the margin for a rate measured too high: a lease answers `rate × lifetime` requests
/// for [`WRITES_PER_LEASE_LIFETIME`] writes. 6/s for the default second.
pub fn break_even_rate(lifetime_ms: i64) -> u32 {
    let lifetime_ms = u64::try_from(lifetime_ms.max(1)).unwrap_or(1);
    let per_s = u64::from(WRITES_PER_LEASE_LIFETIME * RATE_MARGIN) * 1_000;
    u32::try_from(per_s.div_ceil(lifetime_ms)).unwrap_or(u32::MAX)
}

impl Default for LeaseOptions {
    fn default() -> Self {
        const LIFETIME_MS: i64 = 1_000;
        LeaseOptions {
            lifetime_ms: LIFETIME_MS,
            hot_rate: break_even_rate(LIFETIME_MS),
            share_divisor: 8,
            wait_ms: 1_000,
            panic_at_fetch: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_taken_from_twice_its_break_even_rate() {
        // Three writes a lifetime, twice over: 6 decisions a second for a second's lease.
        assert_eq!(break_even_rate(1_000), 6);
        assert_eq!(LeaseOptions::default().hot_rate, 6);
        // A longer lease pays at a lower rate; a shorter one needs a higher one.
        assert_eq!(break_even_rate(2_000), 3);
        assert_eq!(break_even_rate(250), 24);
        assert_eq!(break_even_rate(0), 6_000);
        assert_eq!(break_even_rate(i64::MAX), 1);
    }
}

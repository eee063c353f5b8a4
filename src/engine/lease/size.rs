//! How big a lease is: pure arithmetic on the local demand, the lease lifetime and the
//! shard's share. No clock, no store, no lock: `book/` measures the demand and
//! `mod.rs` asks the store for the size chosen here.

use super::super::bucket::ShardShare;

/// The demand this process puts on one limit of a bucket, measured over a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    /// Millitokens taken per second (all requests of the window).
    pub per_s: i64,
    /// Millitokens the largest single request of the window took.
    pub largest: i64,
}

/// The smallest useful lease, in requests: a block that answers fewer than this many
/// requests costs a write (and a return) for too little.
pub const MIN_REQUESTS_PER_LEASE: i64 = 4;

/// The millitokens to lease for one limit, or `None` when no useful lease fits:
/// the demand over `lifetime_ms`, at least [`MIN_REQUESTS_PER_LEASE`] of the largest
/// request, at most `1/share_divisor` of the shard's share (so several servers can each
/// hold one, and a server that goes quiet or crashes strands little).
pub fn lease_size(
    demand: Demand,
    lifetime_ms: i64,
    share: ShardShare,
    share_divisor: i64,
) -> Option<i64> {
    let largest = demand.largest.max(1);
    let cap = share.ceiling / share_divisor.max(1);
    let least = largest.saturating_mul(MIN_REQUESTS_PER_LEASE);
    if cap < least {
        return None;
    }
    let over_lifetime =
        (i128::from(demand.per_s.max(0)) * i128::from(lifetime_ms.max(0)) / 1_000) as i64;
    Some(over_lifetime.clamp(least, cap))
}

/// What to ask for when the shard holds `available` millitokens (refilled to now): at
/// most half of it, up to `wanted`, if that is still a useful lease for a request of
/// `largest`. The other half stays for requests decided by the store meanwhile (those
/// of this server while the lease is in flight, and other servers'), so a bucket near
/// empty is never emptied into a lease.
pub fn what_fits(wanted: i64, available: i64, largest: i64) -> Option<i64> {
    let fits = wanted.min(available / 2);
    (fits >= largest.max(1).saturating_mul(MIN_REQUESTS_PER_LEASE)).then_some(fits)
}

/// Whether a lease holding `rest` of a last grant of `granted` should be topped up now:
/// below half, so the next block arrives before this one runs out at a steady rate (the
/// store answers in milliseconds; half a lease lasts about half its lifetime).
pub fn needs_top_up(rest: i64, granted: i64) -> bool {
    rest < granted / 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn share(ceiling: i64) -> ShardShare {
        ShardShare {
            ceiling,
            refill_amount: ceiling,
            refill_period_ms: 1_000,
        }
    }

    #[test]
    fn a_lease_covers_the_demand_of_its_lifetime() {
        let d = Demand {
            per_s: 200_000,
            largest: 1_000,
        };
        // 200 tokens/s for one second, under a share of 10,000 tokens / 8.
        assert_eq!(lease_size(d, 1_000, share(10_000_000), 8), Some(200_000));
        // Capped at an eighth of the share.
        assert_eq!(lease_size(d, 1_000, share(800_000), 8), Some(100_000));
        // A slow demand still gets a block of a few requests.
        let slow = Demand {
            per_s: 1_000,
            largest: 1_000,
        };
        assert_eq!(lease_size(slow, 1_000, share(10_000_000), 8), Some(4_000));
    }

    #[test]
    fn no_lease_where_the_share_is_too_small_for_a_few_requests() {
        let d = Demand {
            per_s: 1_000_000,
            largest: 1_000,
        };
        // An eighth of 24 tokens is 3 tokens: less than four requests.
        assert_eq!(lease_size(d, 1_000, share(24_000), 8), None);
        assert_eq!(lease_size(d, 1_000, share(32_000), 8), Some(4_000));
    }

    #[test]
    fn a_lease_takes_at_most_half_of_what_the_shard_holds() {
        assert_eq!(what_fits(100_000, 30_000, 1_000), Some(15_000));
        assert_eq!(
            what_fits(100_000, 7_000, 1_000),
            None,
            "half is under four requests"
        );
        assert_eq!(what_fits(5_000, 30_000, 1_000), Some(5_000));
        assert_eq!(what_fits(100_000, -5_000, 1_000), None, "in debt");
    }

    #[test]
    fn top_up_below_half() {
        assert!(!needs_top_up(50, 100));
        assert!(needs_top_up(49, 100));
    }

    proptest! {
        #[test]
        fn a_lease_is_never_above_its_cap_nor_below_a_few_requests(
            per_s in 0i64..1 << 50,
            largest in 0i64..1 << 40,
            lifetime_ms in 0i64..100_000,
            ceiling in 0i64..1 << 50,
            divisor in 1i64..64,
        ) {
            let d = Demand { per_s, largest };
            if let Some(size) = lease_size(d, lifetime_ms, share(ceiling), divisor) {
                prop_assert!(size <= ceiling / divisor);
                prop_assert!(size >= largest.max(1) * MIN_REQUESTS_PER_LEASE);
            } else {
                prop_assert!(ceiling / divisor < largest.max(1) * MIN_REQUESTS_PER_LEASE);
            }
        }

        #[test]
        fn what_fits_never_exceeds_what_is_there_nor_what_was_wanted(
            wanted in 0i64..1 << 50,
            available in -(1i64 << 50)..1 << 50,
            largest in 0i64..1 << 40,
        ) {
            if let Some(f) = what_fits(wanted, available, largest) {
                prop_assert!(f <= wanted && f <= available / 2 && f > 0);
            }
        }
    }
}

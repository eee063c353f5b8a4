//! The store contract itself: the [`BucketStore`] trait every store implements, and the
//! bounds every caller of it keeps (the default call timeout, the most items a commit
//! carries). The shapes it passes are `write.rs`, `credit.rs`, `error.rs` and `item.rs`.

use std::future::Future;

use super::{
    BucketItem, BucketKey, CommitOutcome, Credit, CreditGuard, Debit, DebitMode, DebitOutcome,
    Seed, StoreError, Write,
};

/// How long one store call may take by default (`--store-timeout`), and the deadline of a
/// caller that sets none: long enough for what a cold or briefly slow store needs
/// (credentials, a first TLS connection, the SDK's retries) to finish rather than fail as
/// an outage, short enough that a hung store opens the circuit within about a second and
/// a caller without a deadline of its own waits no longer. A caller with a deadline
/// (Envoy sends one) is answered within it whatever this is.
pub const DEFAULT_STORE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// The longest `--store-timeout` taken: an hour is no call's timeout anyone means, and
/// every deadline computed from it (a call's instant plus the timeout) stays far inside
/// what the clock holds. Past it, `Instant + timeout` overflowed on every request.
pub const MAX_STORE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3_600);

/// A store timeout as the server takes it at start: more than zero (a store call given no
/// time at all would fail every request as an outage) and at most [`MAX_STORE_TIMEOUT`].
/// The error says which bound was passed.
pub fn check_store_timeout(timeout: std::time::Duration) -> Result<std::time::Duration, String> {
    if timeout.is_zero() {
        return Err("a store timeout must be more than zero (e.g. 1s, 250ms)".to_string());
    }
    if timeout > MAX_STORE_TIMEOUT {
        return Err(format!(
            "a store timeout of {} is longer than the most taken, {}",
            humantime::format_duration(timeout),
            humantime::format_duration(MAX_STORE_TIMEOUT)
        ));
    }
    Ok(timeout)
}

/// Most items one commit may carry (DynamoDB's transaction limit).
pub const MAX_COMMIT_ITEMS: usize = 100;

/// The store contract. Every method is atomic on its own; see each type for the exact
/// conditions.
pub trait BucketStore: Send + Sync + 'static {
    /// Fast path or consumption-only retry on one item.
    fn debit(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
    ) -> impl Future<Output = Result<DebitOutcome, StoreError>> + Send;

    /// [`Self::debit`] on an item that may not exist yet. Where `key` holds no item, a
    /// store that can create one and debit it in the same atomic step writes the item
    /// `seed` builds (the shard as a create would write it now, no claim taken) and
    /// applies the debit to it under the same conditions, answering as if it had existed:
    /// `Applied` with the image after the debit, except that no `wcu` token is taken (a
    /// create takes none: the item is the one a slow pass would create, whatever the
    /// store). When the conditions fail on the seed,
    /// nothing is written and the answer is `Refused(None)`, as for any missing item. A
    /// store calls `seed` only when the item is missing, or once per call if it must send
    /// the seed ahead (Redis, DynamoDB). The seed must be refused (as an error, nothing written)
    /// exactly where a [`Write::Create`] of it would be.
    ///
    /// By default nothing is created: a missing item is `Refused(None)` and the caller
    /// creates it by a commit, one call more.
    fn debit_or_create(
        &self,
        key: &BucketKey,
        debits: &[Debit],
        mode: DebitMode,
        seed: &Seed<'_>,
    ) -> impl Future<Output = Result<DebitOutcome, StoreError>> + Send {
        let _ = seed;
        self.debit(key, debits, mode)
    }

    /// Images of several items in one call (`None` for a missing item), in key order.
    fn read(
        &self,
        keys: &[BucketKey],
    ) -> impl Future<Output = Result<Vec<Option<BucketItem>>, StoreError>> + Send;

    /// Up to [`MAX_COMMIT_ITEMS`] writes, all or nothing. One store keeps this weaker:
    /// on a Redis Cluster, a commit whose items lie on several slots is made slot by slot
    /// (no script writes across masters), and a slot's refusal undoes the slots already
    /// written — exactly where untouched, else by giving the request's claim back under a
    /// refund's guard. Others may see the partial commit meanwhile; each part on its own
    /// is a write a slow pass could make plus the claim, so what they see admits less,
    /// never more (`redis/spread.rs` argues it; a write neither undone nor given back is
    /// counted in [`super::counters`]).
    fn commit(
        &self,
        writes: &[Write],
    ) -> impl Future<Output = Result<CommitOutcome, StoreError>> + Send;

    /// Gives millitokens back (best effort; see [`Credit`]), only while the item meets
    /// `guard`. A refund of voided debits requires the stamp the debit's image showed: a
    /// slow pass since then refilled from that baseline, which may already have given the
    /// voided tokens back (the clamp at the ceiling had removed them), and a refund on
    /// top would mint them; a doubling since shrank the share the ceilings were computed
    /// for. A lease's return requires the shard count only. Returns the credits applied.
    fn credit(
        &self,
        key: &BucketKey,
        guard: CreditGuard,
        credits: &[Credit],
    ) -> impl Future<Output = Result<Vec<Credit>, StoreError>> + Send;

    /// The state of the circuit breaker the store is behind (`closed`, `open` or
    /// `probing`; with a circuit per fault domain, the worst of them), for the operator's
    /// page; `None` without one (the memory store).
    fn circuit(&self) -> Option<&'static str> {
        None
    }

    /// Which part of the store answers for `key`, as a small number
    /// (below [`FAULT_DOMAINS`]): calls on one domain fail together when it is down, and
    /// calls on another go on (a Redis Cluster's master and its slots). A circuit breaker
    /// keeps one circuit per domain, so that one dead node does not fail the calls the
    /// healthy ones would answer. One domain (0) unless a store says otherwise.
    fn fault_domain(&self, key: &BucketKey) -> usize {
        let _ = key;
        0
    }
}

/// Most fault domains a store tells apart ([`BucketStore::fault_domain`]); a larger
/// number shares a circuit with another.
pub const FAULT_DOMAINS: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_store_timeout_is_more_than_zero_and_within_the_clock() {
        assert_eq!(
            check_store_timeout(Duration::from_millis(1)),
            Ok(Duration::from_millis(1))
        );
        assert_eq!(
            check_store_timeout(MAX_STORE_TIMEOUT),
            Ok(MAX_STORE_TIMEOUT)
        );
        assert!(check_store_timeout(Duration::ZERO)
            .unwrap_err()
            .contains("more than zero"));
        let e = check_store_timeout(Duration::from_secs(100_000_000_000)).unwrap_err();
        assert!(e.contains("longer than the most taken, 1h"), "{e}");
        // What the bound protects: a deadline computed from the largest timeout taken.
        let _ = tokio::time::Instant::now() + MAX_STORE_TIMEOUT;
    }
}

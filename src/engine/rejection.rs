//! The rejection cache: the last image this process saw of each shard that could refuse
//! (a refusal's, or an admitted debit's that left a limit short of what it took, or a
//! debit voided by a sibling's refusal), trusted for a short time to refuse a request that
//! image proves cannot fit, without a store call. An admitted request on a bucket with
//! room, the common case, costs the cache one atomic load while it holds nothing.
//!
//! It only ever refuses or steers the shard draw; it never admits. Its error is bounded:
//! tokens returned by a path this process did not see (another server's refund) are
//! missed for at most twice the cache lifetime, which can only under-admit.
//!
//! An image older than the lifetime is refreshed by one caller, not by every request in
//! flight: the first to find it old goes to the store, and the others keep trusting the
//! old image (projected to now, so a refill is never missed) until that caller's image
//! replaces it, or for one more lifetime if none does. Without this, each expiry of a
//! hot refused bucket sent every request in flight to the store at once.
//!
//! Likewise for a refill: each request the image lets through to the store takes its
//! amount from the image first ([`RejectionCache::claim`]), so that a refill of a few
//! tokens lets a few requests through, not every request that arrives before the store
//! answers (measured: at 256 streams on a key limited to 2000/s, 1.1 store calls per
//! decision without it).
//!
//! [`RejectionCache::prune`] drops what no caller can still use (see its comment); the
//! server calls it on a timer, so a bucket refused once and never asked for again does
//! not stay, and once no bucket is short admitting goes back to the atomic load.

use super::partitioned::Partitioned;
use super::LimitClaim;
use crate::store::{BucketItem, BucketKey};

#[derive(Debug)]
struct Entry {
    image: BucketItem,
    stored_at: i64,
    /// When a caller was sent to refresh this aged image (none since it was stored).
    refreshing_since: Option<i64>,
}

#[derive(Debug)]
pub(crate) struct RejectionCache {
    ttl_ms: i64,
    /// While it is empty (no bucket short lately, the common case) every call returns
    /// before hashing or locking. Full of recent refusals (many distinct buckets refused
    /// within the lifetime), a part starts over: losing entries only sends requests to
    /// the store.
    images: Partitioned<BucketKey, Entry>,
}

impl RejectionCache {
    pub(crate) fn new(ttl_ms: i64, capacity: usize) -> RejectionCache {
        RejectionCache {
            ttl_ms,
            images: Partitioned::new(capacity),
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.ttl_ms > 0
    }

    /// Whether a lookup could find anything.
    pub(crate) fn holds_any(&self) -> bool {
        self.enabled() && !self.images.is_empty()
    }

    /// Remembers the image of a shard seen at `now` on a refusal.
    pub(crate) fn remember(&self, key: &BucketKey, image: &BucketItem, now: i64) {
        if self.enabled() {
            self.keep(key, image, now);
        }
    }

    /// Remembers the image an admitted debit returned if it could refuse a request
    /// (`short`: some limit no longer covers the amount just taken). Otherwise an image
    /// held of the shard is dropped, as no longer true and of no use for refusing; the
    /// cache then stays empty while no bucket is short, and admitting costs it nothing.
    pub(crate) fn remember_admitted(
        &self,
        key: &BucketKey,
        image: &BucketItem,
        now: i64,
        short: bool,
    ) {
        if short && self.enabled() {
            self.keep(key, image, now);
        } else if self.holds_any() {
            self.images.remove(key);
        }
    }

    fn keep(&self, key: &BucketKey, image: &BucketItem, now: i64) {
        let entry = || Entry {
            image: image.clone(),
            stored_at: now,
            refreshing_since: None,
        };
        self.images.upsert(
            key,
            || (key.clone(), entry()),
            |e| {
                e.image.clone_from(image);
                e.stored_at = now;
                e.refreshing_since = None;
            },
        );
    }

    /// Takes what a request about to debit a shard will take from that shard's cached
    /// image, if one is held: the requests in flight together then see the tokens the
    /// earlier ones are already taking, instead of each finding the same refill and all
    /// going to the store (see the module comment). The store's next image replaces the
    /// claims; a claim whose debit never happened (refused elsewhere, failed) only
    /// refuses early until then, never admits.
    pub(crate) fn claim(&self, key: &BucketKey, limits: &[LimitClaim]) {
        if !self.holds_any() {
            return;
        }
        self.images.with(key, |e| {
            for c in limits {
                if let Some(st) = e.image.limits.get_mut(&c.limit) {
                    st.balance = st.balance.saturating_sub(c.amount);
                }
            }
        });
    }

    /// Applies a refund to the cached image of a shard, so the cache never refuses on a
    /// balance this process itself raised (each credit capped at its ceiling).
    pub(crate) fn credit(&self, key: &BucketKey, credits: &[crate::store::Credit]) {
        if !self.holds_any() {
            return;
        }
        self.images.with(key, |e| {
            for c in credits {
                if let Some(st) = e.image.limits.get_mut(&c.limit) {
                    st.balance = st
                        .balance
                        .saturating_add(c.amount)
                        .min(c.ceiling.max(st.balance));
                }
            }
        });
    }

    /// The last image seen of a shard, however old (for reporting, never for refusing).
    pub(crate) fn latest(&self, key: &BucketKey) -> Option<BucketItem> {
        if !self.holds_any() {
            return None;
        }
        self.images.with(key, |e| e.image.clone())
    }

    /// Drops every entry no caller can trust any more: neither stored nor sent for a
    /// refresh within the last two lifetimes (a live entry of a refused bucket is stored
    /// again at least once a lifetime), or of an item expired by now. Returns how many
    /// were dropped. Costs one atomic load while the cache is empty.
    pub(crate) fn prune(&self, now: i64) -> usize {
        if !self.holds_any() {
            return 0;
        }
        let horizon = self.ttl_ms.saturating_mul(2);
        self.images.retain(|_, e| {
            let used = e
                .refreshing_since
                .map_or(e.stored_at, |t| t.max(e.stored_at));
            now - used < horizon && e.image.ttl.is_none_or(|t| t * 1_000 > now)
        })
    }

    /// Entries held in the cache now.
    pub(crate) fn entries(&self) -> usize {
        self.images.len()
    }

    /// An image of a shard to trust now, if any: one younger than the lifetime, or an
    /// older one while another caller refreshes it. `None` for the caller chosen to
    /// refresh (see the module comment).
    pub(crate) fn fresh(&self, key: &BucketKey, now: i64) -> Option<BucketItem> {
        if !self.holds_any() {
            return None;
        }
        self.images.with(key, |e| self.trust(e, now)).flatten()
    }

    /// Whether to trust `e` at `now` (see [`RejectionCache::fresh`]); marks it as being
    /// refreshed when the caller is the one sent to the store.
    fn trust(&self, e: &mut Entry, now: i64) -> Option<BucketItem> {
        let age = now - e.stored_at;
        if age < 0 || e.image.ttl.is_some_and(|t| t * 1_000 <= now) {
            return None;
        }
        if age < self.ttl_ms {
            return Some(e.image.clone());
        }
        match e.refreshing_since {
            Some(t) if (0..self.ttl_ms).contains(&(now - t)) => Some(e.image.clone()),
            _ => {
                e.refreshing_since = Some(now);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Limits;

    fn image() -> BucketItem {
        BucketItem {
            refilled_at: 0,
            shard_count: 1,
            count_raised_at: 0,
            ttl: None,
            limits: Limits::new(),
        }
    }

    #[test]
    fn an_aged_image_sends_one_caller_to_the_store_while_the_others_keep_trusting_it() {
        let cache = RejectionCache::new(1_000, 16);
        let key = BucketKey::new("e", "r", 0);
        cache.remember(&key, &image(), 0);
        assert!(cache.fresh(&key, 999).is_some(), "within the lifetime");
        assert!(
            cache.fresh(&key, 1_000).is_none(),
            "the first to find it aged refreshes"
        );
        assert!(
            cache.fresh(&key, 1_001).is_some(),
            "the others trust it meanwhile"
        );
        assert!(cache.fresh(&key, 1_999).is_some());
        // The refresh never came back (a failed call): after one more lifetime, the next
        // caller is sent.
        assert!(cache.fresh(&key, 2_000).is_none());
        assert!(cache.fresh(&key, 2_001).is_some());
        cache.remember(&key, &image(), 2_100);
        assert!(cache.fresh(&key, 3_099).is_some());
        assert!(cache.fresh(&key, 3_100).is_none());
    }

    #[test]
    fn a_claim_takes_from_the_held_image_only() {
        use crate::engine::LimitParams;
        let cache = RejectionCache::new(1_000, 16);
        let key = BucketKey::new("e", "r", 0);
        let claim = LimitClaim {
            limit: "rpm".into(),
            params: LimitParams::new(10, 10, 60_000),
            amount: 1_000,
            forced: false,
        };
        cache.claim(&key, std::slice::from_ref(&claim));
        assert!(!cache.holds_any(), "nothing held, nothing to claim from");
        let mut held = image();
        held.limits.insert(
            crate::store::Name::from("rpm"),
            crate::store::LimitState::new(claim.params, 2_500, 0),
        );
        cache.remember(&key, &held, 0);
        cache.claim(&key, &[claim.clone(), claim.clone()]);
        let balance = |now| cache.fresh(&key, now).unwrap().limits["rpm"].balance;
        assert_eq!(balance(1), 500);
        // The store's next image replaces the claims.
        cache.remember(&key, &held, 2);
        assert_eq!(balance(3), 2_500);
        // Another shard's image is not touched.
        cache.claim(&BucketKey::new("e", "r", 1), &[claim]);
        assert_eq!(balance(3), 2_500);
    }

    #[test]
    fn an_admitted_image_is_kept_only_when_short_and_one_with_room_drops_the_image_held() {
        let cache = RejectionCache::new(1_000, 16);
        let key = BucketKey::new("e", "r", 0);
        cache.remember_admitted(&key, &image(), 0, false);
        assert!(!cache.holds_any(), "an image with room is not kept");
        assert!(cache.fresh(&key, 1).is_none());
        cache.remember_admitted(&key, &image(), 0, true);
        assert!(cache.fresh(&key, 1).is_some(), "a short image is kept");
        let newer = BucketItem {
            refilled_at: 7,
            ..image()
        };
        cache.remember_admitted(&key, &newer, 2, true);
        assert_eq!(
            cache.fresh(&key, 3).map(|i| i.refilled_at),
            Some(7),
            "replaced"
        );
        cache.remember_admitted(&key, &image(), 4, false);
        assert!(
            cache.fresh(&key, 5).is_none() && cache.latest(&key).is_none(),
            "room again: the short image must not refuse any more"
        );
        assert!(!cache.holds_any());
    }

    #[test]
    fn prune_drops_only_what_no_caller_can_still_use() {
        let cache = RejectionCache::new(1_000, 64);
        let idle = BucketKey::new("idle", "r", 0);
        let refreshed = BucketKey::new("refreshed", "r", 0);
        let expiring = BucketKey::new("expiring", "r", 0);
        cache.remember(&idle, &image(), 0);
        cache.remember(&refreshed, &image(), 0);
        let item = BucketItem {
            ttl: Some(1),
            ..image()
        };
        cache.remember(&expiring, &item, 0);
        assert_eq!(cache.prune(999), 0, "all within the lifetime");
        assert_eq!(cache.prune(1_000), 1, "the item expired at 1 s");
        assert!(cache.latest(&expiring).is_none());
        // A caller went to refresh `refreshed` at 1.5 s: the others trust it until 2.5 s.
        assert!(cache.fresh(&refreshed, 1_500).is_none());
        assert_eq!(cache.prune(1_999), 0);
        assert_eq!(cache.prune(2_000), 1, "idle for two lifetimes");
        assert!(cache.latest(&idle).is_none());
        assert!(cache.fresh(&refreshed, 2_400).is_some(), "still trusted");
        assert_eq!(cache.prune(3_499), 0);
        assert_eq!(cache.prune(3_500), 1);
        assert!(!cache.holds_any(), "empty again: admitting costs one load");
        assert_eq!(cache.entries(), 0);
    }

    #[test]
    fn an_expired_item_is_never_trusted() {
        let cache = RejectionCache::new(5_000, 16);
        let key = BucketKey::new("e", "r", 0);
        let expiring = BucketItem {
            ttl: Some(1),
            ..image()
        };
        cache.remember(&key, &expiring, 0);
        assert!(cache.fresh(&key, 999).is_some());
        assert!(cache.fresh(&key, 1_000).is_none());
        assert!(cache.fresh(&key, 1_001).is_none());
    }
}

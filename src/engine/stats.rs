//! The engine's counters: what it did, counted per process. One declaration gives each
//! counter its field, its metric name (the same word) and its help text, so every counter
//! the engine keeps is exported and none is renamed on the way. No I/O: the metrics
//! module reads them at scrape time. Striped per thread (`crate::support::striped`): the fast
//! path bumps one on every request, and the workers must not share its cache line.

use crate::support::striped::StripedCounter;

/// One counter as exported: its name (`shardgate_<name>_total`), help text and value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counted {
    pub name: &'static str,
    pub help: &'static str,
    pub value: u64,
}

macro_rules! engine_stats {
    ($($(#[doc = $doc:literal])+ $name:ident,)+) => {
        /// Counters the engine keeps (read by metrics and tests).
        #[derive(Debug, Default)]
        pub struct EngineStats {
            $($(#[doc = $doc])+ pub $name: StripedCounter,)+
        }

        impl EngineStats {
            /// Every counter, in declaration order.
            pub fn counted(&self) -> Vec<Counted> {
                vec![$(Counted {
                    name: stringify!($name),
                    help: concat!($($doc),+).trim_ascii().trim_end_matches('.'),
                    value: self.$name.get(),
                },)+]
            }
        }
    };
}

engine_stats! {
    /// Buckets debited by the fast path (one conditional write).
    fast_path_hits,
    /// Requests refused at the fast path: a bucket's shard was short, nothing was read.
    fast_path_refusals,
    /// Requests refused from the rejection cache, without a store call.
    rejection_cache_hits,
    /// Requests that needed a read and a commit.
    slow_paths,
    /// Buckets that waited for this server's slow pass on their shard instead of racing it.
    slow_passes_followed,
    /// Fast debits retried on another shard after the drawn shard's write budget ran out.
    shard_retries,
    /// Shard-count doublings this server won.
    shard_doublings,
    /// Doublings a hot shard called for but not made: the bucket had 32 shards.
    shard_doublings_declined_at_max,
    /// Doublings a hot shard called for but not made: a doubled shard's share could no
    /// longer hold four usual requests, on one of the bucket's limits.
    shard_doublings_declined_small_share,
    /// Refusals of a request larger than one shard's share of its limit.
    per_shard_ceiling_rejections,
    /// Commits retried as consumption only, after a concurrent writer changed an item.
    consumption_only_retries,
    /// Debits refunded because another bucket of the request refused.
    refunds,
    /// Requests refused because a bucket's item stayed busy with concurrent transactions.
    contended_refusals,
    /// Requests refused because the store throttled a bucket's partition (a hot bucket that
    /// could not double, or whose doubling was throttled too).
    throttled_refusals,
    /// Leases taken: blocks of tokens debited from a hot bucket's shard in advance.
    leases_taken,
    /// Lease fetches that got nothing: the shard could not give a useful block (the
    /// bucket is then debited per request for a while).
    leases_refused,
    /// Requests answered from leases, with no store call.
    lease_decisions,
    /// Leases whose unused rest was credited back to the shard (expired, too short for a
    /// request, or at shutdown).
    leases_returned,
    /// Lease returns the store did not apply (the shard doubled, or refilled near its
    /// ceiling, since; or the store failed): those tokens stay spent until it refills.
    lease_returns_dropped,
    /// Requests that stopped waiting for a lease move on their bucket (a fetch or a return
    /// still under way after the most their deadline allows) and went to the store.
    lease_waits_cut,
    /// Deaths of the lease task (a panic): leasing is then off until restart, and the
    /// leases held were given back.
    lease_task_failures,
}

impl EngineStats {
    pub fn get(counter: &StripedCounter) -> u64 {
        counter.get()
    }

    pub(super) fn bump(counter: &StripedCounter) {
        counter.add(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_is_listed_under_its_field_name() {
        let stats = EngineStats::default();
        EngineStats::bump(&stats.refunds);
        EngineStats::bump(&stats.refunds);
        let counted = stats.counted();
        assert_eq!(counted.len(), 21);
        let refunds = counted.iter().find(|c| c.name == "refunds").unwrap();
        assert_eq!(refunds.value, 2);
        assert_eq!(
            refunds.help,
            "Debits refunded because another bucket of the request refused"
        );
        let two_lines = counted
            .iter()
            .find(|c| c.name == "shard_doublings_declined_small_share")
            .unwrap();
        assert!(
            two_lines.help.contains("share could no longer"),
            "{two_lines:?}"
        );
        assert!(counted.iter().all(|c| !c.help.starts_with(' ')));
    }
}

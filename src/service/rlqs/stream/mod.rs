//! One RLQS stream's state: its domain (the first report's), the buckets it subscribed
//! to and, for each, the report interval seen, how long it has been idle and the fraction
//! it holds; and the answer to one report message ([`Stream::answer`]): every bucket it
//! names assigned from the config in force now (so a reload is sent at the next report,
//! within one interval), a bucket idle for [`ABANDON_AFTER`] reports abandoned.
//!
//! Bounded against a hostile client: at most `max_buckets` buckets and
//! [`MAX_BUCKET_ENTRIES`] entries per bucket id; a bucket past either is not tracked and
//! gets no assignment (Envoy applies its `no_assignment_behavior`). It owns no socket:
//! `server/rlqs.rs` carries the messages.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};

use super::assign::{action, kind, Assignment, Kind};
use super::demand::{BucketKey, Subscription, Totals};
use super::fleet::{draws_for, Fleet};
use super::grant::ENVOY_BURST_S;
use super::share::{bucket, bucket_at, capped, fraction, settled, Bucket, FLOOR_FRACTION};
use crate::config::Config;

/// Most entries of one bucket id (a descriptor is a handful).
pub const MAX_BUCKET_ENTRIES: usize = 16;

/// Reports in a row with no request after which a bucket is abandoned.
pub const ABANDON_AFTER: u32 = 5;

/// An assignment lives this many report intervals: one lost answer does not drop Envoy
/// to its `expired_assignment_behavior`, and a server that is gone stops binding it soon.
pub const TTL_INTERVALS: u32 = 3;

/// The report interval assumed until a report says how long it covers: Envoy 1.40 reports
/// every 5 s whatever the bucket's `reporting_interval` says, and a new bucket's first
/// report covers nothing (0 s).
const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);

/// Bounds on the interval a report may claim (Envoy says it in whole seconds).
const MIN_INTERVAL: Duration = Duration::from_secs(1);
const MAX_INTERVAL: Duration = Duration::from_secs(600);

/// Why a stream is ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("the first report of a stream must name its domain")]
    NoDomain,
}

/// One tracked bucket.
#[derive(Debug, Clone, Copy)]
struct Tracked {
    /// Its number in this stream: its holder in the demand table.
    number: u64,
    interval: Duration,
    idle_reports: u32,
    held: Option<f64>,
    /// The token bucket last sent (Envoy keeps a bucket sent again as it is, and starts a
    /// different one full).
    sent: Option<Bucket>,
}

/// What one report message was answered, for the metrics.
#[derive(Debug, Default)]
pub struct Answer {
    pub response: RateLimitQuotaResponse,
    pub allowed: u64,
    pub denied: u64,
    /// Buckets newly tracked (positive) or let go (abandoned), for the buckets gauge.
    pub buckets_added: usize,
    pub buckets_removed: usize,
    /// Buckets refused: past the stream's bound or with too many entries.
    pub refused: usize,
    pub sent: Vec<&'static str>,
    /// The fraction of its limit (in a fleet: of its server's draw) each token bucket
    /// sent was for: what one Envoy holds of a bucket.
    pub shares: Vec<f64>,
}

impl Answer {
    /// Adds `assignment` of the bucket of `entries` (tracked as `tracked`), valid for
    /// [`TTL_INTERVALS`] of its report interval, with what the metrics count of it.
    fn send(&mut self, entries: &[(String, String)], assignment: Assignment, tracked: &Tracked) {
        let ttl = (tracked.interval * TTL_INTERVALS).max(Duration::from_secs(2));
        self.sent.push(assignment.label());
        if let (Assignment::TokenBucket(_), Some(share)) = (assignment, tracked.held) {
            self.shares.push(share);
        }
        self.response
            .bucket_action
            .push(action(entries, assignment, ttl));
    }
}

/// A bucket of a report between its two passes: its id, its state, the server's key.
struct Reported {
    entries: Vec<(String, String)>,
    tracked: Tracked,
    key: BucketKey,
}

/// The fraction a reported bucket held before this report (none yet: 0).
fn held_of(r: &Reported) -> f64 {
    r.tracked.held.unwrap_or(0.0)
}

/// One stream.
#[derive(Debug)]
pub struct Stream {
    subscription: Subscription,
    domain: Option<Arc<str>>,
    /// By bucket id (its entries sorted by key).
    buckets: HashMap<Vec<(String, String)>, Tracked>,
    /// The number the next new bucket id gets.
    numbered: u64,
    max_buckets: usize,
    /// The server's grants, when its limits are shared with other servers through the
    /// store (`fleet.rs`); `None`: the limit is divided among this server's streams.
    fleet: Option<Arc<Fleet>>,
}

impl Stream {
    pub fn new(subscription: Subscription, max_buckets: usize) -> Stream {
        Stream {
            subscription,
            domain: None,
            buckets: HashMap::new(),
            numbered: 0,
            max_buckets,
            fleet: None,
        }
    }

    /// The stream of a server that shares its limits with others through `fleet`.
    pub fn in_fleet(mut self, fleet: Arc<Fleet>) -> Stream {
        self.fleet = Some(fleet);
        self
    }

    /// The buckets `reports` names, as the server keys them (the stream's domain, or the
    /// report's for a first report; the descriptor under `config`): what a fleet draws
    /// for before they are answered.
    pub fn keys(&self, reports: &RateLimitQuotaUsageReports, config: &Config) -> Vec<BucketKey> {
        let domain: Arc<str> = match &self.domain {
            Some(d) => d.clone(),
            None => Arc::from(reports.domain.as_str()),
        };
        // Only what `answer` will track: a stream past its bound draws nothing more.
        let mut room = self.max_buckets.saturating_sub(self.buckets.len());
        let mut keys = Vec::new();
        let ids = reports
            .bucket_quota_usages
            .iter()
            .filter_map(|u| u.bucket_id.as_ref());
        for id in ids.filter(|id| id.bucket.len() <= MAX_BUCKET_ENTRIES) {
            let mut entries: Vec<(String, String)> = id
                .bucket
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            entries.sort();
            if !self.buckets.contains_key(&entries) {
                if room == 0 {
                    continue;
                }
                room -= 1;
            }
            let key = key_of(&domain, &entries, config);
            if !keys.contains(&key) {
                keys.push(key);
            }
        }
        keys
    }

    /// New assignments for the buckets whose share moved since they were last sent (the
    /// fleet's rate for them moved), without a report: sent at once.
    pub fn reassign(&mut self, config: &Config) -> Answer {
        let mut answer = Answer::default();
        let Some(domain) = self.domain.clone() else {
            return answer;
        };
        let held: Vec<Vec<(String, String)>> = self
            .buckets
            .iter()
            .filter(|(_, t)| t.held.is_some())
            .map(|(e, _)| e.clone())
            .collect();
        for entries in held {
            let Some(mut tracked) = self.buckets.get(&entries).copied() else {
                continue;
            };
            let key = key_of(&domain, &entries, config);
            let before = tracked.sent;
            let assignment = self.limited(&key, &mut tracked, config);
            self.buckets.insert(entries.clone(), tracked);
            if tracked.sent == before {
                continue;
            }
            answer.send(&entries, assignment, &tracked);
        }
        answer
    }

    /// Buckets the stream holds.
    pub fn buckets(&self) -> usize {
        self.buckets.len()
    }

    /// The answer to `reports`, from `config`, at `now`.
    pub fn answer(
        &mut self,
        reports: RateLimitQuotaUsageReports,
        config: &Config,
        now: Instant,
    ) -> Result<Answer, StreamError> {
        let domain = match &self.domain {
            Some(d) => d.clone(),
            None if reports.domain.is_empty() => return Err(StreamError::NoDomain),
            None => {
                let d: Arc<str> = Arc::from(reports.domain.as_str());
                self.domain = Some(d.clone());
                d
            }
        };
        let mut answer = Answer::default();
        // Every bucket's demand first, then the shares, the larger holders first: a share
        // that falls leaves room for one that rises in the same report (two bucket ids of
        // one descriptor, one new beside one holding the whole limit).
        let mut reported = Vec::new();
        for usage in reports.bucket_quota_usages {
            if let Some(r) = self.take_report(&domain, usage, config, now, &mut answer) {
                reported.push(r);
            }
        }
        reported.sort_by(|a, b| held_of(b).total_cmp(&held_of(a)));
        for r in reported {
            let Reported {
                entries,
                mut tracked,
                key,
            } = r;
            let assignment = self.limited(&key, &mut tracked, config);
            self.buckets.insert(entries.clone(), tracked);
            answer.send(&entries, assignment, &tracked);
        }
        Ok(answer)
    }

    /// A report's first pass over one bucket: refused past the stream's bounds, abandoned
    /// when idle for [`ABANDON_AFTER`] reports (answered at once), else tracked with its
    /// demand recorded, to be assigned once every bucket of the report is.
    fn take_report(
        &mut self,
        domain: &Arc<str>,
        usage: BucketQuotaUsage,
        config: &Config,
        now: Instant,
        answer: &mut Answer,
    ) -> Option<Reported> {
        let Some(id) = usage.bucket_id else {
            answer.refused += 1;
            return None;
        };
        if id.bucket.len() > MAX_BUCKET_ENTRIES {
            answer.refused += 1;
            return None;
        }
        let mut entries: Vec<(String, String)> = id.bucket.into_iter().collect();
        entries.sort();
        let known = self.buckets.contains_key(&entries);
        if !known && self.buckets.len() >= self.max_buckets {
            answer.refused += 1;
            return None;
        }
        answer.allowed = answer.allowed.saturating_add(usage.num_requests_allowed);
        answer.denied = answer.denied.saturating_add(usage.num_requests_denied);
        let requests = usage
            .num_requests_allowed
            .saturating_add(usage.num_requests_denied);
        let mut tracked = self.tracked(&entries);
        if !known {
            answer.buckets_added += 1;
        }
        if let Some(elapsed) = usage.time_elapsed {
            let elapsed = Duration::new(elapsed.seconds.max(0) as u64, elapsed.nanos.max(0) as u32);
            if !elapsed.is_zero() {
                tracked.interval = elapsed.clamp(MIN_INTERVAL, MAX_INTERVAL);
            }
        }
        tracked.idle_reports = if requests == 0 {
            tracked.idle_reports + 1
        } else {
            0
        };
        let key = key_of(domain, &entries, config);
        let sub = &self.subscription;
        let holder = sub.holder(tracked.number);
        if tracked.idle_reports >= ABANDON_AFTER {
            sub.demands().forget(&key, holder);
            self.buckets.remove(&entries);
            answer.buckets_removed += 1;
            answer.send(&entries, Assignment::Abandon, &tracked);
            return None;
        }
        let per_second = requests as f64 / tracked.interval.as_secs_f64();
        let stale_after = tracked.interval * TTL_INTERVALS;
        sub.demands()
            .report(&key, holder, per_second, now, stale_after);
        // Counted against the stream's bound at once: a report cannot name more.
        self.buckets.insert(entries.clone(), tracked);
        Some(Reported {
            entries,
            tracked,
            key,
        })
    }

    /// The bucket id `entries`' state, numbered anew if it is new.
    fn tracked(&mut self, entries: &[(String, String)]) -> Tracked {
        if let Some(t) = self.buckets.get(entries) {
            return *t;
        }
        self.numbered += 1;
        Tracked {
            number: self.numbered,
            interval: DEFAULT_INTERVAL,
            idle_reports: 0,
            held: None,
            sent: None,
        }
    }

    /// A bucket's assignment from its rule, with this stream's demand as it last
    /// reported it.
    fn limited(&self, key: &BucketKey, tracked: &mut Tracked, config: &Config) -> Assignment {
        let rule = config
            .domain(&key.0)
            .and_then(|d| d.match_descriptor(&key.1));
        let (tokens, period, burst) = match kind(rule.map(|r| &**r)) {
            Kind::AllowAll => return self.unshared(key, tracked, Assignment::AllowAll),
            Kind::DenyAll => return self.unshared(key, tracked, Assignment::DenyAll),
            Kind::Limited {
                tokens,
                period,
                burst,
            } => (tokens, period, burst),
        };
        let sub = &self.subscription;
        // No report of this stream's left (gone stale): what was sent stands.
        let Some(totals) = sub.demands().peek(key, sub.holder(tracked.number)) else {
            return tracked
                .sent
                .map_or(Assignment::DenyAll, Assignment::TokenBucket);
        };
        let share = self.share(key, tracked, totals);
        // In a fleet a plain limit's tokens come from this server's draws only: before the
        // first (or when it got nothing) the bucket is denied, never divided locally —
        // but for a rule that fails open while the store fails.
        let fleet = self
            .fleet
            .as_ref()
            .filter(|f| rule.is_some_and(|r| draws_for(r) && !f.fails_open(key, r)));
        let b = match fleet {
            // The fractions held sum to at most 1 plus the newcomers' floors: divided by
            // that sum (at least 1 + one floor), the streams' rates stay within the
            // server's. The burst is the store bucket's, drawn from: an Envoy's holds a
            // tenth of a second of its rate (each new one is paid from the bank).
            Some(f) => {
                let held = (totals.others_held + share).max(1.0 + FLOOR_FRACTION);
                let rate = share * f.rate(key).unwrap_or(0.0) / held;
                bucket_at(rate, rate * ENVOY_BURST_S)
            }
            None => bucket(share, tokens, period, burst),
        };
        let Some(b) = b else {
            tracked.sent = None;
            return Assignment::DenyAll;
        };
        if let (Some(fleet), true) = (fleet, tracked.sent != Some(b)) {
            // A new bucket starts full in Envoy: its tokens are promised now.
            fleet.charge(key, f64::from(b.max_tokens));
        }
        tracked.sent = Some(b);
        Assignment::TokenBucket(b)
    }

    /// This stream's fraction of a bucket from its `totals`, recorded as held.
    fn share(&self, key: &BucketKey, tracked: &mut Tracked, totals: Totals) -> f64 {
        let computed = fraction(totals.own, totals.total, totals.holders);
        let share = capped(
            settled(tracked.held, computed),
            totals.others_held,
            totals.holders,
        );
        let sub = &self.subscription;
        sub.demands().hold(key, sub.holder(tracked.number), share);
        tracked.held = Some(share);
        share
    }

    /// An assignment that is not a share: the stream's demand leaves the totals.
    fn unshared(&self, key: &BucketKey, tracked: &mut Tracked, a: Assignment) -> Assignment {
        tracked.held = None;
        tracked.sent = None;
        let sub = &self.subscription;
        sub.demands().forget(key, sub.holder(tracked.number));
        a
    }
}

/// The server's key of the bucket id `entries` (sorted by key) of `domain`: the descriptor
/// it stands for under the domain's `rlqs:` section (its entries sorted without one, or
/// for a domain the rules do not have).
fn key_of(domain: &Arc<str>, entries: &[(String, String)], config: &Config) -> BucketKey {
    let descriptor = match config.domain(domain) {
        Some(d) => d.rlqs_descriptor(entries),
        None => entries.to_vec(),
    };
    (domain.clone(), descriptor)
}

#[cfg(test)]
mod tests;

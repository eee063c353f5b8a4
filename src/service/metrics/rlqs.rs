//! The Rate Limit Quota Service's metrics: streams open, buckets the streams hold,
//! assignments sent by kind, the requests Envoys report they allowed and denied, and
//! buckets refused past a stream's bounds. Recorded by `server/rlqs.rs`; registered with
//! the others by `registry.rs`. Every label set is created up front: recording takes no
//! lock. Rare next to the rate-limit service's calls (a message per Envoy per report), so
//! plain counters, not striped ones.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use super::labels::{DrawLabel, KindLabel, VerdictLabel};

/// The `outcome` label of a fleet draw (`service/rlqs/fleet.rs`): every token asked for,
/// some of them, none, or the store failed.
pub const DRAW_OUTCOMES: [&str; 4] = ["full", "partial", "none", "error"];

/// The `kind` label of assignments sent, as `service/rlqs/assign.rs` names them.
pub const ASSIGNMENT_KINDS: [&str; 4] = ["allow_all", "deny_all", "token_bucket", "abandon"];

#[derive(Debug)]
pub struct RlqsMetrics {
    streams_open: Gauge,
    buckets: Gauge,
    sent: Family<KindLabel, Counter>,
    sent_by_kind: [Counter; ASSIGNMENT_KINDS.len()],
    reported: Family<VerdictLabel, Counter>,
    allowed: Counter,
    denied: Counter,
    refused: Counter,
    draws: Family<DrawLabel, Counter>,
    draws_by_outcome: [Counter; DRAW_OUTCOMES.len()],
    drawn_tokens: Counter,
    returned_tokens: Counter,
    /// Tokens per second promised to this server's Envoys over all fleet buckets.
    promised: Gauge<f64, AtomicU64>,
    /// The fraction of a bucket's limit each token bucket sent was for.
    shares: Histogram,
}

/// The buckets of the shares histogram: fractions of a limit, a tenth of a percent to all.
const SHARE_BUCKETS: [f64; 10] = [0.001, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 0.9, 1.0];

impl Default for RlqsMetrics {
    fn default() -> RlqsMetrics {
        let sent: Family<KindLabel, Counter> = Family::default();
        let sent_by_kind =
            ASSIGNMENT_KINDS.map(|kind| sent.get_or_create(&KindLabel { kind }).clone());
        let reported: Family<VerdictLabel, Counter> = Family::default();
        let allowed = reported
            .get_or_create(&VerdictLabel { verdict: "allowed" })
            .clone();
        let denied = reported
            .get_or_create(&VerdictLabel { verdict: "denied" })
            .clone();
        let draws: Family<DrawLabel, Counter> = Family::default();
        let draws_by_outcome =
            DRAW_OUTCOMES.map(|outcome| draws.get_or_create(&DrawLabel { outcome }).clone());
        RlqsMetrics {
            draws,
            draws_by_outcome,
            drawn_tokens: Counter::default(),
            returned_tokens: Counter::default(),
            promised: Gauge::default(),
            shares: Histogram::new(SHARE_BUCKETS),
            streams_open: Gauge::default(),
            buckets: Gauge::default(),
            sent,
            sent_by_kind,
            reported,
            allowed,
            denied,
            refused: Counter::default(),
        }
    }
}

impl RlqsMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "rlqs_streams_open",
            "Rate Limit Quota Service streams open (one per Envoy per RLQS server and domain)",
            self.streams_open.clone(),
        );
        registry.register(
            "rlqs_buckets",
            "RLQS buckets the open streams hold (a bucket two Envoys report counts twice)",
            self.buckets.clone(),
        );
        registry.register(
            "rlqs_assignments_sent",
            "RLQS bucket actions sent, by kind (allow_all, deny_all, token_bucket, abandon)",
            self.sent.clone(),
        );
        registry.register(
            "rlqs_reported_requests",
            "Requests Envoys reported over RLQS, by what Envoy did (allowed, denied)",
            self.reported.clone(),
        );
        registry.register(
            "rlqs_buckets_refused",
            "RLQS bucket reports refused: past a stream's bucket bound or with too many entries (Envoy keeps its no_assignment_behavior)",
            self.refused.clone(),
        );
        self.register_fleet(registry);
    }

    fn register_fleet(&self, registry: &mut Registry) {
        registry.register(
            "rlqs_share",
            "The fraction of a bucket's limit (in a fleet: of its server's draw) each RLQS token bucket sent was for: what one Envoy holds",
            self.shares.clone(),
        );
        registry.register(
            "rlqs_draws",
            "Draws of RLQS tokens from the shared store, by outcome (full, partial, none, error)",
            self.draws.clone(),
        );
        registry.register(
            "rlqs_drawn_tokens",
            "RLQS tokens drawn from the shared store for this server's Envoys",
            self.drawn_tokens.clone(),
        );
        registry.register(
            "rlqs_returned_tokens",
            "RLQS tokens given back to the shared store when this server's Envoys' demand fell",
            self.returned_tokens.clone(),
        );
        registry.register(
            "rlqs_promised_tokens_per_second",
            "Tokens per second this server promises its Envoys over every RLQS bucket drawn from the shared store",
            self.promised.clone(),
        );
    }

    /// Token buckets were sent for these fractions of their limits.
    pub fn shares(&self, shares: &[f64]) {
        for &share in shares {
            self.shares.observe(share);
        }
    }

    /// A fleet draw asked for `asked` tokens and got `got` (`None`: the store failed).
    pub fn drew(&self, asked: u64, got: Option<u64>) {
        let outcome = match got {
            None => 3,
            Some(0) => 2,
            Some(g) if g < asked => 1,
            Some(_) => 0,
        };
        if let Some(c) = self.draws_by_outcome.get(outcome) {
            c.inc();
        }
        self.drawn_tokens.inc_by(got.unwrap_or(0));
    }

    /// A fleet bucket's surplus of `tokens` was given back to the store.
    pub fn gave_back(&self, tokens: u64) {
        self.returned_tokens.inc_by(tokens);
    }

    /// The rate promised over every fleet bucket moved by `delta` tokens per second.
    pub fn promised_moved(&self, delta: f64) {
        self.promised.inc_by(delta);
    }

    pub fn stream_opened(&self) {
        self.streams_open.inc();
    }

    /// A stream ended, holding `buckets`.
    pub fn stream_closed(&self, buckets: usize) {
        self.streams_open.dec();
        self.buckets.dec_by(buckets as i64);
    }

    /// One report answered: buckets gained and let go, what was sent and reported.
    pub fn answered(&self, added: usize, removed: usize, sent: &[&'static str]) {
        self.buckets.inc_by(added as i64 - removed as i64);
        for kind in sent {
            let at = ASSIGNMENT_KINDS.iter().position(|k| k == kind);
            if let Some(counter) = at.and_then(|i| self.sent_by_kind.get(i)) {
                counter.inc();
            }
        }
    }

    pub fn reported(&self, allowed: u64, denied: u64, refused: usize) {
        self.allowed.inc_by(allowed);
        self.denied.inc_by(denied);
        self.refused.inc_by(refused as u64);
    }

    /// Buckets the open streams hold now.
    pub fn buckets(&self) -> i64 {
        self.buckets.get()
    }

    /// Streams open now.
    pub fn streams_open(&self) -> i64 {
        self.streams_open.get()
    }
}

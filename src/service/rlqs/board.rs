//! What the RLQS side of a server holds, for the other ports to show: the demand table
//! and, in a fleet, the grants — one [`RlqsBoard`] per server, made by the gRPC port's
//! RLQS service and read by `/rlconfig` and `explain`. Owns the words they are shown in;
//! decides nothing and changes nothing.

use std::fmt::Write;
use std::sync::Arc;

use super::demand::{BucketKey, BucketSummary, Demands};
use super::fleet::Fleet;

/// Most buckets `/rlconfig` lists (the most demanded first).
pub const LISTED: usize = 100;

/// One server's RLQS state.
#[derive(Debug)]
pub struct RlqsBoard {
    pub demands: Arc<Demands>,
    pub fleet: Option<Arc<Fleet>>,
}

impl RlqsBoard {
    /// `/rlconfig`'s section: every bucket the streams hold (the [`LISTED`] most
    /// demanded), one line each; empty when no stream holds one.
    pub fn rlconfig(&self) -> String {
        let (total, listed) = self.demands.listing(LISTED);
        if total == 0 {
            return String::new();
        }
        let mut out = format!("rlqs buckets: {total}");
        if total > listed.len() {
            let _ = write!(out, " (the {} most demanded)", listed.len());
        }
        out.push_str(":\n");
        for b in &listed {
            let _ = writeln!(out, "  {}", self.line(b));
        }
        out
    }

    /// `explain`'s line for descriptor `entries` of `domain`, if a stream holds it as an
    /// RLQS bucket: as written (a domain's `rlqs:` section orders its keys), or its
    /// entries sorted by key (a bucket id's order without one).
    pub fn explain(&self, domain: &str, entries: &[(String, String)]) -> Option<String> {
        let mut key: BucketKey = (Arc::from(domain), entries.to_vec());
        let b = self.demands.summary(&key).or_else(|| {
            key.1.sort();
            self.demands.summary(&key)
        })?;
        Some(format!("RLQS: {}", self.line(&b)))
    }

    /// One bucket in words: its id, its streams and their demand and shares, and in a
    /// fleet this server's grant.
    fn line(&self, b: &BucketSummary) -> String {
        let id: Vec<String> = b.key.1.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut held = b.held.clone();
        held.sort_by(|x, y| y.total_cmp(x));
        let shares: Vec<String> = held.iter().map(|h| format!("{:.0} %", 100.0 * h)).collect();
        let mut out = format!(
            "{} ({}): {} Envoy stream{} reporting {:.1} requests/s, holding {}",
            b.key.0,
            id.join(", "),
            b.streams,
            if b.streams == 1 { "" } else { "s" },
            b.per_second,
            shares.join(", "),
        );
        if let Some(g) = self.fleet.as_ref().and_then(|f| f.held(&b.key)) {
            let _ = write!(
                out,
                "; this server draws from the store: {:.1} tokens/s promised, {:.0} banked, \
                 cap {:.1}/s",
                g.rate, g.bank, g.cap
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::rlqs::demand::Holder;
    use std::time::{Duration, Instant};

    fn holder(stream: u64) -> Holder {
        Holder {
            stream,
            bucket_id: 1,
        }
    }

    #[test]
    fn a_bucket_is_listed_and_explained_with_its_streams() {
        let demands = Arc::new(Demands::default());
        let key: BucketKey = (Arc::from("d"), vec![("tenant".into(), "acme".into())]);
        let now = Instant::now();
        demands.report(&key, holder(1), 30.0, now, Duration::from_secs(15));
        demands.hold(&key, holder(1), 0.75);
        demands.report(&key, holder(2), 10.0, now, Duration::from_secs(15));
        demands.hold(&key, holder(2), 0.25);
        let board = RlqsBoard {
            demands,
            fleet: None,
        };
        let text = board.rlconfig();
        assert_eq!(
            text,
            "rlqs buckets: 1:\n  d (tenant=acme): 2 Envoy streams reporting 40.0 requests/s, holding 75 %, 25 %\n"
        );
        let said = board.explain("d", &[("tenant".into(), "acme".into())]);
        assert_eq!(
            said.as_deref(),
            Some("RLQS: d (tenant=acme): 2 Envoy streams reporting 40.0 requests/s, holding 75 %, 25 %")
        );
        assert_eq!(
            board.explain("d", &[("tenant".into(), "other".into())]),
            None
        );
        assert_eq!(
            board.explain("e", &[("tenant".into(), "acme".into())]),
            None
        );
    }

    #[test]
    fn nothing_is_said_without_streams() {
        let board = RlqsBoard {
            demands: Arc::default(),
            fleet: None,
        };
        assert_eq!(board.rlconfig(), "");
    }
}

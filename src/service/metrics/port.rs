//! The gRPC port's connection-level metrics: connections open, calls in flight, the
//! streams reset and GOAWAYs the server sent (by HTTP/2 error code), connections the
//! server closed and why, and calls that panicked. Recorded by `server/connection/`;
//! registered with the others by `registry.rs`.
//!
//! What every call moves (calls in flight) is striped per thread; the rest moves once per
//! connection or per rare event, on counters created up front so that recording takes no
//! lock.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::labels::{CodeLabel, EndLabel, ReasonLabel};
use crate::support::striped::StripedGauge;

/// HTTP/2's error codes (RFC 9113, section 7), by value: the `code` label of the resets
/// and GOAWAYs sent. A code past the list is `other`.
const H2_CODES: [&str; 14] = [
    "no_error",
    "protocol_error",
    "internal_error",
    "flow_control_error",
    "settings_timeout",
    "stream_closed",
    "frame_size_error",
    "refused_stream",
    "cancel",
    "compression_error",
    "connect_error",
    "enhance_your_calm",
    "inadequate_security",
    "http_1_1_required",
];

/// Why the server closed a connection itself (a client closing its own is not counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionClose {
    /// Its calls were not done within `--grpc-max-connection-age-grace` of its GOAWAY.
    AgeGrace,
    /// No HTTP/2 connection preface within the time a client is given to send it.
    NoPreface,
    /// The server shut down before the client sent its preface.
    ShutdownBeforePreface,
}

impl ConnectionClose {
    const ALL: [ConnectionClose; 3] = [
        ConnectionClose::AgeGrace,
        ConnectionClose::NoPreface,
        ConnectionClose::ShutdownBeforePreface,
    ];

    fn label(self) -> &'static str {
        match self {
            ConnectionClose::AgeGrace => "age_grace",
            ConnectionClose::NoPreface => "no_preface",
            ConnectionClose::ShutdownBeforePreface => "shutdown_before_preface",
        }
    }
}

/// How a call that panicked was ended: answered INTERNAL (the panic came before its
/// answer) or its stream reset (it came while the answer was being sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PanicEnd {
    Internal,
    Reset,
}

/// The `end` label of `call_panics`, in [`PanicEnd`]'s order.
const PANIC_ENDS: [&str; 2] = ["internal", "reset"];

/// The gRPC port's connection-level metrics.
#[derive(Debug)]
pub struct PortMetrics {
    connections_open: Gauge,
    /// TLS handshakes under way (at most `tls.rs`' cap): at the cap, new clients wait in
    /// the listen queue.
    handshakes: Gauge,
    calls_in_flight: StripedGauge,
    resets_sent: Family<CodeLabel, Counter>,
    resets_by_code: [Counter; H2_CODES.len() + 1],
    goaways_sent: Family<CodeLabel, Counter>,
    goaways_by_code: [Counter; H2_CODES.len() + 1],
    closed: Family<ReasonLabel, Counter>,
    panics: Family<EndLabel, Counter>,
}

/// A code's label and its index in the per-code arrays.
fn code_index(code: u32) -> usize {
    (code as usize).min(H2_CODES.len())
}

fn code_label(index: usize) -> &'static str {
    H2_CODES.get(index).copied().unwrap_or("other")
}

/// The family's counter of each code, created up front.
fn per_code(family: &Family<CodeLabel, Counter>) -> [Counter; H2_CODES.len() + 1] {
    std::array::from_fn(|i| {
        family
            .get_or_create(&CodeLabel {
                code: code_label(i),
            })
            .clone()
    })
}

impl Default for PortMetrics {
    fn default() -> PortMetrics {
        let resets_sent = Family::default();
        let goaways_sent = Family::default();
        let closed: Family<ReasonLabel, Counter> = Family::default();
        for close in ConnectionClose::ALL {
            drop(closed.get_or_create(&ReasonLabel {
                reason: close.label(),
            }));
        }
        let panics: Family<EndLabel, Counter> = Family::default();
        for end in PANIC_ENDS {
            drop(panics.get_or_create(&EndLabel { end }));
        }
        PortMetrics {
            connections_open: Gauge::default(),
            handshakes: Gauge::default(),
            calls_in_flight: StripedGauge::default(),
            resets_by_code: per_code(&resets_sent),
            resets_sent,
            goaways_by_code: per_code(&goaways_sent),
            goaways_sent,
            closed,
            panics,
        }
    }
}

impl PortMetrics {
    pub(super) fn register(&self, registry: &mut Registry) {
        registry.register(
            "grpc_connections_open",
            "Connections open on the gRPC port (TLS: once the handshake is done)",
            self.connections_open.clone(),
        );
        registry.register(
            "tls_handshakes_in_progress",
            "TLS handshakes under way on the gRPC port (at most 1024: past it new clients wait in the listen queue)",
            self.handshakes.clone(),
        );
        registry.register(
            "grpc_calls_in_flight",
            "Calls of every service being answered on the gRPC port",
            self.calls_in_flight.clone(),
        );
        registry.register(
            "grpc_stream_resets_sent",
            "RST_STREAM frames the gRPC port sent, by HTTP/2 error code",
            self.resets_sent.clone(),
        );
        registry.register(
            "grpc_goaways_sent",
            "GOAWAY frames the gRPC port sent, by HTTP/2 error code (a graceful close sends two)",
            self.goaways_sent.clone(),
        );
        registry.register(
            "grpc_connections_closed_by_server",
            "Connections the gRPC port closed without waiting for their client, by reason",
            self.closed.clone(),
        );
        registry.register(
            "call_panics",
            "Calls whose answer panicked, by how the call was ended (answered INTERNAL, or its stream reset); the other calls of the connection are unaffected",
            self.panics.clone(),
        );
    }

    pub fn connection_opened(&self) {
        self.connections_open.inc();
    }

    pub fn connection_closed(&self) {
        self.connections_open.dec();
    }

    pub fn handshake_started(&self) {
        self.handshakes.inc();
    }

    pub fn handshake_ended(&self) {
        self.handshakes.dec();
    }

    /// TLS handshakes under way now.
    pub fn handshakes(&self) -> i64 {
        self.handshakes.get()
    }

    pub fn call_started(&self) {
        self.calls_in_flight.inc();
    }

    pub fn call_ended(&self) {
        self.calls_in_flight.dec();
    }

    /// An RST_STREAM frame sent with this HTTP/2 error code.
    pub fn reset_sent(&self, code: u32) {
        // `code_index` is at most `H2_CODES.len()`, the arrays' last place.
        if let Some(counter) = self.resets_by_code.get(code_index(code)) {
            counter.inc();
        }
    }

    /// A GOAWAY frame sent with this HTTP/2 error code.
    pub fn goaway_sent(&self, code: u32) {
        if let Some(counter) = self.goaways_by_code.get(code_index(code)) {
            counter.inc();
        }
    }

    pub fn closed_by_server(&self, why: ConnectionClose) {
        self.closed
            .get_or_create(&ReasonLabel {
                reason: why.label(),
            })
            .inc();
    }

    pub fn call_panicked(&self, end: PanicEnd) {
        let end = match end {
            PanicEnd::Internal => PANIC_ENDS[0],
            PanicEnd::Reset => PANIC_ENDS[1],
        };
        self.panics.get_or_create(&EndLabel { end }).inc();
    }

    /// Calls that panicked so far, however they were ended.
    pub fn panics(&self) -> u64 {
        PANIC_ENDS
            .into_iter()
            .map(|end| self.panics.get_or_create(&EndLabel { end }).get())
            .sum()
    }

    /// Connections open now.
    pub fn connections(&self) -> i64 {
        self.connections_open.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_past_the_list_are_other() {
        let m = PortMetrics::default();
        m.reset_sent(7);
        m.reset_sent(0xff);
        m.goaway_sent(11);
        let mut registry = Registry::with_prefix("shardgate");
        m.register(&mut registry);
        let mut page = String::new();
        prometheus_client::encoding::text::encode(&mut page, &registry).unwrap();
        assert!(
            page.contains("shardgate_grpc_stream_resets_sent_total{code=\"refused_stream\"} 1"),
            "{page}"
        );
        assert!(
            page.contains("shardgate_grpc_stream_resets_sent_total{code=\"other\"} 1"),
            "{page}"
        );
        assert!(
            page.contains("shardgate_grpc_goaways_sent_total{code=\"enhance_your_calm\"} 1"),
            "{page}"
        );
        assert!(
            page.contains("shardgate_call_panics_total{end=\"internal\"} 0"),
            "{page}"
        );
    }
}

//! The account of every DynamoDB call a store made, by operation and outcome, with the
//! capacity DynamoDB reported: what `/metrics` exports and what tests check call costs
//! against. Recording a call takes no lock: the totals are atomic counters in fixed
//! places; the sequence of calls (tests compare call sequences) is kept only once asked
//! for, and only then locks.

use parking_lot::Mutex;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use aws_sdk_dynamodb::types::ConsumedCapacity;

use crate::store::metered::{CallKind, CallTotals};

/// The operations a store calls.
const OPERATIONS: [&str; 4] = [
    "UpdateItem",
    "PutItem",
    "BatchGetItem",
    "TransactWriteItems",
];

/// What becomes of a call.
const OUTCOMES: [&str; 6] = [
    "ok",
    "condition_failed",
    "conflict",
    "cancelled",
    "throttled",
    "error",
];

/// Capacity units are counted in thousandths (DynamoDB reports halves for reads).
const CAPACITY_SCALE: f64 = 1_000.0;

/// The most recent calls the sequence keeps.
const SEQUENCE_CAP: usize = 100_000;

/// One (operation, outcome)'s counters.
#[derive(Debug, Default)]
struct Tally {
    calls: AtomicU64,
    /// Capacity units × [`CAPACITY_SCALE`].
    capacity: AtomicU64,
}

/// Every DynamoDB call this store made, by operation and outcome; optionally the
/// sequence of the most recent calls.
#[derive(Debug, Default)]
pub struct CallLedger {
    tallies: [[Tally; OUTCOMES.len()]; OPERATIONS.len()],
    /// Whether [`Self::record_sequence`] was called: until then recording a call never
    /// touches the sequence's lock.
    recording: AtomicBool,
    sequence: Mutex<VecDeque<CallKind>>,
}

fn index(names: &[&str], name: &str) -> usize {
    names
        .iter()
        .position(|n| *n == name)
        .unwrap_or_else(|| panic!("'{name}' is not one of {names:?}"))
}

impl CallLedger {
    pub(super) fn record(&self, operation: &'static str, outcome: &'static str, capacity: f64) {
        // `index` answers a place in `OPERATIONS` or `OUTCOMES`, whose lengths size
        // `tallies`: both `get`s find their item.
        let tally = self
            .tallies
            .get(index(&OPERATIONS, operation))
            .and_then(|row| row.get(index(&OUTCOMES, outcome)));
        let Some(tally) = tally else {
            return;
        };
        tally.calls.fetch_add(1, Ordering::Relaxed);
        let scaled = (capacity * CAPACITY_SCALE).round().max(0.0) as u64;
        if scaled > 0 {
            tally.capacity.fetch_add(scaled, Ordering::Relaxed);
        }
        if self.recording.load(Ordering::Relaxed) {
            let mut seq = self.sequence.lock();
            if seq.len() == SEQUENCE_CAP {
                seq.pop_front();
            }
            seq.push_back(CallKind { operation, outcome });
        }
    }

    /// Totals per (operation, outcome) of every kind of call made at least once.
    pub fn totals(&self) -> BTreeMap<CallKind, CallTotals> {
        let mut out = BTreeMap::new();
        for (row, operation) in self.tallies.iter().zip(OPERATIONS) {
            for (tally, outcome) in row.iter().zip(OUTCOMES) {
                let calls = tally.calls.load(Ordering::Relaxed);
                if calls == 0 {
                    continue;
                }
                let capacity = tally.capacity.load(Ordering::Relaxed) as f64 / CAPACITY_SCALE;
                let kind = CallKind { operation, outcome };
                out.insert(kind, CallTotals { calls, capacity });
            }
        }
        out
    }

    /// Calls of one operation, any outcome.
    pub fn calls_of(&self, operation: &str) -> u64 {
        self.tallies
            .get(index(&OPERATIONS, operation))
            .into_iter()
            .flatten()
            .map(|t| t.calls.load(Ordering::Relaxed))
            .sum()
    }

    /// Every call counted so far.
    pub fn total_calls(&self) -> u64 {
        self.tallies
            .iter()
            .flatten()
            .map(|t| t.calls.load(Ordering::Relaxed))
            .sum()
    }

    /// Starts (or restarts) recording the call sequence.
    pub fn record_sequence(&self) {
        self.sequence.lock().clear();
        self.recording.store(true, Ordering::Relaxed);
    }

    /// The calls recorded since `record_sequence`, as `Operation` or `Operation✗` (refused).
    pub fn sequence(&self) -> Vec<String> {
        self.sequence
            .lock()
            .iter()
            .map(|k| match k.outcome {
                "ok" => k.operation.to_string(),
                _ => format!("{}✗", k.operation),
            })
            .collect()
    }

    /// Clears totals and the sequence.
    pub fn reset(&self) {
        for t in self.tallies.iter().flatten() {
            t.calls.store(0, Ordering::Relaxed);
            t.capacity.store(0, Ordering::Relaxed);
        }
        self.sequence.lock().clear();
    }
}

pub(super) fn capacity(c: Option<&ConsumedCapacity>) -> f64 {
    c.and_then(|c| c.capacity_units()).unwrap_or(0.0)
}

pub(super) fn capacity_all(c: &[ConsumedCapacity]) -> f64 {
    c.iter().filter_map(|c| c.capacity_units()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_by_kind_and_the_sequence_once_asked_for() {
        let ledger = CallLedger::default();
        ledger.record("UpdateItem", "ok", 1.0);
        assert!(ledger.sequence().is_empty(), "not recording yet");
        ledger.record_sequence();
        ledger.record("UpdateItem", "condition_failed", 1.0);
        ledger.record("BatchGetItem", "ok", 0.5);
        assert_eq!(ledger.sequence(), ["UpdateItem✗", "BatchGetItem"]);
        assert_eq!(ledger.calls_of("UpdateItem"), 2);
        assert_eq!(ledger.total_calls(), 3);
        let reads = CallKind {
            operation: "BatchGetItem",
            outcome: "ok",
        };
        assert_eq!(
            ledger.totals()[&reads],
            CallTotals {
                calls: 1,
                capacity: 0.5
            }
        );
        ledger.reset();
        assert_eq!((ledger.total_calls(), ledger.sequence().len()), (0, 0));
    }
}

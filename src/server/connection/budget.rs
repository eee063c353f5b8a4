//! What one wake of a connection's task may do (`drive.rs` runs it): how long a round
//! decides before the connection is polled again, how long a wake runs while lanes keep
//! the other workers busy, and when a busy connection's calls are worth lanes at all.
//! Owns the clock reads and the look at the workers; polls nothing itself.

use std::time::{Duration, Instant};

use super::lanes::Workers;

/// How long one wake of the connection's task decides calls itself before lanes may be
/// started: about 3 calls of 16 regex-matched descriptors, 25 hot-key calls.
const INLINE_BUDGET: Duration = Duration::from_micros(100);

/// The least a call must cost on average, polled in the connection's task, for its
/// connection's further calls to be shared with lanes: a lane's spawn, its wakes of the
/// connection from another thread and the h2 lock shared across threads cost more than a
/// hot-key call (~4 µs) gains from a second core (measured on one connection of 64 hot
/// calls: 10 µs of CPU per call shared against 6.5 inline, and fewer calls per second),
/// and much less than a call of 16 regex-matched descriptors (~30 µs).
const COSTLY_CALL: Duration = Duration::from_micros(10);

/// How long a round decides calls before the connection is polled again, writing the
/// answers ready (the lanes' too) and reading what the client sent meanwhile: about 3
/// costly calls, so that answers leave while the backlog is still being decided.
const ROUND_TIME: Duration = Duration::from_micros(100);

/// How long a wake runs while lanes of the connection pull calls, before the task yields.
/// Both workers are busy then, and tokio polls the I/O driver only when a worker runs out
/// of tasks (or every 61 tasks): a task that yields is run again only after its worker has
/// polled it, so the client's next calls, already in the socket, are seen within this
/// time. Without it they were seen only when the lanes had emptied the backlog, and each
/// burst was answered whole before the next was read (one connection of costly calls:
/// 0.83× eight connections' calls per second with 1 ms, 0.95× with 100–250 µs).
const SPREAD_WAKE: Duration = Duration::from_micros(250);

/// One wake's account of its inline work.
pub(super) struct WakeBudget {
    started: Instant,
    /// When this round's deciding began, and the new calls it has polled since.
    deciding: Option<Instant>,
    pub(super) polled: u32,
    /// The deciding of the wake's earlier rounds, and the new calls they polled: with this
    /// round's, what a call costs here (a round of calls longer than the round's time
    /// polls only one).
    earlier_spent: Duration,
    earlier_polled: u32,
    /// When the workers were last looked at: first half the budget in, so that a wake
    /// that stays short never reads their counters (each a cache line the workers write),
    /// then at each later check, at least half the budget apart.
    looked: Option<Instant>,
}

impl WakeBudget {
    pub(super) fn new() -> WakeBudget {
        WakeBudget {
            started: Instant::now(),
            deciding: None,
            polled: 0,
            earlier_spent: Duration::ZERO,
            earlier_polled: 0,
            looked: None,
        }
    }

    /// Whether the wake should end here, with lanes pulling (see [`SPREAD_WAKE`]).
    pub(super) fn spread_wake_spent(&self, lanes_pulling: usize) -> bool {
        lanes_pulling > 0 && self.started.elapsed() >= SPREAD_WAKE
    }

    /// A round's deciding begins at `now`: its calls' cost is measured from here.
    pub(super) fn deciding_begins(&mut self, now: Instant) {
        self.deciding = Some(now);
        self.polled = 0;
    }

    /// A round's deciding ends at `now` (the round's last clock read, taken after its last
    /// call): its cost is kept for the wake's later rounds.
    pub(super) fn deciding_ends(&mut self, now: Instant) {
        if let Some(since) = self.deciding.take() {
            self.earlier_spent += now.saturating_duration_since(since);
            self.earlier_polled += self.polled;
            self.polled = 0;
        }
    }

    /// Whether this round has decided for its [`ROUND_TIME`] by `now`.
    pub(super) fn round_spent(&self, now: Instant) -> bool {
        self.deciding.is_some_and(|since| now - since >= ROUND_TIME)
    }

    /// Whether the calls this wake polled by `now` cost at least [`COSTLY_CALL`] each, on
    /// average: only those are worth a lane's spawn and wakes.
    fn costly(&self, now: Instant) -> bool {
        let this_round = self.deciding.map_or(Duration::ZERO, |since| now - since);
        worth_lanes(
            self.earlier_spent + this_round,
            self.earlier_polled + self.polled,
        )
    }

    /// The workers idle enough for a lane each at `now` (the caller's one clock read per
    /// call, shared with [`Self::round_spent`]): none while the wake is within its
    /// budget or its calls are cheap; past it, those that stayed parked since the last
    /// look (at least half of [`INLINE_BUDGET`] ago). Looked at again at each check past
    /// the budget, not once a wake: a worker whose lane ran out of calls parks, and is
    /// given the next one.
    pub(super) fn idle_workers(&mut self, workers: &mut Option<Workers>, now: Instant) -> usize {
        let Some(workers) = workers else {
            return 0;
        };
        if !self.costly(now) {
            return 0;
        }
        let half = INLINE_BUDGET / 2;
        let Some(looked) = self.looked else {
            if now - self.started >= half {
                workers.look();
                self.looked = Some(now);
            }
            return 0;
        };
        if now - self.started < INLINE_BUDGET || now - looked < half {
            return 0;
        }
        let idle = workers.idle_since_look();
        workers.look();
        self.looked = Some(now);
        idle
    }
}

/// Whether `polled` calls that took `spent` to poll cost [`COSTLY_CALL`] each on average.
fn worth_lanes(spent: Duration, polled: u32) -> bool {
    polled > 0 && spent >= COSTLY_CALL * polled
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_calls_that_cost_enough_are_spread() {
        let us = Duration::from_micros;
        // 16 regex-matched descriptors: ~30 µs a call.
        assert!(worth_lanes(us(90), 3));
        // A hot key: ~4 µs a call, 25 of them in the budget.
        assert!(!worth_lanes(us(100), 25));
        // Nothing polled yet: no measure, no lanes.
        assert!(!worth_lanes(us(500), 0));
    }

    #[test]
    fn a_wake_is_cut_short_only_while_lanes_pull() {
        let mut wake = WakeBudget::new();
        wake.started -= SPREAD_WAKE;
        assert!(wake.spread_wake_spent(1));
        assert!(!wake.spread_wake_spent(0));
        assert!(!WakeBudget::new().spread_wake_spent(1));
    }
}

//! The connection's task: the connection and its calls polled in turn, so that the calls
//! of one read are decided one after another and their answers leave in one write.
//!
//! Two budgets bound what one wake does. **Per round**: at most [`CALLS_PER_ROUND`] calls
//! are polled before the connection is polled again, which writes their answers — the
//! first answer of a burst of 1024 calls does not wait for the whole burst. **Per wake**,
//! on a runtime with more than one worker: once the wake has run for [`INLINE_BUDGET`],
//! its calls cost at least [`COSTLY_CALL`] each and workers have stayed parked through
//! its second half, the further new calls of each round are split into lanes, one task
//! per idle worker and one for this worker, each polling its share of the calls (one
//! spawn per lane, not per call); the connection's task goes back to writing. A
//! connection whose wakes stay short (Envoy's usual load) or whose calls are cheap (a
//! hot key) keeps the savings of running its calls in its own task (no task, no wake per
//! call, one write per burst), and so does one whose runtime is busy anyway (spawning
//! would add that cost for no core gained); a connection busy with more than one core
//! can do (many calls, costly ones: many descriptors, regex values) spreads them over the
//! idle workers (docs/architecture.md, "Every core for one busy connection").

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tonic::codegen::http::{Request, Response};

use super::calls::{Calls, Guarded};
use super::ending::Close;
use super::lanes::{spawn_lanes, Workers};
use super::wakes::ConnectionWakes;
use super::watched::{Preface, Watched};
use crate::service::metrics::ConnectionClose;

/// Rounds of reading, deciding and writing one wake-up may run before the task yields,
/// so that a connection that always has work cannot keep its thread from the others.
const ROUNDS_PER_WAKE: usize = 8;

/// Calls polled in one round before the connection is polled again (and writes their
/// answers).
pub(super) const CALLS_PER_ROUND: usize = 64;

/// How long one wake of the connection's task decides calls itself before it hands the
/// further ones to lanes: about 5 calls of 16 regex-matched descriptors, 30 hot-key calls.
const INLINE_BUDGET: Duration = Duration::from_micros(100);

/// The least a call must cost on average, polled in the connection's task, for its
/// connection's further calls to be spread over lanes: a lane's spawn, its wakes of the
/// connection from another thread and the h2 lock shared across threads cost more than a
/// hot-key call (~4 µs) gains from a second core (measured on one connection of 64 hot
/// calls: 12 µs of CPU per call spread against 6.7 inline, and fewer calls per second),
/// and much less than a call of 16 regex-matched descriptors (~30 µs).
const COSTLY_CALL: Duration = Duration::from_micros(10);

/// What the connection's task holds between wakes.
struct Driven {
    running: FuturesUnordered<Guarded>,
    /// New calls, not polled yet.
    fresh: VecDeque<Guarded>,
    open: bool,
    ended: bool,
    /// The runtime's workers, when it has others to spread calls over.
    spread: Option<Workers>,
}

/// One wake's account of its inline work.
struct WakeBudget {
    started: Instant,
    /// When this round's deciding began, and the new calls it has polled since: what a
    /// call costs here.
    deciding: Option<Instant>,
    polled: u32,
    /// When the workers were last looked at: first half the budget in, so that a wake
    /// that stays short never reads their counters (each a cache line the workers write),
    /// then at each later check, at least half the budget apart.
    looked: Option<Instant>,
}

impl WakeBudget {
    fn new() -> WakeBudget {
        WakeBudget {
            started: Instant::now(),
            deciding: None,
            polled: 0,
            looked: None,
        }
    }

    /// A round's deciding begins: its calls' cost is measured from here.
    fn deciding_begins(&mut self) {
        self.deciding = Some(Instant::now());
        self.polled = 0;
    }

    /// Whether the calls this round polled cost at least [`COSTLY_CALL`] each, on
    /// average: only those are worth a lane's spawn and wakes.
    fn costly(&self) -> bool {
        self.deciding
            .is_some_and(|since| worth_lanes(since.elapsed(), self.polled))
    }

    /// The lanes to split new calls into now: none while the wake is within its budget;
    /// past it, one per worker that stayed parked since the last look (at least half of
    /// [`INLINE_BUDGET`] ago). Looked at again at each check past the budget, not once a
    /// wake: a worker busy with the lanes of the last split when this wake began parks
    /// once it has run them, and gets the next share.
    fn lanes(&mut self, workers: &mut Option<Workers>) -> usize {
        let Some(workers) = workers else {
            return 0;
        };
        if !self.costly() {
            return 0;
        }
        let half = INLINE_BUDGET / 2;
        let Some(looked) = self.looked else {
            if self.started.elapsed() >= half {
                workers.look();
                self.looked = Some(Instant::now());
            }
            return 0;
        };
        if self.started.elapsed() < INLINE_BUDGET || looked.elapsed() < half {
            return 0;
        }
        let lanes = workers.idle_since_look();
        workers.look();
        self.looked = Some(Instant::now());
        lanes
    }
}

/// The connection and its calls, polled in turn until the connection is closed and its
/// last call has ended (answered, or dropped by hyper when its stream was reset: a
/// connection gone resets them all). At [`Close::Graceful`] the connection is closed
/// gracefully (the calls in flight are answered first) and `streams_end` tells the calls
/// that would stream on to end; at [`Close::Now`], or at a graceful close before the
/// client's preface (which hyper would wait for), it returns at once, dropping the
/// connection and its calls. Returns why the server closed it, if it did.
pub(super) async fn drive<IO, S, B>(
    mut connection: Pin<&mut http2::Connection<TokioIo<Watched<IO>>, S, Calls>>,
    calls: Calls,
    mut ending: Pin<&mut impl Stream<Item = Close>>,
    preface: &Preface,
    streams_end: &watch::Sender<bool>,
) -> Option<ConnectionClose>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let wakes = Arc::new(ConnectionWakes::default());
    let mut driven = Driven {
        running: FuturesUnordered::new(),
        fresh: VecDeque::new(),
        open: true,
        ended: false,
        spread: Workers::of_this_runtime(),
    };
    let task_waker = Waker::from(wakes.clone());
    let ending_wake = EndingWake::new(&wakes);
    poll_fn(|cx| {
        wakes.task.register(cx.waker());
        while let Some(close) = ending_wake.next(ending.as_mut()) {
            match close {
                Close::Now(why) => return Poll::Ready(Some(why)),
                Close::Graceful if !preface.seen() => {
                    return Poll::Ready(Some(ConnectionClose::ShutdownBeforePreface))
                }
                Close::Graceful if driven.open && !driven.ended => {
                    connection.as_mut().graceful_shutdown();
                    let _ = streams_end.send(true);
                    driven.ended = true;
                }
                Close::Graceful => {}
            }
        }
        let polled = rounds(
            &mut driven,
            connection.as_mut(),
            &calls,
            &wakes,
            &task_waker,
        );
        match polled {
            Some(Poll::Ready(())) => Poll::Ready(None),
            // A wake that came as the rounds ended is this task's to answer.
            Some(Poll::Pending) if !wakes.again.swap(false, SeqCst) => Poll::Pending,
            // Rounds spent with work left (or a late wake): the task goes to the back of
            // the queue.
            _ => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        }
    })
    .await
}

/// Up to [`ROUNDS_PER_WAKE`] rounds of reading, deciding and writing: `Ready` when the
/// connection is closed and its last call done, `Pending` when nothing moved, `None`
/// when the rounds were spent with work left.
fn rounds<IO, S, B>(
    driven: &mut Driven,
    mut connection: Pin<&mut http2::Connection<TokioIo<Watched<IO>>, S, Calls>>,
    calls: &Calls,
    wakes: &Arc<ConnectionWakes>,
    task_waker: &Waker,
) -> Option<Poll<()>>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    S::Future: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    wakes.inside.store(true, SeqCst);
    let mut wake = WakeBudget::new();
    let mut inner = Context::from_waker(task_waker);
    let mut done = None;
    for _ in 0..ROUNDS_PER_WAKE {
        wakes.again.store(false, SeqCst);
        // Read what arrived (queuing its calls) and write what is ready.
        if driven.open {
            if let Poll::Ready(result) = connection.as_mut().poll(&mut inner) {
                driven.open = false;
                if let Err(e) = result {
                    tracing::debug!(error = %e, "gRPC connection ended with an error");
                }
            }
        }
        let mut moved = calls.take(&mut driven.fresh);
        moved |= decide(driven, &mut inner, &mut wake);
        if !driven.open && driven.running.is_empty() && driven.fresh.is_empty() {
            done = Some(Poll::Ready(()));
            break;
        }
        if !moved && !wakes.again.load(SeqCst) {
            done = Some(Poll::Pending);
            break;
        }
    }
    wakes.inside.store(false, SeqCst);
    done
}

/// One round's deciding: the calls that can go on, then the new ones, at most
/// [`CALLS_PER_ROUND`] polls; past the wake's [`INLINE_BUDGET`], if workers are idle, the
/// round's further new calls are split into lanes, one per idle worker and one for this
/// worker. Whether anything moved.
fn decide(driven: &mut Driven, inner: &mut Context<'_>, wake: &mut WakeBudget) -> bool {
    let mut moved = false;
    let mut budget = CALLS_PER_ROUND;
    while budget > 0 {
        match driven.running.poll_next_unpin(inner) {
            Poll::Ready(Some(())) => {
                moved = true;
                budget -= 1;
            }
            _ => break,
        }
    }
    let mut split = false;
    wake.deciding_begins();
    while let Some(mut call) = driven.fresh.pop_front() {
        moved = true;
        if !split {
            let lanes = wake.lanes(&mut driven.spread);
            if lanes > 0 {
                split = true;
                spawn_lanes(&mut driven.fresh, lanes);
            }
        }
        if budget == 0 {
            driven.fresh.push_front(call);
            break;
        }
        budget -= 1;
        wake.polled += 1;
        // Polled here first: most calls end in this poll, and never take a slot in
        // `running`.
        if Pin::new(&mut call).poll(inner).is_pending() {
            driven.running.push(call);
        }
    }
    moved
}

/// Whether `polled` calls that took `spent` to poll cost [`COSTLY_CALL`] each on average.
fn worth_lanes(spent: Duration, polled: u32) -> bool {
    polled > 0 && spent >= COSTLY_CALL * polled
}

/// The waker `ending` (shutdown, the connection's age, its preface) is polled with: it
/// marks that `ending` has something to say and wakes the connection's task, which polls
/// `ending` only then (and once at the start), not on every wake of the task: most wakes
/// are reads and answers.
struct EndingWake {
    fired: AtomicBool,
    wakes: Arc<ConnectionWakes>,
}

impl EndingWake {
    fn new(wakes: &Arc<ConnectionWakes>) -> Arc<EndingWake> {
        Arc::new(EndingWake {
            fired: AtomicBool::new(true),
            wakes: wakes.clone(),
        })
    }

    /// What `ending` says now, polled only if its waker fired since last asked.
    fn next(self: &Arc<Self>, ending: Pin<&mut impl Stream<Item = Close>>) -> Option<Close> {
        if !self.fired.swap(false, SeqCst) {
            return None;
        }
        let waker = Waker::from(self.clone());
        match ending.poll_next(&mut Context::from_waker(&waker)) {
            Poll::Ready(Some(close)) => {
                // It may have more to say (the grace's end): poll it again next time.
                self.fired.store(true, SeqCst);
                Some(close)
            }
            _ => None,
        }
    }
}

impl Wake for EndingWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.fired.store(true, SeqCst);
        self.wakes.task.wake();
    }
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
}

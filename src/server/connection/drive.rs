//! The connection's task: the connection and its calls polled in turn, so that the calls
//! of one read are decided one after another and their answers leave in one write.
//!
//! Budgets bound what one wake does (`budget.rs`). **Per round**: at most
//! [`CALLS_PER_ROUND`] calls, and about 100 µs of deciding, before the connection is polled
//! again, which writes their answers and reads what the client sent meanwhile — the first
//! answer of a burst of 1024 calls does not wait for the whole burst. **Per wake**, on a
//! runtime with more than one worker: once the wake has run for its inline budget, its
//! calls cost at least 10 µs each and workers have stayed parked through its second half,
//! a lane is started for each idle worker: a task that pulls new calls from the
//! connection's backlog, one at a time, as the connection's task also does between its
//! reads and writes (`lanes.rs`). A connection whose wakes stay short (Envoy's usual load)
//! or whose calls are cheap (a hot key) keeps the savings of running its calls in its own
//! task (no task, no wake per call, one write per burst), and so does one whose runtime is
//! busy anyway (a lane would add that cost for no core gained); a connection busy with
//! more than one core can do (many calls, costly ones: many descriptors, regex values)
//! shares them with the idle workers (docs/architecture.md, "Every core for one busy
//! connection").

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Instant;

use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};
use hyper::body::Incoming;
use hyper::server::conn::http2;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tonic::codegen::http::{Request, Response};

use super::budget::WakeBudget;
use super::calls::{Calls, Guarded};
use super::ending::Close;
use super::lanes::{spawn_lanes, Backlog, Workers};
use super::wakes::ConnectionWakes;
use super::watched::{Preface, Watched};
use crate::service::metrics::ConnectionClose;

/// Rounds of reading, deciding and writing one wake-up may run before the task yields,
/// so that a connection that always has work cannot keep its thread from the others.
const ROUNDS_PER_WAKE: usize = 8;

/// Calls polled in one round before the connection is polled again (and writes their
/// answers).
pub(super) const CALLS_PER_ROUND: usize = 64;

/// The fewest new calls waiting for a lane to be started on them: a lane costs a spawn and
/// a worker woken, a few costly calls' worth.
const MIN_LANE_CALLS: usize = 4;

/// What the connection's task holds between wakes.
struct Driven {
    running: FuturesUnordered<Guarded>,
    /// New calls, not polled yet, shared with the lanes.
    backlog: Backlog,
    open: bool,
    ended: bool,
    /// The runtime's workers, when it has others to spread calls over.
    spread: Option<Workers>,
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
        backlog: Backlog::default(),
        open: true,
        ended: false,
        spread: Workers::of_this_runtime(),
    };
    let task_waker = Waker::from(wakes.clone());
    let ending_wake = EndingWake::new(&wakes);
    loop {
        let woke = poll_fn(|cx| {
            wakes.task.register(cx.waker());
            while let Some(close) = ending_wake.next(ending.as_mut()) {
                match close {
                    Close::Now(why) => return Poll::Ready(Woke::Closed(Some(why))),
                    Close::Graceful if !preface.seen() => {
                        return Poll::Ready(Woke::Closed(Some(
                            ConnectionClose::ShutdownBeforePreface,
                        )))
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
                Some(Poll::Ready(())) => Poll::Ready(Woke::Closed(None)),
                // A wake that came as the rounds ended is this task's to answer.
                Some(Poll::Pending) if !wakes.again.swap(false, SeqCst) => Poll::Pending,
                // Rounds spent with work left (or a late wake).
                _ => Poll::Ready(Woke::Spent),
            }
        })
        .await;
        match woke {
            Woke::Closed(why) => return why,
            // With lanes pulling, both workers are busy with this connection: tokio runs
            // a task that yields so only after its worker has polled the I/O driver,
            // which a busy worker does only every 61 tasks or when it runs out of them;
            // without it the client's next calls, already in the socket, were not seen
            // until the lanes had emptied the backlog (`budget.rs`, `SPREAD_WAKE`).
            Woke::Spent if driven.backlog.lanes() > 0 => tokio::task::yield_now().await,
            // Otherwise to the back of the queue, behind the tasks already waiting: on a
            // runtime busy with other connections, a task deferred so would wait up to 61
            // of their polls.
            Woke::Spent => to_the_back().await,
        }
    }
}

/// Yields the task's thread to the tasks waiting, the task itself queued behind them.
async fn to_the_back() {
    let mut yielded = false;
    poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await
}

/// How a wake of the connection's task ended, when it did not wait.
enum Woke {
    /// The connection is done; why the server closed it, if it did.
    Closed(Option<ConnectionClose>),
    /// Its rounds or time were spent with work left.
    Spent,
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
        if wake.spread_wake_spent(driven.backlog.lanes()) {
            break;
        }
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
        let mut moved = calls.take(|new| driven.backlog.extend(new));
        moved |= decide(driven, &mut inner, &mut wake);
        if !driven.open && driven.running.is_empty() && driven.backlog.is_empty() {
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

/// One round's deciding: the calls that can go on, then new ones from the backlog, at
/// most [`CALLS_PER_ROUND`] polls and the round's time; past the wake's inline budget, if
/// workers are idle and the calls are costly, lanes are started on the backlog. Whether
/// anything moved.
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
    // One clock read per call, for the spread, the round's time and its cost.
    let mut now = Instant::now();
    wake.deciding_begins(now);
    while budget > 0 {
        // Looked at before each call; by the wake's calls so far, their cost is known.
        spread(driven, wake, now);
        let Some(mut call) = driven.backlog.pop() else {
            break;
        };
        moved = true;
        budget -= 1;
        wake.polled += 1;
        // Polled here first: most calls end in this poll, and never take a slot in
        // `running`.
        if Pin::new(&mut call).poll(inner).is_pending() {
            driven.running.push(call);
        }
        now = Instant::now();
        if wake.round_spent(now) {
            break;
        }
    }
    wake.deciding_ends(now);
    moved
}

/// Starts a lane for each worker that stayed idle, when the wake is past its budget, its
/// calls are costly and the backlog holds enough for them.
fn spread(driven: &mut Driven, wake: &mut WakeBudget, now: Instant) {
    let idle = wake.idle_workers(&mut driven.spread, now);
    // A lane spawned but not yet running leaves its worker parked: not given another.
    let pulling = driven.backlog.lanes();
    if idle > pulling && driven.backlog.len() >= MIN_LANE_CALLS {
        spawn_lanes(&driven.backlog, idle - pulling);
    }
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

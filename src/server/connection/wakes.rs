//! The connection's waker ([`ConnectionWakes`]): what wakes the connection's task, and
//! when a wake is only noted. A wake while the task runs asks for one more round; any
//! other wakes the task. Owns no call and no I/O.

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::task::Wake;

use futures::task::AtomicWaker;

/// The waker the connection and its calls are polled with. h2 wakes the connection's
/// task whenever a call has an answer to write, and a call's stream is woken when the
/// connection has written; the task polls both in turn anyway, so a wake while it is
/// running ([`inside`](Self::inside)) only asks for one more round. Passed on to the
/// scheduler instead, each would schedule the task once more after every call (and, on
/// the multi-thread scheduler, wake a parked worker to steal it: a `futex` and a context
/// switch per call). A wake from outside (the socket ready, a store's answer, a call
/// spawned on another worker) wakes the task.
#[derive(Default)]
pub(super) struct ConnectionWakes {
    /// Set while the connection's task is polling.
    pub(super) inside: AtomicBool,
    /// A wake came: the connection must be polled again.
    pub(super) again: AtomicBool,
    /// The connection's task.
    pub(super) task: AtomicWaker,
}

impl Wake for ConnectionWakes {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // `again` before `inside`, and the task clears `inside` before it reads `again`:
        // whichever order the two threads run in, one of them wakes the task.
        self.again.store(true, SeqCst);
        if !self.inside.load(SeqCst) {
            self.task.wake();
        }
    }
}

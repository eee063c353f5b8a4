//! A connection's calls as its task holds them: hyper's executor for the connection
//! ([`Calls`]), which queues each call (hyper's stream task) instead of spawning it, and
//! each call's guard ([`Guarded`]): counted in flight while it lives, and fenced so that a
//! panic while it is polled ends that call alone. hyper's stream task holds the call's
//! answer half of the HTTP/2 stream: dropped after a panic, it resets that stream
//! (RST_STREAM), and the connection and its other calls go on.
//!
//! A panic before the answer (deciding, encoding) is caught nearer the call, where it is
//! answered INTERNAL with the call's request id (`server/panics.rs`); what reaches this
//! fence came while the answer was being sent.

use std::future::Future;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use parking_lot::Mutex;

use super::context::ConnectionContext;
use crate::service::metrics::PanicEnd;
use crate::support::text::panic_text;

/// One call (hyper's stream task), boxed so that one queue holds every kind.
type Call = Pin<Box<dyn Future<Output = ()> + Send>>;

/// hyper's executor for one connection: the calls it is given wait here for the
/// connection's task, which polls them (`drive.rs`).
#[derive(Clone)]
pub(super) struct Calls {
    /// Filled by hyper while the connection is polled, emptied by the same task right
    /// after: never contended (the lock only makes the executor `Sync`, as hyper needs).
    queued: Arc<Mutex<Vec<Guarded>>>,
    context: Arc<ConnectionContext>,
}

impl Calls {
    pub(super) fn new(context: Arc<ConnectionContext>) -> Calls {
        Calls {
            queued: Arc::default(),
            context,
        }
    }

    /// Hands the calls queued since the last take to `into` (the connection's backlog),
    /// in their order; whether there were any.
    pub(super) fn take(&self, into: impl FnOnce(std::vec::Drain<'_, Guarded>)) -> bool {
        let mut queued = self.queued.lock();
        let any = !queued.is_empty();
        if any {
            into(queued.drain(..));
        }
        any
    }
}

impl<F> hyper::rt::Executor<F> for Calls
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, call: F) {
        let guarded = Guarded::new(Box::pin(call), self.context.clone());
        self.queued.lock().push(guarded);
    }
}

/// A call, counted in flight while it lives; a panic while it is polled ends it (its
/// stream is reset as it is dropped), is logged and counted, and reaches nobody else.
pub(super) struct Guarded {
    /// `None` once the call panicked (it is dropped then).
    call: Option<Call>,
    context: Arc<ConnectionContext>,
}

impl Guarded {
    fn new(call: Call, context: Arc<ConnectionContext>) -> Guarded {
        context.metrics.port().call_started();
        Guarded {
            call: Some(call),
            context,
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.context.metrics.port().call_ended();
    }
}

impl Future for Guarded {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(call) = self.call.as_mut() else {
            return Poll::Ready(());
        };
        let panicked = match catch_unwind(AssertUnwindSafe(|| call.as_mut().poll(cx))) {
            Ok(polled) => return polled,
            Err(panic) => panic,
        };
        // Dropping the call resets its stream; a drop that panics too is caught alike.
        let call = self.call.take();
        let _ = catch_unwind(AssertUnwindSafe(move || drop(call)));
        let context = &self.context;
        context.metrics.port().call_panicked(PanicEnd::Reset);
        tracing::error!(
            connection = context.id,
            panic = %panic_text(&*panicked, 256),
            "a call panicked while its answer was sent; its stream was reset, the connection's other calls go on"
        );
        Poll::Ready(())
    }
}

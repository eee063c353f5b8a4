//! Counts the store calls one scope makes: how a `decision` span reports its call's
//! `store_calls`. The count is task-local, so concurrent calls never mix theirs, and a
//! call made outside a counted scope (the lease task fetching or returning a lease, the
//! health probe) counts for no one. A call counts when it is sent, so one its decision
//! stopped waiting for (the deadline passed) counts too; one the circuit breaker refused
//! never left the process and does not.
//!
//! Only [`Metered`](super::metered::Metered), the wrapper every served store runs behind,
//! counts; a store used bare counts nothing. It holds no decision and no metric.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::task::futures::TaskLocalFuture;

tokio::task_local! {
    static STORE_CALLS: Cell<u32>;
}

/// Runs `work`, counting the store calls it makes (its own: calls made in tasks it
/// spawns are not seen).
pub fn counted<F: Future>(work: F) -> Counted<F> {
    Counted {
        scope: STORE_CALLS.scope(Cell::new(0), work),
    }
}

pin_project_lite::pin_project! {
    /// `work` and the count of its store calls. A future of its own rather than an `async`
    /// block: one would hold `work` twice (captured, and moved into its `.await`), and
    /// the decision's future is boxed by tonic on every call.
    pub struct Counted<F: Future> {
        #[pin]
        scope: TaskLocalFuture<Cell<u32>, F>,
    }
}

impl<F: Future> Future for Counted<F> {
    type Output = (F::Output, u32);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut scope = self.project().scope;
        let output = ready!(scope.as_mut().poll(cx));
        let calls = scope.take_value().map_or(0, |n| n.get());
        Poll::Ready((output, calls))
    }
}

/// One store call was sent (+1) or turned out not to have been (-1: refused before
/// leaving the process); nothing outside [`counted`].
pub(crate) fn add(delta: i32) {
    let _ = STORE_CALLS.try_with(|n| n.set(n.get().saturating_add_signed(delta)));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn counts_its_own_scope_only() {
        add(1);
        let ((), outer) = counted(async {
            add(1);
            add(1);
            let ((), inner) = counted(async { add(1) }).await;
            assert_eq!(inner, 1);
            tokio::spawn(async { add(1) }).await.unwrap();
            add(-1);
        })
        .await;
        assert_eq!(outer, 1);
    }
}

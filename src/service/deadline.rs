//! A call's deadline: how long the store may take on its behalf. The caller says how long
//! it will wait (gRPC's `grpc-timeout`; Envoy sends its rate-limit filter's `timeout`, 20 ms
//! by default); the store gets that less a margin for the answer to travel back, so the
//! `failure_mode` answer reaches the caller before the caller gives up. `--store-timeout`
//! caps it, and is the deadline of a caller that sends none (the HTTP `/json` surface, a
//! client without a deadline).
//!
//! [`Bounded`] holds a call to its deadline.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// The smallest margin kept for the answer to travel back.
const MIN_MARGIN: Duration = Duration::from_millis(2);

/// The largest margin: a caller that allows seconds loses no more than this.
const MAX_MARGIN: Duration = Duration::from_millis(20);

/// The margin kept out of a caller's `timeout` for the answer to be written, sent and
/// read: a third of it, within 2–20 ms (6.7 ms of Envoy's default 20 ms, which leaves the
/// store 13.3 ms). Sized for a loaded machine: on a busy 2-core CI machine the answer
/// reached a 50 ms caller up to 12.6 ms after the store's deadline passed, so a fifth
/// (10 ms) let 2 of 200 such callers time out; a caller's deadline missed costs it the
/// answer shardgate chose.
pub fn margin(timeout: Duration) -> Duration {
    (timeout / 3).clamp(MIN_MARGIN, MAX_MARGIN)
}

/// The instant the store must have answered by, for a call received at `now` from a
/// caller that allows `caller` (`None`: it did not say), with the store's `cap`.
pub fn deadline(now: Instant, caller: Option<Duration>, cap: Duration) -> Instant {
    let budget = match caller {
        Some(t) => t.saturating_sub(margin(t)).min(cap),
        None => cap,
    };
    now + budget
}

/// The caller's timeout from a `grpc-timeout` header value: 1 to 8 digits and a unit
/// (`H`, `M`, `S`, `m`, `u`, `n`), per gRPC's HTTP/2 protocol. `None` when malformed (the
/// call then runs to the cap, as one without a deadline).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    // Checked: a value ending in a multi-byte character has no one-byte unit to split off.
    let (digits, unit) = value.split_at_checked(value.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3_600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

pin_project_lite::pin_project! {
    /// `call`, given up at `deadline`: resolves to its output, or `None` once the deadline
    /// has passed. A call whose deadline passed before it started is never polled (it
    /// would only load the store for an answer nobody waits for). The timer is set only
    /// when the call does not answer at once — the memory store always does — and is
    /// boxed, being large: the call's future stays as small as it was.
    pub struct Bounded<F> {
        #[pin]
        call: F,
        deadline: Instant,
        timer: Option<Pin<Box<Sleep>>>,
    }
}

impl<F> Bounded<F> {
    pub fn new(call: F, deadline: Instant) -> Bounded<F> {
        Bounded {
            call,
            deadline,
            timer: None,
        }
    }
}

impl<F: Future> Future for Bounded<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if this.timer.is_none() && Instant::now() >= *this.deadline {
            return Poll::Ready(None);
        }
        if let Poll::Ready(out) = this.call.poll(cx) {
            return Poll::Ready(Some(out));
        }
        let deadline = *this.deadline;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        timer.as_mut().poll(cx).map(|()| None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Duration = Duration::from_secs(1);

    #[test]
    fn parses_every_unit_and_refuses_the_malformed() {
        assert_eq!(parse_grpc_timeout("20m"), Some(Duration::from_millis(20)));
        assert_eq!(parse_grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_grpc_timeout("1H"), Some(Duration::from_secs(3_600)));
        assert_eq!(parse_grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("500u"), Some(Duration::from_micros(500)));
        assert_eq!(
            parse_grpc_timeout("99999999n"),
            Some(Duration::from_nanos(99_999_999))
        );
        for bad in ["", "m", "20", "20x", "123456789m", "-1m", "1.5S", "20 m"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    /// A value ending in a character of more than one byte: before the split was
    /// checked, cutting its last byte off panicked (not a char boundary).
    #[test]
    fn a_value_ending_in_a_multibyte_character_is_refused_not_a_panic() {
        for bad in ["1é", "20µ", "é", "5ms€"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_store_gets_the_callers_time_less_a_margin_up_to_the_cap() {
        let now = Instant::now();
        let envoy = deadline(now, Some(Duration::from_millis(20)), CAP);
        let twenty = Duration::from_millis(20);
        assert_eq!(envoy - now, twenty - twenty / 3);
        let patient = deadline(now, Some(Duration::from_secs(2)), CAP);
        assert_eq!(patient - now, CAP, "capped");
        let silent = deadline(now, None, CAP);
        assert_eq!(silent - now, CAP);
        let hasty = deadline(now, Some(Duration::from_micros(1_500)), CAP);
        assert_eq!(hasty, now, "no time left for the store");
        assert_eq!(
            margin(Duration::from_millis(50)),
            Duration::from_millis(50) / 3
        );
        assert_eq!(margin(Duration::from_secs(2)), Duration::from_millis(20));
        assert_eq!(margin(Duration::from_millis(3)), Duration::from_millis(2));
    }

    #[tokio::test]
    async fn a_bounded_call_answers_gives_up_or_never_starts() {
        let soon = Instant::now() + Duration::from_millis(20);
        assert_eq!(Bounded::new(async { 7 }, soon).await, Some(7));
        let hangs = std::future::pending::<u8>();
        assert_eq!(Bounded::new(hangs, soon).await, None);
        let started = std::sync::atomic::AtomicBool::new(false);
        let call = async { started.store(true, std::sync::atomic::Ordering::SeqCst) };
        let past = Instant::now() - Duration::from_millis(1);
        assert_eq!(Bounded::new(call, past).await, None);
        assert!(
            !started.load(std::sync::atomic::Ordering::SeqCst),
            "never polled"
        );
    }
}

//! Rate-limited logging: at most one line per interval for a recurring condition (a store
//! failure burst, a request no shard can admit), with the number of occurrences folded
//! into the next line. Shared by the engine and the service; it only counts and says when.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Admits one log line per interval; counts the rest.
#[derive(Debug)]
pub struct LogThrottle {
    epoch: Instant,
    interval_ms: i64,
    /// Milliseconds since `epoch` of the last admitted line (-1: never).
    last: AtomicI64,
    suppressed: AtomicU64,
}

impl LogThrottle {
    pub fn new(interval: Duration) -> LogThrottle {
        LogThrottle {
            epoch: Instant::now(),
            interval_ms: interval.as_millis().min(i64::MAX as u128) as i64,
            last: AtomicI64::new(-1),
            suppressed: AtomicU64::new(0),
        }
    }

    /// `Some(occurrences suppressed since the last line)` when a line may be written now.
    pub fn admit(&self) -> Option<u64> {
        let now = self.epoch.elapsed().as_millis() as i64;
        let last = self.last.load(Ordering::Relaxed);
        if last >= 0 && now - last < self.interval_ms {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        match self
            .last
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => Some(self.suppressed.swap(0, Ordering::Relaxed)),
            Err(_) => {
                self.suppressed.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_of_the_rest() {
        let t = LogThrottle::new(Duration::from_secs(3_600));
        assert_eq!(t.admit(), Some(0));
        for _ in 0..5 {
            assert_eq!(t.admit(), None);
        }
        let t0 = LogThrottle::new(Duration::ZERO);
        assert_eq!(t0.admit(), Some(0));
        assert_eq!(t0.admit(), Some(0));
    }
}

//! Test-only faults for the tests that show the server's supervision end to end
//! (`tests/python/test_supervision.py`): `SHARDGATE_TEST_END_TASK=grpc|http` makes that
//! port's task end on its own after `SHARDGATE_TEST_END_TASK_AFTER_MS` (default 500),
//! dropping its listener, as a task that returned or panicked would. Built only with the
//! `test-hooks` feature, which only tests build (never a release).
//!
//! Owns reading those two variables; must not change anything when they are unset.

use std::future::Future;
use std::time::Duration;

/// `port` (its future), ended early with `ended` when the variables name it (`"grpc"`,
/// `"http"`).
pub(super) async fn ended_early<T>(name: &str, port: impl Future<Output = T>, ended: T) -> T {
    let asked = std::env::var("SHARDGATE_TEST_END_TASK").is_ok_and(|v| v == name);
    if !asked {
        return port.await;
    }
    let after = std::env::var("SHARDGATE_TEST_END_TASK_AFTER_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    tokio::select! {
        done = port => done,
        () = tokio::time::sleep(Duration::from_millis(after)) => {
            tracing::warn!(task = name, "test hook: the task ends now");
            ended
        }
    }
}

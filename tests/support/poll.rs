//! The tests' one wait: poll a condition until it holds or a deadline passes.
//! Shared by every test crate (`#[path]`-included), so each wait has a limit.

use std::time::{Duration, Instant};

/// Runs `check` every `every` until it returns `Some`, for at most `limit`
/// (an attempt still running then is given at most `limit` more); then
/// panics naming `what`.
pub(crate) async fn poll<T>(
    what: &str,
    limit: Duration,
    every: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        // An attempt that never ends must not hold the poll past its limit
        // (the limit is otherwise checked only between attempts): each one
        // gets at most `limit` itself, so a poll ends within twice it.
        if let Ok(Some(v)) = tokio::time::timeout(limit, check()).await {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(every).await;
    }
}

//! The tests' one wait: poll a condition until it holds or a deadline passes.
//! Shared by every test crate (`#[path]`-included), so each wait has a limit.

use std::time::{Duration, Instant};

/// Runs `check` every `every` until it returns `Some`, for at most `limit`;
/// then panics naming `what`.
pub async fn poll<T>(
    what: &str,
    limit: Duration,
    every: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for: {what}"
        );
        tokio::time::sleep(every).await;
    }
}

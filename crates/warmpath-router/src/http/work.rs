//! The bounded pool where big bodies (at least [`OFFLOAD_BYTES`]) are routed,
//! one per CPU at once, so they cannot stall the threads serving connections.

use crate::http::error::ApiError;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Bodies at least this big go to the pool (for smaller ones a hand-off costs more).
const OFFLOAD_BYTES: usize = 256 * 1024;

/// Longest wait for a free thread; past it, 503 `overloaded`.
const QUEUE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug)]
pub(crate) struct WorkPool {
    turns: Arc<Semaphore>,
    offload_bytes: usize,
    queue_timeout: Duration,
}

impl WorkPool {
    /// A pool of one thread per CPU.
    pub(crate) fn new() -> Self {
        let threads = std::thread::available_parallelism().map_or(2, usize::from);
        WorkPool {
            turns: Arc::new(Semaphore::new(threads)),
            offload_bytes: OFFLOAD_BYTES,
            queue_timeout: QUEUE_TIMEOUT,
        }
    }

    /// Whether a body of `len` bytes is routed here rather than inline.
    pub(crate) fn offloads(&self, len: usize) -> bool {
        len >= self.offload_bytes
    }

    /// Runs `job` on a blocking thread once a turn is free; a started job runs
    /// to its end (it cannot be interrupted), holding its turn, so the bound holds.
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
    ) -> Result<T, ApiError> {
        let turn =
            tokio::time::timeout(self.queue_timeout, Arc::clone(&self.turns).acquire_owned())
                .await
                .map_err(|_| {
                    metrics::counter!("warmpath_work_rejected_total").increment(1);
                    ApiError::overloaded(format!(
                "the router is busy with large requests (no turn within {} ms); retry later",
                self.queue_timeout.as_millis()
            ))
                })?
                .map_err(|_| ApiError::internal("the work pool is closed"))?;
        metrics::counter!("warmpath_work_offloaded_total").increment(1);
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            job()
        })
        .await
        .map_err(|e| ApiError::internal(format!("routing work failed: {e}")))?
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pool(threads: usize, queue_timeout_ms: u64) -> WorkPool {
        WorkPool {
            turns: Arc::new(Semaphore::new(threads)),
            offload_bytes: 100,
            queue_timeout: Duration::from_millis(queue_timeout_ms),
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn big_bodies_run_on_another_thread() {
        let p = pool(1, 1000);
        assert!(!p.offloads(99) && p.offloads(100));
        let here = std::thread::current().id();
        let away = p.run(move || Ok(std::thread::current().id())).await;
        assert_ne!(away.unwrap(), here);
    }

    #[tokio::test]
    async fn a_full_pool_answers_overloaded_after_the_queue_timeout() {
        let p = Arc::new(pool(1, 50));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let busy = {
            let p = Arc::clone(&p);
            tokio::spawn(async move {
                p.run(move || {
                    rx.recv().ok();
                    Ok(())
                })
                .await
            })
        };
        // Wait until the first job holds the only turn.
        while p.turns.available_permits() > 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let e = p.run(|| Ok(())).await.unwrap_err();
        assert_eq!(e.status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(e.code, "overloaded");
        tx.send(()).unwrap();
        busy.await.unwrap().unwrap();
        p.run(|| Ok(())).await.unwrap();
    }
}

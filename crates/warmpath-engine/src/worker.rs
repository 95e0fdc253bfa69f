//! One worker thread owns the [`Engine`]; requests wait in a bounded FIFO queue
//! and run one at a time. Tokens stream back over a bounded channel per request;
//! a request whose receiver is gone stops at its next token. The thread ends once
//! every [`EngineHandle`] is dropped and the current request finishes.

use crate::engine::{Engine, Finish};
use crate::error::EngineError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use tokio::sync::{mpsc, oneshot};

/// Tokens buffered per request before the worker waits for the client.
const STREAM_BUFFER: usize = 64;

/// What a generation request streams back.
#[derive(Debug)]
pub enum StreamItem {
    /// The next generated token id.
    Token(u32),
    /// Generation ended.
    Done {
        finish: Finish,
        /// Prompt tokens served from the prefix cache.
        cached_tokens: usize,
        /// Tokens generated.
        completion_tokens: usize,
    },
    /// The request failed.
    Failed(EngineError),
}

/// A request for the worker.
#[derive(Debug)]
pub struct GenerateRequest {
    pub tokens: Vec<u32>,
    /// `cache_salt`, isolating the request's prefix cache entries.
    pub salt: Option<String>,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Ids that end generation.
    pub stop_ids: Vec<u32>,
}

enum Job {
    Generate(GenerateRequest, mpsc::Sender<StreamItem>),
    Reset(oneshot::Sender<Result<(), EngineError>>),
}

/// Live numbers for `/metrics`, updated by the worker.
#[derive(Debug, Default)]
pub struct EngineStats {
    running: AtomicU64,
    waiting: AtomicU64,
    used_blocks: AtomicU64,
    queried_tokens: AtomicU64,
    hit_tokens: AtomicU64,
}

/// A snapshot of [`EngineStats`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Requests being computed (0 or 1).
    pub running: u64,
    /// Requests queued.
    pub waiting: u64,
    /// Cache blocks in use.
    pub used_blocks: u64,
    /// Prompt tokens looked up in the prefix cache.
    pub queried_tokens: u64,
    /// Of those, found cached.
    pub hit_tokens: u64,
}

impl EngineStats {
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            running: self.running.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
            used_blocks: self.used_blocks.load(Ordering::Relaxed),
            queried_tokens: self.queried_tokens.load(Ordering::Relaxed),
            hit_tokens: self.hit_tokens.load(Ordering::Relaxed),
        }
    }

    fn refresh(&self, engine: &Engine) {
        let s = engine.cache().stats();
        self.used_blocks
            .store(engine.cache().len() as u64, Ordering::Relaxed);
        self.queried_tokens
            .store(s.queried_tokens, Ordering::Relaxed);
        self.hit_tokens.store(s.hit_tokens, Ordering::Relaxed);
    }
}

/// Submits work to the worker; cheap to clone.
#[derive(Clone, Debug)]
pub struct EngineHandle {
    tx: mpsc::Sender<Job>,
    stats: Arc<EngineStats>,
    queue: usize,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Job::Generate(r, _) => f.debug_tuple("Generate").field(r).finish(),
            Job::Reset(_) => f.write_str("Reset"),
        }
    }
}

/// The worker thread; join it after dropping every handle.
#[derive(Debug)]
pub struct WorkerThread(JoinHandle<()>);

impl WorkerThread {
    /// Waits for the thread to end.
    pub fn join(self) {
        if self.0.join().is_err() {
            tracing::error!("engine worker thread panicked");
        }
    }
}

/// Starts the worker with a queue of `queue` requests.
pub fn spawn(engine: Engine, queue: usize) -> Result<(EngineHandle, WorkerThread), EngineError> {
    let queue = queue.max(1);
    let (tx, rx) = mpsc::channel(queue);
    let stats = Arc::new(EngineStats::default());
    stats.refresh(&engine);
    let st = stats.clone();
    let thread = std::thread::Builder::new()
        .name("warmpath-engine".into())
        .spawn(move || run(engine, rx, st))
        .map_err(|source| EngineError::Io {
            path: "<engine worker thread>".into(),
            source,
        })?;
    Ok((EngineHandle { tx, stats, queue }, WorkerThread(thread)))
}

fn run(mut engine: Engine, mut rx: mpsc::Receiver<Job>, stats: Arc<EngineStats>) {
    while let Some(job) = rx.blocking_recv() {
        stats.waiting.fetch_sub(1, Ordering::Relaxed);
        stats.running.store(1, Ordering::Relaxed);
        match job {
            Job::Generate(req, out) => {
                let span = tracing::info_span!("generate", prompt = req.tokens.len());
                let _g = span.enter();
                if out.is_closed() {
                    tracing::debug!("client left while queued");
                } else {
                    let result = engine.generate(
                        &req.tokens,
                        req.salt.as_deref(),
                        req.max_tokens,
                        &req.stop_ids,
                        |t| out.blocking_send(StreamItem::Token(t)).is_ok(),
                    );
                    let item = match result {
                        Ok(g) => StreamItem::Done {
                            finish: g.finish,
                            cached_tokens: g.cached_tokens,
                            completion_tokens: g.tokens.len(),
                        },
                        Err(e) => {
                            tracing::warn!(error = %e, "generation failed");
                            StreamItem::Failed(e)
                        }
                    };
                    // The client may have left; nothing more to do then.
                    let _ = out.blocking_send(item);
                }
            }
            Job::Reset(reply) => {
                let _ = reply.send(engine.reset_cache());
            }
        }
        stats.refresh(&engine);
        stats.running.store(0, Ordering::Relaxed);
    }
    tracing::debug!("engine worker stopped: every handle dropped");
}

impl EngineHandle {
    pub fn stats(&self) -> StatsSnapshot {
        self.stats.snapshot()
    }

    fn submit(&self, job: Job) -> Result<(), EngineError> {
        self.stats.waiting.fetch_add(1, Ordering::Relaxed);
        self.tx.try_send(job).map_err(|e| {
            self.stats.waiting.fetch_sub(1, Ordering::Relaxed);
            match e {
                mpsc::error::TrySendError::Full(_) => EngineError::Busy(self.queue),
                mpsc::error::TrySendError::Closed(_) => EngineError::WorkerGone,
            }
        })
    }

    /// Queues a generation; its tokens arrive on the returned receiver, ending
    /// with [`StreamItem::Done`] or [`StreamItem::Failed`]. Dropping the
    /// receiver cancels the request. Fails at once when the queue is full.
    pub fn generate(
        &self,
        req: GenerateRequest,
    ) -> Result<mpsc::Receiver<StreamItem>, EngineError> {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        self.submit(Job::Generate(req, tx))?;
        Ok(rx)
    }

    /// Drops the prefix cache after the requests queued before it.
    pub async fn reset_prefix_cache(&self) -> Result<(), EngineError> {
        let (tx, rx) = oneshot::channel();
        self.submit(Job::Reset(tx))?;
        rx.await.map_err(|_| EngineError::WorkerGone)?
    }
}

//! The worker thread that owns the [`Engine`]. Tokens stream back over a bounded
//! channel per request; a request whose receiver is gone stops at its next token.

use crate::engine::{Engine, Generation};
use crate::error::EngineError;
use parking_lot::Mutex;
use std::sync::Arc;
use std::thread::JoinHandle;
use tokio::sync::{mpsc, oneshot};

/// Tokens buffered per request before the worker waits for the client.
const STREAM_BUFFER: usize = 64;

/// What a generation request streams back.
#[derive(Debug)]
pub enum StreamItem {
    Token(u32),
    Done(Generation),
    Failed(EngineError),
}

/// A request for the worker.
#[derive(Debug)]
pub struct GenerateRequest {
    pub tokens: Vec<u32>,
    /// `cache_salt`, isolating the request's prefix cache entries.
    pub salt: Option<String>,
    pub max_tokens: usize,
    pub stop_ids: Vec<u32>,
}

#[derive(Debug)]
enum Job {
    Generate(GenerateRequest, mpsc::Sender<StreamItem>),
    Reset(oneshot::Sender<Result<(), EngineError>>),
}

/// Live numbers for `/metrics`, updated by the worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Requests being computed (0 or 1).
    pub running: u64,
    pub waiting: u64,
    pub used_blocks: u64,
    /// Prompt tokens looked up in the prefix cache.
    pub queried_tokens: u64,
    /// Of those, found cached.
    pub hit_tokens: u64,
}

type Stats = Arc<Mutex<StatsSnapshot>>;

fn refresh(stats: &Stats, engine: &Engine) {
    let s = engine.cache().stats();
    let mut st = stats.lock();
    st.used_blocks = engine.cache().len() as u64;
    st.queried_tokens = s.queried_tokens;
    st.hit_tokens = s.hit_tokens;
}

/// Submits work to the worker; cheap to clone.
#[derive(Clone, Debug)]
pub struct EngineHandle {
    tx: mpsc::Sender<Job>,
    stats: Stats,
    queue: usize,
}

/// The worker thread; join it after dropping every handle.
#[derive(Debug)]
pub struct WorkerThread(JoinHandle<()>);

impl WorkerThread {
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
    let stats = Stats::default();
    refresh(&stats, &engine);
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

fn run(mut engine: Engine, mut rx: mpsc::Receiver<Job>, stats: Stats) {
    while let Some(job) = rx.blocking_recv() {
        {
            let mut st = stats.lock();
            st.waiting = st.waiting.saturating_sub(1);
            st.running = 1;
        }
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
                        Ok(g) => StreamItem::Done(g),
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
        refresh(&stats, &engine);
        stats.lock().running = 0;
    }
    tracing::debug!("engine worker stopped: every handle dropped");
}

impl EngineHandle {
    pub fn stats(&self) -> StatsSnapshot {
        *self.stats.lock()
    }

    fn submit(&self, job: Job) -> Result<(), EngineError> {
        self.stats.lock().waiting += 1;
        self.tx.try_send(job).map_err(|e| {
            let mut st = self.stats.lock();
            st.waiting = st.waiting.saturating_sub(1);
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

//! One simulated engine: admission into a batch of `max_batch`, one FIFO
//! prefill queue served by one task, a prefix cache with vLLM's semantics
//! ([`PrefixCache`]), and the counters vLLM exports.
//!
//! A request's life, as [`SimEngine::admit`] and [`SimEngine::prefill`] drive it:
//! 1. it waits for a batch slot (counted in `waiting`);
//! 2. it waits in the prefill queue (still `waiting`), then the prefill task
//!    looks up its cached prefix, sleeps `prefill_ms(uncached)`, caches every
//!    full block of the prompt (publishing the events) and pins the blocks;
//! 3. it decodes (`running`) while the HTTP layer paces the output tokens;
//! 4. dropping its [`Admission`] (end, error or client gone) unpins the blocks
//!    and frees the slot.

use crate::error::BenchError;
use crate::timing::TimeModel;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use warmpath_core::prefix_cache::{CacheEvent, EngineBlockHash, PrefixCache};

/// Counters and gauges in vLLM's terms (see `/metrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineStats {
    /// Requests prefilling or decoding.
    pub running: u32,
    /// Requests admitted but not yet prefilling.
    pub waiting: u32,
    /// Cache usage, 0..=1.
    pub kv_usage: f64,
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries: u64,
    /// Of those, cached.
    pub prefix_hits: u64,
    /// Prompt tokens processed.
    pub prompt_tokens: u64,
    /// Output tokens generated.
    pub generation_tokens: u64,
    /// Requests finished.
    pub requests: u64,
}

struct State {
    cache: PrefixCache<()>,
    stats: EngineStats,
    /// Admitted requests by id: whether prefill started, what they pin.
    tickets: HashMap<u64, Ticket>,
    next_id: u64,
}

#[derive(Default)]
struct Ticket {
    started: bool,
    pinned: Vec<EngineBlockHash>,
}

struct Job {
    id: u64,
    tokens: Vec<u32>,
    salt: Option<String>,
    done: oneshot::Sender<usize>,
}

/// A simulated engine; share it behind an `Arc`.
#[derive(Debug)]
pub struct SimEngine {
    time: TimeModel,
    state: Arc<Mutex<State>>,
    slots: Arc<Semaphore>,
    queue: mpsc::Sender<Job>,
    num_blocks: usize,
    block_size: usize,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").field("stats", &self.stats).finish()
    }
}

/// A request's place in the engine; dropping it (end, error or client gone)
/// unpins its blocks and frees its slot. All bookkeeping happens under the
/// engine's one lock, so a drop racing the prefill task is consistent.
#[derive(Debug)]
pub struct Admission {
    state: Arc<Mutex<State>>,
    _slot: OwnedSemaphorePermit,
    id: u64,
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut s = self.state.lock();
        let Some(t) = s.tickets.remove(&self.id) else {
            return;
        };
        for h in &t.pinned {
            s.cache.unpin(*h);
        }
        if t.started {
            s.stats.running = s.stats.running.saturating_sub(1);
        } else {
            s.stats.waiting = s.stats.waiting.saturating_sub(1);
        }
    }
}

impl SimEngine {
    /// Starts an engine whose prefill task lives until `shutdown`; cache
    /// events go to `events` (bounded; the prefill task waits for room).
    pub fn start(
        time: TimeModel,
        block_size: usize,
        num_blocks: usize,
        max_queue: usize,
        events: mpsc::Sender<Vec<CacheEvent>>,
        shutdown: CancellationToken,
    ) -> Result<Arc<Self>, BenchError> {
        time.validate()?;
        let state = Arc::new(Mutex::new(State {
            cache: PrefixCache::new(block_size, num_blocks)?,
            stats: EngineStats::default(),
            tickets: HashMap::new(),
            next_id: 0,
        }));
        let (tx, rx) = mpsc::channel(max_queue.max(1));
        tokio::spawn(prefill_loop(
            time.clone(),
            state.clone(),
            rx,
            events,
            shutdown,
        ));
        Ok(Arc::new(SimEngine {
            slots: Arc::new(Semaphore::new(time.max_batch as usize)),
            time,
            state,
            queue: tx,
            num_blocks,
            block_size,
        }))
    }

    /// The time model.
    pub fn time(&self) -> &TimeModel {
        &self.time
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Capacity in blocks.
    pub fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    /// Current counters.
    pub fn stats(&self) -> EngineStats {
        let s = self.state.lock();
        EngineStats {
            kv_usage: s.cache.usage(),
            prefix_queries: s.cache.stats().queried_tokens,
            prefix_hits: s.cache.stats().hit_tokens,
            ..s.stats
        }
    }

    /// Waits for a batch slot. Counted as waiting until its prefill starts.
    pub async fn admit(&self) -> Result<Admission, BenchError> {
        let id = {
            let mut s = self.state.lock();
            s.next_id += 1;
            let id = s.next_id;
            s.tickets.insert(id, Ticket::default());
            s.stats.waiting += 1;
            id
        };
        match self.slots.clone().acquire_owned().await {
            Ok(slot) => Ok(Admission {
                state: self.state.clone(),
                _slot: slot,
                id,
            }),
            Err(_) => {
                let mut s = self.state.lock();
                s.tickets.remove(&id);
                s.stats.waiting = s.stats.waiting.saturating_sub(1);
                Err(BenchError::Component {
                    what: "simulated engine".into(),
                    reason: "shutting down".into(),
                })
            }
        }
    }

    /// Queues the prompt for prefill and waits until it is done; returns the
    /// cached tokens. The request counts as `running` from its prefill on.
    pub async fn prefill(
        &self,
        adm: &Admission,
        tokens: Vec<u32>,
        salt: Option<String>,
    ) -> Result<usize, BenchError> {
        let (done, rx) = oneshot::channel();
        let gone = || BenchError::Component {
            what: "simulated engine".into(),
            reason: "the prefill task has stopped".into(),
        };
        let job = Job {
            id: adm.id,
            tokens,
            salt,
            done,
        };
        self.queue.send(job).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())
    }

    /// Counts a finished request and its output tokens.
    pub fn finished(&self, prompt_tokens: usize, output_tokens: usize) {
        let mut s = self.state.lock();
        s.stats.requests += 1;
        s.stats.prompt_tokens += prompt_tokens as u64;
        s.stats.generation_tokens += output_tokens as u64;
    }

    /// Drops every cached block (vLLM's `reset_prefix_cache`); refused while
    /// requests hold blocks.
    pub async fn reset(&self, events: &mpsc::Sender<Vec<CacheEvent>>) -> Result<(), BenchError> {
        let evs = self.state.lock().cache.clear()?;
        events.send(evs).await.map_err(|_| BenchError::Component {
            what: "kv event publisher".into(),
            reason: "stopped".into(),
        })
    }
}

async fn prefill_loop(
    time: TimeModel,
    state: Arc<Mutex<State>>,
    mut rx: mpsc::Receiver<Job>,
    events: mpsc::Sender<Vec<CacheEvent>>,
    shutdown: CancellationToken,
) {
    loop {
        let job = tokio::select! {
            _ = shutdown.cancelled() => break,
            j = rx.recv() => match j { Some(j) => j, None => break },
        };
        let cached = {
            let mut s = state.lock();
            let Some(t) = s.tickets.get_mut(&job.id) else {
                // The client left while queued: skip the work.
                continue;
            };
            t.started = true;
            s.stats.waiting = s.stats.waiting.saturating_sub(1);
            s.stats.running += 1;
            s.cache
                .lookup(&job.tokens, job.salt.as_deref())
                .cached_tokens
        };
        let ms = time.prefill_ms(job.tokens.len().saturating_sub(cached));
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(Duration::from_secs_f64(ms / 1000.0)) => {}
        }
        let evs = {
            let mut s = state.lock();
            // vLLM keeps the computed blocks even when the request is aborted.
            let out = s.cache.insert(&job.tokens, job.salt.as_deref(), |_| ());
            if s.tickets.contains_key(&job.id) {
                let hashes = s.cache.block_hashes(&job.tokens, job.salt.as_deref());
                let pinned: Vec<_> = hashes.into_iter().take(out.cached_blocks).collect();
                for h in &pinned {
                    s.cache.pin(*h);
                }
                if let Some(t) = s.tickets.get_mut(&job.id) {
                    t.pinned = pinned;
                }
            }
            out.events
        };
        if !evs.is_empty() && events.send(evs).await.is_err() {
            tracing::warn!("kv event publisher stopped; events dropped");
        }
        // A failed send means the client left; its Admission cleans up.
        let _ = job.done.send(cached);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn engine(blocks: usize) -> (Arc<SimEngine>, mpsc::Receiver<Vec<CacheEvent>>) {
        let (tx, rx) = mpsc::channel(64);
        let time = TimeModel::default().scaled(1000.0);
        let e = SimEngine::start(time, 4, blocks, 16, tx, CancellationToken::new()).unwrap();
        (e, rx)
    }

    #[tokio::test]
    async fn second_request_hits_and_full_hit_recomputes_last_block() {
        let (e, mut events) = engine(100);
        let prompt: Vec<u32> = (0..16).collect();
        let a = e.admit().await.unwrap();
        assert_eq!(e.stats().waiting, 1);
        assert_eq!(e.prefill(&a, prompt.clone(), None).await.unwrap(), 0);
        assert_eq!(e.stats().running, 1);
        drop(a);
        assert_eq!(e.stats().running, 0);
        match &events.recv().await.unwrap()[0] {
            CacheEvent::BlockStored { block_hashes, .. } => assert_eq!(block_hashes.len(), 4),
            other => panic!("{other:?}"),
        }
        // Same 16 tokens: 4 blocks cached, but the last one is recomputed.
        let b = e.admit().await.unwrap();
        assert_eq!(e.prefill(&b, prompt.clone(), None).await.unwrap(), 12);
        drop(b);
        // A different salt shares nothing.
        let c = e.admit().await.unwrap();
        assert_eq!(e.prefill(&c, prompt, Some("acme".into())).await.unwrap(), 0);
        let s = e.stats();
        assert_eq!(s.prefix_queries, 48);
        assert_eq!(s.prefix_hits, 12);
        // Blocks are pinned while a request runs: reset is refused.
        assert!(e.reset(&mpsc::channel(1).0).await.is_err());
        drop(c);
        let (tx, mut rx) = mpsc::channel(1);
        e.reset(&tx).await.unwrap();
        assert_eq!(rx.recv().await.unwrap(), vec![CacheEvent::AllBlocksCleared]);
        assert_eq!(e.stats().kv_usage, 0.0);
    }

    #[tokio::test]
    async fn a_request_dropped_while_queued_is_skipped() {
        let (e, _events) = engine(100);
        let a = e.admit().await.unwrap();
        drop(a);
        let s = e.stats();
        assert_eq!((s.waiting, s.running), (0, 0));
        let b = e.admit().await.unwrap();
        assert_eq!(e.prefill(&b, (0..8).collect(), None).await.unwrap(), 0);
    }
}

//! One simulated engine: admission into a batch of `max_batch`, one FIFO
//! prefill queue served by one task, a prefix cache with vLLM's semantics,
//! and the counters vLLM exports. Blocks that decode fills are cached and
//! published as they fill, as vLLM's `allocate_slots` does. Every cache change
//! and its events happen under one async lock, so the event stream is in the
//! cache's order even when many requests decode at once.

use crate::error::{component, BenchError};
use crate::timing::TimeModel;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use warmpath_core::prefix_cache::{CacheEvent, EngineBlockHash, PrefixCache};
use warmpath_openai::vllm_metrics::Totals;
use warmpath_openai::VllmStats;

struct State {
    cache: PrefixCache<()>,
    /// In vLLM's terms; the cache's gauges are read when asked.
    stats: VllmStats,
    /// Admitted requests by id: whether prefill started, what they pin.
    tickets: HashMap<u64, Ticket>,
    next_id: u64,
}

#[derive(Default)]
struct Ticket {
    started: bool,
    /// The request's `cache_salt` (known once its prefill starts).
    salt: Option<String>,
    /// Its cached blocks, in order (pinned while it runs).
    pinned: Vec<EngineBlockHash>,
}

struct Job {
    id: u64,
    tokens: Vec<u32>,
    salt: Option<String>,
    /// Gets the prompt tokens served from the cache.
    done: oneshot::Sender<usize>,
}

#[derive(Debug)]
pub struct SimEngine {
    pub(super) time: TimeModel,
    state: Arc<Mutex<State>>,
    slots: Arc<Semaphore>,
    queue: mpsc::Sender<Job>,
    events: mpsc::Sender<Vec<CacheEvent>>,
    /// Held while the cache changes and its events are sent.
    publish: Arc<tokio::sync::Mutex<()>>,
    pub(super) num_blocks: usize,
    pub(super) block_size: usize,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").field("stats", &self.stats).finish()
    }
}

/// A request's place in the engine; dropping it (end, error or client gone)
/// unpins its blocks and frees its slot, under the engine's one lock.
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
    /// Starts an engine whose prefill task lives until `shutdown`.
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
            stats: VllmStats {
                totals: Some(Totals::default()),
                ..VllmStats::default()
            },
            tickets: HashMap::new(),
            next_id: 0,
        }));
        let (tx, rx) = mpsc::channel(max_queue.max(1));
        let publish = Arc::new(tokio::sync::Mutex::new(()));
        tokio::spawn(prefill_loop(
            time.clone(),
            state.clone(),
            rx,
            (events.clone(), publish.clone()),
            shutdown,
        ));
        Ok(Arc::new(SimEngine {
            slots: Arc::new(Semaphore::new(time.max_batch as usize)),
            time,
            state,
            queue: tx,
            events,
            publish,
            num_blocks,
            block_size,
        }))
    }

    pub fn stats(&self) -> VllmStats {
        let s = self.state.lock();
        VllmStats {
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
        // The semaphore is never closed, so acquiring cannot fail.
        let slot = self.slots.clone().acquire_owned().await;
        let _slot = slot.map_err(|_| component("simulated engine", "closed"))?;
        let state = self.state.clone();
        Ok(Admission { state, _slot, id })
    }

    /// Queues the prompt for prefill and waits until it is done; returns the
    /// prompt tokens served from the cache.
    pub async fn prefill(
        &self,
        adm: &Admission,
        tokens: Vec<u32>,
        salt: Option<String>,
    ) -> Result<usize, BenchError> {
        let (done, rx) = oneshot::channel();
        let gone = || component("simulated engine", "the prefill task has stopped");
        let job = Job {
            id: adm.id,
            tokens,
            salt,
            done,
        };
        self.queue.send(job).await.map_err(|_| gone())?;
        rx.await.map_err(|_| gone())
    }

    /// Decode has computed the KV of `computed`: caches, pins and publishes
    /// the blocks that became full since the last call, chained on the
    /// request's earlier ones, as vLLM does; nothing for a request not running.
    pub async fn decoded(&self, adm: &Admission, computed: &[u32]) -> Result<(), BenchError> {
        let full = computed.len() / self.block_size;
        let _order = self.publish.lock().await;
        let evs = {
            let mut guard = self.state.lock();
            let s = &mut *guard;
            let Some(t) = s.tickets.get_mut(&adm.id) else {
                return Ok(());
            };
            if !t.started || full <= t.pinned.len() {
                return Ok(());
            }
            let out = s.cache.insert(computed, t.salt.as_deref(), |_| ());
            let hashes = s
                .cache
                .block_hashes(&computed[..full * self.block_size], t.salt.as_deref());
            for h in hashes.iter().take(out.cached_blocks).skip(t.pinned.len()) {
                s.cache.pin(*h);
                t.pinned.push(*h);
            }
            out.events
        };
        if !evs.is_empty() {
            self.events.send(evs).await.map_err(|_| publisher_gone())?;
        }
        Ok(())
    }

    pub fn finished(&self, prompt_tokens: usize, output_tokens: usize) {
        let mut s = self.state.lock();
        let t = s.stats.totals.get_or_insert_default();
        t.requests += 1;
        t.prompt_tokens += prompt_tokens as u64;
        t.generation_tokens += output_tokens as u64;
    }

    /// Drops every cached block; refused while requests hold blocks.
    pub async fn reset(&self) -> Result<(), BenchError> {
        let _order = self.publish.lock().await;
        let evs = self.state.lock().cache.clear()?;
        self.events.send(evs).await.map_err(|_| publisher_gone())
    }
}

fn publisher_gone() -> BenchError {
    component("kv event publisher", "stopped")
}

async fn prefill_loop(
    time: TimeModel,
    state: Arc<Mutex<State>>,
    mut rx: mpsc::Receiver<Job>,
    (events, publish): (mpsc::Sender<Vec<CacheEvent>>, Arc<tokio::sync::Mutex<()>>),
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
            t.salt.clone_from(&job.salt);
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
        let order = publish.lock().await;
        let evs = {
            let mut guard = state.lock();
            let s = &mut *guard;
            // vLLM keeps the computed blocks even when the request is aborted.
            let out = s.cache.insert(&job.tokens, job.salt.as_deref(), |_| ());
            if let Some(t) = s.tickets.get_mut(&job.id) {
                let hashes = s.cache.block_hashes(&job.tokens, job.salt.as_deref());
                t.pinned = hashes.into_iter().take(out.cached_blocks).collect();
                for h in &t.pinned {
                    s.cache.pin(*h);
                }
            }
            out.events
        };
        if !evs.is_empty() && events.send(evs).await.is_err() {
            tracing::warn!("kv event publisher stopped; events dropped");
        }
        drop(order);
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
        assert!(e.reset().await.is_err());
        drop(c);
        e.reset().await.unwrap();
        let mut last = Vec::new();
        while let Ok(evs) = events.try_recv() {
            last = evs;
        }
        assert_eq!(last, vec![CacheEvent::AllBlocksCleared]);
        assert_eq!(e.stats().kv_usage, 0.0);
    }

    /// Blocks that decode fills are cached, pinned and published chained on
    /// the prompt's, so a next turn that resends prompt + answer hits them.
    #[tokio::test]
    async fn decoded_blocks_are_cached_and_published_as_they_fill() {
        let (e, mut events) = engine(100);
        let prompt: Vec<u32> = (0..6).collect();
        let a = e.admit().await.unwrap();
        e.prefill(&a, prompt.clone(), Some("s".into()))
            .await
            .unwrap();
        let first = match events.recv().await.unwrap().remove(0) {
            CacheEvent::BlockStored { block_hashes, .. } => block_hashes[0],
            other => panic!("{other:?}"),
        };
        // Two output tokens fed back: 8 tokens, block 1 is full.
        let mut seq = prompt.clone();
        seq.extend([100, 101]);
        e.decoded(&a, &seq[..7]).await.unwrap(); // not full yet: nothing
        e.decoded(&a, &seq).await.unwrap();
        match events.recv().await.unwrap().remove(0) {
            CacheEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                cache_salt,
                ..
            } => {
                assert_eq!(block_hashes.len(), 1);
                assert_eq!(parent_block_hash, Some(first));
                assert_eq!(token_ids, vec![4, 5, 100, 101]);
                assert_eq!(cache_salt, None);
            }
            other => panic!("{other:?}"),
        }
        // Calling again for the same length changes nothing.
        e.decoded(&a, &seq).await.unwrap();
        assert!(events.try_recv().is_err());
        // Pinned while the request runs, released after.
        assert!(e.reset().await.is_err());
        drop(a);
        // The next turn: prompt + answer + more hits both blocks.
        let mut next = seq.clone();
        next.extend([7, 7, 7]);
        let b = e.admit().await.unwrap();
        let p = e.prefill(&b, next, Some("s".into())).await.unwrap();
        assert_eq!(p, 8);
        // Not for a request that is not running.
        drop(b);
        let c = e.admit().await.unwrap();
        e.decoded(&c, &[9; 12]).await.unwrap();
        assert!(events.try_recv().is_err());
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

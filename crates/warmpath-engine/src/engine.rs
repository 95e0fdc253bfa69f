//! The engine proper: a model plus a block-level prefix cache of K/V. Each request
//! reuses its longest cached prefix (whole blocks, under its `cache_salt`),
//! prefills the rest in chunks, stores every full prompt block and decodes
//! greedily; decoded tokens are not cached.

use crate::error::EngineError;
use crate::kv::KvState;
use crate::model::Llama;
use candle_core::Tensor;
use std::time::Instant;
use warmpath_core::prefix_cache::{CacheEvent, PrefixCache};

/// Receives the cache's events, in order (e.g. a vLLM-style ZMQ publisher).
pub trait EventSink: Send {
    /// Called with every non-empty batch of changes.
    fn publish(&mut self, events: Vec<CacheEvent>);
}

/// Drops every event.
#[derive(Debug, Default)]
pub struct NoEvents;

impl EventSink for NoEvents {
    fn publish(&mut self, _events: Vec<CacheEvent>) {}
}

/// Sizing of the engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineOptions {
    /// Tokens per cache block (vLLM's default is 16).
    pub block_size: usize,
    pub cache_blocks: usize,
    /// Longest run of tokens prefilled in one forward pass.
    pub prefill_chunk: usize,
}

/// A prefilled prompt, ready to decode.
#[derive(Debug)]
pub struct Prefill {
    /// Logits of the last prompt position (f32, `[vocab]`).
    pub logits: Tensor,
    /// K/V of every prompt position.
    pub past: KvState,
    pub cached_tokens: usize,
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Finish {
    /// A stop token was produced (not in the output).
    Stop,
    Length,
    Cancelled,
}

impl Finish {
    /// OpenAI's `finish_reason` (`None` for a cancelled request).
    pub fn reason(self) -> Option<&'static str> {
        match self {
            Finish::Stop => Some("stop"),
            Finish::Length => Some("length"),
            Finish::Cancelled => None,
        }
    }
}

/// What [`Engine::generate`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub finish: Finish,
    /// Prompt tokens served from the cache.
    pub cached_tokens: usize,
}

/// The model and its prefix cache.
pub struct Engine {
    model: Llama,
    cache: PrefixCache<KvState>,
    options: EngineOptions,
    sink: Box<dyn EventSink>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("model", &self.model)
            .field("options", &self.options)
            .field("cached_blocks", &self.cache.len())
            .finish_non_exhaustive()
    }
}

/// Index of the largest value (the first one on ties).
pub fn argmax(logits: &Tensor) -> Result<u32, EngineError> {
    let v = logits.to_vec1::<f32>()?;
    let mut best = 0usize;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    Ok(best as u32)
}

impl Engine {
    /// An engine with an empty cache; events go to `sink`.
    pub fn new(
        model: Llama,
        options: EngineOptions,
        sink: Box<dyn EventSink>,
    ) -> Result<Self, EngineError> {
        if options.prefill_chunk == 0 {
            return Err(EngineError::BadRequest(
                "prefill_chunk must be at least 1".into(),
            ));
        }
        Ok(Engine {
            cache: PrefixCache::new(options.block_size, options.cache_blocks)?,
            model,
            options,
            sink,
        })
    }

    /// The prefix cache (read-only: contents, usage, counters).
    pub fn cache(&self) -> &PrefixCache<KvState> {
        &self.cache
    }

    /// Checks a prompt against the model before any work.
    pub fn check_prompt(&self, tokens: &[u32], max_tokens: usize) -> Result<(), EngineError> {
        let cfg = self.model.config();
        if tokens.is_empty() {
            return Err(EngineError::BadRequest("the prompt has no tokens".into()));
        }
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= cfg.vocab_size) {
            return Err(EngineError::BadRequest(format!(
                "token id {bad} is outside the vocabulary of {} ids",
                cfg.vocab_size
            )));
        }
        let total = tokens.len().saturating_add(max_tokens);
        if total > cfg.max_position_embeddings {
            return Err(EngineError::BadRequest(format!(
                "prompt ({} tokens) plus max_tokens ({max_tokens}) exceeds the model's context of {} tokens",
                tokens.len(),
                cfg.max_position_embeddings
            )));
        }
        Ok(())
    }

    /// Prefills `tokens`: reuses the longest cached prefix, computes the
    /// rest, stores every full block and publishes the resulting events.
    pub fn prefill(&mut self, tokens: &[u32], salt: Option<&str>) -> Result<Prefill, EngineError> {
        self.check_prompt(tokens, 0)?;
        let start = Instant::now();
        let m = self.cache.lookup(tokens, salt);
        let blocks: Vec<&KvState> = m.hashes[..m.cached_blocks]
            .iter()
            .map_while(|h| self.cache.get(*h))
            .collect();
        let cached_tokens = blocks.len() * self.options.block_size;
        let mut past = KvState::concat(&blocks)?;
        let mut logits = None;
        for chunk in tokens[cached_tokens..].chunks(self.options.prefill_chunk) {
            let (l, kv) = self.model.forward(chunk, &past)?;
            past = KvState::concat(&[&past, &kv])?;
            logits = Some(l);
        }
        let logits = logits.ok_or_else(|| {
            EngineError::BadRequest("nothing left to prefill (empty prompt)".into())
        })?;
        let bs = self.options.block_size;
        let out = self
            .cache
            .try_insert(tokens, salt, |i| past.slice_copy(i * bs, bs))?;
        if !out.events.is_empty() {
            self.sink.publish(out.events);
        }
        let seconds = start.elapsed().as_secs_f64();
        metrics::counter!("warmpath_engine_prefill_tokens_total")
            .increment((tokens.len() - cached_tokens) as u64);
        metrics::counter!("warmpath_engine_cached_tokens_total").increment(cached_tokens as u64);
        metrics::histogram!("warmpath_engine_prefill_seconds").record(seconds);
        let (prompt, cached, stored) = (tokens.len(), cached_tokens, out.stored);
        tracing::debug!(prompt, cached, stored, seconds, "prefill");
        Ok(Prefill {
            logits,
            past,
            cached_tokens,
        })
    }

    /// Prefills, then decodes greedily up to `max_tokens`, stopping at any of
    /// `stop_ids`. `on_token` sees each token as it is produced; returning
    /// false (the client left) stops the work.
    pub fn generate(
        &mut self,
        tokens: &[u32],
        salt: Option<&str>,
        max_tokens: usize,
        stop_ids: &[u32],
        mut on_token: impl FnMut(u32) -> bool,
    ) -> Result<Generation, EngineError> {
        self.check_prompt(tokens, max_tokens)?;
        let Prefill {
            mut logits,
            mut past,
            cached_tokens,
            ..
        } = self.prefill(tokens, salt)?;
        let mut out = Vec::new();
        let finish = loop {
            if out.len() >= max_tokens {
                break Finish::Length;
            }
            let next = argmax(&logits)?;
            if stop_ids.contains(&next) {
                break Finish::Stop;
            }
            out.push(next);
            if !on_token(next) {
                break Finish::Cancelled;
            }
            if out.len() >= max_tokens {
                break Finish::Length;
            }
            let (l, kv) = self.model.forward(&[next], &past)?;
            past = KvState::concat(&[&past, &kv])?;
            logits = l;
        };
        metrics::counter!("warmpath_engine_generated_tokens_total").increment(out.len() as u64);
        Ok(Generation {
            tokens: out,
            finish,
            cached_tokens,
        })
    }

    /// Drops the whole cache (vLLM's `/reset_prefix_cache`) and publishes
    /// AllBlocksCleared.
    pub fn reset_cache(&mut self) -> Result<(), EngineError> {
        let events = self.cache.clear()?;
        self.sink.publish(events);
        Ok(())
    }
}

//! The HTTP face of one simulated instance: the shared vLLM-compatible server
//! ([`warmpath_openai`]) over a [`SimEngine`].

use super::engine::{Admission, SimEngine};
use super::output::{Output, OutputVocab};
use axum::http::StatusCode;
use futures::StreamExt as _;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use warmpath_core::tokenize::ChatTokenizer;
use warmpath_openai::{ApiError, Backend, Generation, Item, Job, ServerConfig, VllmStats};

/// Context length (prompt plus output), in tokens (vLLM's `max_model_len`).
pub(super) const MAX_MODEL_LEN: usize = 65_536;
/// Output tokens when the request does not say.
pub(super) const DEFAULT_MAX_TOKENS: usize = 16;

#[derive(Debug)]
pub(crate) struct AppState {
    pub(crate) config: ServerConfig,
    pub(crate) engine: Arc<SimEngine>,
    pub(crate) tokenizer: Arc<ChatTokenizer>,
    pub(crate) output: Arc<OutputVocab>,
    pub(crate) shutdown: CancellationToken,
}

fn unavailable(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string())
}

impl Backend for AppState {
    const HTTP_ERRORS: &'static str = "warmpath_sim_http_errors_total";

    fn config(&self) -> &ServerConfig {
        &self.config
    }

    fn tokenizer(&self) -> &ChatTokenizer {
        &self.tokenizer
    }

    fn generate(&self, job: Job) -> impl Future<Output = Result<Generation, ApiError>> + Send {
        let (engine, output) = (self.engine.clone(), self.output.clone());
        let shutdown = self.shutdown.clone();
        async move {
            let adm = engine.admit().await.map_err(unavailable)?;
            let (tx, rx) = mpsc::channel::<Item>(16);
            // Owned by the generation: it ends when the receiver is dropped
            // (a send fails) or on shutdown.
            tokio::spawn(async move {
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = produce(&engine, &output, adm, job, tx) => {}
                }
            });
            Ok(ReceiverStream::new(rx).boxed())
        }
    }

    async fn reset(&self) -> Result<(), ApiError> {
        self.engine
            .reset()
            .await
            .map_err(|e| ApiError::new(StatusCode::CONFLICT, e.to_string()))
    }

    fn stats(&self) -> VllmStats {
        self.engine.stats()
    }
}

/// Prefills, then decodes the output into `tx`; stops when the client left.
async fn produce(
    engine: &SimEngine,
    output: &OutputVocab,
    adm: Admission,
    job: Job,
    tx: mpsc::Sender<Item>,
) {
    let (prompt_len, max_tokens) = (job.tokens.len(), job.max_tokens);
    let seed = (job.tokens.iter()).fold(0u64, |a, t| a.rotate_left(5) ^ u64::from(*t));
    let prompt = job.tokens.clone();
    let cached = match engine.prefill(&adm, job.tokens, job.salt).await {
        Ok(cached) => cached,
        Err(e) => {
            let _ = tx.send(Item::Failed(unavailable(e))).await;
            return;
        }
    };
    let out = output.generate(seed, max_tokens);
    if !decode(engine, &adm, prompt, &out, &tx).await {
        return;
    }
    engine.finished(prompt_len, max_tokens);
    drop(adm);
    let _ = tx
        .send(Item::Done {
            finish: Some("length"),
            completion_tokens: max_tokens,
            cached_tokens: cached,
        })
        .await;
}

/// Decodes `out` after the prefill, one token per step, each sent to `tx`
/// (failing when the client left). Step `i` feeds token `i - 1` back, caching
/// every block that fills (the last token's KV is never computed, as in
/// vLLM). Returns whether every token was emitted.
async fn decode(
    engine: &SimEngine,
    adm: &Admission,
    prompt: Vec<u32>,
    out: &Output,
    tx: &mpsc::Sender<Item>,
) -> bool {
    let bs = engine.block_size;
    let step = Duration::from_secs_f64(engine.time.decode_step_ms / 1000.0);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + step, step);
    let mut seq = prompt;
    seq.reserve(out.ids.len());
    for (i, piece) in out.pieces.iter().enumerate() {
        if i > 0 {
            tick.tick().await;
            seq.push(out.ids[i - 1]);
            if seq.len().is_multiple_of(bs) {
                if let Err(e) = engine.decoded(adm, &seq).await {
                    tracing::warn!(error = %e, "caching a decoded block failed");
                }
            }
        }
        if tx.send(Item::Text(piece.clone())).await.is_err() {
            return false;
        }
    }
    true
}

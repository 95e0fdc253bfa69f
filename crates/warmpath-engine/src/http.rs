//! The engine behind the shared vLLM-compatible server ([`warmpath_openai`]):
//! only what the engine does differently (the worker queue, stop ids,
//! incremental detokenization, its own `warmpath_*` metrics).

use crate::detok::IncrementalText;
use crate::error::EngineError;
use crate::worker::{EngineHandle, GenerateRequest, StreamItem};
use axum::http::StatusCode;
use axum::Router;
use futures::{stream, StreamExt as _};
use metrics_exporter_prometheus::PrometheusHandle;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use warmpath_core::tokenize::ChatTokenizer;
use warmpath_openai::{ApiError, Backend, Generation, Item, Job, VllmStats};

pub use warmpath_openai::ServerConfig;

/// What the handlers need; `prometheus` (if any) renders the process's
/// `warmpath_*` metrics below the vLLM ones.
#[derive(Debug)]
pub struct AppState {
    pub engine: EngineHandle,
    pub tokenizer: Arc<ChatTokenizer>,
    pub stop_ids: Vec<u32>,
    pub config: ServerConfig,
    pub prometheus: Option<PrometheusHandle>,
}

pub fn router(state: AppState) -> Router {
    warmpath_openai::router(Arc::new(state))
}

/// The status an engine error answers with.
fn api_error(e: EngineError) -> ApiError {
    let status = if e.is_client_error() {
        StatusCode::BAD_REQUEST
    } else if matches!(e, EngineError::Busy(_) | EngineError::WorkerGone) {
        StatusCode::SERVICE_UNAVAILABLE
    } else if e.is_retryable() {
        StatusCode::CONFLICT
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    ApiError::new(status, e.to_string())
}

impl Backend for AppState {
    const HTTP_ERRORS: &'static str = "warmpath_engine_http_errors_total";

    fn config(&self) -> &ServerConfig {
        &self.config
    }

    fn tokenizer(&self) -> &ChatTokenizer {
        &self.tokenizer
    }

    fn generate(&self, job: Job) -> impl Future<Output = Result<Generation, ApiError>> + Send {
        metrics::counter!("warmpath_engine_requests_total", "kind" => job.kind.name()).increment(1);
        let rx = self.engine.generate(GenerateRequest {
            tokens: job.tokens,
            salt: job.salt,
            max_tokens: job.max_tokens,
            stop_ids: self.stop_ids.clone(),
        });
        let tokenizer = self.tokenizer.clone();
        std::future::ready(rx.map(|rx| texts(rx, tokenizer)).map_err(api_error))
    }

    async fn reset(&self) -> Result<(), ApiError> {
        self.engine.reset_prefix_cache().await.map_err(api_error)?;
        tracing::info!("prefix cache reset");
        Ok(())
    }

    fn stats(&self) -> VllmStats {
        let st = self.engine.stats();
        let blocks = self.config.cache_blocks;
        VllmStats {
            running: st.running,
            waiting: st.waiting,
            kv_usage: if blocks == 0 {
                0.0
            } else {
                st.used_blocks as f64 / blocks as f64
            },
            prefix_queries: st.queried_tokens,
            prefix_hits: st.hit_tokens,
            totals: None,
        }
    }

    fn extra_metrics(&self) -> String {
        self.prometheus
            .as_ref()
            .map(PrometheusHandle::render)
            .unwrap_or_default()
    }
}

/// The worker's token ids as text pieces. Dropping the stream drops the
/// worker's receiver, which stops the request at its next token.
fn texts(rx: mpsc::Receiver<StreamItem>, tokenizer: Arc<ChatTokenizer>) -> Generation {
    let mut text = IncrementalText::default();
    let mut ids = Vec::new();
    // The worker sends `Done` or `Failed` last, then drops its sender.
    ReceiverStream::new(rx)
        .flat_map(move |item| {
            let (last, done) = match item {
                StreamItem::Token(t) => {
                    ids.push(t);
                    (false, None)
                }
                StreamItem::Done(g) => {
                    let done = Item::Done {
                        finish: g.finish.reason(),
                        completion_tokens: g.tokens.len(),
                        cached_tokens: g.cached_tokens,
                    };
                    (true, Some(done))
                }
                StreamItem::Failed(e) => return stream::iter(vec![Item::Failed(api_error(e))]),
            };
            let piece = text.advance(&tokenizer, &ids, last);
            let piece = (!piece.is_empty()).then_some(Item::Text(piece));
            stream::iter(piece.into_iter().chain(done).collect::<Vec<_>>())
        })
        .boxed()
}

//! The routes and what every backend shares: request validation, the
//! non-streamed answer and the SSE relay. A backend supplies only
//! [`Backend`]: its limits, tokenizer, generation, reset and statistics.

use crate::body::{now, Kind, Meta};
use crate::error::ApiError;
use crate::vllm_metrics::{self, VllmStats};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::channel::mpsc;
use futures::stream::BoxStream;
use futures::{SinkExt as _, StreamExt as _};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use warmpath_core::request::{Expect, Request};
use warmpath_core::tokenize::ChatTokenizer;

/// What the server reports and enforces.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The model name served (`model` must match it).
    pub model_name: String,
    /// Context length: prompt plus requested output tokens (vLLM's
    /// `max_model_len`).
    pub max_model_len: usize,
    /// Tokens per cache block (for `vllm:cache_config_info`).
    pub block_size: usize,
    /// Cache capacity in blocks (for `vllm:cache_config_info`).
    pub cache_blocks: usize,
    /// `max_tokens` when the request gives none.
    pub default_max_tokens: usize,
}

/// One validated request, handed to [`Backend::generate`].
#[derive(Debug)]
pub struct Job {
    pub kind: Kind,
    /// The prompt's token ids (chat template applied).
    pub tokens: Vec<u32>,
    /// vLLM's `cache_salt` (1 to 1024 characters).
    pub salt: Option<String>,
    pub max_tokens: usize,
}

/// What a generation yields: text pieces, then one `Done` or `Failed`.
#[derive(Debug)]
pub enum Item {
    /// The next piece of output text (each is one streamed chunk).
    Text(String),
    /// The end, with vLLM's `finish_reason` and the usage counts.
    Done {
        /// `finish_reason` (`"length"`, `"stop"`).
        finish: Option<&'static str>,
        completion_tokens: usize,
        /// Prompt tokens served from the prefix cache.
        cached_tokens: usize,
    },
    /// The generation failed after it started.
    Failed(ApiError),
}

/// A running generation. Dropping it is how the server says the client left:
/// the backend stops working on it.
pub type Generation = BoxStream<'static, Item>;

/// What differs between the engine and the simulator.
pub trait Backend: Send + Sync + 'static {
    /// The counter of error answers, labelled by `status`.
    const HTTP_ERRORS: &'static str;

    /// Limits and names.
    fn config(&self) -> &ServerConfig;

    /// The model's chat tokenizer.
    fn tokenizer(&self) -> &ChatTokenizer;

    /// Admits `job` and starts generating (an error here is the answer).
    fn generate(&self, job: Job) -> impl Future<Output = Result<Generation, ApiError>> + Send;

    /// Empties the prefix cache (`POST /reset_prefix_cache`).
    fn reset(&self) -> impl Future<Output = Result<(), ApiError>> + Send;

    /// The figures behind `/metrics`.
    fn stats(&self) -> VllmStats;

    /// More Prometheus text, rendered below vLLM's metrics.
    fn extra_metrics(&self) -> String {
        String::new()
    }
}

/// The axum router with every endpoint.
pub fn router<B: Backend>(backend: Arc<B>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(generate::<B, true>))
        .route("/v1/completions", post(generate::<B, false>))
        .route("/v1/models", get(models::<B>))
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/metrics", get(metrics_text::<B>))
        .route("/reset_prefix_cache", post(reset::<B>))
        .with_state(backend)
}

/// Counts an error answer, then renders either.
fn answer<B: Backend>(r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(|e| {
        metrics::counter!(B::HTTP_ERRORS, "status" => e.status().as_u16().to_string()).increment(1);
        e.into_response()
    })
}

async fn generate<B: Backend, const CHAT: bool>(State(b): State<Arc<B>>, body: Bytes) -> Response {
    let kind = if CHAT { Kind::Chat } else { Kind::Completion };
    answer::<B>(serve(&*b, &body, kind).await)
}

/// The fields the request reader leaves to the server.
#[derive(serde::Deserialize)]
struct Extras {
    n: Option<Value>,
    stream_options: Option<Value>,
}

/// Everything a request asks for, validated.
struct Parsed {
    job: Job,
    stream: bool,
    include_usage: bool,
}

fn parse<B: Backend>(b: &B, body: &[u8], kind: Kind) -> Result<Parsed, ApiError> {
    let extras: Extras = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("the request body is not valid JSON: {e}")))?;
    let expect = match kind {
        Kind::Chat => Expect::Chat,
        Kind::Completion => Expect::Completion,
    };
    let req = Request::parse(body, expect).map_err(|e| ApiError::bad(e.to_string()))?;
    let cfg = b.config();
    if req.model != cfg.model_name {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("The model `{}` does not exist.", req.model),
        ));
    }
    let n = extras.n.as_ref().and_then(Value::as_u64);
    if n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad("only n = 1 is supported"));
    }
    let salt = match req.cache_salt.as_deref() {
        Some(s) if s.is_empty() || s.chars().count() > 1024 => {
            return Err(ApiError::bad("cache_salt must be 1 to 1024 characters"))
        }
        other => other.map(str::to_owned),
    };
    let max_tokens = req
        .max_tokens
        .map_or(cfg.default_max_tokens, |m| m as usize);
    if max_tokens == 0 {
        return Err(ApiError::bad("max_tokens must be at least 1"));
    }
    let tokens = b.tokenizer().encode_request(&req).map_err(|e| {
        if e.is_client_error() {
            ApiError::bad(e.to_string())
        } else {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        }
    })?;
    if tokens.is_empty() {
        return Err(ApiError::bad("the prompt is empty"));
    }
    if tokens.len() + max_tokens > cfg.max_model_len {
        return Err(ApiError::bad(format!(
            "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the prompt, {} for the completion).",
            cfg.max_model_len,
            tokens.len() + max_tokens,
            tokens.len(),
            max_tokens
        )));
    }
    let include_usage = extras
        .stream_options
        .as_ref()
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(Parsed {
        job: Job {
            kind,
            tokens,
            salt,
            max_tokens,
        },
        stream: req.stream,
        include_usage,
    })
}

async fn serve<B: Backend>(b: &B, body: &[u8], kind: Kind) -> Result<Response, ApiError> {
    let p = parse(b, body, kind)?;
    let meta = Meta::new(kind, &b.config().model_name, p.job.tokens.len());
    let generation = b.generate(p.job).await?;
    if p.stream {
        Ok(stream(generation, meta, p.include_usage).into_response())
    } else {
        collect(generation, meta).await
    }
}

/// The whole answer, once the generation is done.
async fn collect(mut generation: Generation, meta: Meta) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(item) = generation.next().await {
        match item {
            Item::Text(piece) => text.push_str(&piece),
            Item::Done {
                finish,
                completion_tokens,
                cached_tokens,
            } => {
                let usage = meta.usage(completion_tokens, cached_tokens);
                return Ok(Json(meta.full(&text, finish, usage)).into_response());
            }
            Item::Failed(e) => return Err(e),
        }
    }
    Err(stopped())
}

fn stopped() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the engine stopped before the answer was complete",
    )
}

/// Streams server-sent events. The relay task is owned by the response: when
/// the client goes away a send fails, the relay ends and drops the
/// generation, which stops the backend's work on it.
fn stream(generation: Generation, meta: Meta, include_usage: bool) -> impl IntoResponse {
    let (tx, rx) = mpsc::channel::<Event>(16);
    tokio::spawn(relay(generation, meta, include_usage, tx));
    Sse::new(rx.map(Ok::<_, Infallible>))
}

async fn relay(
    mut generation: Generation,
    meta: Meta,
    include_usage: bool,
    mut tx: mpsc::Sender<Event>,
) {
    let ev = |v: Value| Event::default().data(v.to_string());
    let done = || Event::default().data("[DONE]");
    let mut first = true;
    while let Some(item) = generation.next().await {
        let (events, last) = match item {
            Item::Text(piece) => {
                let e = ev(meta.chunk(&piece, first, None));
                first = false;
                (vec![e], false)
            }
            Item::Done {
                finish,
                completion_tokens,
                cached_tokens,
            } => {
                let mut tail = vec![ev(meta.chunk("", false, finish))];
                if include_usage {
                    let usage = meta.usage(completion_tokens, cached_tokens);
                    tail.push(ev(meta.usage_chunk(usage)));
                }
                tail.push(done());
                (tail, true)
            }
            Item::Failed(e) => {
                let body = json!({"error": {"message": e.message(), "code": e.status().as_u16()}});
                (vec![ev(body), done()], true)
            }
        };
        for e in events {
            if tx.send(e).await.is_err() {
                return; // the client left
            }
        }
        if last {
            return;
        }
    }
    // The backend ended without an answer (shut down): say so, then end.
    let _ = tx
        .send(ev(json!({"error": {"message": stopped().message()}})))
        .await;
}

async fn models<B: Backend>(State(b): State<Arc<B>>) -> Json<Value> {
    let c = b.config();
    Json(json!({"object": "list", "data": [{
        "id": c.model_name, "object": "model", "created": now(), "owned_by": "vllm",
        "root": c.model_name, "parent": null, "max_model_len": c.max_model_len,
    }]}))
}

async fn reset<B: Backend>(State(b): State<Arc<B>>) -> Response {
    answer::<B>(b.reset().await.map(|()| StatusCode::OK.into_response()))
}

async fn metrics_text<B: Backend>(State(b): State<Arc<B>>) -> Response {
    let c = b.config();
    let mut out = vllm_metrics::render(&c.model_name, c.block_size, c.cache_blocks, &b.stats());
    out.push_str(&b.extra_metrics());
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

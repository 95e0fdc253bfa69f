//! The OpenAI-compatible HTTP surface, shaped like vLLM's:
//! `POST /v1/chat/completions`, `POST /v1/completions` (streaming or not),
//! `GET /v1/models`, `GET /health`, `GET /metrics` (vLLM's metric names) and
//! `POST /reset_prefix_cache`.
//!
//! Request bodies are read with [`warmpath_core::request::Request`] (the same
//! reader the router uses) and tokenized with the model's chat template.
//! Generation is greedy; `max_tokens` defaults to [`ServerConfig::default_max_tokens`].

use crate::error::EngineError;
use crate::openai::{self, Kind};
use crate::worker::{EngineHandle, GenerateRequest, StreamItem};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use warmpath_core::request::{Expect, Request};
use warmpath_core::tokenize::ChatTokenizer;

/// What the HTTP layer reports and enforces.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The model name served (`model` must match it).
    pub model_name: String,
    /// Context length (prompt + generated tokens).
    pub max_model_len: usize,
    /// Tokens per cache block (for `vllm:cache_config_info`).
    pub block_size: usize,
    /// Cache capacity in blocks (for `vllm:cache_config_info`).
    pub cache_blocks: usize,
    /// `max_tokens` when the request gives none.
    pub default_max_tokens: usize,
}

struct Inner {
    engine: EngineHandle,
    tokenizer: Arc<ChatTokenizer>,
    stop_ids: Vec<u32>,
    config: ServerConfig,
    prometheus: Option<PrometheusHandle>,
}

/// Shared state of the handlers.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("config", &self.0.config)
            .finish_non_exhaustive()
    }
}

impl AppState {
    /// Bundles what the handlers need. `prometheus` (if any) renders the
    /// process's `warmpath_*` metrics below the vLLM ones.
    pub fn new(
        engine: EngineHandle,
        tokenizer: Arc<ChatTokenizer>,
        stop_ids: Vec<u32>,
        config: ServerConfig,
        prometheus: Option<PrometheusHandle>,
    ) -> Self {
        AppState(Arc::new(Inner {
            engine,
            tokenizer,
            stop_ids,
            config,
            prometheus,
        }))
    }
}

/// The axum router with every endpoint.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completion))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .route("/reset_prefix_cache", post(reset))
        .with_state(state)
}

/// An error answer in OpenAI's shape.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
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
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = if self.status.is_client_error() {
            "invalid_request_error"
        } else {
            "server_error"
        };
        metrics::counter!("warmpath_engine_http_errors_total", "status" => self.status.as_u16().to_string())
            .increment(1);
        let body =
            json!({"error": {"message": self.message, "type": kind, "code": self.status.as_u16()}});
        (self.status, Json(body)).into_response()
    }
}

async fn chat(State(s): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    generate(s, body, Kind::Chat).await
}

async fn completion(State(s): State<AppState>, body: Bytes) -> Result<Response, ApiError> {
    generate(s, body, Kind::Completion).await
}

/// Everything a request asks for, validated.
struct Parsed {
    tokens: Vec<u32>,
    salt: Option<String>,
    max_tokens: usize,
    stream: bool,
    include_usage: bool,
}

fn parse(s: &Inner, body: &[u8], kind: Kind) -> Result<Parsed, ApiError> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("request body is not valid JSON: {e}")))?;
    let expect = match kind {
        Kind::Chat => Expect::Chat,
        Kind::Completion => Expect::Completion,
    };
    let req = Request::from_value(&v, expect).map_err(|e| ApiError::bad(e.to_string()))?;
    if req.model != s.config.model_name {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("The model `{}` does not exist.", req.model),
        ));
    }
    if let Some(n) = v.get("n").and_then(Value::as_u64) {
        if n != 1 {
            return Err(ApiError::bad("only n = 1 is supported"));
        }
    }
    let salt = match req.cache_salt.as_deref() {
        Some("") => return Err(ApiError::bad("cache_salt must not be empty")),
        Some(x) if x.chars().count() > 1024 => {
            return Err(ApiError::bad("cache_salt must be at most 1024 characters"))
        }
        other => other.map(str::to_owned),
    };
    let tokens = s.tokenizer.encode_request(&req).map_err(|e| {
        if e.is_client_error() {
            ApiError::bad(e.to_string())
        } else {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        }
    })?;
    let max_tokens = req
        .max_tokens
        .map_or(s.config.default_max_tokens, |m| m as usize);
    let include_usage = v
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(Parsed {
        tokens,
        salt,
        max_tokens,
        stream: req.stream,
        include_usage,
    })
}

async fn generate(s: AppState, body: Bytes, kind: Kind) -> Result<Response, ApiError> {
    let p = parse(&s.0, &body, kind)?;
    let prompt_tokens = p.tokens.len();
    if prompt_tokens + p.max_tokens > s.0.config.max_model_len {
        return Err(ApiError::bad(format!(
            "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the prompt, {} for the completion).",
            s.0.config.max_model_len,
            prompt_tokens + p.max_tokens,
            prompt_tokens,
            p.max_tokens
        )));
    }
    metrics::counter!("warmpath_engine_requests_total", "kind" => kind.name()).increment(1);
    let rx = s.0.engine.generate(GenerateRequest {
        tokens: p.tokens,
        salt: p.salt,
        max_tokens: p.max_tokens,
        stop_ids: s.0.stop_ids.clone(),
    })?;
    let meta = openai::Meta::new(kind, &s.0.config.model_name, prompt_tokens);
    if p.stream {
        Ok(stream(s, rx, meta, p.include_usage).into_response())
    } else {
        collect(&s.0, rx, meta).await
    }
}

async fn collect(
    s: &Inner,
    mut rx: mpsc::Receiver<StreamItem>,
    meta: openai::Meta,
) -> Result<Response, ApiError> {
    let mut ids = Vec::new();
    while let Some(item) = rx.recv().await {
        match item {
            StreamItem::Token(t) => ids.push(t),
            StreamItem::Done {
                finish,
                cached_tokens,
                ..
            } => {
                let text =
                    s.tokenizer.tokenizer().decode(&ids, true).map_err(|e| {
                        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
                    })?;
                let usage = meta.usage(ids.len(), cached_tokens);
                return Ok(Json(meta.full(&text, finish.reason(), usage)).into_response());
            }
            StreamItem::Failed(e) => return Err(e.into()),
        }
    }
    Err(EngineError::WorkerGone.into())
}

/// Streams server-sent events. A relay task turns the worker's tokens into
/// events; when the client goes away the event channel closes, the relay
/// ends and drops the token receiver, which stops the worker.
fn stream(
    s: AppState,
    mut rx: mpsc::Receiver<StreamItem>,
    meta: openai::Meta,
    include_usage: bool,
) -> impl IntoResponse {
    let (tx, events) = mpsc::channel::<Result<Event, Infallible>>(16);
    tokio::spawn(async move {
        let send = |v: Value| {
            let tx = tx.clone();
            async move {
                tx.send(Ok(Event::default().data(v.to_string())))
                    .await
                    .is_ok()
            }
        };
        if meta.kind == Kind::Chat && !send(meta.chunk_role()).await {
            return;
        }
        let mut text = openai::IncrementalText::default();
        let mut ids = Vec::new();
        while let Some(item) = rx.recv().await {
            match item {
                StreamItem::Token(t) => {
                    ids.push(t);
                    let piece = text.advance(&s.0.tokenizer, &ids, false);
                    if !piece.is_empty() && !send(meta.chunk(&piece, None)).await {
                        return;
                    }
                }
                StreamItem::Done {
                    finish,
                    cached_tokens,
                    completion_tokens,
                } => {
                    let piece = text.advance(&s.0.tokenizer, &ids, true);
                    if !send(meta.chunk(&piece, finish.reason())).await {
                        return;
                    }
                    if include_usage {
                        let usage = meta.usage(completion_tokens, cached_tokens);
                        if !send(meta.usage_chunk(usage)).await {
                            return;
                        }
                    }
                    break;
                }
                StreamItem::Failed(e) => {
                    let _ =
                        send(json!({"error": {"message": e.to_string(), "type": "server_error"}}))
                            .await;
                    break;
                }
            }
        }
        let _ = tx.send(Ok(Event::default().data("[DONE]"))).await;
    });
    Sse::new(ReceiverStream::new(events))
}

async fn models(State(s): State<AppState>) -> Json<Value> {
    Json(json!({
        "object": "list",
        "data": [{
            "id": s.0.config.model_name,
            "object": "model",
            "created": openai::now(),
            "owned_by": "warmpath",
            "root": s.0.config.model_name,
            "max_model_len": s.0.config.max_model_len,
        }]
    }))
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn reset(State(s): State<AppState>) -> Result<StatusCode, ApiError> {
    s.0.engine.reset_prefix_cache().await?;
    tracing::info!("prefix cache reset");
    Ok(StatusCode::OK)
}

async fn metrics_text(State(s): State<AppState>) -> Response {
    let st = s.0.engine.stats();
    let c = &s.0.config;
    let m = &c.model_name;
    let usage = if c.cache_blocks == 0 {
        0.0
    } else {
        st.used_blocks as f64 / c.cache_blocks as f64
    };
    let mut out = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, labels: String, value: String| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}"
        );
    };
    let ml = format!(
        "model_name=\"{}\"",
        m.replace('\\', "\\\\").replace('"', "\\\"")
    );
    metric(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        ml.clone(),
        st.running.to_string(),
    );
    metric(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        ml.clone(),
        st.waiting.to_string(),
    );
    metric(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        ml.clone(),
        usage.to_string(),
    );
    metric(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in tokens.",
        ml.clone(),
        st.queried_tokens.to_string(),
    );
    metric(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in tokens.",
        ml.clone(),
        st.hit_tokens.to_string(),
    );
    metric(
        "vllm:cache_config_info",
        "gauge",
        "Information of the LLMEngine CacheConfig.",
        format!(
            "block_size=\"{}\",enable_prefix_caching=\"True\",num_gpu_blocks=\"{}\"",
            c.block_size, c.cache_blocks
        ),
        "1".into(),
    );
    if let Some(p) = &s.0.prometheus {
        out.push_str(&p.render());
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

//! The HTTP face of one simulated instance: what vLLM's OpenAI server answers.

use super::engine::{Admission, SimEngine};
use super::openai::{ApiError, Meta};
use crate::words::WordGen;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use warmpath_core::prefix_cache::CacheEvent;
use warmpath_core::request::{Expect, Request};
use warmpath_core::tokenize::ChatTokenizer;

/// Longest prompt accepted, in tokens (vLLM's `max_model_len`).
pub const MAX_MODEL_LEN: usize = 65_536;
/// Most output tokens one request may ask for.
pub const MAX_OUTPUT_TOKENS: u32 = 4096;
/// Output tokens when the request does not say.
pub const DEFAULT_MAX_TOKENS: u32 = 16;

/// Everything the handlers share.
#[derive(Debug)]
pub(crate) struct AppState {
    pub(crate) id: String,
    pub(crate) model: String,
    pub(crate) engine: Arc<SimEngine>,
    pub(crate) tokenizer: Arc<ChatTokenizer>,
    pub(crate) events: mpsc::Sender<Vec<CacheEvent>>,
    pub(crate) words: WordGen,
    pub(crate) shutdown: CancellationToken,
}

pub(crate) fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completion))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .route("/reset_prefix_cache", post(reset))
        .with_state(state)
}

async fn chat(State(st): State<Arc<AppState>>, body: axum::body::Bytes) -> Response {
    serve(st, body, Expect::Chat)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn completion(State(st): State<Arc<AppState>>, body: axum::body::Bytes) -> Response {
    serve(st, body, Expect::Completion)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

struct Work {
    meta: Meta,
    prompt: usize,
    max_tokens: u32,
    include_usage: bool,
    seed: u64,
}

async fn serve(
    st: Arc<AppState>,
    body: axum::body::Bytes,
    expect: Expect,
) -> Result<Response, ApiError> {
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad(format!("the body is not valid JSON: {e}")))?;
    let req = Request::from_value(&v, expect).map_err(|e| ApiError::bad(e.to_string()))?;
    if req.model != st.model {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("The model `{}` does not exist.", req.model),
        ));
    }
    if let Some(salt) = req.cache_salt.as_deref() {
        if salt.is_empty() || salt.chars().count() > 1024 {
            return Err(ApiError::bad("cache_salt must be 1 to 1024 characters"));
        }
    }
    let max_tokens = req.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS);
    if max_tokens == 0 || max_tokens > MAX_OUTPUT_TOKENS {
        return Err(ApiError::bad(format!(
            "max_tokens must be in 1..={MAX_OUTPUT_TOKENS}, got {max_tokens}"
        )));
    }
    let tokens = st.tokenizer.encode_request(&req).map_err(|e| {
        if e.is_client_error() {
            ApiError::bad(e.to_string())
        } else {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
        }
    })?;
    if tokens.is_empty() || tokens.len() > MAX_MODEL_LEN {
        return Err(ApiError::bad(format!(
            "the prompt has {} tokens; it must have 1 to {MAX_MODEL_LEN}",
            tokens.len()
        )));
    }
    let include_usage = v
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let work = Work {
        meta: Meta::new(req.is_chat(), &st.model),
        prompt: tokens.len(),
        max_tokens,
        include_usage,
        seed: tokens
            .iter()
            .fold(0u64, |a, t| a.rotate_left(5) ^ u64::from(*t)),
    };
    let salt = req.cache_salt.as_deref().map(str::to_owned);
    metrics::counter!("warmpath_sim_requests_total", "instance" => st.id.clone()).increment(1);
    let adm = st
        .engine
        .admit()
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    if req.stream {
        Ok(stream(st, adm, tokens, salt, work).into_response())
    } else {
        let cached = st
            .engine
            .prefill(&adm, tokens, salt)
            .await
            .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
        let decode = st.engine.time().decode_ms(work.max_tokens);
        tokio::time::sleep(Duration::from_secs_f64(decode / 1000.0)).await;
        let text = output_text(&st.words, work.seed, work.max_tokens);
        st.engine.finished(work.prompt, work.max_tokens as usize);
        drop(adm);
        let usage = Meta::usage(work.prompt, work.max_tokens as usize, cached);
        Ok(Json(work.meta.full(&text, usage)).into_response())
    }
}

/// The generated output: one word per token.
fn output_text(words: &WordGen, seed: u64, tokens: u32) -> String {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..tokens).fold(String::new(), |mut s, _| {
        s.push_str(words.word(&mut rng));
        s.push(' ');
        s
    })
}

/// Streams the response; a task owned by the response channel does the work
/// and stops as soon as the client is gone (a send fails) or on shutdown.
fn stream(
    st: Arc<AppState>,
    adm: Admission,
    tokens: Vec<u32>,
    salt: Option<String>,
    work: Work,
) -> impl IntoResponse {
    let (tx, rx) = mpsc::channel::<Event>(16);
    let shutdown = st.shutdown.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = produce(st, adm, tokens, salt, work, tx) => {}
        }
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Sse::new(body)
}

async fn produce(
    st: Arc<AppState>,
    adm: Admission,
    tokens: Vec<u32>,
    salt: Option<String>,
    work: Work,
    tx: mpsc::Sender<Event>,
) {
    let ev = |v: Value| Event::default().data(v.to_string());
    let cached = match st.engine.prefill(&adm, tokens, salt).await {
        Ok(c) => c,
        Err(e) => {
            let _ = tx
                .send(ev(json!({"error": {"message": e.to_string()}})))
                .await;
            return;
        }
    };
    let mut rng = SmallRng::seed_from_u64(work.seed);
    let step = Duration::from_secs_f64(st.engine.time().decode_step_ms / 1000.0);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + step, step);
    for i in 0..work.max_tokens {
        if i > 0 {
            tick.tick().await;
        }
        let word = format!("{} ", st.words.word(&mut rng));
        if tx
            .send(ev(work.meta.chunk(&word, i == 0, None)))
            .await
            .is_err()
        {
            metrics::counter!("warmpath_sim_client_gone_total").increment(1);
            return; // the client left: stop decoding (adm drops, slot freed)
        }
    }
    st.engine.finished(work.prompt, work.max_tokens as usize);
    drop(adm);
    let mut tail = vec![ev(work.meta.chunk("", false, Some("length")))];
    if work.include_usage {
        let usage = Meta::usage(work.prompt, work.max_tokens as usize, cached);
        tail.push(ev(work.meta.usage_chunk(usage)));
    }
    tail.push(Event::default().data("[DONE]"));
    for e in tail {
        if tx.send(e).await.is_err() {
            return;
        }
    }
}

async fn models(State(st): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"object": "list", "data": [{
        "id": st.model, "object": "model", "created": 0, "owned_by": "vllm",
        "root": st.model, "parent": null, "max_model_len": MAX_MODEL_LEN,
    }]}))
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn reset(State(st): State<Arc<AppState>>) -> Response {
    match st.engine.reset(&st.events).await {
        Ok(()) => StatusCode::OK.into_response(),
        Err(e) => ApiError::new(StatusCode::CONFLICT, e.to_string()).into_response(),
    }
}

/// Prometheus text with vLLM's metric names.
pub(crate) fn render_metrics(st: &AppState) -> String {
    let s = st.engine.stats();
    let l = format!("model_name=\"{}\"", st.model);
    let mut out = String::new();
    let mut put = |name: &str, kind: &str, labels: &str, value: String| {
        let _ = writeln!(out, "# TYPE vllm:{name} {kind}");
        let _ = writeln!(out, "vllm:{name}{{{labels}}} {value}");
    };
    put("num_requests_running", "gauge", &l, s.running.to_string());
    put("num_requests_waiting", "gauge", &l, s.waiting.to_string());
    put(
        "kv_cache_usage_perc",
        "gauge",
        &l,
        format!("{}", s.kv_usage),
    );
    put(
        "prefix_cache_queries_total",
        "counter",
        &l,
        s.prefix_queries.to_string(),
    );
    put(
        "prefix_cache_hits_total",
        "counter",
        &l,
        s.prefix_hits.to_string(),
    );
    put(
        "prompt_tokens_total",
        "counter",
        &l,
        s.prompt_tokens.to_string(),
    );
    put(
        "generation_tokens_total",
        "counter",
        &l,
        s.generation_tokens.to_string(),
    );
    put(
        "request_success_total",
        "counter",
        &format!("{l},finished_reason=\"length\""),
        s.requests.to_string(),
    );
    let info = format!(
        "block_size=\"{}\",num_gpu_blocks=\"{}\",enable_prefix_caching=\"True\",cache_dtype=\"auto\"",
        st.engine.block_size(),
        st.engine.num_blocks()
    );
    put("cache_config_info", "gauge", &info, "1.0".into());
    out
}

async fn metrics_text(State(st): State<Arc<AppState>>) -> impl IntoResponse {
    (
        [("content-type", "text/plain; version=0.0.4")],
        render_metrics(&st),
    )
}

//! The HTTP face of one simulated instance: what vLLM's OpenAI server answers.

use super::engine::{Admission, Prefilled, SimEngine};
use super::openai::{ApiError, Meta};
use super::output::{Output, OutputVocab};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::fmt::Write as _;
use std::future::Future;
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
    pub(crate) output: Arc<OutputVocab>,
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
    /// When the handler got the request, and how long tokenizing and
    /// waiting for a batch slot took.
    start: std::time::Instant,
    tokenize: Duration,
    admit: Duration,
}

impl Work {
    /// Records where the time to the first token went (histograms
    /// `warmpath_sim_first_token_phase_seconds{phase}` and a debug event).
    fn first_token(&self, p: &Prefilled) {
        let total = self.start.elapsed();
        let rest = total.saturating_sub(self.tokenize + self.admit + p.queued + p.computed);
        for (phase, d) in [
            ("tokenize", self.tokenize),
            ("admit", self.admit),
            ("queue", p.queued),
            ("prefill", p.computed),
            ("other", rest),
            ("total", total),
        ] {
            metrics::histogram!("warmpath_sim_first_token_phase_seconds", "phase" => phase)
                .record(d.as_secs_f64());
        }
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        tracing::debug!(
            target: "warmpath_bench::sim::timing",
            prompt = self.prompt,
            cached = p.cached,
            tokenize_ms = ms(self.tokenize),
            admit_ms = ms(self.admit),
            queue_ms = ms(p.queued),
            prefill_ms = ms(p.computed),
            other_ms = ms(rest),
            total_ms = ms(total),
            "first token"
        );
    }
}

async fn serve(
    st: Arc<AppState>,
    body: axum::body::Bytes,
    expect: Expect,
) -> Result<Response, ApiError> {
    let start = std::time::Instant::now();
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
    let tokenize = start.elapsed();
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
        start,
        tokenize,
        admit: Duration::ZERO,
    };
    let mut work = work;
    let salt = req.cache_salt.as_deref().map(str::to_owned);
    metrics::counter!("warmpath_sim_requests_total", "instance" => st.id.clone()).increment(1);
    let adm = st
        .engine
        .admit()
        .await
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    work.admit = start.elapsed().saturating_sub(work.tokenize);
    if req.stream {
        Ok(stream(st, adm, tokens, salt, work).into_response())
    } else {
        let p = st
            .engine
            .prefill(&adm, tokens.clone(), salt)
            .await
            .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
        work.first_token(&p);
        let out = st.output.generate(work.seed, work.max_tokens as usize);
        decode(&st, &adm, tokens, &out, |_, _| std::future::ready(true)).await;
        st.engine.finished(work.prompt, work.max_tokens as usize);
        drop(adm);
        let usage = Meta::usage(work.prompt, work.max_tokens as usize, p.cached);
        Ok(Json(work.meta.full(&out.text(), usage)).into_response())
    }
}

/// Decodes `out` after the prefill: the first token right away (it comes out
/// of the prefill), then one per decode step, each handed to `emit` (which
/// answers false when the client left: stop). Step `i` feeds token `i - 1`
/// back, so its KV is computed then, and every block that fills is cached
/// and published (the last token's KV is never computed, as in vLLM).
/// Returns whether every token was emitted.
async fn decode<F, Fut>(
    st: &AppState,
    adm: &Admission,
    prompt: Vec<u32>,
    out: &Output,
    mut emit: F,
) -> bool
where
    F: FnMut(usize, &str) -> Fut,
    Fut: Future<Output = bool>,
{
    let bs = st.engine.block_size();
    let step = Duration::from_secs_f64(st.engine.time().decode_step_ms / 1000.0);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + step, step);
    let mut seq = prompt;
    seq.reserve(out.ids.len());
    for (i, piece) in out.pieces.iter().enumerate() {
        if i > 0 {
            tick.tick().await;
            seq.push(out.ids[i - 1]);
            if seq.len() % bs == 0 {
                if let Err(e) = st.engine.decoded(adm, &seq).await {
                    tracing::warn!(error = %e, "caching a decoded block failed");
                }
            }
        }
        if !emit(i, piece).await {
            return false;
        }
    }
    true
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
    let prompt = tokens.clone();
    let p = match st.engine.prefill(&adm, tokens, salt).await {
        Ok(p) => p,
        Err(e) => {
            let _ = tx
                .send(ev(json!({"error": {"message": e.to_string()}})))
                .await;
            return;
        }
    };
    let out = st.output.generate(work.seed, work.max_tokens as usize);
    let emit = |i: usize, piece: &str| {
        let (tx, event) = (tx.clone(), ev(work.meta.chunk(piece, i == 0, None)));
        if i == 0 {
            work.first_token(&p);
        }
        async move { tx.send(event).await.is_ok() }
    };
    if !decode(&st, &adm, prompt, &out, emit).await {
        metrics::counter!("warmpath_sim_client_gone_total").increment(1);
        return; // the client left: stop decoding (adm drops, slot freed)
    }
    st.engine.finished(work.prompt, work.max_tokens as usize);
    drop(adm);
    let mut tail = vec![ev(work.meta.chunk("", false, Some("length")))];
    if work.include_usage {
        let usage = Meta::usage(work.prompt, work.max_tokens as usize, p.cached);
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

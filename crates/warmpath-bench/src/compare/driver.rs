//! The load driver: replays a trace open-loop against an OpenAI endpoint
//! (streaming, so TTFT is the first content chunk) and records one
//! [`Sample`] per request.

use crate::workload::TraceRequest;
use futures::StreamExt;
use indicatif::ProgressBar;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// What happened to one request.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Sample {
    /// Scheduled arrival, seconds from the start.
    pub arrival_s: f64,
    /// Time to the first content chunk, ms (None on failure).
    pub ttft_ms: Option<f64>,
    /// Time to the end of the stream, ms.
    pub e2e_ms: Option<f64>,
    /// Completion time, seconds from the start.
    pub done_s: f64,
    /// Prompt tokens (engine usage).
    pub prompt_tokens: u64,
    /// Cached prompt tokens (engine usage).
    pub cached_tokens: u64,
    /// Output tokens.
    pub completion_tokens: u64,
    /// `x-warmpath-backend`.
    pub backend: Option<String>,
    /// `x-warmpath-decision`.
    pub decision: Option<String>,
    /// Blocks the router's index said the chosen backend holds (sampled).
    pub predicted_blocks: Option<u64>,
    /// Why it failed.
    pub error: Option<String>,
}

/// How to drive one run.
#[derive(Clone, Debug)]
pub struct DriveConfig {
    /// The router's (or an engine's) base URL.
    pub url: String,
    /// Ask `POST /cache-index/query` before every n-th request (0: never).
    pub fidelity_every: usize,
    /// Per-request timeout.
    pub timeout: Duration,
}

/// Replays `trace` (arrivals relative to now); returns the samples in trace
/// order. Stops early, keeping what finished, when `cancel` fires.
pub async fn drive(
    client: &reqwest::Client,
    cfg: &DriveConfig,
    trace: &[TraceRequest],
    progress: &ProgressBar,
    cancel: &CancellationToken,
) -> Vec<Sample> {
    let start = Instant::now();
    let mut set = JoinSet::new();
    let cfg = Arc::new(cfg.clone());
    for (i, r) in trace.iter().enumerate() {
        let at = start + Duration::from_secs_f64(r.arrival);
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep_until(at.into()) => {}
        }
        let (client, cfg, r) = (client.clone(), cfg.clone(), r.clone());
        let query = cfg.fidelity_every > 0 && i % cfg.fidelity_every == 0;
        let pb = progress.clone();
        set.spawn(async move {
            let mut s = one(&client, &cfg, &r, query, start).await;
            s.arrival_s = r.arrival;
            pb.inc(1);
            (i, s)
        });
    }
    let mut out = vec![Sample::default(); trace.len()];
    loop {
        tokio::select! {
            _ = cancel.cancelled() => { set.abort_all(); break }
            next = set.join_next() => match next {
                None => break,
                Some(Ok((i, s))) => out[i] = s,
                Some(Err(e)) => tracing::warn!(error = %e, "a driver task failed"),
            }
        }
    }
    out
}

fn request(
    client: &reqwest::Client,
    url: &str,
    r: &TraceRequest,
    body: &serde_json::Value,
) -> reqwest::RequestBuilder {
    let mut b = client.post(url).json(body);
    if let Some(t) = r.header_tenant() {
        b = b.header("x-prefix-aware-id", t);
    }
    b
}

async fn one(
    client: &reqwest::Client,
    cfg: &DriveConfig,
    r: &TraceRequest,
    query: bool,
    origin: Instant,
) -> Sample {
    let mut s = Sample::default();
    let body = r.body(true);
    let mut predicted = None;
    if query {
        let url = format!("{}/cache-index/query", cfg.url);
        if let Ok(resp) = request(client, &url, r, &body).send().await {
            if let Ok(v) = resp.json::<serde_json::Value>().await {
                predicted = Some(v);
            }
        }
    }
    let t0 = Instant::now();
    let url = format!("{}{}", cfg.url, r.path());
    let fut = async {
        let resp = request(client, &url, r, &body)
            .send()
            .await
            .map_err(|e| format!("send: {e}"))?;
        let header = |n: &str| {
            resp.headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        s.backend = header("x-warmpath-backend");
        s.decision = header("x-warmpath-decision");
        if !resp.status().is_success() {
            let status = resp.status();
            let text = resp.text().await.unwrap_or_default();
            return Err(format!(
                "HTTP {status}: {}",
                text.chars().take(200).collect::<String>()
            ));
        }
        let mut stream = resp.bytes_stream();
        let mut buf = String::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| format!("stream: {e}"))?;
            buf.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buf.find("\n\n") {
                let event: String = buf.drain(..end + 2).collect();
                for line in event.lines() {
                    let Some(data) = line.strip_prefix("data:") else {
                        continue;
                    };
                    let data = data.trim();
                    if data == "[DONE]" {
                        continue;
                    }
                    let v: serde_json::Value =
                        serde_json::from_str(data).map_err(|e| format!("bad chunk: {e}"))?;
                    if let Some(err) = v.get("error") {
                        return Err(format!("stream error: {err}"));
                    }
                    // vLLM (and warmpath-engine) open a chat stream with a
                    // `{"role": "assistant", "content": ""}` delta before any
                    // compute: only a non-empty text is the first token.
                    let non_empty = |p: &str| {
                        v.pointer(p)
                            .and_then(|t| t.as_str())
                            .is_some_and(|t| !t.is_empty())
                    };
                    let has_text =
                        non_empty("/choices/0/delta/content") || non_empty("/choices/0/text");
                    if has_text && s.ttft_ms.is_none() {
                        s.ttft_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
                    }
                    if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                        let n = |p: &str| u.pointer(p).and_then(|x| x.as_u64()).unwrap_or(0);
                        s.prompt_tokens = n("/prompt_tokens");
                        s.completion_tokens = n("/completion_tokens");
                        s.cached_tokens = n("/prompt_tokens_details/cached_tokens");
                    }
                }
            }
        }
        Ok(())
    };
    let res = tokio::time::timeout(cfg.timeout, fut).await;
    match res {
        Ok(Ok(())) if s.ttft_ms.is_some() => {
            s.e2e_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
        }
        Ok(Ok(())) => s.error = Some("the stream ended without output".into()),
        Ok(Err(e)) => {
            s.ttft_ms = None;
            s.error = Some(e);
        }
        Err(_) => {
            s.ttft_ms = None;
            s.error = Some(format!("timed out after {:?}", cfg.timeout));
        }
    }
    s.done_s = origin.elapsed().as_secs_f64();
    if let (Some(v), Some(b)) = (predicted, &s.backend) {
        s.predicted_blocks = v["workers"]
            .as_array()
            .and_then(|ws| ws.iter().find(|w| w["worker_id"] == b.as_str()))
            .and_then(|w| w["matched_blocks"].as_u64());
    }
    s
}

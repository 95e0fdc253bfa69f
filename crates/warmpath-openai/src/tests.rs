//! The shared server over a fake backend that answers fixed pieces.
#![allow(clippy::unwrap_used)]

use crate::{router, ApiError, Backend, Generation, Item, Job, ServerConfig, VllmStats};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use futures::StreamExt as _;
use serde_json::{json, Value};
use std::future::Future;
use std::sync::{Arc, Mutex};
use tower::ServiceExt as _;
use warmpath_core::tokenize::{tiny, CacheConfig, ChatTokenizer};

struct Fake {
    config: ServerConfig,
    tokenizer: ChatTokenizer,
    jobs: Mutex<Vec<(usize, Option<String>, usize)>>,
}

impl Backend for Fake {
    const HTTP_ERRORS: &'static str = "test_http_errors_total";

    fn config(&self) -> &ServerConfig {
        &self.config
    }

    fn tokenizer(&self) -> &ChatTokenizer {
        &self.tokenizer
    }

    fn generate(&self, job: Job) -> impl Future<Output = Result<Generation, ApiError>> + Send {
        let n = job.max_tokens;
        let cached = job.tokens.len() / 2;
        self.jobs
            .lock()
            .unwrap()
            .push((job.tokens.len(), job.salt, job.max_tokens));
        let mut items: Vec<Item> = (0..n).map(|i| Item::Text(format!("t{i} "))).collect();
        items.push(Item::Done {
            finish: Some("length"),
            completion_tokens: n,
            cached_tokens: cached,
        });
        std::future::ready(Ok(futures::stream::iter(items).boxed()))
    }

    fn reset(&self) -> impl Future<Output = Result<(), ApiError>> + Send {
        std::future::ready(Ok(()))
    }

    fn stats(&self) -> VllmStats {
        VllmStats {
            prefix_hits: 3,
            ..VllmStats::default()
        }
    }
}

fn fake() -> Arc<Fake> {
    let tokenizer = ChatTokenizer::new(&tiny::files().unwrap(), CacheConfig::default()).unwrap();
    Arc::new(Fake {
        config: ServerConfig {
            model_name: "m".into(),
            max_model_len: 512,
            block_size: 16,
            cache_blocks: 64,
            default_max_tokens: 3,
        },
        tokenizer,
        jobs: Mutex::default(),
    })
}

async fn call(b: &Arc<Fake>, method: &str, path: &str, body: &str) -> (StatusCode, String) {
    let req = Request::builder()
        .method(method)
        .uri(path)
        .body(Body::from(body.to_owned()))
        .unwrap();
    let r = router(b.clone()).oneshot(req).await.unwrap();
    let status = r.status();
    let bytes = axum::body::to_bytes(r.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

fn chat(extra: Value) -> String {
    let mut v = json!({"model": "m", "messages": [{"role": "user", "content": "hello there"}]});
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v.to_string()
}

#[tokio::test]
async fn whole_answers_carry_usage_and_the_salt_reaches_the_backend() {
    let b = fake();
    let (s, body) = call(
        &b,
        "POST",
        "/v1/chat/completions",
        &chat(json!({"cache_salt": "x"})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "t0 t1 t2 ");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    let (prompt, salt, max) = b.jobs.lock().unwrap()[0].clone();
    assert_eq!(v["usage"]["prompt_tokens"], prompt);
    assert_eq!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"],
        prompt / 2
    );
    assert_eq!((salt.as_deref(), max), (Some("x"), 3));
}

#[tokio::test]
async fn streams_end_with_usage_and_done() {
    let b = fake();
    let body = chat(json!({"stream": true, "max_tokens": 4,
                           "stream_options": {"include_usage": true}}));
    let (s, sse) = call(&b, "POST", "/v1/chat/completions", &body).await;
    assert_eq!(s, StatusCode::OK);
    let data: Vec<&str> = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    // 4 pieces + finish + usage + [DONE].
    assert_eq!(data.len(), 7, "{sse}");
    assert_eq!(data.last(), Some(&"[DONE]"));
    let first: Value = serde_json::from_str(data[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(first["choices"][0]["delta"]["content"], "t0 ");
    let finish: Value = serde_json::from_str(data[4]).unwrap();
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let usage: Value = serde_json::from_str(data[5]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 4);
    let text = r#"{"model": "m", "prompt": "hi", "stream": true, "max_tokens": 1}"#;
    let (_, sse) = call(&b, "POST", "/v1/completions", text).await;
    assert!(sse.contains(r#""text":"t0 ""#), "{sse}");
    assert!(!sse.contains("usage"));
}

#[tokio::test]
async fn bad_requests_get_vllm_errors() {
    let b = fake();
    let (s, body) = call(&b, "POST", "/v1/chat/completions", "{nope").await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("JSON"));
    assert_eq!(v["error"]["type"], "BadRequestError");
    assert_eq!(v["error"]["code"], 400);
    let wrong = chat(json!({"model": "other"}));
    let (s, body) = call(&b, "POST", "/v1/chat/completions", &wrong).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert!(body.contains("`other`"));
    for bad in [
        json!({"cache_salt": ""}),
        json!({"cache_salt": "s".repeat(1025)}),
        json!({"max_tokens": 0}),
        json!({"max_tokens": 100_000}),
        json!({"n": 2}),
        json!({"messages": []}),
    ] {
        let (s, body) = call(&b, "POST", "/v1/chat/completions", &chat(bad.clone())).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{bad}: {body}");
    }
    let (_, body) = call(
        &b,
        "POST",
        "/v1/chat/completions",
        &chat(json!({"max_tokens": 600})),
    )
    .await;
    assert!(body.contains("maximum context length is 512"), "{body}");
    assert!(b.jobs.lock().unwrap().is_empty());
}

#[tokio::test]
async fn the_other_routes_answer() {
    let b = fake();
    let (s, body) = call(&b, "GET", "/v1/models", "").await;
    assert_eq!(s, StatusCode::OK);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["data"][0]["id"], "m");
    assert_eq!(v["data"][0]["max_model_len"], 512);
    assert_eq!(call(&b, "GET", "/health", "").await.0, StatusCode::OK);
    assert_eq!(
        call(&b, "POST", "/reset_prefix_cache", "").await.0,
        StatusCode::OK
    );
    let (_, text) = call(&b, "GET", "/metrics", "").await;
    assert!(text.contains("vllm:prefix_cache_hits_total{model_name=\"m\"} 3"));
    assert!(text.contains("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"64\""));
}

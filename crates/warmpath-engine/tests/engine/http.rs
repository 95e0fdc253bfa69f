//! The OpenAI-compatible server end to end over real HTTP on 127.0.0.1:0,
//! with the tiny model.

use candle_core::{DType, Device};
use serde_json::{json, Value};
use std::sync::Arc;
use warmpath_engine::http::{router, AppState, ServerConfig};
use warmpath_engine::{load, worker, Engine, EngineOptions, ModelSource, NoEvents, SizePreset};

const MODEL: &str = "warmpath-tiny";

async fn start(cache_blocks: usize) -> String {
    let loaded = load(
        &ModelSource::Random {
            size: SizePreset::Tiny,
            seed: 0,
        },
        &Device::Cpu,
        DType::F32,
    )
    .unwrap();
    let max_model_len = loaded.model.config().max_position_embeddings;
    let opts = EngineOptions {
        block_size: 16,
        cache_blocks,
        prefill_chunk: 256,
    };
    let engine = Engine::new(loaded.model, opts, Box::new(NoEvents)).unwrap();
    let (handle, _thread) = worker::spawn(engine, 8).unwrap();
    let state = AppState {
        engine: handle,
        tokenizer: Arc::new(loaded.tokenizer),
        stop_ids: loaded.stop_ids,
        config: ServerConfig {
            model_name: MODEL.into(),
            max_model_len,
            block_size: 16,
            cache_blocks,
            default_max_tokens: 8,
        },
        prometheus: None,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router(state)).await });
    format!("http://{addr}")
}

fn long_system() -> String {
    warmpath_core::tokenize::tiny::corpus_slice(0, 1500)
}

async fn post(base: &str, path: &str, body: Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

fn chat(system: &str, user: &str) -> Value {
    json!({"model": MODEL, "max_tokens": 6, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": user}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_prefix_is_reported_as_cached_and_salts_isolate() {
    let base = start(1024).await;
    let sys = long_system();
    let (s, a) = post(&base, "/v1/chat/completions", chat(&sys, "first question")).await;
    assert_eq!(s, 200, "{a}");
    assert_eq!(a["object"], "chat.completion");
    assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let prompt = a["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt > 200, "prompt {prompt}");
    assert!(a["usage"]["completion_tokens"].as_u64().unwrap() <= 6);
    let (_, b) = post(&base, "/v1/chat/completions", chat(&sys, "second question")).await;
    let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= prompt - 32 && cached % 16 == 0,
        "cached {cached} of {prompt}"
    );
    // Same prompt under a salt: nothing shared.
    let mut salted = chat(&sys, "second question");
    salted["cache_salt"] = json!("tenant-1");
    let (_, c) = post(&base, "/v1/chat/completions", salted.clone()).await;
    assert_eq!(c["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    // Greedy decoding: the answer depends only on the prompt.
    assert_eq!(b["choices"][0]["message"], c["choices"][0]["message"]);
    let (_, d) = post(&base, "/v1/chat/completions", salted).await;
    assert!(
        d["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    let metrics = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "vllm:num_requests_running{",
        "vllm:num_requests_waiting{",
        "vllm:kv_cache_usage_perc{",
        "vllm:prefix_cache_queries_total{",
        "vllm:prefix_cache_hits_total{",
        "vllm:cache_config_info{block_size=\"16\",",
    ] {
        assert!(metrics.contains(name), "{name} missing in\n{metrics}");
    }
    let hits: u64 = metrics
        .lines()
        .find(|l| l.starts_with("vllm:prefix_cache_hits_total{"))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap()
        .parse()
        .unwrap();
    assert!(hits >= cached);

    // Reset: nothing cached afterwards.
    let r = reqwest::Client::new()
        .post(format!("{base}/reset_prefix_cache"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let (_, e) = post(&base, "/v1/chat/completions", chat(&sys, "second question")).await;
    assert_eq!(e["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_matches_non_streaming() {
    let base = start(256).await;
    let body = json!({"model": MODEL, "prompt": "The quick brown fox", "max_tokens": 7});
    let (s, whole) = post(&base, "/v1/completions", body.clone()).await;
    assert_eq!(s, 200, "{whole}");
    let text = whole["choices"][0]["text"].as_str().unwrap().to_owned();
    let mut sbody = body;
    sbody["stream"] = json!(true);
    sbody["stream_options"] = json!({"include_usage": true});
    let sse = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .json(&sbody)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let datas: Vec<&str> = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(datas.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = datas[..datas.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(streamed, text);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(
        usage["completion_tokens"],
        whole["usage"]["completion_tokens"]
    );
    assert!(usage["prompt_tokens_details"]["cached_tokens"].is_u64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_clear_errors() {
    let base = start(64).await;
    let raw = reqwest::Client::new()
        .post(format!("{base}/v1/completions"))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status().as_u16(), 400);
    let (s, e) = post(
        &base,
        "/v1/completions",
        json!({"model": "other", "prompt": "x"}),
    )
    .await;
    assert_eq!(s, 404);
    assert!(e["error"]["message"].as_str().unwrap().contains("other"));
    let (s, _) = post(
        &base,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "x", "cache_salt": ""}),
    )
    .await;
    assert_eq!(s, 400);
    let (s, e) = post(
        &base,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "x", "max_tokens": 100000}),
    )
    .await;
    assert_eq!(s, 400);
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("context length"));
    let (s, _) = post(
        &base,
        "/v1/completions",
        json!({"model": MODEL, "prompt": [5000]}),
    )
    .await;
    assert_eq!(s, 400);
    let (s, _) = post(
        &base,
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": []}),
    )
    .await;
    assert_eq!(s, 400);
    let models: Value = reqwest::get(format!("{base}/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(
        reqwest::get(format!("{base}/health"))
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
}

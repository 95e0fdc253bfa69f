//! The simulated instance over real HTTP on 127.0.0.1.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::words::{WordGen, TOKENS_PER_WORD};
use rand::SeedableRng;
use serde_json::{json, Value};

async fn instance() -> (SimInstance, CancellationToken) {
    let cfg = SimConfig {
        time: TimeModel::default().scaled(20.0),
        cache_blocks: 256,
        ..Default::default()
    };
    let token = CancellationToken::new();
    let fleet = Fleet::start(1, &cfg, tiny_tokenizer().unwrap(), token.clone());
    (fleet.await.unwrap().instances.remove(0), token)
}

fn chat(doc: &str, q: &str, stream: bool) -> Value {
    json!({"model": "warmpath-tiny", "max_tokens": 4, "stream": stream,
           "stream_options": {"include_usage": true},
           "messages": [{"role": "system", "content": doc}, {"role": "user", "content": q}]})
}

#[tokio::test]
async fn second_request_with_the_same_document_is_served_from_cache() {
    let (inst, _t) = instance().await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", inst.url);
    let doc = WordGen::default().text(&mut rand::rngs::SmallRng::seed_from_u64(1), 300);
    let a: Value = c
        .post(&url)
        .json(&chat(&doc, "first?", false))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(a["usage"]["completion_tokens"], 4);
    let prompt = a["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(prompt > 300);
    let b: Value = c
        .post(&url)
        .json(&chat(&doc, "second?", false))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached > 0 && cached.is_multiple_of(16) && cached < prompt,
        "{cached} of {prompt}"
    );
    // A salt isolates: nothing shared.
    let mut salted = chat(&doc, "second?", false);
    salted["cache_salt"] = json!("acme");
    let s: Value = c
        .post(&url)
        .json(&salted)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(s["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    let m = c
        .get(format!("{}/metrics", inst.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(m.contains("vllm:num_requests_running{model_name=\"warmpath-tiny\"} 0"));
    assert!(m.contains(&format!(
        "vllm:prefix_cache_hits_total{{model_name=\"warmpath-tiny\"}} {cached}"
    )));
    assert!(m.contains("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"256\""));
    assert!(m.contains("vllm:kv_cache_usage_perc"));

    assert!(c
        .post(format!("{}/reset_prefix_cache", inst.url))
        .send()
        .await
        .unwrap()
        .status()
        .is_success());
    let r: Value = c
        .post(&url)
        .json(&chat(&doc, "third?", false))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

#[tokio::test]
async fn streams_like_vllm() {
    let (inst, _t) = instance().await;
    let c = reqwest::Client::new();
    let body = c
        .post(format!("{}/v1/chat/completions", inst.url))
        .json(&chat("a short document", "q", true))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"));
    let first: Value = serde_json::from_str(data[0]).unwrap();
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let usage: Value = serde_json::from_str(data[data.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 4);
    // 4 tokens + finish + usage + [DONE].
    assert_eq!(data.len(), 7);
    let comp = c
        .post(format!("{}/v1/completions", inst.url))
        .json(&json!({"model": "warmpath-tiny", "prompt": "hello there", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    let v: Value = comp.json().await.unwrap();
    assert_eq!(v["object"], "text_completion");
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    let (inst, _t) = instance().await;
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", inst.url);
    let r = c.post(&url).body("{nope").send().await.unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("JSON"));
    let mut wrong = chat("d", "q", false);
    wrong["model"] = json!("other");
    assert_eq!(
        c.post(&url).json(&wrong).send().await.unwrap().status(),
        404
    );
    let mut big = chat("d", "q", false);
    big["max_tokens"] = json!(100_000);
    assert_eq!(c.post(&url).json(&big).send().await.unwrap().status(), 400);
    let models: Value = c
        .get(format!("{}/v1/models", inst.url))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "warmpath-tiny");
    assert!(c
        .get(format!("{}/health", inst.url))
        .send()
        .await
        .unwrap()
        .status()
        .is_success());
}

#[test]
fn tokens_per_word_is_calibrated() {
    let tok = tiny_tokenizer().unwrap();
    let text = WordGen::default().text(&mut rand::rngs::SmallRng::seed_from_u64(9), 2000);
    let n = tok.encode_text(&text, false).unwrap().len() as f64 / 2000.0;
    assert!(
        (n / TOKENS_PER_WORD - 1.0).abs() < 0.25,
        "the word generator averages {n:.2} tokens per word; TOKENS_PER_WORD is {TOKENS_PER_WORD}"
    );
}

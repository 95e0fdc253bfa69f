//! Bounded work per request, end to end on the real router binary: the prompt
//! cap (configured, and learned from the engines' model cards) and the work
//! pool that keeps giant bodies off the threads serving connections.

use crate::support;

use axum::extract::State;
use axum::routing::{get, post as route_post};
use axum::Router;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::poll::poll;
use support::*;
use warmpath_core::tokenize::tiny;

/// An engine stand-in: its `/v1/models` card for `m` gives `max_model_len`
/// (when set), and it counts the chats it answers.
struct Engine {
    addr: SocketAddr,
    chats: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn engine(max_model_len: Option<u64>) -> Engine {
    let chats = Arc::new(AtomicUsize::new(0));
    let models = move || async move {
        let mut card = json!({"id": "m", "object": "model"});
        if let Some(n) = max_model_len {
            card["max_model_len"] = json!(n);
        }
        axum::Json(json!({"object": "list", "data": [card]}))
    };
    let app = Router::new()
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/chat/completions",
            route_post(
                |State(n): State<Arc<AtomicUsize>>, _body: axum::body::Bytes| async move {
                    n.fetch_add(1, Ordering::SeqCst);
                    axum::Json(json!({"object": "chat.completion", "choices": []}))
                },
            ),
        )
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(Arc::clone(&chats));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.ok();
    });
    Engine { addr, chats, task }
}

/// The router binary with a kv_aware pool `m` (the tiny tokenizer in `dir`)
/// over `e`, plus top-level `sections` and `pool` lines of router.yaml.
async fn tiny_router(dir: &Path, e: &Engine, sections: &str, pool: &str) -> RouterProcess {
    tiny::write_model_dir(dir).unwrap();
    let cfg = dir.join("router.yaml");
    let yaml = format!(
        "{sections}\npools:\n  - model: m\n    strategy: kv_aware\n    tokenizer: '{}'\n{pool}\n    backends: [{{url: 'http://{}'}}]\n",
        dir.display(),
        e.addr
    );
    std::fs::write(&cfg, yaml).unwrap();
    RouterProcess::spawn(&["--config", cfg.to_str().unwrap()]).await
}

/// About `bytes` of corpus text, distinct per `seed` (no chunk in common).
fn text(seed: usize, bytes: usize) -> String {
    let mut s = String::with_capacity(bytes + 4096);
    let mut at = seed * 7919;
    while s.len() < bytes {
        s.push_str(&format!("part{seed}x{at} "));
        s.push_str(&tiny::corpus_slice(at, 4000));
        at += 3989;
    }
    s
}

/// `warmpath_work_offloaded_total` on `r`'s `/metrics`.
async fn offloaded(c: &TestClient, r: &RouterProcess) -> Option<f64> {
    let metrics = String::from_utf8(get_url(c, &r.url("/metrics")).await.body.to_vec()).unwrap();
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("warmpath_work_offloaded_total "))
        .and_then(|v| v.parse().ok())
}

fn chat_of(text: &str) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": text}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_over_max_prompt_tokens_gets_vllms_400_and_is_not_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(None).await;
    let r = tiny_router(dir.path(), &e, "", "    max_prompt_tokens: 200").await;
    let c = client();
    let url = r.url("/v1/chat/completions");
    assert_eq!(
        post(&c, &url, &chat_of("hello there"), &[]).await.status,
        200
    );
    // A few hundred tokens: counted exactly.
    let long = text(0, 2000);
    let err = post(&c, &url, &chat_of(&long), &[]).await.error(400);
    assert_eq!(err["code"], "context_length_exceeded");
    assert_eq!(err["param"], "input_tokens");
    let msg = err["message"].as_str().unwrap();
    assert!(
        msg.starts_with(
            "This model's maximum context length is 201 tokens. However, your request has "
        ) && msg.ends_with(" input tokens. Please reduce the length of the input messages."),
        "{msg}"
    );
    // 8 MB: refused soon after the cap, not after tokenizing all of it.
    let giant = text(1, 8 << 20);
    let t = Instant::now();
    let err = post(&c, &url, &chat_of(&giant), &[]).await.error(400);
    assert!(
        err["message"].as_str().unwrap().contains("has at least "),
        "{err}"
    );
    eprintln!("8 MB prompt refused in {:?}", t.elapsed());
    // Token-id prompts are capped too.
    let ids: Vec<u32> = (0..300).collect();
    let body = json!({"model": "m", "prompt": ids});
    let err = post(&c, &r.url("/v1/completions"), &body, &[])
        .await
        .error(400);
    assert!(
        err["message"]
            .as_str()
            .unwrap()
            .contains("has 300 input tokens"),
        "{err}"
    );
    assert_eq!(
        e.chats.load(Ordering::SeqCst),
        1,
        "only the short chat went upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cap_defaults_to_the_engines_max_model_len() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(Some(64)).await;
    let r = tiny_router(dir.path(), &e, "health: {probe_interval_ms: 50}", "").await;
    let c = client();
    let url = r.url("/v1/chat/completions");
    let long = chat_of(&text(0, 1000));
    // Learned from the card within a few probe intervals: then 400 with the
    // engine's own limit in vLLM's words.
    let msg = poll(
        "the cap learned from /v1/models",
        Duration::from_secs(20),
        Duration::from_millis(50),
        async || {
            let reply = post(&c, &url, &long, &[]).await;
            (reply.status == 400).then(|| {
                reply.json()["error"]["message"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            })
        },
    )
    .await;
    assert!(
        msg.starts_with("This model's maximum context length is 64 tokens."),
        "{msg}"
    );
    assert_eq!(post(&c, &url, &chat_of("hi"), &[]).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn giant_bodies_are_routed_off_the_serving_threads() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(None).await;
    // Bodies of 256 KiB and up go to the work pool (one thread per CPU).
    let r = tiny_router(dir.path(), &e, "", "").await;
    let c = client();
    let url = r.url("/v1/chat/completions");
    let giants: Vec<_> = (0..3)
        .map(|i| {
            let (c, url) = (c.clone(), url.clone());
            // Distinct texts: no chunk is remembered from another giant.
            let body = chat_of(&text(i, 6 << 20));
            tokio::spawn(async move {
                let reply = post(&c, &url, &body, &[]).await;
                (reply.status, Instant::now())
            })
        })
        .collect();
    // While they are tokenized, /health and a small chat answer at once.
    let mut slowest = Duration::ZERO;
    let mut probes = 0;
    let t = Instant::now();
    while giants.iter().any(|g| !g.is_finished()) && t.elapsed() < Duration::from_secs(120) {
        let t = Instant::now();
        assert_eq!(get_url(&c, &r.url("/health")).await.status, 200);
        assert_eq!(post(&c, &url, &chat_of("small"), &[]).await.status, 200);
        slowest = slowest.max(t.elapsed());
        probes += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for g in giants {
        assert_eq!(g.await.unwrap().0, 200);
    }
    eprintln!("{probes} probes while 3 giants were routed; slowest {slowest:?}");
    assert!(
        probes >= 3,
        "the giants finished before they could be probed ({probes})"
    );
    assert!(
        slowest < Duration::from_secs(1),
        "a small request waited {slowest:?}"
    );
    assert_eq!(offloaded(&c, &r).await, Some(3.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_big_query_is_answered_on_the_work_pool_under_the_same_cap() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(None).await;
    let r = tiny_router(dir.path(), &e, "", "    max_prompt_tokens: 400000").await;
    let c = client();
    let url = r.url("/cache-index/query");
    // Over the work pool's 256 KiB.
    let big = post(&c, &url, &chat_of(&text(3, 300_000)), &[]).await;
    assert_eq!(big.status, 200, "{:?}", big.body);
    assert!(big.json()["blocks"].as_u64().unwrap() > 1000);
    let small = post(&c, &url, &chat_of("hello"), &[]).await;
    assert_eq!(small.status, 200);
    assert_eq!(
        offloaded(&c, &r).await,
        Some(1.0),
        "only the big query went to the pool"
    );
    // The prompt cap holds for queries too.
    let over = post(&c, &url, &chat_of(&text(4, 3_000_000)), &[])
        .await
        .error(400);
    assert_eq!(over["code"], "context_length_exceeded");
    assert_eq!(
        e.chats.load(Ordering::SeqCst),
        0,
        "queries send nothing upstream"
    );
}

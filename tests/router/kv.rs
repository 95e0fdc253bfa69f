//! `kv_aware` end to end, with the router running in-process (so that the
//! tests can fill its cache index through the core API until agents do) and
//! real HTTP test backends; and the proof that the router's token ids equal
//! what the engine computes with the generated tiny tokenizer and template.

use crate::support;

use serde_json::{json, Value};
use std::path::Path;
use support::*;
use tokio_util::sync::CancellationToken;
use warmpath_core::tokenize::{tiny, ChatTokenizer};
use warmpath_core::{hash_tokens, BlockHash, HashSeed, Request, Tier};
use warmpath_router::config::{PoolConfig, RouterConfig};
use warmpath_router::RunningRouter;

async fn start(dir: &Path, bs: &[TestBackend], threshold: u32) -> RunningRouter {
    start_pool(dir, bs, threshold, "m").await
}

/// `/metrics` is one recorder for the whole test process, so a test that
/// reads a pool's series names its pool apart from the other tests' `m`.
async fn start_pool(dir: &Path, bs: &[TestBackend], threshold: u32, model: &str) -> RunningRouter {
    tiny::write_model_dir(dir).unwrap();
    let mut pool = PoolConfig::new(model);
    pool.tokenizer = Some(dir.to_owned());
    pool.prefix_aware.concurrency_threshold = threshold;
    pool.backends = bs.iter().map(TestBackend::config).collect();
    let config = RouterConfig {
        listen: "127.0.0.1:0".into(),
        pools: vec![pool],
        ..Default::default()
    };
    warmpath_router::start(config, CancellationToken::new())
        .await
        .unwrap()
}

fn system_prompt() -> String {
    (0..4)
        .map(|i| tiny::corpus_slice(i * 1400, 1400))
        .collect::<Vec<_>>()
        .join("\n")
}

fn request(question: &str) -> Value {
    chat("m", question)
}

fn chat(model: &str, question: &str) -> Value {
    json!({"model": model, "messages": [
        {"role": "system", "content": system_prompt()},
        {"role": "user", "content": question},
    ]})
}

fn hashes(v: &Value) -> Vec<BlockHash> {
    v["block_hashes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| BlockHash::from_hex(h.as_str().unwrap()).unwrap())
        .collect()
}

fn url(r: &RunningRouter, path: &str) -> String {
    format!("http://{}{path}", r.http_addr)
}

/// The pool of the test that reads `/metrics`.
const WARM: &str = "warm";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_aware_routes_to_the_worker_that_holds_the_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let bs = vec![
        TestBackend::start("w0").await,
        TestBackend::start("w1").await,
        TestBackend::start("w2").await,
    ];
    let r = start_pool(dir.path(), &bs, 64, WARM).await;
    let c = client();
    let q = post(
        &c,
        &url(&r, "/cache-index/query"),
        &chat(WARM, "first?"),
        &[],
    )
    .await
    .json();
    assert_eq!(q["strategy"], "kv_aware");
    let chain = hashes(&q);
    assert!(
        chain.len() > 40,
        "a long prompt has many blocks: {}",
        chain.len()
    );
    assert_eq!(q["decision"]["decision"], "prefix_hash", "cold: falls back");
    assert_eq!(
        bs.iter().map(TestBackend::count).sum::<usize>(),
        0,
        "query sends nothing upstream"
    );

    let index = r.index(WARM).unwrap();
    let slot = index.worker_slot("w2").unwrap();
    let held = chain.len() - 3;
    index.store(slot, Tier::Gpu, &chain[..held]).unwrap();

    for question in [
        "first?",
        "a different question that shares the system prompt",
    ] {
        let reply = post(
            &c,
            &url(&r, "/v1/chat/completions"),
            &chat(WARM, question),
            &[],
        )
        .await;
        assert_eq!(reply.status, 200);
        assert_eq!((reply.backend(), reply.decision()), ("w2", "kv_match"));
    }
    let q = post(
        &c,
        &url(&r, "/cache-index/query"),
        &chat(WARM, "first?"),
        &[],
    )
    .await
    .json();
    assert_eq!(q["workers"][2]["matched_blocks"], held);
    assert_eq!(q["workers"][0]["matched_blocks"], 0);

    // A tenant salts the chain: nothing matches, so it falls back.
    let q = post(
        &c,
        &url(&r, "/cache-index/query"),
        &chat(WARM, "first?"),
        &[("x-prefix-aware-id", "acme")],
    )
    .await
    .json();
    assert_eq!(q["tenant"], "acme");
    assert_ne!(hashes(&q)[0], chain[0]);
    assert_eq!(q["decision"]["decision"], "prefix_hash");

    let idx = get_url(&c, &url(&r, "/cache-index")).await.json();
    let p = &idx["pools"][0];
    assert_eq!(p["workers"][2]["blocks"], held);
    assert_eq!(p["workers"][2]["tiers"]["gpu"], held);
    let warm = &p["warmest_chains"][0];
    assert_eq!(warm["root"], chain[0].to_hex());
    assert_eq!(warm["hits"], 2);
    assert_eq!(warm["holders"][0]["worker_id"], "w2");
    assert_eq!(warm["holders"][0]["blocks"], held);
    assert_eq!(warm["routed"][0]["worker_id"], "w2");
    let words: String = system_prompt().chars().take(40).collect();
    assert!(!idx.to_string().contains(&words), "no prompt text");
    // The hot path's memos served the repeated system prompt: the first
    // query encoded its chunks, the two chats and the two later queries
    // found every one of them.
    let caches = idx["hot_path_caches"].as_array().unwrap();
    let count = |pool: &str, cache: &str, what: &str| {
        caches
            .iter()
            .find(|c| c["pool"] == pool && c["cache"] == cache)
            .unwrap_or_else(|| panic!("{pool}/{cache} missing: {caches:?}"))[what]
            .as_u64()
            .unwrap()
    };
    let chunks = count(WARM, "chunks", "misses");
    assert!(
        chunks >= 2,
        "the system prompt is cut into chunks: {caches:?}"
    );
    assert_eq!(count(WARM, "chunks", "hits"), 4 * chunks, "{caches:?}");
    assert!(count(WARM, "words", "hits") > 0, "{caches:?}");
    let metrics = String::from_utf8(get_url(&c, &url(&r, "/metrics")).await.body.to_vec()).unwrap();
    let want = format!(" {}", 4 * chunks);
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("warmpath_hot_cache_hits_total")
                && l.contains("pool=\"warm\"")
                && l.contains("cache=\"chunks\"")
                && l.ends_with(&want)),
        "{metrics}"
    );
    assert!(
        metrics.contains("phase=\"tokenize\""),
        "tokenize phase timed"
    );
    assert!(metrics.contains("warmpath_predicted_cached_tokens_total"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_aware_spills_when_the_holder_is_full() {
    let dir = tempfile::tempdir().unwrap();
    let bs = vec![
        TestBackend::start("w0").await,
        TestBackend::start("w1").await,
    ];
    let r = start(dir.path(), &bs, 1).await;
    let c = client();
    let chain = hashes(
        &post(&c, &url(&r, "/cache-index/query"), &request("q"), &[])
            .await
            .json(),
    );
    let index = r.index("m").unwrap();
    index
        .store(index.worker_slot("w0").unwrap(), Tier::Gpu, &chain)
        .unwrap();
    let mut held = request("q");
    held["x_hold"] = json!("release");
    let (c2, u2) = (client(), url(&r, "/v1/chat/completions"));
    let h = tokio::spawn(async move { post(&c2, &u2, &held, &[]).await });
    eventually("held on w0", || bs[0].active() == 1).await;
    let reply = post(&c, &url(&r, "/v1/chat/completions"), &request("q"), &[]).await;
    assert_eq!((reply.backend(), reply.decision()), ("w1", "spill"));
    bs[0].release();
    let first = h.await.unwrap();
    assert_eq!((first.backend(), first.decision()), ("w0", "kv_match"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_id_prompts_are_hashed_as_given() {
    let dir = tempfile::tempdir().unwrap();
    let bs = vec![TestBackend::start("w0").await];
    let r = start(dir.path(), &bs, 64).await;
    let c = client();
    let ids: Vec<u32> = (0..100).collect();
    let body = json!({"model": "m", "prompt": ids});
    let q = post(&c, &url(&r, "/cache-index/query"), &body, &[])
        .await
        .json();
    assert_eq!(
        hashes(&q),
        hash_tokens(HashSeed::new("m", "", ""), 16, &ids)
    );
    let q = post(
        &c,
        &url(&r, "/cache-index/query"),
        &body,
        &[("x-prefix-aware-id", "acme")],
    )
    .await
    .json();
    assert_eq!(
        hashes(&q),
        hash_tokens(HashSeed::new("m", "", "acme"), 16, &ids)
    );
    // And the golden vector of DESIGN.md through the router.
    let body = json!({"model": "m", "prompt": (0..32).collect::<Vec<u32>>()});
    let q = post(&c, &url(&r, "/cache-index/query"), &body, &[])
        .await
        .json();
    assert_eq!(
        q["block_hashes"],
        json!(["d3034b7f684156db", "ab6763183c4579bf"])
    );
}

/// The chat template rendered independently of warmpath (plain minijinja
/// with Hugging Face's settings), then encoded by the `tokenizers` library
/// as vLLM does: chat text without special tokens, completions with them.
fn engine_ids(dir: &Path, body: &Value) -> Vec<u32> {
    let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    if let Some(prompt) = body.get("prompt") {
        return tok
            .encode(prompt.as_str().unwrap(), true)
            .unwrap()
            .get_ids()
            .to_vec();
    }
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(dir.join("tokenizer_config.json")).unwrap()).unwrap();
    let mut env = minijinja::Environment::new();
    env.set_syntax(
        minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .unwrap(),
    );
    env.add_template("chat", cfg["chat_template"].as_str().unwrap())
        .unwrap();
    let text = env
        .get_template("chat")
        .unwrap()
        .render(minijinja::context! {
            messages => minijinja::value::Serde(body["messages"].clone()),
            bos_token => minijinja::value::Serde(cfg["bos_token"].clone()),
            eos_token => minijinja::value::Serde(cfg["eos_token"].clone()),
            add_generation_prompt => true,
        })
        .unwrap();
    tok.encode(text, false).unwrap().get_ids().to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_token_ids_equal_the_engines() {
    let dir = tempfile::tempdir().unwrap();
    let bs = vec![TestBackend::start("w0").await];
    let r = start(dir.path(), &bs, 64).await;
    let c = client();
    let chat_tok = ChatTokenizer::load(dir.path()).unwrap();
    let cases = vec![
        request("What does the passage say?"),
        json!({"model": "m", "messages": [
            {"role": "system", "content": "  You are terse.  "},
            {"role": "user", "content": "héllo wörld — ünïcode ✓ 日本語"},
            {"role": "assistant", "content": "Hi.\n\nHow can I help?"},
            {"role": "user", "content": "Say <|eot_id|> literally, and tabs\tand  spaces."},
        ]}),
        json!({"model": "m", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]}]}),
        json!({"model": "m", "prompt": tiny::corpus_slice(100, 3000)}),
    ];
    for body in cases {
        let want = match body["messages"][0]["content"].as_array() {
            Some(parts) => {
                // vLLM joins text parts with "\n" before templating.
                let joined: Vec<&str> = parts.iter().map(|p| p["text"].as_str().unwrap()).collect();
                let mut flat = body.clone();
                flat["messages"][0]["content"] = json!(joined.join("\n"));
                engine_ids(dir.path(), &flat)
            }
            None => engine_ids(dir.path(), &body),
        };
        let req =
            Request::from_slice(body.to_string().as_bytes(), warmpath_core::Expect::Any).unwrap();
        assert_eq!(
            chat_tok.encode_request(&req).unwrap(),
            want,
            "ChatTokenizer ids for {body}"
        );
        let q = post(&c, &url(&r, "/cache-index/query"), &body, &[])
            .await
            .json();
        assert_eq!(
            hashes(&q),
            hash_tokens(HashSeed::new("m", "", ""), 16, &want),
            "router hashes for {body}"
        );
    }
}

/// A request of another prefix (system prompt `k`), for the load of others.
fn other(k: usize) -> Value {
    json!({"model": "m", "messages": [
        {"role": "system", "content": tiny::corpus_slice(20_000 + k * 1500, 1400)},
        {"role": "user", "content": "q"},
    ]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_aware_replicates_a_prefix_too_hot_for_one_backend_until_its_load_falls() {
    let dir = tempfile::tempdir().unwrap();
    let bs = vec![
        TestBackend::start("w0").await,
        TestBackend::start("w1").await,
    ];
    let r = start(dir.path(), &bs, 64).await;
    let c = client();
    let chat = url(&r, "/v1/chat/completions");
    let chain = hashes(
        &post(&c, &url(&r, "/cache-index/query"), &request("q"), &[])
            .await
            .json(),
    );
    let index = r.index("m").unwrap();
    index
        .store(index.worker_slot("w0").unwrap(), Tier::Gpu, &chain)
        .unwrap();
    // All the traffic is one prefix: more than one backend's even share.
    // Once its popularity is known, one request starts a copy on w1.
    let mut copy = None;
    for i in 0..100 {
        let reply = post(&c, &chat, &request(&format!("q{i}")), &[]).await;
        assert_eq!(reply.status, 200);
        if reply.decision() == "replicate" {
            copy = Some(reply.backend().to_owned());
            break;
        }
        assert_eq!((reply.backend(), reply.decision()), ("w0", "kv_match"));
    }
    assert_eq!(copy.as_deref(), Some("w1"), "no copy was started");
    // Its blocks are published there (as its agent would): both serve it.
    index
        .store(index.worker_slot("w1").unwrap(), Tier::Gpu, &chain)
        .unwrap();
    let mut served = [0u32; 2];
    for i in 0..30 {
        let reply = post(&c, &chat, &request(&format!("p{i}")), &[]).await;
        assert_eq!(reply.decision(), "kv_match");
        served[usize::from(reply.backend() == "w1")] += 1;
    }
    assert!(served[0] > 0 && served[1] > 0, "{served:?}");
    let metrics = String::from_utf8(get_url(&c, &url(&r, "/metrics")).await.body.to_vec()).unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("warmpath_requests_total")
                && l.contains("decision=\"replicate\"")),
        "{metrics}"
    );
    // Other prefixes now bring most of the traffic: one backend serves the
    // hot one within an even share again. The copy is dropped, no other is
    // started, and its requests stay on one backend although both hold it.
    for k in 0..200 {
        let reply = post(&c, &chat, &other(k % 5), &[]).await;
        assert_eq!(reply.status, 200);
    }
    let mut last = Vec::new();
    for i in 0..20 {
        let reply = post(&c, &chat, &request(&format!("r{i}")), &[]).await;
        assert_ne!(reply.decision(), "replicate");
        last.push(reply.backend().to_owned());
    }
    let tail = &last[10..];
    assert!(tail.iter().all(|b| *b == tail[0]), "{last:?}");
}

/// A cold prompt of its own for each `k` (a distinct system prompt).
fn cold_prompt(k: usize) -> Value {
    json!({"model": "m", "messages": [
        {"role": "system", "content": tiny::corpus_slice(k * 997, 1200)},
        {"role": "user", "content": "what does it say?"},
    ]})
}

/// Waits until `r` has nothing in flight (the last reply's guard dropped),
/// so each decision sees the same loads on both twins.
async fn settled(c: &TestClient, r: &RouterProcess) {
    let what = "no request in flight";
    let limit = std::time::Duration::from_secs(10);
    poll::poll(
        what,
        limit,
        std::time::Duration::from_millis(2),
        async || {
            let v = get_url(c, &r.url("/cache-index")).await.json();
            let busy = v["pools"][0]["workers"]
                .as_array()?
                .iter()
                .any(|w| w["in_flight"] != 0 || w["pending_prefill_blocks"] != 0);
            (!busy).then_some(())
        },
    )
    .await;
}

/// `POST /cache-index/query` is read-only (issue 17 item 6): the same
/// queries repeated give the same answers, each answer is what the next
/// routed request then does, and a router that answered many queries routes
/// exactly as a twin that answered none. (Before, kv_aware's query ran the
/// routed pick: it recorded a home, cache pressure and popularity for each
/// queried prefix, so repeated rounds answered differently and later
/// placements moved.) Real router binaries: this test's traffic stays out
/// of the in-process routers' metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_index_query_is_read_only() {
    let dir = tempfile::tempdir().unwrap();
    tiny::write_model_dir(dir.path()).unwrap();
    let bs = [
        TestBackend::start("w0").await,
        TestBackend::start("w1").await,
        TestBackend::start("w2").await,
    ];
    let pool = format!(
        "    strategy: kv_aware\n    tokenizer: '{}'",
        dir.path().display()
    );
    let refs: Vec<&TestBackend> = bs.iter().collect();
    let queried = yaml_router("", &pool, &refs).await;
    let twin = yaml_router("", &pool, &refs).await;
    let c = client();
    let query = async |k: usize| {
        let q = post(&c, &queried.url("/cache-index/query"), &cold_prompt(k), &[]).await;
        assert_eq!(q.status, 200);
        let v = q.json();
        (v["decision"].clone(), v["workers"].clone())
    };
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let mut round = Vec::new();
        for k in 0..8 {
            round.push(query(k).await);
        }
        rounds.push(round);
    }
    assert_eq!(rounds[0], rounds[1], "a repeated query answers the same");
    assert_eq!(rounds[1], rounds[2]);
    // Routed: the queried prompts and more, in the same order on both; on
    // the queried one each request is queried first, several times.
    let mut seen = [Vec::new(), Vec::new()];
    for k in (0..16).chain(0..8) {
        let (decision, _) = query(k).await;
        for _ in 0..3 {
            assert_eq!(query(k).await.0, decision);
        }
        for (i, r) in [&queried, &twin].into_iter().enumerate() {
            let reply = post(&c, &r.url("/v1/chat/completions"), &cold_prompt(k), &[]).await;
            assert_eq!(reply.status, 200);
            seen[i].push((reply.backend().to_owned(), reply.decision().to_owned()));
            settled(&c, r).await;
        }
        let (backend, kind) = seen[0].last().unwrap();
        assert_eq!(decision["worker_id"], backend.as_str(), "prompt {k}");
        assert_eq!(decision["decision"], kind.as_str(), "prompt {k}");
    }
    assert_eq!(seen[0], seen[1], "queries changed later routing decisions");
}

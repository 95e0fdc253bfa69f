//! The rest of vLLM's OpenAI surface through the real `warmpath-router`
//! binary: `/v1/embeddings`, `/v1/responses`, `/tokenize`, `/detokenize` and
//! the pooling endpoints (`/pooling`, `/score`, `/rerank`, …),
//! proxied to test backends that record what they received (paths, bodies
//! to the byte), routed by prefix where the body has a prompt, refused with
//! OpenAI-shaped errors when malformed; and `/v1/models` merging the
//! engines' own model cards.

use crate::support;

use bytes::Bytes;
use serde_json::{json, Value};
use std::collections::HashSet;
use support::*;

const PROMPTED: [&str; 3] = ["/v1/embeddings", "/v1/responses", "/tokenize"];

/// A prefix longer than the default prefix key (4096 characters), fixed by `seed`.
fn long(seed: &str) -> String {
    format!("{seed} ").repeat(8192 / (seed.len() + 1) + 1)
}

/// A body for `path` whose prompt is `seed`'s long prefix, then `tail`.
fn body(path: &str, seed: &str, tail: &str) -> Value {
    let p = long(seed);
    match path {
        "/v1/embeddings" => json!({"model": "m", "input": format!("{p}{tail}")}),
        "/v1/responses" => json!({"model": "m", "instructions": p, "input": tail}),
        "/tokenize" => json!({"model": "m", "messages": [
            {"role": "system", "content": p}, {"role": "user", "content": tail}]}),
        _ => json!({"model": "m", "tokens": [1, 2, 3]}),
    }
}

fn by_url<'a>(bs: &'a [TestBackend], url: &str) -> &'a TestBackend {
    bs.iter().find(|b| b.url() == url).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_endpoint_is_proxied_with_path_query_and_body_untouched() {
    let bs = backends(2).await;
    let r = router(&bs, &["--strategy", "prefix_aware"]).await;
    let c = client();
    for path in PROMPTED.iter().chain(&["/detokenize"]) {
        // Odd spacing and a field the router does not know: sent as is.
        let mut v = body(path, "alpha", "q");
        v["x_vendor_field"] = json!({"keep": [1, 2]});
        let raw = format!("  {}\n", v);
        let url = r.url(&format!("{path}?trace=1"));
        let reply = send(&c, request("POST", &url, raw.clone(), &[])).await;
        assert_eq!(reply.status, 200, "{path}: {:?}", reply.body);
        let want = if *path == "/detokenize" {
            "least_outstanding"
        } else {
            "prefix_hash"
        };
        assert_eq!(reply.decision(), want, "{path}");
        let got = by_url(&bs, reply.backend()).requests();
        let last = got.last().unwrap();
        assert_eq!(last.path, format!("{path}?trace=1"));
        assert_eq!(
            last.body,
            Bytes::from(raw),
            "{path}: body forwarded byte for byte"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompted_endpoints_stick_to_their_prefix_and_spread_others() {
    let bs = backends(2).await;
    let r = router(&bs, &["--strategy", "prefix_aware"]).await;
    let c = client();
    for path in PROMPTED {
        let url = r.url(path);
        let first = post(&c, &url, &body(path, "shared", "t0"), &[]).await;
        let owner = first.backend().to_owned();
        for i in 1..6 {
            let reply = post(&c, &url, &body(path, "shared", &format!("t{i}")), &[]).await;
            assert_eq!(
                (reply.backend(), reply.decision()),
                (owner.as_str(), "prefix_hash"),
                "{path}: same prefix, same backend"
            );
        }
        let mut owners = HashSet::new();
        for s in 0..24 {
            let reply = post(&c, &url, &body(path, &format!("seed{s}"), "q"), &[]).await;
            owners.insert(reply.backend().to_owned());
        }
        assert_eq!(owners.len(), 2, "{path}: different prefixes spread");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detokenize_goes_to_the_least_loaded_backend() {
    let bs = backends(2).await;
    let r = router(&bs, &["--strategy", "prefix_aware"]).await;
    let c = client();
    let url = r.url("/detokenize");
    let (c2, url2) = (client(), url.clone());
    let held = tokio::spawn(async move {
        let b = json!({"model": "m", "tokens": [1], "x_hold": "release"});
        post(&c2, &url2, &b, &[]).await
    });
    eventually("one held", || {
        bs.iter().map(TestBackend::active).sum::<u32>() == 1
    })
    .await;
    let busy = bs.iter().find(|b| b.active() == 1).unwrap().url();
    for _ in 0..5 {
        let reply = post(&c, &url, &json!({"model": "m", "tokens": [7, 8]}), &[]).await;
        assert_eq!(reply.decision(), "least_outstanding");
        assert_ne!(reply.backend(), busy, "never the busy backend");
    }
    bs.iter().for_each(TestBackend::release);
    assert_eq!(held.await.unwrap().status, 200);
}

/// vLLM's pooling endpoints (rerankers, scorers, classifiers, reward models).
const POOLING: [&str; 7] = [
    "/pooling",
    "/classify",
    "/score",
    "/v1/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pooling_endpoints_are_proxied_to_the_least_loaded_backend() {
    let bs = backends(2).await;
    let r = router(&bs, &["--strategy", "prefix_aware"]).await;
    let c = client();
    let (c2, url2) = (client(), r.url("/v1/completions"));
    let held = tokio::spawn(async move {
        let b = json!({"model": "m", "prompt": "x", "x_hold": "release"});
        post(&c2, &url2, &b, &[]).await
    });
    eventually("one held", || {
        bs.iter().map(TestBackend::active).sum::<u32>() == 1
    })
    .await;
    let busy = bs.iter().find(|b| b.active() == 1).unwrap().url();
    for path in POOLING {
        let raw = format!(
            " {}",
            json!({"model": "m", "query": "q", "documents": ["a", "b"], "x_vendor": 1})
        );
        let url = r.url(&format!("{path}?trace=1"));
        let reply = send(&c, request("POST", &url, raw.clone(), &[])).await;
        assert_eq!(reply.status, 200, "{path}: {:?}", reply.body);
        assert_eq!(reply.decision(), "least_outstanding", "{path}");
        assert_ne!(reply.backend(), busy, "{path}: never the busy backend");
        let got = by_url(&bs, reply.backend()).requests();
        let last = got.last().unwrap();
        assert_eq!(last.path, format!("{path}?trace=1"));
        assert_eq!(
            last.body,
            Bytes::from(raw),
            "{path}: forwarded byte for byte"
        );
        // Malformed and unknown-model bodies never reach a backend.
        let before: usize = bs.iter().map(TestBackend::count).sum();
        let e = send(&c, request("POST", &r.url(path), "{", &[]))
            .await
            .error(400);
        assert_eq!(e["code"], "invalid_json", "{path}");
        let other = json!({"model": "nope", "query": "q"});
        let e = post(&c, &r.url(path), &other, &[]).await.error(404);
        assert_eq!(e["code"], "model_not_found", "{path}");
        assert_eq!(bs.iter().map(TestBackend::count).sum::<usize>(), before);
        let get = send(&c, request("GET", &r.url(path), "", &[])).await;
        assert_eq!(get.status, 405, "{path}");
    }
    bs.iter().for_each(TestBackend::release);
    assert_eq!(held.await.unwrap().status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_get_openai_errors_and_reach_no_backend() {
    let bs = backends(1).await;
    let r = yaml_router(
        "max_body_bytes: 4096",
        "    strategy: prefix_aware",
        &[&bs[0]],
    )
    .await;
    let c = client();
    let cases: Vec<(&str, String, u16, &str, Option<&str>)> = vec![
        ("/v1/embeddings", "{".into(), 400, "invalid_json", None),
        ("/v1/embeddings", "[]".into(), 400, "invalid_json", None),
        (
            "/v1/embeddings",
            json!({"model": "m"}).to_string(),
            400,
            "missing_field",
            Some("input"),
        ),
        (
            "/v1/embeddings",
            json!({"model": "m", "input": []}).to_string(),
            400,
            "empty_field",
            Some("input"),
        ),
        (
            "/v1/embeddings",
            json!({"model": "m", "input": ["a", 2]}).to_string(),
            400,
            "invalid_type",
            Some("input[1]"),
        ),
        (
            "/v1/embeddings",
            json!({"model": 5, "input": "x"}).to_string(),
            400,
            "invalid_type",
            Some("model"),
        ),
        (
            "/v1/embeddings",
            json!({"model": "nope", "input": "x"}).to_string(),
            404,
            "model_not_found",
            Some("model"),
        ),
        ("/v1/responses", "nul".into(), 400, "invalid_json", None),
        (
            "/v1/responses",
            json!({"model": "m"}).to_string(),
            400,
            "missing_field",
            Some("input"),
        ),
        (
            "/v1/responses",
            json!({"model": "m", "input": 3}).to_string(),
            400,
            "invalid_type",
            Some("input"),
        ),
        (
            "/v1/responses",
            json!({"model": "m", "input": [{"role": 1}]}).to_string(),
            400,
            "invalid_type",
            Some("input[0].role"),
        ),
        (
            "/v1/responses",
            json!({"model": "m", "input": "x", "instructions": {}}).to_string(),
            400,
            "invalid_type",
            Some("instructions"),
        ),
        ("/tokenize", "{}x".into(), 400, "invalid_json", None),
        (
            "/tokenize",
            json!({"model": "m"}).to_string(),
            400,
            "missing_field",
            Some("prompt"),
        ),
        (
            "/tokenize",
            json!({"model": "m", "messages": [{"content": "x"}]}).to_string(),
            400,
            "invalid_type",
            Some("messages[0].role"),
        ),
        (
            "/tokenize",
            json!({"model": "m", "prompt": {}}).to_string(),
            400,
            "invalid_type",
            Some("prompt"),
        ),
        ("/detokenize", "".into(), 400, "invalid_json", None),
        (
            "/detokenize",
            json!({"model": "m"}).to_string(),
            400,
            "missing_field",
            Some("tokens"),
        ),
        (
            "/detokenize",
            json!({"model": "m", "tokens": [1, -1]}).to_string(),
            400,
            "invalid_type",
            Some("tokens[1]"),
        ),
        (
            "/detokenize",
            json!({"model": "m", "tokens": "1 2"}).to_string(),
            400,
            "invalid_type",
            Some("tokens"),
        ),
        (
            "/v1/responses",
            json!({"model": "m", "input": "x".repeat(5000)}).to_string(),
            413,
            "request_too_large",
            None,
        ),
        (
            "/v1/embeddings",
            json!({"model": "m", "input": "x", "prompt_cache_key": 1}).to_string(),
            400,
            "invalid_type",
            Some("prompt_cache_key"),
        ),
    ];
    for (path, raw, status, code, param) in cases {
        let reply = send(&c, request("POST", &r.url(path), raw.clone(), &[])).await;
        let e = reply.error(status);
        assert_eq!(e["code"], code, "{path} {raw}: {e}");
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{path} {raw}: {e}");
        }
    }
    for path in PROMPTED.iter().chain(&["/detokenize"]) {
        let reply = get_url(&c, &r.url(path)).await;
        assert_eq!(reply.error(405)["code"], "method_not_allowed", "{path}");
        assert_eq!(reply.header("allow"), "POST");
    }
    assert_eq!(bs[0].count(), 0, "nothing malformed was forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_defaults_to_the_only_pool_and_tenants_salt_what_prefills() {
    let b = TestBackend::start("b").await;
    let r = yaml_router("", "    strategy: prefix_aware", &[&b]).await;
    let c = client();
    let tenant = [("x-prefix-aware-id", "team-a")];
    // vLLM's `model` is optional: the only pool serves it.
    let reply = post(&c, &r.url("/tokenize"), &json!({"prompt": "hi"}), &tenant).await;
    assert_eq!(reply.status, 200);
    let got = b.requests().last().unwrap().json();
    assert_eq!(
        got,
        json!({"prompt": "hi"}),
        "tokenize: no cache_salt added"
    );
    for path in ["/v1/embeddings", "/v1/responses"] {
        let v = json!({"model": "m", "input": "hello"});
        assert_eq!(post(&c, &r.url(path), &v, &tenant).await.status, 200);
        let got = b.requests().last().unwrap().json();
        assert_eq!(got["cache_salt"], "team-a", "{path}");
        assert_eq!(got["input"], "hello");
    }
    let bad = [("x-prefix-aware-id", "")];
    let e = post(&c, &r.url("/detokenize"), &json!({"tokens": [1]}), &bad)
        .await
        .error(400);
    assert_eq!(e["code"], "invalid_tenant");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_merges_the_engines_own_cards() {
    let a = TestBackend::start("a").await;
    let b = TestBackend::start("b").await;
    a.set_cards(json!([
        {"id": "m", "object": "model", "created": 11, "owned_by": "vllm",
         "root": "/models/m", "parent": null, "max_model_len": 8192,
         "permission": [{"id": "modelperm-1"}]},
        {"id": "sql", "object": "model", "created": 12, "owned_by": "vllm",
         "root": "/lora/sql", "parent": "m"},
        {"id": "unrelated", "object": "model", "parent": null},
    ]));
    b.set_cards(json!([
        {"id": "m", "object": "model", "root": "/other/m", "max_model_len": 4096},
    ]));
    let yaml = "health: {probe_interval_ms: 100}\n";
    let pool = "    strategy: random";
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("router.yaml");
    std::fs::write(
        &cfg,
        format!(
            "{yaml}pools:\n  - model: m\n{pool}\n    backends:\n      - {{url: '{}', worker_id: a}}\n      - {{url: '{}', worker_id: b}}\n",
            a.url(),
            b.url()
        ),
    )
    .unwrap();
    let r = RouterProcess::spawn(&["--config", cfg.to_str().unwrap()]).await;
    let c = client();
    let url = r.url("/v1/models");
    let mut cards = Value::Null;
    for _ in 0..200 {
        cards = get_url(&c, &url).await.json();
        if cards["data"][0]["max_model_len"] == 4096 && cards["data"].as_array().unwrap().len() == 2
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let data = cards["data"].as_array().unwrap();
    let ids: Vec<&str> = data.iter().map(|d| d["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["m", "sql"], "{cards}");
    let m = &data[0];
    assert_eq!(
        m["max_model_len"], 4096,
        "the smallest any engine serves: {m}"
    );
    assert_eq!(m["root"], "/models/m", "the first engine's card, kept: {m}");
    assert_eq!(m["owned_by"], "vllm");
    assert_eq!(m["created"], 11);
    assert_eq!(m["permission"][0]["id"], "modelperm-1");
    assert!(m.get("parent").is_some_and(Value::is_null), "{m}");
    let sql = &data[1];
    assert_eq!(
        (&sql["root"], &sql["parent"]),
        (&json!("/lora/sql"), &json!("m"))
    );
}

/// Each prompted endpoint, kv_aware with the tiny tokenizer (the router in
/// process, its index filled through the core API): routed to the worker
/// holding the blocks of the chat or completion body it amounts to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_aware_routes_each_prompted_endpoint_to_the_worker_holding_its_blocks() {
    use tokio_util::sync::CancellationToken;
    use warmpath_core::tokenize::tiny;
    use warmpath_core::{BlockHash, Tier};
    use warmpath_router::config::{PoolConfig, RouterConfig};
    let dir = tempfile::tempdir().unwrap();
    tiny::write_model_dir(dir.path()).unwrap();
    let bs = [
        TestBackend::start("w0").await,
        TestBackend::start("w1").await,
        TestBackend::start("w2").await,
    ];
    let mut pool = PoolConfig::new("m");
    pool.tokenizer = Some(dir.path().to_owned());
    pool.backends = bs.iter().map(TestBackend::config).collect();
    let config = RouterConfig {
        listen: "127.0.0.1:0".into(),
        pools: vec![pool],
        ..Default::default()
    };
    let r = warmpath_router::start(config, CancellationToken::new())
        .await
        .unwrap();
    let url = |path: &str| format!("http://{}{path}", r.http_addr);
    let text = (0..3)
        .map(|i| tiny::corpus_slice(i * 1400, 1400))
        .collect::<Vec<_>>()
        .join("\n");
    let user = |content: &str| json!({"role": "user", "content": content});
    let cases = [
        (
            "/v1/embeddings",
            json!({"model": "m", "input": text}),
            json!({"model": "m", "prompt": text}),
            "w1",
        ),
        (
            "/v1/responses",
            json!({"model": "m", "instructions": text, "input": "why?"}),
            json!({"model": "m", "messages": [
                {"role": "system", "content": text}, user("why?")]}),
            "w2",
        ),
        (
            "/tokenize",
            json!({"model": "m", "messages": [user(&text)]}),
            json!({"model": "m", "messages": [user(&text)]}),
            "w0",
        ),
    ];
    let c = client();
    let index = r.index("m").unwrap();
    for (path, body, same, worker) in cases {
        let q = post(&c, &url("/cache-index/query"), &same, &[])
            .await
            .json();
        assert_eq!(q["strategy"], "kv_aware");
        let chain: Vec<BlockHash> = q["block_hashes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| BlockHash::from_hex(h.as_str().unwrap()).unwrap())
            .collect();
        assert!(chain.len() > 20, "{path}: {} blocks", chain.len());
        let slot = index.worker_slot(worker).unwrap();
        index.store(slot, Tier::Gpu, &chain).unwrap();
        let reply = post(&c, &url(path), &body, &[]).await;
        assert_eq!(
            (reply.backend(), reply.decision()),
            (worker, "kv_match"),
            "{path}"
        );
    }
}

/// The peak resident memory of process `pid` (VmHWM), in MiB.
fn peak_rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_native_body_costs_its_bytes_not_a_json_tree() {
    let b = TestBackend::start("b").await;
    let r = yaml_router("", "    strategy: prefix_aware", &[&b]).await;
    let c = client();
    // 24 MiB of `0,`: as a serde_json::Value that is 12M values of 32
    // bytes and more, parsed on an async worker (over 0.5 GiB a request).
    let mut body = String::from("{\"model\":\"m\",\"inputs\":[");
    body.push_str(&"0,".repeat(12 * 1024 * 1024));
    body.push_str("0]}");
    let body = bytes::Bytes::from(body);
    let base = peak_rss_mib(r.pid());
    let mut sent = Vec::new();
    for _ in 0..3 {
        let (c, url, body) = (c.clone(), r.url("/invocations"), body.clone());
        sent.push(tokio::spawn(async move {
            send(&c, request("POST", &url, body, &[])).await
        }));
    }
    // /health answers meanwhile.
    let t = std::time::Instant::now();
    assert_eq!(get_url(&c, &r.url("/health")).await.status, 200);
    assert!(
        t.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        t.elapsed()
    );
    for s in sent {
        // Routed and forwarded (the test engine's own 2 MiB limit cuts
        // the upload short: its answer or a 502).
        let reply = s.await.unwrap();
        assert_eq!(reply.backend(), b.url(), "{:?}", reply.status);
    }
    let grown = peak_rss_mib(r.pid()).saturating_sub(base);
    // Three bodies of 24 MiB held at once, plus their copies upstream.
    assert!(grown < 400, "peak RSS grew by {grown} MiB");
}

//! End-to-end tests of the real `warmpath-router` binary against real local
//! HTTP backends (tests/support), everything on 127.0.0.1 port 0.

use crate::support;

use serde_json::{json, Value};
use std::collections::{HashMap, HashSet};
use std::time::Duration;
use support::*;

fn by_url<'a>(bs: &'a [TestBackend], url: &str) -> &'a TestBackend {
    bs.iter().find(|b| b.url() == url).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_passes_through_byte_for_byte_and_chunk_by_chunk() {
    let bs = backends(1).await;
    let r = router(&bs, &["--strategy", "random"]).await;
    let c = client();
    let body = json!({"model": "m", "stream": true, "x_chunks": 6, "x_delay_ms": 30,
                      "messages": [{"role": "user", "content": "hi"}]});
    let (status, headers, frames, err) =
        post_frames(&c, &r.url("/v1/chat/completions"), &body).await;
    assert_eq!(status, 200);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(headers["x-warmpath-backend"], bs[0].url().as_str());
    assert_eq!(headers["x-warmpath-decision"], "random");
    let got: Vec<u8> = frames.iter().flat_map(|f| f.to_vec()).collect();
    assert_eq!(
        String::from_utf8(got).unwrap(),
        sse_chunks("b0", 6).concat()
    );
    assert!(
        frames.len() >= 4,
        "the stream arrived in {} frame(s), not chunk by chunk",
        frames.len()
    );
    let rec = &bs[0].requests()[0];
    assert_eq!(rec.path, "/v1/chat/completions");
    assert_eq!(rec.json(), body, "body forwarded unchanged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_headers_and_bodies_pass_through() {
    let bs = backends(1).await;
    let r = router(&bs, &[]).await;
    let c = client();
    let raw = "{\"model\":\"m\",  \"prompt\":\"x\", \"x_status\": 418}";
    let reply = send(
        &c,
        request(
            "POST",
            &r.url("/v1/completions?trace=1"),
            raw,
            &[
                ("x-custom", "yes"),
                ("connection", "keep-alive, x-hop"),
                ("x-hop", "this hop only"),
            ],
        ),
    )
    .await;
    assert_eq!(reply.status, 418);
    assert_eq!(reply.json()["backend"], "b0");
    assert_eq!(reply.decision(), "prefix_hash");
    let rec = &bs[0].requests()[0];
    assert_eq!(rec.path, "/v1/completions?trace=1");
    assert_eq!(rec.body, raw.as_bytes(), "byte-identical body");
    assert_eq!(rec.headers["x-custom"], "yes");
    assert!(
        !rec.headers.contains_key("x-hop"),
        "a header the client's Connection names is not forwarded: {:?}",
        rec.headers
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_gets_an_openai_error_and_nothing_goes_upstream() {
    let bs = backends(1).await;
    let r = router(&bs, &["--max-body-bytes", "4096"]).await;
    let c = client();
    let chat = r.url("/v1/chat/completions");
    let raw = |b: &str| request("POST", &chat, b.to_owned(), &[]);
    let e = send(&c, raw("{\"model\": ")).await.error(400);
    assert_eq!(e["code"], "invalid_json");
    send(&c, raw("[1,2]")).await.error(400);
    let e = post(
        &c,
        &chat,
        &json!({"messages": [{"role": "user", "content": "x"}]}),
        &[],
    )
    .await
    .error(400);
    assert_eq!(e["param"], "model");
    let e = post(
        &c,
        &chat,
        &json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
        &[],
    )
    .await
    .error(404);
    assert_eq!(e["code"], "model_not_found");
    let e = post(&c, &chat, &json!({"model": "m", "messages": []}), &[])
        .await
        .error(400);
    assert_eq!(e["param"], "messages");
    post(&c, &chat, &json!({"model": "m", "messages": "hi"}), &[])
        .await
        .error(400);
    let big = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(5000)}]});
    let e = post(&c, &chat, &big, &[]).await.error(413);
    assert_eq!(e["code"], "request_too_large");
    let ok = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
    let long = "t".repeat(65);
    let e = post(&c, &chat, &ok, &[("x-prefix-aware-id", long.as_str())])
        .await
        .error(400);
    assert_eq!(e["code"], "invalid_tenant");
    let two = [("x-prefix-aware-id", "a"), ("x-prefix-aware-id", "b")];
    let e = post(&c, &chat, &ok, &two).await.error(400);
    assert_eq!(e["code"], "invalid_tenant");
    assert!(
        e["message"].as_str().unwrap().contains("more than once"),
        "{e}"
    );
    let mut bad_key = ok.clone();
    bad_key["prompt_cache_key"] = json!(7);
    post(&c, &chat, &bad_key, &[]).await.error(400);
    let mut empty_key = ok.clone();
    empty_key["prompt_cache_key"] = json!("");
    post(&c, &chat, &empty_key, &[]).await.error(400);
    let e = post(
        &c,
        &r.url("/v1/completions"),
        &json!({"model": "m", "prompt": [[]]}),
        &[],
    )
    .await
    .error(400);
    assert!(e["message"].as_str().unwrap().contains("prompt"), "{e}");
    send(&c, request("POST", &chat, vec![0xff, 0xfe], &[]))
        .await
        .error(400);
    assert_eq!(bs[0].count(), 0, "nothing reached the backend");
    // And the router is still fine.
    assert_eq!(post(&c, &chat, &ok, &[]).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_failures_retry_elsewhere_then_eject_then_503() {
    // A port that refuses connections: bind, note, close.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let live = TestBackend::start("live").await;
    let lurl = live.url();
    let c = client();
    let r = RouterProcess::spawn(&[
        "--model",
        "m",
        "--backend",
        &dead,
        "--backend",
        &lurl,
        "--strategy",
        "random",
    ])
    .await;
    for i in 0..20 {
        let body = json!({"model": "m", "prompt": format!("p{i}")});
        let reply = post(&c, &r.url("/v1/completions"), &body, &[]).await;
        assert_eq!(reply.status, 200, "request {i} retried on the live backend");
        assert_eq!(reply.backend(), lurl);
    }
    assert_eq!(live.count(), 20);
    drop(r);
    let r = RouterProcess::spawn(&["--model", "m", "--backend", &dead]).await;
    for _ in 0..3 {
        let e = post(
            &c,
            &r.url("/v1/completions"),
            &json!({"model": "m", "prompt": "x"}),
            &[],
        )
        .await
        .error(502);
        assert_eq!(e["code"], "upstream_failed");
    }
    assert_all_ejected(&c, &r).await;
    // Panic routing tries the only candidate again: a refused connect, 502.
    let e = post(
        &c,
        &r.url("/v1/completions"),
        &json!({"model": "m", "prompt": "x"}),
        &[],
    )
    .await
    .error(502);
    assert_eq!(e["code"], "upstream_failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_spreads_and_least_outstanding_balances_in_flight() {
    let bs = backends(3).await;
    let r = router(&bs, &["--strategy", "random"]).await;
    let c = client();
    for i in 0..60 {
        let reply = post(
            &c,
            &r.url("/v1/completions"),
            &json!({"model": "m", "prompt": format!("{i}")}),
            &[],
        )
        .await;
        assert_eq!(reply.decision(), "random");
    }
    for b in &bs {
        assert!(
            b.count() > 5,
            "random sent {} of 60 to {}",
            b.count(),
            b.name()
        );
    }
    drop(r);
    let bs = backends(3).await;
    let r = router(&bs, &["--strategy", "least_outstanding"]).await;
    let mut held = Vec::new();
    for i in 0..6u32 {
        let c = client();
        let url = r.url("/v1/completions");
        held.push(tokio::spawn(async move {
            post(
                &c,
                &url,
                &json!({"model": "m", "prompt": "same", "x_hold": "release"}),
                &[],
            )
            .await
        }));
        eventually("the request is held", || {
            bs.iter().map(TestBackend::active).sum::<u32>() == i + 1
        })
        .await;
    }
    for b in &bs {
        assert_eq!(b.active(), 2, "least_outstanding puts 2 of 6 on each");
        b.release();
    }
    for h in held {
        assert_eq!(h.await.unwrap().decision(), "least_outstanding");
    }
}

/// [`chat`] with a system prompt longer than the 4096 characters of the
/// prefix key, so the question is not part of the key.
fn long_chat(model: &str, seed: &str, tail: &str) -> Value {
    let mut body = chat(model, seed, tail);
    body["messages"][0]["content"] = json!(format!("{seed} ").repeat(4096 / (seed.len() + 1) + 1));
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_aware_is_sticky_and_spills_at_the_threshold() {
    // Threshold 1 with 2 backends: the bounded-load cap (1.25 x mean) would
    // still admit a second request, so the spill below is the threshold's.
    let bs = backends(2).await;
    let r = router(
        &bs,
        &["--strategy", "prefix_aware", "--concurrency-threshold", "1"],
    )
    .await;
    let c = client();
    let url = r.url("/v1/chat/completions");
    let first = post(&c, &url, &long_chat("m", "alpha", "q0"), &[]).await;
    assert_eq!(first.decision(), "prefix_hash");
    let owner = first.backend().to_owned();
    for i in 1..10 {
        let reply = post(
            &c,
            &url,
            &long_chat("m", "alpha", &format!("question {i}")),
            &[],
        )
        .await;
        assert_eq!(
            (reply.backend(), reply.decision()),
            (owner.as_str(), "prefix_hash")
        );
    }
    let mut owners = HashSet::new();
    for s in 0..30 {
        owners.insert(
            post(&c, &url, &long_chat("m", &format!("seed{s}"), "q"), &[])
                .await
                .backend()
                .to_owned(),
        );
    }
    assert_eq!(
        owners.len(),
        2,
        "different prefixes spread over both backends"
    );
    let (c2, url2) = (client(), url.clone());
    let mut body = long_chat("m", "alpha", "held");
    body["x_hold"] = json!("release");
    let held = tokio::spawn(async move { post(&c2, &url2, &body, &[]).await });
    let o = by_url(&bs, &owner);
    eventually("one held on the owner", || o.active() == 1).await;
    let spilled = post(&c, &url, &long_chat("m", "alpha", "second"), &[]).await;
    assert_eq!(spilled.decision(), "spill");
    assert_ne!(spilled.backend(), owner);
    o.release();
    let held = held.await.unwrap();
    assert_eq!(
        (held.backend(), held.decision()),
        (owner.as_str(), "prefix_hash")
    );
    let after = post(&c, &url, &long_chat("m", "alpha", "third"), &[]).await;
    assert_eq!(
        after.backend(),
        owner,
        "sticky again once the owner has room"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_separated_and_forwarded_as_cache_salt() {
    let bs = backends(4).await;
    let r = router(&bs, &["--strategy", "prefix_aware"]).await;
    let c = client();
    let url = r.url("/v1/chat/completions");
    let mut placed: HashMap<String, String> = HashMap::new();
    for t in 0..24 {
        let tenant = format!("tenant-{t}");
        let reply = post(
            &c,
            &url,
            &chat("m", "shared", "q"),
            &[("x-prefix-aware-id", tenant.as_str())],
        )
        .await;
        assert_eq!(reply.status, 200);
        placed.insert(tenant, reply.backend().to_owned());
    }
    let distinct: HashSet<&String> = placed.values().collect();
    assert!(
        distinct.len() >= 2,
        "one shared prefix, many tenants: {distinct:?}"
    );
    for b in &bs {
        for rec in b.requests() {
            let salt = rec.json()["cache_salt"].as_str().unwrap().to_owned();
            assert_eq!(
                placed[&salt],
                b.url(),
                "salt {salt} matches the routed tenant"
            );
        }
    }
    // prompt_cache_key is a tenant too; the body stays as sent apart from the salt.
    let mut body = chat("m", "shared", "q");
    body["prompt_cache_key"] = json!("acme");
    let reply = post(&c, &url, &body, &[]).await;
    let rec = by_url(&bs, reply.backend()).requests().pop().unwrap();
    let mut expected = body.clone();
    expected["cache_salt"] = json!("acme");
    assert_eq!(rec.json(), expected);
    // Without a tenant nothing is added.
    let reply = post(&c, &url, &chat("m", "shared", "q"), &[]).await;
    let rec = by_url(&bs, reply.backend()).requests().pop().unwrap();
    assert!(rec.json().get("cache_salt").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn strategy_switches_under_load_fail_no_request() {
    let bs = backends(3).await;
    let r = router(&bs, &["--admin-token", "s3cret"]).await;
    let c = client();
    let admin = r.url("/admin/pools/m/strategy");
    let put = |body: &str, auth: Option<&str>| {
        let h: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
        request("PUT", &admin, body.to_owned(), &h)
    };
    send(&c, put("{\"strategy\":\"random\"}", None))
        .await
        .error(401);
    send(&c, put("{\"strategy\":\"random\"}", Some("Bearer wrong")))
        .await
        .error(401);
    send(&c, put("{\"strategy\":\"fastest\"}", Some("Bearer s3cret")))
        .await
        .error(400);
    let e = send(
        &c,
        put("{\"strategy\":\"kv_aware\"}", Some("Bearer s3cret")),
    )
    .await
    .error(409);
    assert_eq!(e["code"], "needs_tokenizer");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    const CLIENTS: usize = 4;
    let mut load = Vec::new();
    for w in 0..CLIENTS {
        let (c, url, stop) = (client(), r.url("/v1/chat/completions"), stop.clone());
        let done = done.clone();
        load.push(tokio::spawn(async move {
            let mut seen = HashMap::<String, u32>::new();
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let mut body = chat("m", &format!("w{w}"), &format!("{i}"));
                if i % 2 == 0 {
                    body["stream"] = json!(true);
                    body["x_delay_ms"] = json!(5);
                }
                let reply = post(&c, &url, &body, &[]).await;
                assert_eq!(reply.status, 200, "{:?}", reply.body);
                *seen.entry(reply.decision().to_owned()).or_default() += 1;
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                i += 1;
            }
            seen
        }));
    }
    let order = ["random", "least_outstanding", "prefix_aware"];
    let answered = || done.load(std::sync::atomic::Ordering::SeqCst);
    for k in 0..12 {
        // Each strategy serves requests before the next switch: past the
        // (at most CLIENTS) requests in flight at the switch, the next
        // answer was routed by it.
        let at = answered();
        poll::poll(
            "requests answered since the last switch",
            Duration::from_secs(10),
            Duration::from_millis(5),
            async || (answered() > at + CLIENTS).then_some(()),
        )
        .await;
        let reply = send(
            &c,
            put(
                &format!("{{\"strategy\":\"{}\"}}", order[k % 3]),
                Some("Bearer s3cret"),
            ),
        )
        .await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.json()["strategy"], order[k % 3]);
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut kinds = HashSet::new();
    for h in load {
        kinds.extend(h.await.unwrap().into_keys());
    }
    assert!(kinds.len() >= 3, "decisions seen: {kinds:?}");
    let auth = [("authorization", "Bearer s3cret")];
    let idx = send(&c, request("GET", &r.url("/cache-index"), "", &auth))
        .await
        .json();
    assert_eq!(idx["pools"][0]["strategy"], "prefix_aware");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_killed_mid_stream_gives_a_clean_error_and_others_carry_on() {
    let bs = backends(2).await;
    let r = router(&bs, &["--strategy", "least_outstanding"]).await;
    let url = r.url("/v1/chat/completions");
    let long = json!({"model": "m", "stream": true, "x_chunks": 200, "x_delay_ms": 10,
                      "messages": [{"role": "user", "content": "long"}]});
    // The victim's answer has begun (its head and a first chunk reached
    // the client) before its backend dies.
    use http_body_util::BodyExt;
    let c1 = client();
    let resp = c1
        .request(request("POST", &url, long.to_string(), &[]))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut victim_body = resp.into_body();
    let mut frames = Vec::new();
    while frames.is_empty() {
        let f = victim_body.frame().await.unwrap().unwrap();
        frames.extend(f.into_data().ok());
    }
    let victim = bs.iter().position(|b| b.count() == 1).unwrap();
    let other = 1 - victim;
    let (c2, u2, l2) = (client(), url.clone(), long.clone());
    let healthy_stream = tokio::spawn(async move { post_frames(&c2, &u2, &l2).await });
    eventually("second stream on the other backend", || {
        bs[other].count() == 1
    })
    .await;
    bs[victim].kill();
    while let Some(Ok(f)) = victim_body.frame().await {
        frames.extend(f.into_data().ok());
    }
    let text = String::from_utf8(frames.iter().flat_map(|f| f.to_vec()).collect()).unwrap();
    assert!(text.starts_with("data: "), "some chunks arrived first");
    assert!(!text.contains("[DONE]"));
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    let err: Value = serde_json::from_str(last.strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(
        err["error"]["type"], "upstream_error",
        "clean SSE error event: {last}"
    );
    let (status, _, frames, err) = healthy_stream.await.unwrap();
    assert_eq!(status, 200);
    assert!(err.is_none());
    let text = String::from_utf8(frames.iter().flat_map(|f| f.to_vec()).collect()).unwrap();
    assert_eq!(
        text,
        sse_chunks(bs[other].name(), 200).concat(),
        "the other stream is untouched"
    );
    let c = client();
    for _ in 0..5 {
        let reply = post(
            &c,
            &url,
            &json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
            &[],
        )
        .await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.backend(), bs[other].url());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_cancels_the_upstream_stream() {
    let bs = backends(1).await;
    let r = router(&bs, &[]).await;
    let c = client();
    let body = json!({"model": "m", "stream": true, "x_chunks": 1000, "x_delay_ms": 10,
                      "messages": [{"role": "user", "content": "x"}]});
    let resp = c
        .request(request(
            "POST",
            &r.url("/v1/chat/completions"),
            body.to_string(),
            &[],
        ))
        .await
        .unwrap();
    let mut b = resp.into_body();
    use http_body_util::BodyExt;
    for _ in 0..3 {
        b.frame().await.unwrap().unwrap();
    }
    drop(b);
    eventually("the backend saw the client leave", || {
        bs[0].cancelled() == 1
    })
    .await;
    let mut drained = false;
    for _ in 0..500 {
        let idx = get_url(&c, &r.url("/cache-index")).await.json();
        if idx["pools"][0]["workers"][0]["in_flight"] == 0 {
            drained = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(drained, "the router's in-flight count went back to 0");
    let text = String::from_utf8(get_url(&c, &r.url("/metrics")).await.body.to_vec()).unwrap();
    assert!(text.contains("warmpath_backend_in_flight"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_metrics_and_invocations() {
    let bs = backends(2).await;
    let r = router(&bs, &[]).await;
    let c = client();
    let models = get_url(&c, &r.url("/v1/models")).await.json();
    assert_eq!(models["data"][0]["id"], "m");
    assert_eq!(get_url(&c, &r.url("/health")).await.json()["status"], "ok");
    // /invocations: raw body untouched, even with a tenant header.
    let raw = "{ \"model\": \"m\", \"inputs\": \"whatever\" }";
    let reply = send(
        &c,
        request(
            "POST",
            &r.url("/invocations"),
            raw,
            &[("x-prefix-aware-id", "t1")],
        ),
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.decision(), "prefix_hash");
    let rec = by_url(&bs, reply.backend()).requests().pop().unwrap();
    assert_eq!(
        (rec.path.as_str(), rec.body.as_ref()),
        ("/invocations", raw.as_bytes())
    );
    let again = send(
        &c,
        request(
            "POST",
            &r.url("/invocations"),
            raw,
            &[("x-prefix-aware-id", "t1")],
        ),
    )
    .await;
    assert_eq!(
        again.backend(),
        reply.backend(),
        "same raw prefix, same backend"
    );
    let text = String::from_utf8(get_url(&c, &r.url("/metrics")).await.body.to_vec()).unwrap();
    for name in [
        "warmpath_requests_total",
        "warmpath_router_overhead_seconds",
        "warmpath_upstream_first_byte_seconds",
        "warmpath_matched_blocks",
        "warmpath_index_entries",
        "warmpath_stale_workers",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics");
    }
    assert!(text.contains("decision=\"prefix_hash\""), "{text}");
    // The series are registered when the pool is built: check they count.
    let value = |series: &str, label: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(series) && l.contains(label))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    assert!(
        value("warmpath_upstream_first_byte_seconds_count", "pool=") >= 2.0,
        "{text}"
    );
    assert!(
        value("warmpath_router_overhead_seconds_count", "phase=\"parse\"") >= 2.0,
        "{text}"
    );
    assert!(
        value("warmpath_router_overhead_seconds_count", "phase=\"pick\"") >= 2.0,
        "{text}"
    );
    assert!(
        value("warmpath_matched_blocks_count", "pool=") >= 2.0,
        "{text}"
    );
    assert_eq!(
        get_url(&c, &r.url("/nowhere")).await.error(404)["code"],
        "not_found"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lora_adapters_route_within_their_subset() {
    let plain = TestBackend::start_with("plain", "m", &[]).await;
    let learned = TestBackend::start_with("learned", "m", &["chat-lora"]).await;
    let sql = TestBackend::start_with("sql", "m", &["sql-lora"]).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("router.yaml");
    std::fs::write(
        &cfg,
        format!(
            "health: {{probe_interval_ms: 100}}\npools:\n  - model: m\n    strategy: random\n    backends:\n      - {{url: '{}', worker_id: plain}}\n      - {{url: '{}', worker_id: learned}}\n      - {{url: '{}', worker_id: sql}}\n",
            plain.url(), learned.url(), sql.url()
        ),
    )
    .unwrap();
    let r = RouterProcess::spawn(&["--config", cfg.to_str().unwrap()]).await;
    let c = client();
    let url = r.url("/v1/completions");
    // Each adapter is learned from its engine's /v1/models (404 until
    // then), and then goes only there.
    for (adapter, home) in [("chat-lora", "learned"), ("sql-lora", "sql")] {
        let mut ok = false;
        for _ in 0..100 {
            let reply = post(&c, &url, &json!({"model": adapter, "prompt": "x"}), &[]).await;
            if reply.status == 200 {
                assert_eq!(reply.backend(), home);
                ok = true;
                break;
            }
            assert_eq!(reply.status, 404);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(ok, "{adapter} learned from /v1/models");
        for i in 0..10 {
            let reply = post(
                &c,
                &url,
                &json!({"model": adapter, "prompt": format!("{i}")}),
                &[],
            )
            .await;
            assert_eq!(reply.backend(), home);
        }
    }
    let models = get_url(&c, &r.url("/v1/models")).await.json();
    let ids: HashSet<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert!(
        ids.contains("sql-lora") && ids.contains("chat-lora"),
        "{ids:?}"
    );
}

//! What a failing backend gets from the real `warmpath-router` binary: 5xx
//! answers and timeouts that count toward ejection, a backend that never
//! answers (504), answers that go silent (an SSE error event, a cut body),
//! each against a test backend on 127.0.0.1 port 0.

use crate::support;

use serde_json::{json, Value};
use std::time::Duration;
use support::*;

/// The router binary over one backend (`random`), with `sections` of
/// router.yaml. Health probes are set far apart by the callers, so nothing
/// brings an ejected backend back during a test.
async fn one_backend_router(b: &TestBackend, sections: &str) -> RouterProcess {
    yaml_router(sections, "    strategy: random", &[b]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consecutive_5xx_answers_eject_a_backend() {
    let b = TestBackend::start("b").await;
    let r = one_backend_router(&b, "health: {eject_after: 3, probe_interval_ms: 600000}").await;
    let c = client();
    let url = r.url("/v1/completions");
    let with = |status: u16| json!({"model": "m", "prompt": "x", "x_status": status});
    // Two 500s, then an answer below 500: the count starts again.
    for status in [500, 503, 200, 500, 502] {
        let reply = post(&c, &url, &with(status), &[]).await;
        assert_eq!(reply.status, status, "passed through, not retried");
    }
    assert_eq!(get_url(&c, &r.url("/health")).await.status, 200);
    // The third 5xx in a row ejects it.
    assert_eq!(post(&c, &url, &with(500), &[]).await.status, 500);
    assert_all_ejected(&c, &r).await;
    // It was the only candidate: panic routing still sends it requests.
    assert_eq!(post(&c, &url, &with(200), &[]).await.status, 200);
    assert_eq!(b.count(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_that_never_answers_times_out_with_504() {
    let b = TestBackend::start("b").await;
    let r = one_backend_router(
        &b,
        "upstream: {first_byte_timeout_ms: 300}\nhealth: {eject_after: 2, probe_interval_ms: 600000}",
    )
    .await;
    let c = client();
    let url = r.url("/v1/completions");
    let slow = json!({"model": "m", "prompt": "x", "x_hold_ms": 5000});
    let t = std::time::Instant::now();
    let reply = post(&c, &url, &slow, &[]).await;
    assert!(
        t.elapsed() < std::time::Duration::from_secs(3),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(reply.backend(), b.url());
    assert_eq!(reply.error(504)["code"], "upstream_timeout");
    // A timeout is a failure: the second in a row ejects the backend.
    post(&c, &url, &slow, &[]).await.error(504);
    assert_all_ejected(&c, &r).await;
    let fast = json!({"model": "m", "prompt": "x"});
    assert_eq!(
        post(&c, &url, &fast, &[]).await.status,
        200,
        "panic routing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_that_go_silent_are_cut_off_and_count_as_failures() {
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let b = TestBackend::start("b").await;
    let r = one_backend_router(
        &b,
        "upstream: {first_byte_timeout_ms: 300}\nhealth: {eject_after: 2, probe_interval_ms: 600000}",
    )
    .await;
    let c = client();
    let in_flight = async |r: &RouterProcess| {
        get_url(&client(), &r.url("/cache-index")).await.json()["pools"][0]["workers"][0]
            ["in_flight"]
            .as_u64()
            .unwrap()
    };
    // A stream whose backend falls silent after its first chunk: the
    // client gets that chunk, then an SSE error event, then the end.
    let body = json!({"model": "m", "stream": true, "x_chunks": 3, "x_delay_ms": 60000,
                      "messages": [{"role": "user", "content": "x"}]});
    let t = std::time::Instant::now();
    let (code, _, frames, err) = post_frames(&c, &r.url("/v1/chat/completions"), &body).await;
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(code, 200);
    assert!(err.is_none(), "{err:?}");
    let text = String::from_utf8(frames.iter().flat_map(|f| f.to_vec()).collect()).unwrap();
    let first = &sse_chunks("b", 3)[0];
    let rest = text
        .strip_prefix(first.as_str())
        .unwrap_or_else(|| panic!("{text}"));
    let event: Value = serde_json::from_str(rest.strip_prefix("data: ").unwrap().trim()).unwrap();
    assert_eq!(event["error"]["code"], "upstream_timeout", "{event}");
    // The stalled request no longer counts as load, though the backend
    // still holds it.
    assert_eq!(in_flight(&r).await, 0);

    // A whole-body answer that stalls after its headers is cut off too.
    let stalled = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stalled_url = format!("http://{}", stalled.local_addr().unwrap());
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (mut s, _) = stalled.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).await.unwrap_or(0);
            if buf[..n].starts_with(b"GET") {
                // Health probes and model listings are answered in full.
                let ok = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
                let _ = s.write_all(ok.as_bytes()).await;
                continue;
            }
            let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"partial\":";
            s.write_all(head.as_bytes()).await.unwrap();
            held.push(s);
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("router.yaml");
    std::fs::write(
        &cfg,
        format!(
            "upstream: {{first_byte_timeout_ms: 300}}\nhealth: {{eject_after: 1, probe_interval_ms: 600000}}\npools:\n  - model: m\n    strategy: random\n    backends: [{{url: '{stalled_url}'}}]\n"
        ),
    )
    .unwrap();
    let r2 = RouterProcess::spawn(&["--config", cfg.to_str().unwrap()]).await;
    let resp = c
        .request(request(
            "POST",
            &r2.url("/v1/completions"),
            json!({"model": "m", "prompt": "x"}).to_string(),
            &[],
        ))
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let t = std::time::Instant::now();
    assert!(
        resp.into_body().collect().await.is_err(),
        "an incomplete body"
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(in_flight(&r2).await, 0);
    // The silence was a failure: with eject_after 1 the backend is out.
    assert_all_ejected(&c, &r2).await;
    holder.abort();

    // Back on the first router: a second silent stream ejects its backend.
    post_frames(&c, &r.url("/v1/chat/completions"), &body).await;
    assert_all_ejected(&c, &r).await;
}

/// A raw HTTP/1.1 request for `body` on `path`.
fn raw_post(port: u16, path: &str, body: &Value) -> String {
    let body = body.to_string();
    format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_before_the_first_byte_cancels_its_upstream_request() {
    use tokio::io::AsyncWriteExt;
    let b = TestBackend::start("b0").await;
    let r = one_backend_router(&b, "").await;
    let held =
        |stream: bool| json!({"model": "m", "prompt": "x", "stream": stream, "x_hold": "release"});
    // HTTP/1.1, streaming or not: the client closes while the engine has
    // not answered yet; the router's upstream connection closes at once
    // (it stayed open, and the engine kept working, for as long as the
    // engine liked).
    for (n, stream) in [(1, false), (2, true)] {
        let mut s = tokio::net::TcpStream::connect(r.addr).await.unwrap();
        let req = raw_post(r.addr.port(), "/v1/completions", &held(stream));
        s.write_all(req.as_bytes()).await.unwrap();
        eventually("the engine holds the request", || b.active() == 1).await;
        drop(s);
        let gone = std::time::Instant::now();
        eventually("the upstream request is cancelled", || b.abandoned() == n).await;
        assert!(
            gone.elapsed() < Duration::from_secs(3),
            "{:?}",
            gone.elapsed()
        );
    }
    // HTTP/2: a client resets its stream (drops the request).
    let h2: TestClient =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(true)
            .build_http();
    let url = r.url("/v1/completions");
    let body = held(true).to_string();
    let asked = tokio::spawn(async move { h2.request(request("POST", &url, body, &[])).await });
    eventually("the engine holds the h2 request", || b.active() == 1).await;
    asked.abort();
    eventually("the h2 request is cancelled", || b.abandoned() == 3).await;
    // Another client's request is served all along.
    b.release();
    let c = client();
    let ok = post(
        &c,
        &r.url("/v1/completions"),
        &json!({"model": "m", "prompt": "x"}),
        &[],
    )
    .await;
    assert_eq!(ok.status, 200);
    // A cancelled request is no failure of the backend's.
    let ok = post(
        &c,
        &r.url("/v1/completions"),
        &json!({"model": "m", "prompt": "y"}),
        &[],
    )
    .await;
    assert_eq!(ok.status, 200);
}

/// HTTP/2: one stream the client never reads, on a connection it keeps
/// using. Flow control, not the socket, stops the router's writes, so no
/// connection-level deadline fires; the stream's own send watchdog lets the
/// backend's answer and its slot go, and the connection serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_left_unread_lets_its_backend_go_and_the_connection_serves_on() {
    use http_body_util::BodyExt;
    let b = TestBackend::start("b0").await;
    let r = one_backend_router(&b, "server:\n  header_timeout_ms: 200").await;
    // One HTTP/2 connection, driven by its own task, that this test holds.
    let tcp = tokio::net::TcpStream::connect(r.addr).await.unwrap();
    // A small window: the unread stream holds few frames (h2 refuses a
    // connection that buffers too many unread DATA frames).
    let (mut h2, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .initial_stream_window_size(65_535)
            .handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
    let driver = tokio::spawn(conn);
    let body = json!({"model": "m", "prompt": "x", "stream": true, "x_chunks": 400_000});
    let req = |body: &serde_json::Value| {
        hyper::Request::post(format!("http://{}/v1/completions", r.addr))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_string(),
            )))
            .unwrap()
    };
    // The answer's head arrives; its body is never read.
    let unread = h2.send_request(req(&body)).await.unwrap();
    assert_eq!(unread.status(), 200);
    eventually("the upstream stream is dropped", || b.cancelled() == 1).await;
    let m = get_url(&client(), &r.url("/metrics")).await;
    let text = String::from_utf8_lossy(&m.body).into_owned();
    let in_flight = format!(
        "warmpath_backend_in_flight{{pool=\"m\",backend=\"{}\"}}",
        b.url()
    );
    assert_eq!(metric_value(&text, &in_flight), Some(0.0), "{text}");
    assert_eq!(
        metric_value(&text, "warmpath_send_timeouts_total"),
        Some(1.0),
        "{text}"
    );
    // The same connection serves on.
    let ok = h2
        .send_request(req(&json!({"model": "m", "prompt": "x"})))
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    ok.into_body().collect().await.unwrap();
    assert!(!driver.is_finished(), "the connection is still open");
    drop(unread);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_off_after_the_send_timeout() {
    use tokio::io::AsyncWriteExt;
    let b = TestBackend::start("b0").await;
    let r = one_backend_router(&b, "server:\n  header_timeout_ms: 200").await;
    // A stream of ~50 MB that the client never reads: the socket buffers
    // fill, the router's writes wait, and after the send timeout it lets
    // the client, its in-flight slot and the upstream stream go.
    let body = json!({"model": "m", "prompt": "x", "stream": true, "x_chunks": 400_000});
    let mut s = tokio::net::TcpStream::connect(r.addr).await.unwrap();
    s.write_all(raw_post(r.addr.port(), "/v1/completions", &body).as_bytes())
        .await
        .unwrap();
    eventually("the upstream stream is dropped", || b.cancelled() == 1).await;
    let c = client();
    let m = get_url(&c, &r.url("/metrics")).await;
    let cancelled = format!(
        "warmpath_backend_requests_total{{pool=\"m\",backend=\"{}\",outcome=\"cancelled\"}}",
        b.url()
    );
    assert_eq!(
        metric_value(&String::from_utf8_lossy(&m.body), &cancelled),
        Some(1.0)
    );
    let text = String::from_utf8_lossy(&m.body).into_owned();
    assert_eq!(
        metric_value(
            &text,
            &format!(
                "warmpath_backend_in_flight{{pool=\"m\",backend=\"{}\"}}",
                b.url()
            )
        ),
        Some(0.0),
        "{text}"
    );
    drop(s);
    let ok = post(
        &c,
        &r.url("/v1/completions"),
        &json!({"model": "m", "prompt": "x"}),
        &[],
    )
    .await;
    assert_eq!(ok.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_behind_an_api_key_get_it_on_every_request_and_it_never_shows() {
    let key = "sk-engine-secret-0123456789";
    let b0 = TestBackend::start_with("b0", "m", &["sql"]).await;
    b0.require_key(key);
    let b1 = TestBackend::start("b1").await;
    b1.require_key("sk-b1-own-key");
    let yaml = format!(
        "health:\n  probe: completion\n  probe_interval_ms: 100\npools:\n  - model: m\n    strategy: least_outstanding\n    backends:\n      - {{url: '{}', worker_id: b0}}\n      - {{url: '{}', worker_id: b1, api_key: sk-b1-own-key}}\n",
        b0.url(),
        b1.url()
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("router.yaml");
    std::fs::write(&cfg, yaml).unwrap();
    let r = RouterProcess::spawn_logged(
        &["--config", cfg.to_str().unwrap()],
        &[("WARMPATH_UPSTREAM_API_KEY", key)],
    )
    .await;
    let c = client();
    // Probes pass (they got 401 and ejected the engine), so the router is
    // ready; the adapter is learned from the engine's /v1/models.
    assert_eq!(get_url(&c, &r.url("/readyz")).await.status, 200);
    poll::poll(
        "the adapter is served",
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || {
            let models = get_url(&c, &r.url("/v1/models")).await.json();
            models["data"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["id"] == "sql")
                .then_some(())
        },
    )
    .await;
    // A client's own key (meant for the router) is replaced, on both
    // engines, each with its own key.
    for _ in 0..4 {
        let got = post(
            &c,
            &r.url("/v1/completions"),
            &json!({"model": "m", "prompt": "x"}),
            &[("authorization", "Bearer client-key")],
        )
        .await;
        assert_eq!(got.status, 200, "{:?}", got.body);
    }
    for (b, k) in [(&b0, key), (&b1, "sk-b1-own-key")] {
        let sent: Vec<_> = b.requests();
        assert!(
            sent.iter().any(|q| q.path == "/v1/completions"),
            "{}",
            b.name()
        );
        for q in sent {
            assert_eq!(
                q.headers["authorization"],
                format!("Bearer {k}"),
                "{}",
                q.path
            );
        }
    }
    // A response looked up on every engine carries the key too.
    let _ = get_url(&c, &r.url("/v1/responses/resp_unknown")).await;
    // Neither key shows anywhere the router speaks.
    let mut shown = String::new();
    for path in ["/cache-index", "/metrics", "/admin/pools/m/backends"] {
        shown.push_str(&String::from_utf8_lossy(
            &get_url(&c, &r.url(path)).await.body,
        ));
    }
    b0.kill();
    let failed = post(
        &c,
        &r.url("/v1/completions"),
        &json!({"model": "m", "prompt": "x"}),
        &[],
    )
    .await;
    shown.push_str(&String::from_utf8_lossy(&failed.body));
    shown.push_str(&r.logs());
    for k in [key, "sk-b1-own-key"] {
        assert!(!shown.contains(k), "{k} leaked");
    }
    assert!(r.logs().contains("DEBUG"), "debug logs were captured");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_upstream_key_the_clients_authorization_passes_through() {
    let b = TestBackend::start("b0").await;
    let r = one_backend_router(&b, "").await;
    let c = client();
    let got = post(
        &c,
        &r.url("/v1/completions"),
        &json!({"model": "m", "prompt": "x"}),
        &[("authorization", "Bearer client-key")],
    )
    .await;
    assert_eq!(got.status, 200);
    assert_eq!(
        b.requests()[0].headers["authorization"],
        "Bearer client-key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ejection_has_a_ceiling_and_only_engine_faults_count() {
    let bs = backends(4).await;
    let urls: Vec<String> = bs
        .iter()
        .map(|b| format!("{{url: '{}', worker_id: {}}}", b.url(), b.name()))
        .collect();
    let yaml = format!(
        "health: {{eject_after: 1, probe_interval_ms: 600000}}\npools:\n  - model: m\n    strategy: random\n    backends: [{}]\n",
        urls.join(", ")
    );
    let r = RouterProcess::from_yaml(&yaml).await;
    let c = client();
    let url = r.url("/v1/completions");
    // 501 and 505 answer the request's shape, not a broken engine.
    for status in [501, 505, 400, 404] {
        for _ in 0..8 {
            let got = post(
                &c,
                &url,
                &json!({"model": "m", "prompt": "x", "x_status": status}),
                &[],
            )
            .await;
            assert_eq!(got.status, status);
        }
    }
    let in_rotation = async || {
        let v = get_url(&c, &r.url("/readyz")).await.json();
        v["pools"][0]["in_rotation"].as_u64().unwrap()
    };
    assert_eq!(in_rotation().await, 4);
    // Every engine answers 500 to a poisoned request mix: at most half of
    // the pool goes out (it all went, and the pool answered 503).
    for _ in 0..40 {
        let got = post(
            &c,
            &url,
            &json!({"model": "m", "prompt": "x", "x_status": 500}),
            &[],
        )
        .await;
        assert_eq!(got.status, 500, "{:?}", got.body);
    }
    assert_eq!(in_rotation().await, 2);
    let m = String::from_utf8_lossy(&get_url(&c, &r.url("/metrics")).await.body).into_owned();
    assert!(
        metric_value(&m, "warmpath_ejections_refused_total{pool=\"m\"}").is_some_and(|n| n >= 1.0),
        "{m}"
    );
    // Other requests are still served.
    for _ in 0..4 {
        assert_eq!(
            post(&c, &url, &json!({"model": "m", "prompt": "ok"}), &[])
                .await
                .status,
            200
        );
    }
}

/// A pool whose only candidate was ejected routes to it anyway (Envoy's
/// panic routing) instead of answering 503 until the back-off ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_with_every_member_ejected_routes_to_them_in_panic() {
    let b = TestBackend::start("b0").await;
    let r = one_backend_router(&b, "health: {eject_after: 1, probe_interval_ms: 600000}").await;
    let c = client();
    let url = r.url("/v1/completions");
    let got = post(
        &c,
        &url,
        &json!({"model": "m", "prompt": "x", "x_status": 500}),
        &[],
    )
    .await;
    assert_eq!(got.status, 500);
    let v = get_url(&c, &r.url("/readyz")).await.json();
    assert_eq!(v["pools"][0]["in_rotation"].as_u64(), Some(0), "{v}");
    for _ in 0..3 {
        let got = post(&c, &url, &json!({"model": "m", "prompt": "ok"}), &[]).await;
        assert_eq!(got.status, 200, "{:?}", got.body);
    }
    let m = String::from_utf8_lossy(&get_url(&c, &r.url("/metrics")).await.body).into_owned();
    assert_eq!(
        metric_value(&m, "warmpath_panic_routed_total{pool=\"m\"}"),
        Some(3.0),
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_asking_for_credentials_is_alive_not_ejected() {
    let b = TestBackend::start("b0").await;
    b.require_key("sk-not-configured");
    let r = one_backend_router(
        &b,
        "health: {probe: completion, probe_interval_ms: 50, eject_after: 1}",
    )
    .await;
    let c = client();
    tokio::time::sleep(Duration::from_millis(400)).await;
    // vLLM with --api-key answered every probe 401: the only engine was
    // ejected and clients that brought the right key got 503.
    assert_eq!(get_url(&c, &r.url("/readyz")).await.status, 200);
    let got = post(
        &c,
        &r.url("/v1/completions"),
        &json!({"model": "m", "prompt": "x"}),
        &[("authorization", "Bearer sk-not-configured")],
    )
    .await;
    assert_eq!(got.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_event_never_merges_into_a_half_sent_event() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // An engine that sends one event and half of the next, then stalls.
    let engine = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", engine.local_addr().unwrap());
    let serving = tokio::spawn(async move {
        let mut held = Vec::new();
        loop {
            let (mut s, _) = engine.accept().await.unwrap();
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).await.unwrap_or(0);
            if buf[..n].starts_with(b"GET") {
                let ok = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
                let _ = s.write_all(ok.as_bytes()).await;
                continue;
            }
            let body = "data: {\"n\":1}\n\ndata: {\"n\":";
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n",
                body.len()
            );
            s.write_all(head.as_bytes()).await.unwrap();
            held.push(s);
        }
    });
    let yaml = format!(
        "upstream: {{first_byte_timeout_ms: 300}}\npools:\n  - model: m\n    strategy: random\n    backends: [{{url: '{url}'}}]\n"
    );
    let r = RouterProcess::from_yaml(&yaml).await;
    let c = client();
    let body = json!({"model": "m", "prompt": "x", "stream": true});
    let (code, _, frames, err) = post_frames(&c, &r.url("/v1/completions"), &body).await;
    assert_eq!(code, 200);
    assert!(err.is_none(), "{err:?}");
    let text = String::from_utf8(frames.iter().flat_map(|f| f.to_vec()).collect()).unwrap();
    // Every event a client's SSE parser sees is whole: the half-sent one
    // ends where it was cut, and the error event stands on its own.
    let events: Vec<&str> = text
        .split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .collect();
    assert_eq!(events.len(), 3, "{text:?}");
    assert_eq!(events[0], "data: {\"n\":1}");
    assert_eq!(events[1], "data: {\"n\":");
    let error: Value =
        serde_json::from_str(events[2].trim().strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(error["error"]["code"], "upstream_timeout", "{text:?}");
    serving.abort();
}

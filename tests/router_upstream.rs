//! What a failing backend gets from the real `warmpath-router` binary: 5xx
//! answers and timeouts that count toward ejection, a backend that never
//! answers (504), answers that go silent (an SSE error event, a cut body),
//! each against a test backend on 127.0.0.1 port 0.
#![allow(clippy::unwrap_used)]

mod support;

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
    let e = post(&c, &url, &with(200), &[]).await.error(503);
    assert_eq!(e["code"], "no_healthy_backend");
    assert_eq!(get_url(&c, &r.url("/health")).await.status, 503);
    assert_eq!(b.count(), 6, "nothing was sent to the ejected backend");
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
    let fast = json!({"model": "m", "prompt": "x"});
    post(&c, &url, &fast, &[]).await.error(503);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_that_go_silent_are_cut_off_and_count_as_failures() {
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let b = TestBackend::start("b").await;
    let r = one_backend_router(
        &b,
        "upstream: {stream_idle_timeout_ms: 300}\nhealth: {eject_after: 2, probe_interval_ms: 600000}",
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
            "upstream: {{stream_idle_timeout_ms: 300}}\nhealth: {{eject_after: 1, probe_interval_ms: 600000}}\npools:\n  - model: m\n    strategy: random\n    backends: [{{url: '{stalled_url}'}}]\n"
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
    assert_no_backend(&c, &r2).await;
    holder.abort();

    // Back on the first router: a second silent stream ejects its backend.
    post_frames(&c, &r.url("/v1/chat/completions"), &body).await;
    assert_no_backend(&c, &r).await;
}

//! End-to-end tests of the real `warmpath-router` binary's life cycle and HTTP
//! front: configuration reload on SIGHUP, HTTP/2 clients, the routes served
//! beside the proxied ones, graceful SIGTERM. Everything on 127.0.0.1 port 0.
#![allow(clippy::unwrap_used)]

mod support;

use serde_json::json;
use std::time::Duration;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_strategy_and_bad_configs_do_not_start() {
    let bs = backends(2).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("router.yaml");
    let write = |strategy: &str| {
        std::fs::write(
            &cfg,
            format!(
                "pools:\n  - model: m\n    strategy: {strategy}\n    backends: [{{url: '{}'}}, {{url: '{}'}}]\n",
                bs[0].url(),
                bs[1].url()
            ),
        )
        .unwrap()
    };
    write("random");
    let r = RouterProcess::spawn(&["--config", cfg.to_str().unwrap()]).await;
    let c = client();
    let url = r.url("/v1/completions");
    assert_eq!(
        post(&c, &url, &json!({"model": "m", "prompt": "x"}), &[])
            .await
            .decision(),
        "random"
    );
    write("least_outstanding");
    r.hangup();
    let mut switched = false;
    for _ in 0..200 {
        if post(&c, &url, &json!({"model": "m", "prompt": "x"}), &[])
            .await
            .decision()
            == "least_outstanding"
        {
            switched = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(switched, "SIGHUP applied the new strategy");
    // Invalid start-up configurations fail with a clear message.
    for (flag, value, says) in [
        ("--strategy", "kv_aware", "needs a tokenizer"),
        ("--prefix-length", "5", "1024..=65536"),
    ] {
        let args = [
            "--model",
            "m",
            "--backend",
            "http://127.0.0.1:9",
            flag,
            value,
        ];
        let (ok, err) = run_to_exit(&args).await;
        assert!(!ok && err.contains(says), "{err}");
    }
    let (ok, err) = run_to_exit(&["--config", "/nonexistent/router.yaml"]).await;
    assert!(!ok && err.contains("cannot read config file"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_clients_and_every_non_proxy_route_are_served() {
    let bs = backends(1).await;
    let r = router(&bs, &["--strategy", "random"]).await;
    // HTTP/2 with prior knowledge (h2c), as gRPC-style clients speak it.
    let h2: TestClient =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .http2_only(true)
            .build_http();
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let rep = post(
        &h2,
        &r.url("/v1/chat/completions?api-version=1"),
        &body,
        &[],
    )
    .await;
    assert_eq!(rep.status, 200, "{:?}", rep.body);
    assert_eq!(rep.backend(), bs[0].url());
    assert_eq!(
        bs[0].requests()[0].path,
        "/v1/chat/completions?api-version=1"
    );
    let rep = get_url(&h2, &r.url("/v1/models")).await;
    assert_eq!(rep.json()["data"][0]["id"], "m");

    let c = client();
    // A proxied path with another method, or a near-miss path, is answered
    // by the router's table: 405 and 404, nothing sent upstream.
    let rep = get_url(&c, &r.url("/v1/chat/completions")).await;
    assert_eq!(rep.status, 405);
    let rep = post(&c, &r.url("/v1/chat/completions/"), &body, &[]).await;
    assert_eq!(rep.error(404)["code"], "not_found");
    let rep = post(&c, &r.url("/V1/completions"), &body, &[]).await;
    assert_eq!(rep.status, 404);
    assert_eq!(bs[0].count(), 1);
    // Every proxied endpoint still answers through the fast path.
    let completion = json!({"model": "m", "prompt": "hi"});
    for path in ["/v1/completions", "/invocations"] {
        let rep = post(&c, &r.url(path), &completion, &[]).await;
        assert_eq!(rep.status, 200, "{path}");
        assert_eq!(rep.backend(), bs[0].url(), "{path}");
    }
    assert_eq!(bs[0].count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_streams_finish_then_exits() {
    let bs = backends(1).await;
    let r = router(&bs, &[]).await;
    let url = r.url("/v1/chat/completions");
    let c = client();
    let body = json!({"model": "m", "stream": true, "x_chunks": 20, "x_delay_ms": 20,
                      "messages": [{"role": "user", "content": "x"}]});
    let stream = tokio::spawn({
        let (c, url, body) = (c.clone(), url.clone(), body.clone());
        async move { post_frames(&c, &url, &body).await }
    });
    eventually("the stream started upstream", || bs[0].count() == 1).await;
    let status = r.terminate().await;
    assert!(status.success(), "exit status {status:?}");
    let (code, _, frames, err) = stream.await.unwrap();
    assert_eq!(code, 200);
    assert!(err.is_none(), "the in-flight stream was cut: {err:?}");
    let got: Vec<u8> = frames.iter().flat_map(|f| f.to_vec()).collect();
    assert_eq!(
        String::from_utf8(got).unwrap(),
        sse_chunks("b0", 20).concat()
    );
    assert!(
        c.request(request("POST", &url, body.to_string(), &[]))
            .await
            .is_err(),
        "a stopped router still answered"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_headers_are_cut_off_and_half_closed_clients_get_their_answer() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let bs = backends(1).await;
    let r = router(&bs, &["--header-timeout-ms", "300"]).await;
    let read_all = |mut s: tokio::net::TcpStream| async move {
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
            .await
            .expect("the router closes the connection")
            .map(|_| String::from_utf8_lossy(&got).into_owned())
    };

    // Half a header, then nothing: the connection is closed after the
    // header timeout (not held for as long as the client likes).
    let mut s = tokio::net::TcpStream::connect(r.addr).await.unwrap();
    s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let t = std::time::Instant::now();
    let _ = read_all(s).await;
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "closed after {:?}",
        t.elapsed()
    );

    // Nothing at all: closed too.
    let s = tokio::net::TcpStream::connect(r.addr).await.unwrap();
    let t = std::time::Instant::now();
    let _ = read_all(s).await;
    assert!(t.elapsed() < Duration::from_secs(5), "idle connection held");

    // A whole request, then the client shuts its write side: it still
    // gets the answer.
    let body = r#"{"model":"m","prompt":"x"}"#;
    let mut s = tokio::net::TcpStream::connect(r.addr).await.unwrap();
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    s.shutdown().await.unwrap();
    let answer = read_all(s).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert_eq!(bs[0].count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_prints_an_agents_credential_and_refuses_to_print_without_a_secret() {
    let bin = env!("CARGO_BIN_EXE_warmpath-router");
    let out = tokio::process::Command::new(bin)
        .args(["--print-agent-token", "gpu-node-5"])
        .env("WARMPATH_AGENT_SECRET", "the-router-secret")
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        warmpath_proto::worker_token("the-router-secret", "gpu-node-5")
    );
    let out = tokio::process::Command::new(bin)
        .args(["--print-agent-token", "gpu-node-5"])
        .env_remove("WARMPATH_AGENT_SECRET")
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs the agent secret"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

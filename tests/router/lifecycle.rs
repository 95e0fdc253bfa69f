//! End-to-end tests of the real `warmpath-router` binary's life cycle and HTTP
//! front: configuration reload on SIGHUP, HTTP/2 clients, the routes served
//! beside the proxied ones, graceful SIGTERM. Everything on 127.0.0.1 port 0.

use crate::support;

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
        ("--concurrency-threshold", "0", "concurrency_threshold"),
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
    s.write_all(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n")
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

    // A whole request, then the client shuts its write side: that is a
    // client leaving (as nginx and Envoy take it; a fully closed socket
    // looks the same until a write fails). The request is cancelled unless
    // the engine was quicker, and the connection is closed, not held.
    let body = r#"{"model":"m","prompt":"x"}"#;
    let mut s = tokio::net::TcpStream::connect(r.addr).await.unwrap();
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    s.shutdown().await.unwrap();
    let answer = read_all(s).await.unwrap_or_default();
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 200"),
        "{answer}"
    );
    assert!(bs[0].count() <= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_idle_past_30_s_is_honoured() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let b = TestBackend::start("b0").await;
    let r = router_with(&b, "server:\n  header_timeout_ms: 7500").await;
    let body = r#"{"model":"m","prompt":"x"}"#;
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = tokio::net::TcpStream::connect(r.addr).await.unwrap();
    let mut buf = vec![0u8; 65536];
    for round in 0..2 {
        s.write_all(req.as_bytes()).await.unwrap();
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        let answer = String::from_utf8_lossy(&buf[..n]);
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "round {round}: {answer:?}"
        );
        if round == 0 {
            // hyper's own 30 s header timer closed an idle keep-alive
            // connection here, whatever the keep-alive idle timeout (6 header
            // timeouts, 45 s here) said.
            tokio::time::sleep(Duration::from_millis(31_500)).await;
        }
    }
    assert_eq!(b.count(), 2);
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

/// The router binary over `b` (`random`), with `sections` of router.yaml.
async fn router_with(b: &TestBackend, sections: &str) -> RouterProcess {
    yaml_router(sections, "    strategy: random", &[b]).await
}

/// Reads until the router closes the connection (at most 10 s).
async fn read_to_close(mut s: tokio::net::TcpStream) -> String {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got))
        .await
        .expect("the router closes the connection");
    String::from_utf8_lossy(&got).into_owned()
}

/// The JSON body of a raw HTTP/1.1 answer.
fn raw_json(answer: &str) -> serde_json::Value {
    let body = answer.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

async fn raw_send(r: &RouterProcess, bytes: &[u8]) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut s = tokio::net::TcpStream::connect(r.addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_bodies_get_408_and_idle_keep_alive_connections_are_closed() {
    let b = TestBackend::start("b").await;
    let r = router_with(&b, "server: {header_timeout_ms: 100}").await;
    let head =
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n";
    // A body shorter than its Content-Length, and a chunked body that
    // stalls: 408 in the OpenAI shape, and the connection is closed.
    for rest in [
        "Content-Length: 100\r\n\r\n{\"model\":",
        "Transfer-Encoding: chunked\r\n\r\n5\r\n{\"mod\r\n",
    ] {
        let t = std::time::Instant::now();
        let s = raw_send(&r, format!("{head}{rest}").as_bytes()).await;
        let answer = read_to_close(s).await;
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        let e = raw_json(&answer);
        assert_eq!(e["error"]["code"], "body_timeout", "{e}");
        assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
    }
    assert_eq!(b.count(), 0, "nothing went upstream");
    // A served keep-alive connection left idle is closed after the
    // keep-alive idle timeout (6 header timeouts, 600 ms), not after the
    // header timeout (100 ms).
    let body = r#"{"model":"m","prompt":"x"}"#;
    let t = std::time::Instant::now();
    let s = raw_send(
        &r,
        format!("{head}Content-Length: {}\r\n\r\n{body}", body.len()).as_bytes(),
    )
    .await;
    let answer = read_to_close(s).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let held = t.elapsed();
    assert!(
        held >= Duration::from_millis(400) && held < Duration::from_secs(5),
        "{held:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_max_connections_new_ones_are_refused_and_idle_ones_close_first() {
    let b = TestBackend::start("b").await;
    let r = router_with(&b, "server: {max_connections: 3, header_timeout_ms: 10000}").await;
    // Three connections busy on a slow backend fill the limit.
    let body = r#"{"model":"m","prompt":"x","x_hold":"release"}"#;
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut busy = Vec::new();
    for _ in 0..3 {
        busy.push(raw_send(&r, req.as_bytes()).await);
    }
    eventually("three requests upstream", || b.active() == 3).await;
    // A fourth is refused at once, with a 503 in the OpenAI shape.
    let t = std::time::Instant::now();
    let refused = tokio::net::TcpStream::connect(r.addr).await.unwrap();
    let answer = read_to_close(refused).await;
    assert!(
        t.elapsed() < Duration::from_millis(900),
        "{:?}",
        t.elapsed()
    );
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert_eq!(raw_json(&answer)["error"]["code"], "too_many_connections");
    b.release();
    // Once answered they are idle; near the limit their keep-alive is
    // short (60 s otherwise), so one closes and makes room.
    let metrics = support::poll::poll(
        "room for a new connection",
        Duration::from_secs(5),
        Duration::from_millis(50),
        async || {
            // A refused connection's 503 comes before the request is sent,
            // which the client reports as an error.
            use http_body_util::BodyExt;
            // Each attempt has its own deadline: one seen stuck once in CI
            // (no socket open, the request never answered) held the whole
            // poll, whose limit is only checked between attempts.
            let attempt = async {
                let req = request("GET", &r.url("/metrics"), "", &[]);
                let resp = client().request(req).await.ok()?;
                if resp.status() != 200 {
                    return None;
                }
                let body = resp.into_body().collect().await.ok()?.to_bytes();
                Some(String::from_utf8(body.to_vec()).unwrap())
            };
            tokio::time::timeout(Duration::from_secs(1), attempt)
                .await
                .ok()
                .flatten()
        },
    )
    .await;
    let refused: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("warmpath_connections_refused_total "))
        .unwrap_or_else(|| panic!("{metrics}"))
        .parse()
        .unwrap();
    assert!(refused >= 1, "{metrics}");
    drop(busy);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_then_ends_what_remains_within_the_deadlines() {
    let b = TestBackend::start("b").await;
    let r = router_with(
        &b,
        "server: {drain_grace_ms: 300, header_timeout_ms: 60000}",
    )
    .await;
    let url = r.url("/v1/chat/completions");
    let c = client();
    // Half a header, a request on a backend that hangs, a stream gone silent.
    let half = raw_send(&r, b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n").await;
    let hung = tokio::spawn({
        let (c, url) = (c.clone(), url.clone());
        let body = json!({"model": "m", "x_hold_ms": 60000, "messages": [{"role": "user", "content": "x"}]});
        async move { post(&c, &url, &body, &[]).await }
    });
    let silent = tokio::spawn({
        let (c, url) = (c.clone(), url.clone());
        let body = json!({"model": "m", "stream": true, "x_chunks": 3, "x_delay_ms": 60000,
                          "messages": [{"role": "user", "content": "x"}]});
        async move { post_frames(&c, &url, &body).await }
    });
    eventually("both requests upstream", || b.count() == 2).await;
    let (readyz, livez) = (r.url("/readyz"), r.url("/livez"));
    assert_eq!(get_url(&c, &readyz).await.status, 200);
    let t = std::time::Instant::now();
    let exited = tokio::spawn(r.terminate());
    // Draining: still served (a new connection each time), each answer
    // telling the client to close.
    let fresh = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
    let served = support::poll::poll(
        "an answer marked as draining",
        Duration::from_secs(5),
        Duration::from_millis(10),
        async || {
            let rep = post(&client(), &url, &fresh, &[]).await;
            let closing = rep.headers.get("connection").is_some_and(|v| v == "close");
            closing.then_some(rep.status)
        },
    )
    .await;
    assert_eq!(served, 200);
    // Not ready from the signal on, while still alive and serving.
    assert_eq!(get_url(&client(), &readyz).await.status, 503);
    assert_eq!(get_url(&client(), &livez).await.status, 200);
    let status = exited.await.unwrap();
    assert!(status.success(), "{status:?}");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(5),
        "{took:?}"
    );
    let e = hung.await.unwrap().error(503);
    assert_eq!(e["code"], "shutting_down");
    let (code, _, frames, _) = silent.await.unwrap();
    assert_eq!(code, 200);
    let text = String::from_utf8(frames.iter().flat_map(|f| f.to_vec()).collect()).unwrap();
    assert!(text.starts_with(&sse_chunks("b", 3)[0]), "{text}");
    assert!(text.contains(r#""code":"shutting_down""#), "{text}");
    let _ = read_to_close(half).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_hyper_cannot_parse_gets_an_openai_error_and_a_close() {
    // hyper answers a head it cannot parse itself, before any service sees
    // it; the socket wrapper gives that answer the OpenAI JSON shape.
    let b = TestBackend::start("b").await;
    let r = router_with(&b, "").await;
    let s = raw_send(
        &r,
        b"GET /health HTTP/1.1\r\nHost: localhost\r\nX-Bad: a\x01b\r\n\r\n",
    )
    .await;
    let answer = read_to_close(s).await;
    assert!(
        answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
        "{answer:?}"
    );
    let e = raw_json(&answer);
    assert_eq!(e["error"]["code"], "invalid_request_head", "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error", "{e}");
    // The connection's next use is refused cleanly; the router still serves.
    assert_eq!(get_url(&client(), &r.url("/v1/models")).await.status, 200);
}

/// The router binary under `ulimit -n {nofile}` with `args`; its stderr
/// is collected into the returned buffer.
async fn router_with_nofile(
    nofile: u32,
    args: &str,
) -> (
    tokio::process::Child,
    std::net::SocketAddr,
    std::sync::Arc<parking_lot::Mutex<String>>,
) {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let bin = env!("CARGO_BIN_EXE_warmpath-router");
    let mut child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n {nofile} && exec {bin} --listen 127.0.0.1:0 {args}"
        ))
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let addr = support::listen_addr(&mut child).await;
    let log = std::sync::Arc::new(parking_lot::Mutex::new(String::new()));
    let mut err = BufReader::new(child.stderr.take().unwrap()).lines();
    let sink = std::sync::Arc::clone(&log);
    tokio::spawn(async move {
        while let Ok(Some(l)) = err.next_line().await {
            sink.lock().push_str(&l);
            sink.lock().push('\n');
        }
    });
    (child, addr, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_file_limit_sizes_max_connections_and_accept_failures_back_off_quietly() {
    let b = TestBackend::start("b").await;
    let pool = |header_ms: u64| {
        format!(
            "--model m --strategy random --header-timeout-ms {header_ms} --backend {}",
            b.url()
        )
    };
    // Default max_connections: 80% of `ulimit -n 256`, so 204: connections
    // past it get a 503 instead of starving accept. The idle connections
    // must outlive the 220 connects and reads: under CI load those took
    // longer than a 500 ms header timeout, the first ones were closed and
    // nothing past them was refused.
    let (_child, addr, _log) = router_with_nofile(256, &pool(3_000)).await;
    let mut open = Vec::new();
    for _ in 0..220 {
        open.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    let mut refused = 0;
    for s in open.drain(200..) {
        let answer = read_to_close(s).await;
        refused += usize::from(answer.starts_with("HTTP/1.1 503"));
    }
    assert!(refused >= 10, "{refused} of the last 20 refused");
    drop(open);

    // A limit above the open-file limit: accept fails (EMFILE), is logged
    // once, backs off, and works again once descriptors are free.
    let (_child, addr, log) =
        router_with_nofile(128, &format!("{} --max-connections 100000", pool(500))).await;
    let mut open = Vec::new();
    for _ in 0..200 {
        open.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    eventually("an accept failure logged", || {
        log.lock().contains("accept failed")
    })
    .await;
    // Out of descriptors for a while: the old loop logged every 50 ms.
    tokio::time::sleep(Duration::from_millis(600)).await;
    drop(open);
    let url = format!("http://{addr}/v1/models");
    support::poll::poll(
        "accept working again",
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || {
            let req = request("GET", &url, "", &[]);
            let resp = client().request(req).await.ok()?;
            (resp.status() == 200).then_some(())
        },
    )
    .await;
    let text = log.lock().clone();
    assert_eq!(
        text.matches("accept failed").count(),
        1,
        "logged more than once in 10 s:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_in_flight_have_a_budget() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let b = TestBackend::start("b0").await;
    let r = router_with(
        &b,
        "max_body_bytes: 10000\nserver:\n  header_timeout_ms: 7000",
    )
    .await;
    let big = |n: usize| {
        let body = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(n - 25));
        assert_eq!(body.len(), n);
        body
    };
    let head = |len: usize| {
        format!(
            "POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
        )
    };
    // The budget is 32 largest bodies (320 kB). Slow clients: 32 of them,
    // each 9.9 kB of a 10 kB body, then nothing (316.8 kB held).
    let mut slow = Vec::new();
    for _ in 0..32 {
        let mut s = tokio::net::TcpStream::connect(r.addr).await.unwrap();
        let body = big(10_000);
        s.write_all(head(10_000).as_bytes()).await.unwrap();
        s.write_all(&body.as_bytes()[..9_900]).await.unwrap();
        slow.push(s);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // A 6 kB body would take the router past its budget: 503,
    // retryable, at once (it was read and held whatever the total).
    let mut s = tokio::net::TcpStream::connect(r.addr).await.unwrap();
    s.write_all(format!("{}{}", head(6_000), big(6_000)).as_bytes())
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
        .await
        .unwrap()
        .unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]).to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 503"), "{answer}");
    assert!(answer.contains("retry-after: 1"), "{answer}");
    assert!(answer.contains("\"code\":\"overloaded\""), "{answer}");
    // Small requests still pass.
    let c = client();
    let ok = post(
        &c,
        &r.url("/v1/completions"),
        &serde_json::json!({"model": "m", "prompt": "x"}),
        &[],
    )
    .await;
    assert_eq!(ok.status, 200);
    // Once the slow client leaves, its bytes are given back.
    drop(slow);
    let body: serde_json::Value = serde_json::from_str(&big(6_000)).unwrap();
    poll::poll(
        "the budget is given back",
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || {
            (post(&c, &r.url("/v1/completions"), &body, &[]).await.status == 200).then_some(())
        },
    )
    .await;
    let m = String::from_utf8_lossy(&get_url(&c, &r.url("/metrics")).await.body).into_owned();
    assert!(
        metric_value(&m, "warmpath_request_bodies_refused_total").is_some_and(|n| n >= 1.0),
        "{m}"
    );
}

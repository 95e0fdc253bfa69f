//! The agent's HTTP server: `/livez` and `/readyz` against a fake engine's
//! metrics page, a test router and a KV-event publisher on 127.0.0.1, and the
//! bounds on what one client may hold. The silence check and the removed
//! flags run the real binary to read its log.

use crate::common;

use common::{poll, TestRouter};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use warmpath_agent::{Agent, AgentConfig};
use warmpath_vllm_events::{KvEventPublisher, PublisherConfig};

/// A fake engine whose `/metrics` has vLLM's load gauges and a
/// `vllm:prompt_tokens_total` that grows by `grow` at every scrape.
async fn engine(grow: u64) -> SocketAddr {
    let tokens = Arc::new(AtomicU64::new(0));
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let t = tokens.fetch_add(grow, Ordering::Relaxed) + grow;
            async move {
                format!(
                    "vllm:num_requests_running{{engine=\"0\"}} 0\n\
                     vllm:num_requests_waiting{{engine=\"0\"}} 0\n\
                     vllm:kv_cache_usage_perc{{engine=\"0\"}} 0.1\n\
                     vllm:prompt_tokens_total{{engine=\"0\"}} {t}\n"
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn publisher() -> KvEventPublisher {
    KvEventPublisher::bind(PublisherConfig::new("tcp://127.0.0.1:0"))
        .await
        .unwrap()
}

fn config(engine_url: &str, p: &KvEventPublisher, routers: Vec<String>) -> AgentConfig {
    let mut c = AgentConfig::new("w1", "m", engine_url, p.endpoint());
    c.routers = routers;
    c.load_interval = Duration::from_millis(50);
    c.link.backoff_min = Duration::from_millis(20);
    c.link.backoff_max = Duration::from_millis(200);
    c
}

/// (status, body) of `GET url`.
async fn get(url: &str) -> (u16, Value) {
    let r = reqwest::get(url).await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Polls `/readyz` of `addr` until its `not_ready` reasons are `want`.
async fn until_reasons(addr: SocketAddr, want: &[&str]) -> (u16, Value) {
    let url = format!("http://{addr}/readyz");
    poll::poll(
        &format!("/readyz not ready for {want:?}"),
        Duration::from_secs(20),
        Duration::from_millis(20),
        async || {
            let (status, v) = get(&url).await;
            let got: Vec<&str> = v["not_ready"]
                .as_array()?
                .iter()
                .filter_map(Value::as_str)
                .collect();
            (got == want).then_some((status, v.clone()))
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_needs_a_reachable_engine_and_a_router_stream() {
    let router = TestRouter::start("127.0.0.1:0".parse().unwrap(), None).await;
    let p = publisher().await;
    let up = format!("http://{}", engine(0).await);
    let agent = Agent::start(config(&up, &p, vec![router.url()]), None)
        .await
        .unwrap();
    let addr = agent.http_addr();
    let (status, v) = until_reasons(addr, &[]).await;
    assert_eq!((status, v["status"].as_str()), (200, Some("ok")));
    assert_eq!(get(&format!("http://{addr}/health")).await.0, 200);
    assert_eq!(get(&format!("http://{addr}/livez")).await.0, 200);
    // The router goes away: not ready, but alive.
    router.stop().await;
    let (status, _) = until_reasons(addr, &["no_router_stream"]).await;
    assert_eq!(status, 503);
    assert_eq!(get(&format!("http://{addr}/health")).await.0, 503);
    assert_eq!(get(&format!("http://{addr}/livez")).await.0, 200);
    agent.shutdown().await;

    // An engine that does not answer: not ready, though the router is up.
    let router = TestRouter::start("127.0.0.1:0".parse().unwrap(), None).await;
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let agent = Agent::start(config(&down, &p, vec![router.url()]), None)
        .await
        .unwrap();
    let (status, _) = until_reasons(agent.http_addr(), &["engine_unreachable"]).await;
    assert_eq!(status, 503);
    agent.shutdown().await;
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_tokens_without_kv_events_turn_readyz_false_and_log_the_wildcard_rule() {
    let router = TestRouter::start("127.0.0.1:0".parse().unwrap(), None).await;
    let p = publisher().await;
    let engine_url = format!("http://{}", engine(1000).await);
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_warmpath-agent"))
        .args([
            "--worker-id",
            "w1",
            "--model",
            "m",
            "--engine-url",
            engine_url.as_str(),
        ])
        .args([
            "--kv-events",
            p.endpoint(),
            "--router",
            router.url().as_str(),
        ])
        .args(["--load-interval-ms", "50", "--events-silence-ms", "300"])
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The address on stdout, the logs on stderr: both read into one channel.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let out = BufReader::new(child.stdout.take().unwrap()).lines();
    let err = BufReader::new(child.stderr.take().unwrap()).lines();
    tokio::spawn(forward_lines(out, tx.clone()));
    tokio::spawn(forward_lines(err, tx));
    let mut seen = Vec::new();
    let addr: SocketAddr = loop {
        let l = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("agent did not start within 30 s")
            .expect("agent exited");
        if let Some(a) = l.strip_prefix("warmpath-agent listening on http://") {
            break a.parse().unwrap();
        }
        seen.push(l);
    };
    let (status, _) = until_reasons(addr, &["kv_events_silent"]).await;
    assert_eq!(status, 503);
    // Logged once, at ERROR, naming the endpoint and the rule.
    let rule = "vLLM connects instead of binding when the endpoint is not a wildcard (tcp://*:PORT); point it at tcp://*:PORT";
    let line = poll::poll(
        "the silence logged",
        Duration::from_secs(10),
        Duration::from_millis(10),
        async || {
            while let Ok(l) = rx.try_recv() {
                seen.push(l);
            }
            seen.iter().find(|l| l.contains(rule)).cloned()
        },
    )
    .await;
    assert!(
        line.contains("ERROR") && line.contains(p.endpoint()),
        "{line}"
    );
    let metrics = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for want in [
        "# HELP warmpath_agent_ready ",
        "warmpath_agent_ready 0",
        "warmpath_agent_kv_events_silent 1",
        "warmpath_agent_router_streams 1",
        "warmpath_agent_engine_up 1",
    ] {
        assert!(metrics.contains(want), "{want} not in {metrics}");
    }
    // Events arrive again: ready (and the error is not repeated).
    poll::poll(
        "ready once events arrive",
        Duration::from_secs(20),
        Duration::from_millis(20),
        async || {
            p.publish(vec![]).await.unwrap();
            (get(&format!("http://{addr}/readyz")).await.0 == 200).then_some(())
        },
    )
    .await;
    while let Ok(l) = rx.try_recv() {
        seen.push(l);
    }
    assert_eq!(seen.iter().filter(|l| l.contains(rule)).count(), 1);
    child.kill().await.unwrap();
    router.stop().await;
}

/// Sends every line of `lines` into `tx` until either ends.
async fn forward_lines<R: tokio::io::AsyncBufRead + Unpin>(
    mut lines: tokio::io::Lines<R>,
    tx: tokio::sync::mpsc::UnboundedSender<String>,
) {
    while let Ok(Some(l)) = lines.next_line().await {
        if tx.send(l).is_err() {
            return;
        }
    }
}

/// Reads `c` until the peer closes it or `limit` passes: what it sent, and
/// whether it closed.
async fn read_to_close(c: &mut tokio::net::TcpStream, limit: Duration) -> (String, bool) {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let until = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(until, c.read(&mut buf)).await {
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), false),
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// An agent with no engine scraping and no router, its HTTP server under `http`.
async fn bare_agent(p: &KvEventPublisher, http: warmpath_agent::serve::HttpLimits) -> Agent {
    let mut cfg = config("http://127.0.0.1:1", p, vec![]);
    cfg.load_interval = Duration::ZERO;
    cfg.http = http;
    Agent::start(cfg, None).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_head_and_a_silent_connection_are_closed_while_others_are_served() {
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;
    let p = publisher().await;
    let agent = bare_agent(
        &p,
        warmpath_agent::serve::HttpLimits {
            request_timeout: Duration::from_millis(400),
            ..Default::default()
        },
    )
    .await;
    let addr = agent.http_addr();

    // Half a head, then nothing: closed after the request deadline, with no
    // answer (the request never began).
    let t = std::time::Instant::now();
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\ncontent-le")
        .await
        .unwrap();
    // Another client is served meanwhile.
    assert_eq!(get(&format!("http://{addr}/livez")).await.0, 200);
    let (_, closed) = read_to_close(&mut slow, Duration::from_secs(5)).await;
    assert!(closed, "a half-sent head still open after 5 s");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(380),
        "closed too early: {took:?}"
    );

    // A connection that sends nothing at all is a head that never came.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let (_, closed) = read_to_close(&mut silent, Duration::from_secs(5)).await;
    assert!(closed, "a silent connection still open after 5 s");

    // One request per connection: answered, then closed at once (no idle
    // keep-alive connection to bound).
    let mut once = TcpStream::connect(addr).await.unwrap();
    once.write_all(b"GET /livez HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let t = std::time::Instant::now();
    let (answer, closed) = read_to_close(&mut once, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        closed && t.elapsed() < Duration::from_millis(380),
        "{:?}",
        t.elapsed()
    );

    // A client that keeps asking is served each time on a new connection.
    let client = reqwest::Client::new();
    for _ in 0..3 {
        let r = client
            .get(format!("http://{addr}/livez"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_get_a_503_at_once_and_service_resumes_when_slots_free() {
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;
    let p = publisher().await;
    let agent = bare_agent(
        &p,
        warmpath_agent::serve::HttpLimits {
            max_connections: 3,
            request_timeout: Duration::from_millis(1500),
        },
    )
    .await;
    let addr = agent.http_addr();

    // Three slowloris connections take every slot.
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /livez HTTP/1.1\r\n").await.unwrap();
        held.push(c);
    }
    // One more: refused at once, with an answer that says why.
    let t = std::time::Instant::now();
    let mut over = TcpStream::connect(addr).await.unwrap();
    let (answer, closed) = read_to_close(&mut over, Duration::from_secs(5)).await;
    assert!(
        closed && t.elapsed() < Duration::from_secs(1),
        "{:?}",
        t.elapsed()
    );
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(answer.contains("too many connections"), "{answer}");

    // The request deadline frees the slots: a normal client is served again.
    poll::poll(
        "served once the slots free",
        Duration::from_secs(5),
        Duration::from_millis(100),
        async || {
            let r = reqwest::Client::new()
                .get(format!("http://{addr}/livez"))
                .timeout(Duration::from_secs(5))
                .send()
                .await
                .ok()?;
            (r.status() == 200).then_some(())
        },
    )
    .await;
    for mut c in held {
        let (_, closed) = read_to_close(&mut c, Duration::from_secs(5)).await;
        assert!(closed, "a slowloris slot was never freed");
    }
    agent.shutdown().await;
}

#[tokio::test]
async fn a_flag_of_the_removed_observe_mode_fails_the_start_and_names_kv_events() {
    for flag in ["--mode", "--tokenizer", "--block-size", "--cache-blocks"] {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_warmpath-agent"))
            .args([
                "--worker-id",
                "w1",
                "--model",
                "m",
                "--engine-url",
                "http://127.0.0.1:1",
            ])
            .args(["--kv-events", "tcp://127.0.0.1:1", &format!("{flag}=x")])
            .output()
            .await
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag}: started");
        for want in [
            flag,
            "observe mode was removed",
            "--kv-events-config",
            "--kv-events tcp://",
        ] {
            assert!(err.contains(want), "{flag}: {want:?} not in {err}");
        }
    }
}

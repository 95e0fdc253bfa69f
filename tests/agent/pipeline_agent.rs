//! The agent's life beside an engine, end to end with the real agent binary
//! and the real router: per-worker credentials against a forged agent, no
//! token in plain text to another host, a warm engine learned at start, an
//! engine restart seen in its metrics.

use crate::{ingest, tools};

use ingest::*;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A hand-made agent stream claiming `worker` (epoch `epoch`) with `token`:
/// the router's first answer, or the gRPC status that refused the stream.
async fn forged_hello(
    grpc: SocketAddr,
    token: Option<&str>,
    worker: &str,
    epoch: u64,
) -> Result<Option<warmpath_proto::v1::RouterMessage>, tonic::Status> {
    use warmpath_proto::v1::{agent_message::Msg, AgentMessage, Hello};
    let mut client = warmpath_proto::CacheEventsClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let hello = Hello {
        worker_id: worker.into(),
        endpoint: "http://127.0.0.1:1".into(),
        model: "m".into(),
        block_size: BS,
        epoch,
        agent_version: "forged".into(),
        dp_rank: 0,
        partial: false,
    };
    tx.send(AgentMessage {
        msg: Some(Msg::Hello(hello)),
    })
    .await
    .unwrap();
    let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    if let Some(t) = token {
        req.metadata_mut()
            .insert("authorization", warmpath_proto::bearer(t).parse().unwrap());
    }
    let mut answers = client.publish(req).await?.into_inner();
    let first = tokio::time::timeout(Duration::from_secs(10), answers.message())
        .await
        .expect("no answer to the forged Hello within 10 s");
    drop(tx);
    first
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_worker_credentials_stop_a_forged_agent_and_let_restarts_in() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "the-router-secret";
    let r = router(
        &s(&["--grpc-listen", "127.0.0.1:0", "--agent-secret", secret]),
        &["a", "b"],
    )
    .await;
    let grpc = r.grpc_addr.unwrap();
    let (token_a, token_b) = (
        warmpath_proto::worker_token(secret, "a"),
        warmpath_proto::worker_token(secret, "b"),
    );
    let with = |t: &str| s(&["--router", &format!("http://{grpc}"), "--agent-token", t]);
    let p = publisher().await;
    let a = agent(dir.path(), "a", &p, &with(&token_a));
    tokio::time::sleep(Duration::from_millis(300)).await;
    p.publish(vec![stored(100, None, 0..32, BS)]).await.unwrap();
    wait_until("a's blocks", Duration::from_secs(30), &[&p], || {
        blocks(&r, "a") == 8
    })
    .await;

    // b's own credential, a newer epoch, claiming a: refused after the Hello.
    let answer = forged_hello(grpc, Some(&token_b), "a", u64::MAX)
        .await
        .unwrap();
    let refused = match answer.and_then(|m| m.msg) {
        Some(warmpath_proto::v1::router_message::Msg::Refused(r)) => r,
        other => panic!("the forged Hello was not refused: {other:?}"),
    };
    assert!(
        refused.reason.contains("does not name worker \"a\""),
        "{}",
        refused.reason
    );
    assert!(!refused.retryable);
    // No credential, or the shared-token style of a made-up one: not even a stream.
    for t in [None, Some("guess")] {
        let e = forged_hello(grpc, t, "a", u64::MAX).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e}");
    }
    // a kept its entries and its stream: its next events still arrive.
    assert_eq!(blocks(&r, "a"), 8);
    p.publish(vec![stored(108, Some(107), 32..40, BS)])
        .await
        .unwrap();
    wait_until("a's next blocks", Duration::from_secs(30), &[&p], || {
        blocks(&r, "a") == 10
    })
    .await;
    let st = agent_status(r.http_addr).await;
    assert_eq!(st["connected"], true, "{st}");
    let m = metrics_text(r.http_addr).await;
    assert!(
        m.lines()
            .any(|l| l.starts_with("warmpath_ingest_refused_total{reason=\"identity\"}")),
        "{m}"
    );

    // The real a restarts with its credential: the new epoch takes over.
    // Its blocks and `connected` are those of the old stream until then,
    // so wait for the new epoch's own snapshot of them.
    let old = agent_status(r.http_addr).await;
    drop(a);
    let _a = agent(dir.path(), "a", &p, &with(&token_a));
    let http = r.http_addr;
    let st = poll::poll(
        "the restarted agent's snapshot under a new epoch",
        Duration::from_secs(30),
        Duration::from_millis(50),
        async || {
            let st = agent_status(http).await;
            let took_over =
                st["epoch"] != old["epoch"] && st["snapshots"].as_u64() > old["snapshots"].as_u64();
            (took_over && blocks(&r, "a") == 10).then_some(st)
        },
    )
    .await;
    assert_eq!(st["connected"], true, "{st}");
    assert!(st["refused"].is_null(), "{st}");
    r.shutdown();
    r.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_will_not_send_its_token_in_plain_text_to_another_host() {
    let out = Command::new(env!("CARGO_BIN_EXE_warmpath-agent"))
        .args(["--worker-id", "w", "--model", "m"])
        .args(["--engine-url", "http://127.0.0.1:9"])
        .args(["--kv-events", "tcp://127.0.0.1:9"])
        // Never contacted: the agent refuses before connecting anywhere.
        .args(["--router", "http://192.0.2.1:50051", "--agent-token", "t"])
        .env_remove("WARMPATH_AGENT_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("plain text") && err.contains("--insecure"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_started_beside_a_warm_engine_learns_its_cache_without_a_new_event() {
    let dir = tempfile::tempdir().unwrap();
    let r = router(&s(&["--grpc-listen", "127.0.0.1:0"]), &["w"]).await;
    let p = publisher().await;
    // The engine cached 10 blocks before the agent existed; its replay
    // buffer still holds the batches. Nothing is published after this.
    p.publish(vec![stored(100, None, 0..24, BS)]).await.unwrap();
    p.publish(vec![stored(106, Some(105), 24..40, BS)])
        .await
        .unwrap();
    let started = Instant::now();
    let _a = agent(
        dir.path(),
        "w",
        &p,
        &s(&["--router", &format!("http://{}", r.grpc_addr.unwrap())]),
    );
    poll::poll(
        "the warm engine's blocks",
        Duration::from_secs(30),
        Duration::from_millis(50),
        async || (blocks(&r, "w") == 10).then_some(()),
    )
    .await;
    let idx = index(&r);
    let slot = idx.worker_slot("w").unwrap();
    assert_eq!(idx.longest_match(&wp(40)).of(slot).unwrap().blocks, 10);
    eprintln!("learned {:?} after the agent started", started.elapsed());
    // Live batches keep applying after the start-up replay.
    p.publish(vec![stored(110, Some(109), 40..48, BS)])
        .await
        .unwrap();
    poll::poll(
        "the next live batch",
        Duration::from_secs(30),
        Duration::from_millis(50),
        async || (blocks(&r, "w") == 12).then_some(()),
    )
    .await;
    r.shutdown();
    r.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_restart_seen_in_its_metrics_clears_the_worker_at_once() {
    use std::sync::atomic::{AtomicU64, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let r = router(&s(&["--grpc-listen", "127.0.0.1:0"]), &["w"]).await;
    let p = publisher().await;
    // The engine's metrics page, with the start time of its process.
    let started_at = Arc::new(AtomicU64::new(1_000));
    let page = {
        let t = Arc::clone(&started_at);
        move || async move {
            format!(
                "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.5\nvllm:cache_config_info{{block_size=\"4\",num_gpu_blocks=\"512\"}} 1.0\nprocess_start_time_seconds {}\n",
                t.load(Ordering::SeqCst)
            )
        }
    };
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let engine = l.local_addr().unwrap();
    let app = axum::Router::new().route("/metrics", axum::routing::get(page));
    let server = tokio::spawn(async move { axum::serve(l, app).await.ok() });
    let log = dir.path().join("agent.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_warmpath-agent"))
        .args(["--worker-id", "w", "--model", "m"])
        .args(["--engine-url", &format!("http://{engine}")])
        .args(["--kv-events", p.endpoint()])
        .args(["--kv-replay", p.replay_endpoint().unwrap()])
        .args(["--listen", "127.0.0.1:0", "--load-interval-ms", "100"])
        .args(["--router", &format!("http://{}", r.grpc_addr.unwrap())])
        .env("NO_COLOR", "1")
        .env_remove("WARMPATH_AGENT_TOKEN")
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .unwrap();
    let _a = Proc { child, log };
    tokio::time::sleep(Duration::from_millis(300)).await;
    p.publish(vec![stored(100, None, 0..32, BS)]).await.unwrap();
    wait_until("the blocks", Duration::from_secs(30), &[&p], || {
        blocks(&r, "w") == 8
    })
    .await;
    // The engine's capacity reaches the router with its load (kv_aware models
    // that backend's cache from then on).
    let http = r.http_addr;
    poll::poll(
        "the engine's capacity at the router",
        Duration::from_secs(30),
        Duration::from_millis(50),
        async || {
            let v: serde_json::Value = reqwest::get(format!("http://{http}/cache-index"))
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            (v["pools"][0]["workers"][0]["agent_load"]["capacity_blocks"] == 512).then_some(())
        },
    )
    .await;
    // The engine process is replaced: a new start time, its sequence from 0
    // with an empty replay buffer, and no event yet. The worker is cleared
    // at once, without waiting for one.
    p.restart().await;
    started_at.store(2_000, Ordering::SeqCst);
    poll::poll(
        "the worker cleared after the restart",
        Duration::from_secs(30),
        Duration::from_millis(50),
        async || (blocks(&r, "w") == 0).then_some(()),
    )
    .await;
    // The new process's events are learned as usual.
    p.publish(vec![stored(500, None, 0..8, BS)]).await.unwrap();
    wait_until(
        "the new engine's blocks",
        Duration::from_secs(30),
        &[&p],
        || blocks(&r, "w") == 2,
    )
    .await;
    server.abort();
    r.shutdown();
    r.wait().await;
}

/// `promtool check metrics` on `text`; `None` when promtool is not installed.
fn promtool(what: &str, text: &str) -> Option<String> {
    use std::io::Write;
    let mut child = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            tools::missing(
                "promtool",
                &format!("{what}'s metrics ({e}; Debian's `prometheus`)"),
            );
            return None;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    Some(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_binaries_metrics_pass_promtool() {
    let dir = tempfile::tempdir().unwrap();
    let r = router(&s(&["--grpc-listen", "127.0.0.1:0"]), &["w"]).await;
    let p = publisher().await;
    let a = agent(
        dir.path(),
        "w",
        &p,
        &s(&["--router", &format!("http://{}", r.grpc_addr.unwrap())]),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    p.publish(vec![stored(100, None, 0..16, BS)]).await.unwrap();
    wait_until("the blocks", Duration::from_secs(30), &[&p], || {
        blocks(&r, "w") == 4
    })
    .await;
    let agent_http = a
        .output()
        .lines()
        .find_map(|l| {
            l.strip_prefix("warmpath-agent listening on ")
                .map(str::to_owned)
        })
        .unwrap();
    let agent_metrics = reqwest::get(format!("{agent_http}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        agent_metrics.contains("warmpath_agent_batches_total"),
        "{agent_metrics}"
    );
    // One request (its backend refuses connections: a 502), so the
    // per-request series exist too.
    let answer = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", r.http_addr))
        .json(&serde_json::json!({"model": "m", "prompt": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 502);
    // This process's recorder also holds the series of other tests'
    // in-process agents, their HELP lost when they started before it was
    // installed; a router process has none of them.
    let router_metrics: String = metrics_text(r.http_addr)
        .await
        .lines()
        .filter(|l| !l.contains("warmpath_agent_"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        router_metrics.contains("warmpath_ingest_blocks_total"),
        "{router_metrics}"
    );
    assert!(
        router_metrics.contains("warmpath_ingest_lag_seconds_bucket{"),
        "the ingest lag is a histogram, so replicas aggregate: {router_metrics}"
    );
    assert!(
        agent_metrics.contains("warmpath_build_info{binary=\"warmpath-agent\""),
        "{agent_metrics}"
    );
    assert!(
        router_metrics.contains("warmpath_build_info{binary=\"warmpath-router\""),
        "{router_metrics}"
    );
    assert!(
        router_metrics.contains("warmpath_backend_ejections_total{"),
        "{router_metrics}"
    );
    for (what, text) in [("agent", &agent_metrics), ("router", &router_metrics)] {
        if let Some(problems) = promtool(what, text) {
            assert!(problems.trim().is_empty(), "{what}: {problems}\n{text}");
        }
    }
    deploy_files_name_only_real_series(&[&agent_metrics, &router_metrics]);
    alert_rules_pass_promtool();
    r.shutdown();
    r.wait().await;
}

/// The repository's `deploy/` folder.
fn deploy(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(path)
}

/// Every `warmpath_*` identifier in `text`.
fn warmpath_names(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("warmpath_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        // Skip `warmpath_router::access`-like paths and words inside names.
        let before = rest[..i].chars().next_back();
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.push(&tail[..end]);
        }
        rest = &tail[end..];
    }
    out
}

/// The dashboard and the alert rules name only series the binaries export
/// (so neither rots when a series is renamed); the dashboard is Grafana JSON
/// whose every panel queries something.
fn deploy_files_name_only_real_series(pages: &[&str]) {
    let exported: std::collections::BTreeSet<&str> = pages
        .iter()
        .flat_map(|p| p.lines())
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let dashboard = std::fs::read_to_string(deploy("grafana/warmpath.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    let mut exprs = Vec::new();
    for panel in json["panels"].as_array().unwrap() {
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{panel}");
        exprs.extend(
            targets
                .iter()
                .map(|t| t["expr"].as_str().unwrap().to_owned()),
        );
    }
    assert!(exprs.len() >= 15, "{exprs:?}");
    let alerts = std::fs::read_to_string(deploy("prometheus/alerts.yaml")).unwrap();
    let rules: Vec<&str> = alerts
        .lines()
        .filter(|l| l.trim_start().starts_with("expr:"))
        .collect();
    assert_eq!(rules.len(), 5, "{alerts}");
    let mut checked = 0;
    for expr in exprs.iter().map(String::as_str).chain(rules) {
        for name in warmpath_names(expr) {
            assert!(
                exported.contains(name),
                "`{name}` (in `{expr}`) is on no /metrics page"
            );
            checked += 1;
        }
    }
    assert!(checked >= 20, "{checked}");
}

/// `promtool check rules` and `promtool test rules` on deploy/prometheus.
fn alert_rules_pass_promtool() {
    let dir = deploy("prometheus");
    for args in [
        ["check", "rules", "alerts.yaml"],
        ["test", "rules", "alerts_test.yaml"],
    ] {
        let out = match Command::new("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
        {
            Ok(o) => o,
            Err(e) => {
                tools::missing(
                    "promtool",
                    &format!("deploy/prometheus/alerts.yaml ({e}; Debian's `prometheus`)"),
                );
                return;
            }
        };
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_agent_logs_json_to_stderr_and_says_following_once() {
    let dir = tempfile::tempdir().unwrap();
    let p = publisher().await;
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let child = Command::new(env!("CARGO_BIN_EXE_warmpath-agent"))
        .args(["--worker-id", "w", "--model", "m"])
        .args(["--engine-url", "http://127.0.0.1:9"])
        .args(["--kv-events", p.endpoint()])
        .args(["--kv-replay", p.replay_endpoint().unwrap()])
        .args(["--listen", "127.0.0.1:0", "--load-interval-ms", "0"])
        .args(["--log-format", "json"])
        // DEBUG for the agent: the quiet re-subscriptions show there.
        .env("RUST_LOG", "info,warmpath_agent=debug")
        .env_remove("WARMPATH_AGENT_TOKEN")
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let _agent = Proc {
        child,
        log: err.clone(),
    };
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    let json_lines = |text: &str| -> Vec<serde_json::Value> {
        let complete = text.rfind('\n').map_or("", |i| &text[..i]);
        complete
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
            .collect()
    };
    let following = |l: &serde_json::Value| {
        l["level"] == "INFO" && l["fields"]["message"] == "following engine events"
    };
    ingest::poll::poll(
        "the agent following its engine",
        Duration::from_secs(20),
        Duration::from_millis(50),
        async || json_lines(&read(&err)).iter().any(following).then_some(()),
    )
    .await;
    // An idle engine for longer than the 3 s after which the old follower
    // re-created its socket (and logged): the socket now stays, so nothing
    // more is said, at INFO or DEBUG.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let lines = json_lines(&read(&err));
    assert_eq!(
        lines.iter().filter(|l| following(l)).count(),
        1,
        "{lines:?}"
    );
    assert!(
        !lines
            .iter()
            .any(|l| l["fields"]["message"].as_str().is_some_and(|m| m
                .starts_with("following engine events again")
                || m.contains("re-creating"))),
        "{lines:?}"
    );
    // stdout: only the line scripts read.
    let stdout = read(&out);
    assert!(
        stdout.starts_with("warmpath-agent listening on http://"),
        "{stdout}"
    );
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
}

/// Issue 17 item 3, the agent's side: an agent started beside an engine
/// whose KV usage its view cannot cover (the engine reports 256 of 512
/// blocks in use, the agent knows none: they were cached before it, past
/// the replay ring) marks its view `partial`, and the router shows it; once
/// events cover the usage the flag clears. (The router's rule for a partial
/// owner: `tests/router/partial.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_cannot_cover_its_engines_kv_usage_reports_a_partial_view() {
    let dir = tempfile::tempdir().unwrap();
    let r = router(&s(&["--grpc-listen", "127.0.0.1:0"]), &["w"]).await;
    let p = publisher().await;
    let page = || async {
        "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.5\nvllm:cache_config_info{block_size=\"4\",num_gpu_blocks=\"512\"} 1.0\nprocess_start_time_seconds 1000\n"
    };
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let engine = l.local_addr().unwrap();
    let app = axum::Router::new().route("/metrics", axum::routing::get(page));
    let server = tokio::spawn(async move { axum::serve(l, app).await.ok() });
    let log = dir.path().join("agent.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_warmpath-agent"))
        .args(["--worker-id", "w", "--model", "m"])
        .args(["--engine-url", &format!("http://{engine}")])
        .args(["--kv-events", p.endpoint()])
        .args(["--kv-replay", p.replay_endpoint().unwrap()])
        .args(["--listen", "127.0.0.1:0", "--load-interval-ms", "100"])
        .args(["--router", &format!("http://{}", r.grpc_addr.unwrap())])
        .env("NO_COLOR", "1")
        .env_remove("WARMPATH_AGENT_TOKEN")
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .unwrap();
    let _a = Proc { child, log };
    let http = r.http_addr;
    let worker = async || -> Option<serde_json::Value> {
        let v: serde_json::Value = reqwest::get(format!("http://{http}/cache-index"))
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        Some(v["pools"][0]["workers"][0].clone())
    };
    poll::poll(
        "the router to show w's view as partial",
        Duration::from_secs(30),
        Duration::from_millis(50),
        async || (worker().await?["partial"] == true).then_some(()),
    )
    .await;
    assert_eq!(blocks(&r, "w"), 0);
    // 240 blocks: within the slack (5% of 512) of the 256 in use.
    p.publish(vec![stored(100, None, 0..960, BS)])
        .await
        .unwrap();
    wait_until("the 240 blocks", Duration::from_secs(30), &[&p], || {
        blocks(&r, "w") == 240
    })
    .await;
    poll::poll(
        "the partial flag to clear",
        Duration::from_secs(30),
        Duration::from_millis(50),
        async || (worker().await?["partial"] == false).then_some(()),
    )
    .await;
    server.abort();
    r.shutdown();
    r.wait().await;
}

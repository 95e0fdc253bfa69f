//! End-to-end tests of the router's health: readiness without client
//! traffic, ejection back-off, completion probes, probe rounds spread over
//! the interval. The real binary against local backends (tests/support),
//! everything on 127.0.0.1 port 0.

use crate::support;

use axum::routing::{get, post as route_post};
use serde_json::json;
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::*;

/// The router binary over `urls` (pool `m`, `random`), with `sections` of
/// router.yaml.
async fn router_over(urls: &[String], sections: &str) -> RouterProcess {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("router.yaml");
    let backends: Vec<String> = urls.iter().map(|u| format!("{{url: '{u}'}}")).collect();
    let yaml = format!(
        "{sections}\npools:\n  - model: m\n    strategy: random\n    backends: [{}]\n",
        backends.join(", ")
    );
    std::fs::write(&cfg, yaml).unwrap();
    RouterProcess::spawn(&["--config", cfg.to_str().unwrap()]).await
}

/// The value of the first `/metrics` line starting with `series` and
/// holding `label`.
async fn metric(c: &TestClient, r: &RouterProcess, series: &str, label: &str) -> Option<f64> {
    let text = String::from_utf8(get_url(c, &r.url("/metrics")).await.body.to_vec()).unwrap();
    text.lines()
        .find(|l| l.starts_with(series) && l.contains(label))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Polls `url` until it answers `status`.
async fn until_status(c: &TestClient, url: &str, status: u16) {
    poll::poll(
        &format!("{url} answering {status}"),
        Duration::from_secs(10),
        Duration::from_millis(10),
        async || (get_url(c, url).await.status == status).then_some(()),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_needs_a_probed_backend_and_no_client_request() {
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let sick = TestBackend::start("sick").await;
    sick.set_healthy(false);
    let r = router_over(
        &[dead, sick.url()],
        "health: {probe_interval_ms: 50, eject_after: 2}",
    )
    .await;
    let c = client();
    // Every backend dead, no client traffic: not ready from the start.
    assert_eq!(get_url(&c, &r.url("/livez")).await.status, 200);
    for path in ["/readyz", "/health"] {
        let reply = get_url(&c, &r.url(path)).await;
        assert_eq!(reply.status, 503, "{path}");
        assert_eq!(reply.json()["status"], "unavailable");
        assert_eq!(reply.json()["pools"][0]["healthy_backends"], 0);
    }
    assert_eq!(metric(&c, &r, "warmpath_ready ", "").await, Some(0.0));
    let sick_url = format!("backend=\"{}\"", sick.url());
    let series = ("warmpath_backend_healthy{", sick_url.as_str());
    assert_eq!(metric(&c, &r, series.0, series.1).await, Some(0.0));
    // One comes up: ready, without a client request.
    sick.set_healthy(true);
    until_status(&c, &r.url("/readyz"), 200).await;
    assert_eq!(get_url(&c, &r.url("/health")).await.json()["status"], "ok");
    assert_eq!(metric(&c, &r, "warmpath_ready ", "").await, Some(1.0));
    assert_eq!(metric(&c, &r, series.0, series.1).await, Some(1.0));
    let text = String::from_utf8(get_url(&c, &r.url("/metrics")).await.body.to_vec()).unwrap();
    assert!(text.contains("# HELP warmpath_ready "), "{text}");
    assert!(text.contains("# HELP warmpath_backend_healthy "), "{text}");
    // It goes down again: probes notice, still without client traffic.
    sick.set_healthy(false);
    until_status(&c, &r.url("/readyz"), 503).await;
    assert_eq!(sick.count(), 0, "no client request was needed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ejection_back_off_doubles_and_a_success_streak_resets_it() {
    let b = TestBackend::start("b").await;
    let r = router_over(
        &[b.url()],
        "health: {eject_after: 2, probe_interval_ms: 160}",
    )
    .await;
    let c = client();
    let url = r.url("/v1/completions");
    let fail = json!({"model": "m", "prompt": "x", "x_status": 500});
    let ok = json!({"model": "m", "prompt": "x"});
    // Ejects (two 5xx), then times how long until it is back in rotation
    // (requests would pass meanwhile: it is the only one, panic routing),
    // and sends it one request.
    let eject_and_time = async || {
        assert_eq!(post(&c, &url, &fail, &[]).await.status, 500);
        assert_eq!(post(&c, &url, &fail, &[]).await.status, 500);
        let t = Instant::now();
        poll::poll(
            "the backend back in rotation",
            Duration::from_secs(10),
            Duration::from_millis(10),
            async || {
                let v = get_url(&c, &r.url("/readyz")).await.json();
                (v["pools"][0]["in_rotation"] == 1).then_some(())
            },
        )
        .await;
        let back = t.elapsed();
        assert_eq!(post(&c, &url, &ok, &[]).await.status, 200);
        back
    };
    // The first back-off is 2.5 probe intervals: 400 ms.
    let first = eject_and_time().await;
    assert!(first >= Duration::from_millis(400), "{first:?}");
    // Back with one success, short of a streak of eject_after: doubled.
    let second = eject_and_time().await;
    assert!(second >= Duration::from_millis(800), "{second:?}");
    // A streak of eject_after (2) answers resets the back-off to the base.
    assert_eq!(post(&c, &url, &ok, &[]).await.status, 200);
    let third = eject_and_time().await;
    assert!(
        third >= Duration::from_millis(400) && third < Duration::from_millis(800),
        "{third:?}"
    );
}

/// An engine whose `/health` answers 200 while its completions hang.
async fn hung_engine() -> SocketAddr {
    let app = axum::Router::new()
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/completions",
            route_post(|| async {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                "never"
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_probe_ejects_an_engine_whose_generation_hangs() {
    let engine = format!("http://{}", hung_engine().await);
    let c = client();
    let sections = "health: {probe_interval_ms: 100, eject_after: 2";
    // /health says 200: the health probe is fooled.
    let fooled = router_over(std::slice::from_ref(&engine), &format!("{sections}}}")).await;
    assert_eq!(get_url(&c, &fooled.url("/readyz")).await.status, 200);
    drop(fooled);
    // The completion probe is not: not ready, then ejected, no client request.
    let r = router_over(&[engine], &format!("{sections}, probe: completion}}")).await;
    assert_eq!(get_url(&c, &r.url("/readyz")).await.status, 503);
    poll::poll(
        "the hung engine ejected",
        Duration::from_secs(10),
        Duration::from_millis(10),
        async || {
            let v = get_url(&c, &r.url("/readyz")).await.json();
            (v["pools"][0]["in_rotation"] == 0).then_some(())
        },
    )
    .await;
    assert_all_ejected(&c, &r).await;
}

/// An engine that notes when each `/health` probe arrives.
async fn noting_engine(
    seen: std::sync::Arc<std::sync::Mutex<Vec<(usize, Instant)>>>,
    id: usize,
) -> String {
    let app = axum::Router::new().route(
        "/health",
        get(move || {
            let seen = std::sync::Arc::clone(&seen);
            async move {
                seen.lock().unwrap().push((id, Instant::now()));
                "ok"
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_probe_rounds_spread_over_the_interval() {
    const N: usize = 4;
    const EVERY: Duration = Duration::from_millis(800);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut urls = Vec::new();
    for id in 0..N {
        urls.push(noting_engine(std::sync::Arc::clone(&seen), id).await);
    }
    let r = router_over(&urls, "health: {probe_interval_ms: 800}").await;
    let c = client();
    assert_eq!(get_url(&c, &r.url("/readyz")).await.status, 200);
    // The start-up round probes all at once, before the router listens.
    let first: Vec<Instant> = seen.lock().unwrap().iter().map(|s| s.1).collect();
    assert_eq!(first.len(), N, "one start-up probe each");
    tokio::time::sleep(EVERY * 3).await;
    let probes = seen.lock().unwrap().clone();
    let later = &probes[N..];
    // Each backend about once per interval, none forgotten.
    for id in 0..N {
        let count = later.iter().filter(|s| s.0 == id).count();
        assert!(
            (2..=4).contains(&count),
            "backend {id}: {count} probes in 3 intervals"
        );
    }
    // One later round: its N probes a quarter interval apart, not a burst.
    let round: Vec<Instant> = later[..N].iter().map(|s| s.1).collect();
    for pair in round.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= EVERY / (2 * N as u32),
            "probes {gap:?} apart in one round (interval {EVERY:?}, {N} backends)"
        );
    }
}

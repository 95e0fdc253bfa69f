//! Router replicas that agree (issue 20), end to end: three real routers
//! (`warmpath_router::start`), three real `warmpath-agent` binaries each
//! streaming to all three, and three fake engines written here. Replica A
//! places prefixes the others never saw; through the agents' streams B and C
//! learn A's placements, so all three preview the same backend for a new
//! prefix, and that prefix sent to A and B at the same moment lands there
//! from both. Then every agent is
//! killed (the sharing channel is gone) and each replica still routes.
//! Last, one router that shares nothing: its previews still tell its picks.

use crate::ingest;

use axum::routing::{get, post};
use clap::Parser;
use ingest::*;
use serde_json::{json, Value};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

const WORKERS: [&str; 3] = ["w0", "w1", "w2"];
/// The model, so the pool: its own, because the in-process routers of the
/// whole test binary share one metrics recorder and [`settled`] sums it.
const MODEL: &str = "replicas";

/// A fake engine: answers completions at once, healthy, serves `model`.
async fn engine(model: &'static str) -> String {
    let app = axum::Router::new()
        .route(
            "/v1/completions",
            post(|| async {
                axum::Json(json!({"id": "c", "object": "text_completion",
                    "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}]}))
            }),
        )
        .route("/health", get(|| async { "ok" }))
        .route(
            "/v1/models",
            get(move || async move {
                axum::Json(json!({"object": "list", "data": [{"id": model, "object": "model"}]}))
            }),
        );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await });
    url
}

/// A kv_aware router over `engines` (worker ids w0..w2), agents on port 0;
/// `tokenizer` holds the generated tiny tokenizer (prompts here are token
/// ids, but kv_aware refuses to start without one).
async fn replica(
    engines: &[String],
    tokenizer: &std::path::Path,
    share: bool,
    model: &str,
) -> warmpath_router::RunningRouter {
    let tok = tokenizer.display().to_string();
    let args = [
        "warmpath-router",
        "--listen",
        "127.0.0.1:0",
        "--grpc-listen",
        "127.0.0.1:0",
        "--model",
        model,
        "--block-size",
        "4",
        "--strategy",
        "kv_aware",
        "--tokenizer",
        &tok,
    ];
    let mut config = warmpath_router::Cli::try_parse_from(args)
        .unwrap()
        .load()
        .unwrap();
    config.ingest.share_decisions = share;
    config.health.probe_interval_ms = 50;
    config.pools[0].backends = engines
        .iter()
        .zip(WORKERS)
        .map(|(url, w)| {
            let mut b = warmpath_router::config::BackendConfig::new(url.clone());
            b.worker_id = Some(w.to_owned());
            b
        })
        .collect();
    warmpath_router::start(config, CancellationToken::new())
        .await
        .unwrap()
}

/// A completion whose prompt is `n` token ids of prefix `p` (hashed by the
/// router without a tokenizer): 8 blocks of 4.
fn prompt(p: u32, model: &str) -> Value {
    let ids: Vec<u32> = (0..32).map(|i| p * 1000 + i).collect();
    json!({"model": model, "prompt": ids, "max_tokens": 1})
}

/// Routes prefix `p` of `model` through `r`; the backend it went to.
async fn route(
    c: &reqwest::Client,
    r: &warmpath_router::RunningRouter,
    p: u32,
    model: &str,
) -> String {
    let resp = c
        .post(format!("http://{}/v1/completions", r.http_addr))
        .json(&prompt(p, model))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    resp.headers()["x-warmpath-backend"]
        .to_str()
        .unwrap()
        .to_owned()
}

/// The backend `r` would pick for prefix `p` of `model` now (`/cache-index/query`).
async fn preview(
    c: &reqwest::Client,
    r: &warmpath_router::RunningRouter,
    p: u32,
    model: &str,
) -> String {
    let v: Value = c
        .post(format!("http://{}/cache-index/query", r.http_addr))
        .json(&prompt(p, model))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["decision"]["worker_id"].as_str().unwrap_or("").to_owned()
}

/// Whether every fact sent so far was received by both other replicas
/// (the routers of this test share one metrics recorder: sums over all;
/// those of the other tests serve other pools).
async fn settled(r: &warmpath_router::RunningRouter) -> bool {
    let text = metrics_text(r.http_addr).await;
    let count = |dir: &str| -> u64 {
        let key = format!("warmpath_replica_facts_total{{pool=\"{MODEL}\",direction=\"{dir}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .map_or(0, |v| v.trim().parse().unwrap())
    };
    count("received") == 2 * count("sent")
}

/// The workers of `r`'s first pool, as `GET /cache-index` shows them.
async fn workers(c: &reqwest::Client, r: &warmpath_router::RunningRouter) -> Vec<Value> {
    let v: Value = c
        .get(format!("http://{}/cache-index", r.http_addr))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["pools"][0]["workers"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

async fn connected(c: &reqwest::Client, r: &warmpath_router::RunningRouter) -> usize {
    let ws = workers(c, r).await;
    ws.iter()
        .filter(|w| w["agent"]["connected"] == true)
        .count()
}

async fn run(share: bool) {
    let dir = tempfile::tempdir().unwrap();
    let engines = vec![
        engine(MODEL).await,
        engine(MODEL).await,
        engine(MODEL).await,
    ];
    let tok = dir.path().join("tokenizer");
    warmpath_core::tokenize::tiny::write_model_dir(&tok).unwrap();
    let rs = vec![
        replica(&engines, &tok, share, MODEL).await,
        replica(&engines, &tok, share, MODEL).await,
        replica(&engines, &tok, share, MODEL).await,
    ];
    let mut flags = Vec::new();
    for r in &rs {
        flags.push("--router".to_owned());
        flags.push(format!("http://{}", r.grpc_addr.unwrap()));
    }
    let pubs = vec![publisher().await, publisher().await, publisher().await];
    let agents: Vec<Proc> = WORKERS
        .iter()
        .zip(&pubs)
        .map(|(w, p)| agent_of(dir.path(), w, MODEL, p, &flags))
        .collect();
    let c = reqwest::Client::new();
    for r in &rs {
        poll::poll(
            "every agent on every replica, every engine healthy",
            Duration::from_secs(30),
            Duration::from_millis(50),
            async || {
                let ready = c
                    .get(format!("http://{}/readyz", r.http_addr))
                    .send()
                    .await
                    .is_ok_and(|x| x.status() == 200);
                (ready && connected(&c, r).await == 3).then_some(())
            },
        )
        .await;
    }
    let (a, b, cc) = (&rs[0], &rs[1], &rs[2]);
    // A alone places two prefixes, eight requests each: two backends carry
    // them, the third nothing, which only A knows first hand. (Clear gaps:
    // replicas record shared decisions in their own order, so decayed
    // loads agree only to a small fraction of one request.)
    for p in [1u32, 2] {
        for _ in 0..8 {
            route(&c, a, p, MODEL).await;
        }
    }
    for (round, x) in (100..103u32).enumerate() {
        // Decayed popularities depend on the order decisions are recorded
        // in: every replica records the last round's before this one's.
        if share {
            poll::poll(
                "every shared decision to reach both other replicas",
                Duration::from_secs(10),
                Duration::from_millis(10),
                async || settled(a).await.then_some(()),
            )
            .await;
        }
        // Every replica has heard of every decision so far: their previews
        // of the new prefix agree (the blind replicas of a run without
        // sharing never do: see the ignored test below).
        let agreed = poll::poll(
            "the replicas to know each other's placements (shared through the agents)",
            Duration::from_secs(10),
            Duration::from_millis(20),
            async || {
                let (pa, pb, pc) = (
                    preview(&c, a, x, MODEL).await,
                    preview(&c, b, x, MODEL).await,
                    preview(&c, cc, x, MODEL).await,
                );
                (pa == pb && pb == pc).then_some(pa)
            },
        );
        let Ok(want) = tokio::time::timeout(Duration::from_secs(8), agreed).await else {
            let m = metrics_text(a.http_addr).await;
            let facts: Vec<&str> = m.lines().filter(|l| l.contains("replica_")).collect();
            panic!(
                "round {round}: replicas disagree on prefix {x}: A {} B {} C {} / {facts:?}",
                preview(&c, a, x, MODEL).await,
                preview(&c, b, x, MODEL).await,
                preview(&c, cc, x, MODEL).await
            );
        };
        // A new prefix sent to two replicas at once lands on one backend.
        let (on_a, on_b) = tokio::join!(route(&c, a, x, MODEL), route(&c, b, x, MODEL));
        assert_eq!(
            on_a, on_b,
            "round {round}: prefix {x} split between replicas"
        );
        assert_eq!(on_a, want, "round {round}");
        println!("NUMBER round {round}: prefix {x} on {on_a} from both A and B");
    }
    // The channel goes: every agent stops. Each replica routes on alone.
    drop(agents);
    for r in &rs {
        poll::poll(
            "the replica to see its agents gone",
            Duration::from_secs(20),
            Duration::from_millis(50),
            async || (connected(&c, r).await == 0).then_some(()),
        )
        .await;
    }
    for (i, r) in rs.iter().enumerate() {
        for p in 200..203u32 {
            let on = route(&c, r, p + i as u32 * 10, MODEL).await;
            assert!(WORKERS.contains(&on.as_str()), "{on}");
        }
    }
    let text = metrics_text(a.http_addr).await;
    assert!(
        text.contains(&format!(
            r#"warmpath_replica_sharing_up{{pool="{MODEL}"}} 0"#
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            r#"warmpath_replica_facts_total{{pool="{MODEL}",direction="received"}}"#
        )),
        "{text}"
    );
    for r in &rs {
        r.shutdown();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_that_share_decisions_place_a_new_prefix_on_one_backend() {
    run(true).await;
}

/// The same with `ingest.share_decisions: false` must fail (B never learns
/// what A placed): run by hand to see that the test above can fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "shows the failure without sharing; run with --ignored"]
async fn without_sharing_replicas_disagree() {
    run(false).await;
}

/// Whether `r` has nothing in flight and no prefill pending on any backend.
async fn idle(c: &reqwest::Client, r: &warmpath_router::RunningRouter) -> bool {
    let ws = workers(c, r).await;
    !ws.is_empty()
        && ws
            .iter()
            .all(|w| w["in_flight"] == 0 && w["pending_prefill_blocks"] == 0)
}

/// A router that shares no decisions (`ingest.share_decisions: false`)
/// breaks kv_aware's ties by the prefix key as its preview does, so
/// `/cache-index/query` tells the pick that follows. Two engines hold each
/// of ten prefixes whole (their agents say so) and the third none: each
/// prefix's first pick is a tie between two equally warm holders. (Before,
/// such a router drew those ties from a random rng: about half the previews
/// named the other holder.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_sharing_a_preview_tells_the_tie_broken_pick() {
    // Its own pool: the routers of the whole test binary share one metrics recorder.
    const TIES: &str = "ties";
    let dir = tempfile::tempdir().unwrap();
    let engines = vec![engine(TIES).await, engine(TIES).await, engine(TIES).await];
    let tok = dir.path().join("tokenizer");
    warmpath_core::tokenize::tiny::write_model_dir(&tok).unwrap();
    let r = replica(&engines, &tok, false, TIES).await;
    let flags = s(&["--router", &format!("http://{}", r.grpc_addr.unwrap())]);
    let pubs = vec![publisher().await, publisher().await];
    let _agents: Vec<Proc> = WORKERS[..2]
        .iter()
        .zip(&pubs)
        .map(|(w, p)| agent_of(dir.path(), w, TIES, p, &flags))
        .collect();
    let prefixes = 1..=10u32;
    for (i, p) in pubs.iter().enumerate() {
        for x in prefixes.clone() {
            let first = (i as u64 + 1) * 1_000_000 + u64::from(x) * 100;
            let toks = x * 1000..x * 1000 + 32;
            p.publish(vec![stored(first, None, toks, BS)])
                .await
                .unwrap();
        }
    }
    let idx = r.index(TIES).unwrap();
    let held = |w: &str| idx.worker_slot(w).map_or(0, |s| idx.block_count(s));
    wait_until(
        "both agents' blocks in the index",
        Duration::from_secs(30),
        &pubs.iter().collect::<Vec<_>>(),
        || held("w0") == 80 && held("w1") == 80,
    )
    .await;
    // Its agents' streams are up, but carry no decisions.
    let text = metrics_text(r.http_addr).await;
    let up = format!(r#"warmpath_replica_sharing_up{{pool="{TIES}"}} 0"#);
    assert!(text.contains(&up), "{text}");
    let c = reqwest::Client::new();
    let mut seen = std::collections::BTreeSet::new();
    for x in prefixes {
        let want = preview(&c, &r, x, TIES).await;
        let got = route(&c, &r, x, TIES).await;
        assert_eq!(got, want, "prefix {x}: the preview named another backend");
        seen.insert(got);
        poll::poll(
            "the request to end",
            Duration::from_secs(10),
            Duration::from_millis(5),
            async || idle(&c, &r).await.then_some(()),
        )
        .await;
    }
    // The ties went both ways: they were ties, broken per key.
    assert_eq!(seen.len(), 2, "{seen:?}");
    r.shutdown();
}

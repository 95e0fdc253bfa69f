//! The hot-path cost of decision sharing (issue 20, router replicas): the
//! router's added latency with `ingest.share_decisions` on and off, in one
//! alternating run, through real agents.
//!
//! Two simulated engines (time model 10,000x faster: the engine's own time
//! is its HTTP and tokenization work), a real agent per engine streaming to
//! four `warmpath-router` processes: two sharing decisions (each sends a
//! fact per phase to the chosen backend's agent and receives the other's),
//! two not. Each round sends the same kind of request (a ~1,100-token
//! shared system prompt, a question of its own, one output token, not
//! streamed) directly to an engine and through each router, in a shuffled
//! order, one at a time on one keep-alive client; a router's added latency
//! is its time minus the round's direct time. The medians of the two
//! groups and the median of paired differences (sharing − not) are
//! printed.
//!
//! A measurement, not a gate (`--ignored`): it asserts only that every
//! request was answered and that the sharing replicas did share (and the
//! others did not).
//!
//! ```text
//! cargo build -p warmpath-router
//! cargo test -p warmpath-bench --test bench share_cost:: -- --ignored --nocapture
//! ```
//! `WARMPATH_SHARE_ROUNDS` sets the rounds (default 400); `WARMPATH_SHARING`
//! how many of the four routers share (default 2; with 1, that router only
//! sends, since no other replica shares with it: the send side's cost alone).

use crate::poll;

use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use warmpath_agent::{Agent, AgentConfig};
use warmpath_bench::compare::replicas::{labelled_sum, RouterProcess, RouterProcesses};
use warmpath_bench::sim::{Fleet, SimConfig};
use warmpath_bench::timing::TimeModel;
use warmpath_core::tokenize::{tiny, ChatTokenizer};
use warmpath_core::Strategy;
use warmpath_router::config::{BackendConfig, PoolConfig, RouterConfig};

/// `target/debug/warmpath-router`, beside this test's `deps/` folder.
fn router_binary() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("warmpath-router");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p warmpath-router` first",
        bin.display()
    );
    bin
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

async fn timed(client: &reqwest::Client, url: &str, body: &Value) -> (f64, Option<String>) {
    let t0 = Instant::now();
    let resp = client.post(url).json(body).send().await.unwrap();
    assert!(resp.status().is_success(), "{url}: {}", resp.status());
    let backend = resp
        .headers()
        .get("x-warmpath-backend")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    resp.bytes().await.unwrap();
    (t0.elapsed().as_secs_f64() * 1e3, backend)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn decision_sharing_hot_path_cost() {
    let rounds: usize = std::env::var("WARMPATH_SHARE_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let on_n: usize = std::env::var("WARMPATH_SHARING")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
        .clamp(1, 3);
    let bin = router_binary();
    let shutdown = CancellationToken::new();
    let dir = std::env::temp_dir().join(format!("warmpath-share-cost-{}", std::process::id()));
    tiny::write_model_dir(&dir).unwrap();
    let sim = SimConfig {
        time: TimeModel::default().scaled(10_000.0),
        cache_blocks: 4096,
        ..Default::default()
    };
    let tokenizer = Arc::new(ChatTokenizer::load(&dir).unwrap());
    let fleet = Fleet::start(2, &sim, tokenizer, shutdown.clone())
        .await
        .unwrap();
    let mut pool = PoolConfig::new(sim.model.clone());
    pool.strategy = Some(Strategy::KvAware);
    pool.tokenizer = Some(dir.clone());
    pool.block_size = sim.block_size;
    for i in &fleet.instances {
        let mut b = BackendConfig::new(i.url.clone());
        b.worker_id = Some(i.id.clone());
        pool.backends.push(b);
    }
    let mut config = RouterConfig {
        pools: vec![pool],
        ..Default::default()
    };
    let limit = Duration::from_secs(60);
    let sharing = RouterProcesses::start(on_n, &bin, &config, &dir, limit)
        .await
        .unwrap();
    config.ingest.share_decisions = false;
    let solo_dir = dir.join("solo");
    std::fs::create_dir_all(&solo_dir).unwrap();
    let solo = RouterProcesses::start(4 - on_n, &bin, &config, &solo_dir, limit)
        .await
        .unwrap();
    let routers: Vec<_> = sharing.replicas.iter().chain(&solo.replicas).collect();
    let mut agents = Vec::new();
    for i in &fleet.instances {
        let mut cfg = AgentConfig::new(&i.id, &sim.model, &i.url, &i.kv_events);
        cfg.kv_replay = i.kv_replay.clone();
        cfg.routers = routers.iter().map(|r| r.grpc.clone()).collect();
        agents.push(Agent::start(cfg, None).await.unwrap());
    }
    let client = reqwest::Client::new();
    for r in &routers {
        poll::poll(
            "every agent to connect to every router",
            Duration::from_secs(60),
            Duration::from_millis(50),
            async || {
                let v: Value = client
                    .get(format!("{}/cache-index", r.http))
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                let up = v["pools"][0]["workers"]
                    .as_array()?
                    .iter()
                    .filter(|w| w["agent"]["connected"] == true)
                    .count();
                (up == fleet.instances.len()).then_some(())
            },
        )
        .await;
    }
    let system: String = (0..100)
        .map(|k| format!("Line {k} of the shared manual covers topic {}. ", k % 13))
        .collect();
    let body = |q: usize| {
        json!({
            "model": sim.model,
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": format!("Question number {q}: what does line {} say?", q % 100)},
            ],
            "max_tokens": 1,
            "stream": false,
        })
    };
    let by_id: std::collections::HashMap<&str, &str> = fleet
        .instances
        .iter()
        .map(|i| (i.id.as_str(), i.url.as_str()))
        .collect();
    // Warm-up: the prompt lands on one backend, every connection is open.
    let mut direct_url = fleet.instances[0].url.clone();
    for q in 0..20 {
        for r in &routers {
            let url = format!("{}/v1/chat/completions", r.http);
            if let (_, Some(b)) = timed(&client, &url, &body(q)).await {
                direct_url = by_id[b.as_str()].to_owned();
            }
        }
    }
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    // Targets: 0 direct, 1..=4 the routers (the first `on_n` sharing).
    let mut added: [Vec<f64>; 4] = Default::default();
    let mut direct = Vec::with_capacity(rounds);
    for q in 0..rounds {
        let mut order = [0usize, 1, 2, 3, 4];
        order.shuffle(&mut rng);
        let mut t = [0.0f64; 5];
        let b = body(1000 + q);
        for &k in &order {
            let url = match k {
                0 => format!("{direct_url}/v1/chat/completions"),
                k => format!("{}/v1/chat/completions", routers[k - 1].http),
            };
            t[k] = timed(&client, &url, &b).await.0;
        }
        direct.push(t[0]);
        for k in 0..4 {
            added[k].push(t[k + 1] - t[0]);
        }
    }
    let on: Vec<f64> = added[..on_n].iter().flatten().copied().collect();
    let off: Vec<f64> = added[on_n..].iter().flatten().copied().collect();
    let mean = |v: &[Vec<f64>], q: usize| v.iter().map(|a| a[q]).sum::<f64>() / v.len() as f64;
    let mut paired: Vec<f64> = (0..rounds)
        .map(|q| mean(&added[..on_n], q) - mean(&added[on_n..], q))
        .collect();
    let (mut on2, mut off2) = (on.clone(), off.clone());
    println!(
        "decision sharing, {rounds} rounds, {on_n} of 4 routers sharing, added latency ms: sharing p50 {:.3} p99 {:.3}; not sharing p50 {:.3} p99 {:.3}; paired (sharing - not) median {:.3}, p10 {:.3}, p90 {:.3}; direct p50 {:.3}",
        median(&mut on.clone()),
        pct(&mut on2, 0.99),
        median(&mut off.clone()),
        pct(&mut off2, 0.99),
        median(&mut paired),
        pct(&mut paired, 0.1),
        pct(&mut paired, 0.9),
        median(&mut direct),
    );
    // The sharing pair did share, the other did not.
    let facts = async |r: &RouterProcess| {
        let url = format!("{}/metrics", r.http);
        let text = client.get(url).send().await.unwrap().text().await.unwrap();
        let name = "warmpath_replica_facts_total";
        (
            labelled_sum(&text, name, "direction=\"sent\""),
            labelled_sum(&text, name, "direction=\"received\""),
        )
    };
    for (k, r) in routers.iter().enumerate() {
        let (sent, received) = facts(r).await;
        println!("router {k}: facts sent {sent}, received {received}");
        if k < on_n {
            assert!(sent > rounds as f64, "{k}");
            assert_eq!(received > 0.0, on_n > 1, "{k}");
        } else {
            assert_eq!((sent, received), (0.0, 0.0), "{k}");
        }
    }
    for a in agents {
        a.shutdown().await;
    }
    sharing.shutdown().await;
    solo.shutdown().await;
    shutdown.cancel();
    let _ = std::fs::remove_dir_all(&dir);
}

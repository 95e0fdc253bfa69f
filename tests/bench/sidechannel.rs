//! The cache-timing side channel across tenants (issue 17 item 8), end to
//! end on the real binaries, all on 127.0.0.1 port 0: one `warmpath-bench
//! sim` process with two simulated vLLM engines (TTFT from cached vs
//! computed prefill, `cached_tokens` in `usage`, real KV events over ZMQ),
//! a `warmpath-agent` process per engine and the `warmpath-router` binary,
//! the pool in `tenants: {from: api_key}` with the default `isolation:
//! engine`.
//!
//! Tenant A warms a document; tenant B, with its own key, then asks for A's
//! exact prompt. B must see no warmth signal: the decision is not
//! `kv_match` (A's entries are in the index), `cached_tokens` is 0, the
//! query endpoint refuses B naming A, and B's TTFT for A's warm prompt
//! equals B's TTFT for a cold one within noise over 50 paired trials. So
//! that the test can fail, A's own repeat of its prompt must be clearly
//! faster (kv_match, cached tokens): the channel is there to be seen.
//! `isolation: route_only` gives exactly this up (README, Tenants).
//!
//! The check cannot flake on a busy machine: it compares medians of paired
//! differences (B warm-for-A minus B cold, in alternating order, so drift
//! cancels) with half the gap the sim's own time model predicts between a
//! cold and a warm prefill of these prompts (about 170 ms for their ~1800
//! tokens, the sim 4x slower than its default model), while A's warm
//! repeat must beat B's cold by that half.
//!
//! The router and agent binaries are another package's: `cargo test
//! --workspace` builds them (their packages' own tests need them) before any
//! test runs, and this test finds them beside its own executable, as
//! `soak.rs` does; run alone, it needs `cargo build -p warmpath-router -p
//! warmpath-agent` first.

use crate::poll;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use warmpath_bench::timing::TimeModel;
use warmpath_core::tokenize::tiny;

const TRIALS: usize = 50;
const KEY_A: &str = "Bearer sk-tenant-a";
const KEY_B: &str = "Bearer sk-tenant-b";
/// The sim's served model and block size (its defaults).
const MODEL: &str = "warmpath-tiny";
const BLOCK_SIZE: usize = 16;
/// 4x slower than the default model: a cold/warm prefill gap of about
/// 170 ms for these ~1800-token prompts, well above scheduling noise.
const TIME_SCALE: f64 = 0.25;

struct Stack {
    router: String,
    time: TimeModel,
    // Killed on drop, router first.
    _router: Child,
    _agents: Vec<Child>,
    _sim: Child,
    dir: PathBuf,
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `target/debug/NAME`, beside this test's `deps/` folder.
fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let bin = exe.parent().and_then(Path::parent).unwrap().join(name);
    assert!(
        bin.exists(),
        "{} is missing: `cargo test --workspace` builds it; alone, run `cargo build -p warmpath-router -p warmpath-agent` first",
        bin.display()
    );
    bin
}

/// One engine of the sim: (worker id, http url, kv-events, replay).
type Engine = (String, String, String, String);

/// `warmpath-bench sim` with two instances; returns it and its engines
/// from the lines it prints (`  ID  http URL  kv-events EP  replay EP`).
async fn sim(model_dir: &Path) -> (Child, Vec<Engine>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_warmpath-bench"))
        .args(["sim", "--instances", "2"])
        .args(["--time-scale", &TIME_SCALE.to_string()])
        .arg("--tokenizer")
        .arg(model_dir)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut engines = Vec::new();
    while engines.len() < 2 {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the sim printed no engines within 30 s")
            .unwrap()
            .expect("the sim exited before listing its engines");
        let w: Vec<&str> = line.split_whitespace().collect();
        if let [id, "http", url, "kv-events", events, "replay", replay] = w[..] {
            engines.push((id.into(), url.into(), events.into(), replay.into()));
        }
    }
    // Keep reading so the sim never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, engines)
}

/// The router binary over `engines`; returns it, its HTTP and gRPC URLs.
async fn router(dir: &Path, engines: &[Engine], isolation: &str) -> (Child, String, String) {
    let mut backends = String::new();
    for (id, url, ..) in engines {
        backends += &format!("      - {{url: '{url}', worker_id: '{id}'}}\n");
    }
    let yaml = format!(
        "listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\npools:\n  - model: {MODEL}\n    strategy: kv_aware\n    tokenizer: {}\n    block_size: {BLOCK_SIZE}\n    tenants: {{from: api_key, isolation: {isolation}}}\n    backends:\n{backends}",
        dir.display()
    );
    let config = dir.join("router.yaml");
    std::fs::write(&config, yaml).unwrap();
    let mut child = Command::new(binary("warmpath-router"))
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("router.log")).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = async || {
        tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("the router did not start within 30 s")
            .unwrap()
            .expect("the router exited before listening (see router.log)")
    };
    let http = next().await.replace("listening on ", "");
    let grpc = next().await.replace("grpc listening on ", "");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, http, grpc)
}

fn agent(engine: &Engine, grpc: &str) -> Child {
    let (id, url, events, replay) = engine;
    Command::new(binary("warmpath-agent"))
        .args(["--worker-id", id, "--model", MODEL, "--engine-url", url])
        .args(["--kv-events", events, "--kv-replay", replay])
        .args(["--router", grpc, "--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

async fn stack(isolation: &str) -> Stack {
    let dir = std::env::temp_dir().join(format!(
        "warmpath-sidechannel-{}-{isolation}",
        std::process::id()
    ));
    tiny::write_model_dir(&dir).unwrap();
    let (sim, engines) = sim(&dir).await;
    let (router, http, grpc) = router(&dir, &engines, isolation).await;
    let agents = engines.iter().map(|e| agent(e, &grpc)).collect();
    // Both agents' streams are up before the first trial.
    let c = reqwest::Client::new();
    poll::poll(
        "both agents to connect to the router",
        Duration::from_secs(30),
        Duration::from_millis(20),
        async || {
            let v: Value = c
                .get(format!("{http}/cache-index"))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            let workers = v["pools"][0]["workers"].as_array()?;
            let up = workers
                .iter()
                .filter(|w| w["agent"]["connected"] == true)
                .count();
            (up == engines.len()).then_some(())
        },
    )
    .await;
    Stack {
        router: http,
        time: TimeModel::default().scaled(TIME_SCALE),
        _router: router,
        _agents: agents,
        _sim: sim,
        dir,
    }
}

/// A long document prompt of its own, max 1 token: `tag` makes its first
/// block unique; the rest is the same text for every tag, so prompts of
/// equal-length tags cost the same prefill when cold.
fn prompt(model: &str, tag: &str) -> Value {
    let doc = format!("[{tag}] {}", tiny::corpus_slice(0, 14_000));
    json!({"model": model, "max_tokens": 1, "messages": [
        {"role": "system", "content": doc},
        {"role": "user", "content": "summarise it"},
    ]})
}

struct Sent {
    ms: f64,
    decision: String,
    prompt_tokens: u64,
    cached: u64,
}

async fn send(c: &reqwest::Client, s: &Stack, key: &str, body: &Value) -> Sent {
    let started = Instant::now();
    let resp = c
        .post(format!("{}/v1/chat/completions", s.router))
        .header("authorization", key)
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let decision = resp.headers()["x-warmpath-decision"]
        .to_str()
        .unwrap()
        .to_owned();
    let v: Value = resp.json().await.unwrap();
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let usage = &v["usage"];
    Sent {
        ms,
        decision,
        prompt_tokens: usage["prompt_tokens"].as_u64().unwrap(),
        cached: usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0),
    }
}

async fn query(
    c: &reqwest::Client,
    s: &Stack,
    headers: &[(&str, &str)],
    body: &Value,
) -> (u16, Value) {
    let mut req = c.post(format!("{}/cache-index/query", s.router)).json(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    (resp.status().as_u16(), resp.json().await.unwrap())
}

/// The most blocks any worker holds of `body`'s chain, as `key` sees it.
async fn matched(c: &reqwest::Client, s: &Stack, key: &str, body: &Value) -> u64 {
    let (status, v) = query(c, s, &[("authorization", key)], body).await;
    assert_eq!(status, 200, "{v}");
    v["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["matched_blocks"].as_u64().unwrap())
        .max()
        .unwrap()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_sees_no_warmth_of_a_tenants_prompt() {
    let s = stack("engine").await;
    let c = reqwest::Client::new();
    let model = MODEL.to_owned();
    let tenant_a = warmpath_core::TenantId::from_api_key("sk-tenant-a");
    let name_a = ("x-warmpath-tenant", tenant_a.as_str());
    // Per trial: B's gap (A's warm prompt minus a cold one), and B's cold
    // minus A's own warm repeat.
    let (mut gap_b, mut gap_a, mut predicted) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..TRIALS {
        let doc = prompt(&model, &format!("a-{i:03}"));
        let first = send(&c, &s, KEY_A, &doc).await;
        assert_eq!(first.cached, 0, "trial {i}: a new document is cold");
        if i == 0 {
            println!("prompt tokens {}", first.prompt_tokens);
        }
        // A's blocks reach the index through the sim's KV events and the agent.
        let what = format!("trial {i}: A's blocks in the index");
        poll::poll(
            &what,
            Duration::from_secs(20),
            Duration::from_millis(5),
            async || (matched(&c, &s, KEY_A, &doc).await > 0).then_some(()),
        )
        .await;
        // B's view: none of it, and naming A is refused.
        assert_eq!(matched(&c, &s, KEY_B, &doc).await, 0, "trial {i}");
        let (status, e) = query(&c, &s, &[("authorization", KEY_B), name_a], &doc).await;
        assert_eq!(status, 403, "trial {i}: B named A: {e}");
        assert_eq!(e["error"]["code"], "tenant_not_allowed");
        let (status, _) = query(
            &c,
            &s,
            &[
                ("authorization", KEY_B),
                ("x-prefix-aware-id", tenant_a.as_str()),
            ],
            &doc,
        )
        .await;
        assert_eq!(status, 200);
        // B asks for A's exact prompt, and for a cold one, in turn.
        let cold = prompt(&model, &format!("b-{i:03}"));
        let (warm_b, cold_b) = if i % 2 == 0 {
            let w = send(&c, &s, KEY_B, &doc).await;
            (w, send(&c, &s, KEY_B, &cold).await)
        } else {
            let k = send(&c, &s, KEY_B, &cold).await;
            (send(&c, &s, KEY_B, &doc).await, k)
        };
        assert_eq!(warm_b.prompt_tokens, cold_b.prompt_tokens, "trial {i}");
        for (what, r) in [("A's prompt", &warm_b), ("a cold prompt", &cold_b)] {
            assert_ne!(r.decision, "kv_match", "trial {i}: B asking for {what}");
            assert_eq!(r.cached, 0, "trial {i}: B asking for {what}");
        }
        // A's own repeat is warm: the signal B must not see.
        let again = send(&c, &s, KEY_A, &doc).await;
        assert_eq!(again.decision, "kv_match", "trial {i}");
        assert!(again.cached > 0, "trial {i}");
        gap_b.push(warm_b.ms - cold_b.ms);
        gap_a.push(cold_b.ms - again.ms);
        let t = &s.time;
        let uncached = (again.prompt_tokens - again.cached) as usize;
        predicted.push(t.prefill_ms(cold_b.prompt_tokens as usize) - t.prefill_ms(uncached));
    }
    let bound = median(predicted) / 2.0;
    let (gb, ga) = (median(gap_b), median(gap_a));
    println!("median B warm-for-A minus cold {gb:.1} ms, cold minus A's warm {ga:.1} ms, bound {bound:.1} ms");
    assert!(
        bound > 20.0,
        "the sim's cold/warm gap is too small to test: {bound}"
    );
    assert!(
        ga > bound,
        "A's warm repeat is not clearly faster ({ga:.1} <= {bound:.1} ms)"
    );
    assert!(
        gb.abs() < bound,
        "B sees A's warmth in TTFT ({gb:.1} ms, bound {bound:.1})"
    );
}

/// The contrast: `isolation: route_only` shares the engine cache across
/// tenants, so the same probe does see A's warmth (the decision, the cached
/// tokens and TTFT): the mode trades the isolation above away, and the
/// probe above is one that would see a channel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_only_shows_a_tenants_warmth_to_another() {
    let s = stack("route_only").await;
    let c = reqwest::Client::new();
    let model = MODEL.to_owned();
    let (mut gap, mut predicted) = (Vec::new(), Vec::new());
    for i in 0..20 {
        let doc = prompt(&model, &format!("a-{i:03}"));
        send(&c, &s, KEY_A, &doc).await;
        let what = format!("trial {i}: A's blocks in the index");
        poll::poll(
            &what,
            Duration::from_secs(20),
            Duration::from_millis(5),
            async || (matched(&c, &s, KEY_B, &doc).await > 0).then_some(()),
        )
        .await;
        let cold = prompt(&model, &format!("b-{i:03}"));
        let warm_b = send(&c, &s, KEY_B, &doc).await;
        let cold_b = send(&c, &s, KEY_B, &cold).await;
        assert_eq!(warm_b.decision, "kv_match", "trial {i}");
        assert!(warm_b.cached > 0, "trial {i}");
        gap.push(cold_b.ms - warm_b.ms);
        let t = &s.time;
        let uncached = (warm_b.prompt_tokens - warm_b.cached) as usize;
        predicted.push(t.prefill_ms(cold_b.prompt_tokens as usize) - t.prefill_ms(uncached));
    }
    let (g, bound) = (median(gap), median(predicted) / 2.0);
    println!("route_only: median B cold minus B on A's prompt {g:.1} ms, bound {bound:.1} ms");
    assert!(
        g > bound,
        "route_only: B did not see A's warmth ({g:.1} <= {bound:.1} ms)"
    );
}

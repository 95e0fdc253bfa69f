//! A bounded soak of the real router binary over simulated engines (issue 16),
//! behind `--ignored`:
//!
//! ```text
//! cargo build -p warmpath-router
//! WARMPATH_SOAK_SECS=600 cargo test -p warmpath-bench --test bench soak:: -- --ignored --nocapture
//! ```
//!
//! Four `warmpath-bench sim` processes (one instance each, the time model
//! 10x slower so two CPUs keep up) behind the real `warmpath-router` binary
//! (`prefix_aware`, upstream timeouts of 3 s, completion probes), all on
//! 127.0.0.1 port 0. An open-loop client sends non-streamed chats at 80% of
//! the capacity of the engines still serving; at 1/3 of the run one engine is
//! killed (SIGKILL), at 2/3 another is made to hang (SIGSTOP: the kernel still
//! accepts its connections, nothing answers, `/health` included).
//!
//! Capacity is derived from the sim's time model: prefill is one FIFO queue
//! per engine, so an engine serves at most `1000 / prefill_ms(prompt)`
//! requests a second with the whole prompt uncached (shared system prompts
//! make real prefills shorter, so 80% of this is an upper bound); decode
//! (`max_batch` 64 overlapping) is far from limiting.
//!
//! What the router guarantees, and the test asserts:
//! - a failure is an answer tagged with the killed or the hung backend
//!   (`x-warmpath-backend`): the router never fails a request on a healthy one;
//! - such a failure started before that backend was seen ejected
//!   (`warmpath_backend_healthy` 0 in `/metrics`, sampled every second, so
//!   one second of slack) and at most one first-byte timeout before the fault:
//!   requests in flight at the fault, or routed there in the ejection window;
//! - both faulty backends are ejected within 15 s of their fault, and every
//!   request started after that succeeds;
//! - the router's RSS at the end is within 30 MiB of its first minute's
//!   maximum.

use crate::poll;

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinSet;
use warmpath_bench::timing::TimeModel;

/// The sims run the default time model this many times faster (0.1: slower).
const TIME_SCALE: f64 = 0.1;
const ENGINES: usize = 4;
const MAX_TOKENS: u32 = 4;
const FIRST_BYTE_MS: u64 = 3000;
const KILLED: usize = 1;
const HUNG: usize = 2;

/// One `warmpath-bench sim --instances 1` process.
struct Sim {
    child: Child,
    url: String,
}

impl Sim {
    async fn spawn() -> Sim {
        let mut child = Command::new(env!("CARGO_BIN_EXE_warmpath-bench"))
            .args(["sim", "--instances", "1", "--no-replay"])
            .args(["--time-scale", &TIME_SCALE.to_string()])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let url = poll::poll(
            "a sim's http line",
            Duration::from_secs(30),
            Duration::ZERO,
            async || {
                let line = lines.next_line().await.unwrap().expect("sim exited");
                let mut words = line.split_whitespace();
                words.find(|w| *w == "http")?;
                words.next().map(str::to_owned)
            },
        )
        .await;
        // Keep reading so the sim never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Sim { child, url }
    }

    fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {pid} failed");
}

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

fn router_yaml(model_dir: &Path, sims: &[Sim]) -> String {
    let mut backends = String::new();
    for (i, s) in sims.iter().enumerate() {
        backends += &format!("      - url: {}\n        worker_id: e{i}\n", s.url);
    }
    format!(
        "listen: 127.0.0.1:0
upstream:
  first_byte_timeout_ms: {FIRST_BYTE_MS}
health:
  eject_after: 3
  probe: completion
  probe_interval_ms: 1000
pools:
  - model: warmpath-tiny
    strategy: prefix_aware
    tokenizer: {}
    block_size: 16
    backends:
{backends}",
        model_dir.display()
    )
}

struct Router {
    child: Child,
    url: String,
}

async fn spawn_router(config: &Path, log: &Path) -> Router {
    let mut child = Command::new(router_binary())
        .args(["--config", &config.display().to_string()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("router did not start within 30 s")
        .unwrap()
        .expect("router exited before listening");
    let url = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Router { child, url }
}

/// RSS of `pid` in KiB (`VmRSS` of `/proc/PID/status`).
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// `warmpath_backend_healthy` of `backend` in Prometheus text.
fn healthy(metrics: &str, backend: &str) -> Option<f64> {
    let label = format!("backend=\"{backend}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with("warmpath_backend_healthy{") && l.contains(&label))
        .find_map(|l| l.rsplit(' ').next()?.trim().parse().ok())
}

/// Sixteen shared system prompts of about 100 tokens, so `prefix_aware` has
/// prefixes to keep together.
fn chat(n: u64) -> Value {
    let doc = n % 16;
    let system: String = (0..40).map(|w| format!("doc{doc} word{w} ")).collect();
    json!({
        "model": "warmpath-tiny",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": format!("question {n}")}
        ],
        "max_tokens": MAX_TOKENS
    })
}

/// One request's outcome, times from the start of the run.
#[derive(Debug)]
struct Rec {
    start: Duration,
    latency: Duration,
    /// HTTP status, or `None` for a client-side error (no answer in 20 s).
    status: Option<u16>,
    backend: String,
    /// The client's error, or the error body.
    error: String,
}

async fn send(client: reqwest::Client, url: String, n: u64, t0: Instant) -> Rec {
    let start = t0.elapsed();
    let sent = Instant::now();
    let res = client.post(&url).json(&chat(n)).send().await;
    let (status, backend, error) = match res {
        Err(e) => (None, String::new(), e.to_string()),
        Ok(resp) => {
            let status = resp.status().as_u16();
            let backend = resp
                .headers()
                .get("x-warmpath-backend")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned();
            match resp.bytes().await {
                Ok(_) if status == 200 => (Some(status), backend, String::new()),
                Ok(body) => (
                    Some(status),
                    backend,
                    String::from_utf8_lossy(&body).into_owned(),
                ),
                Err(e) => (None, backend, format!("body: {e}")),
            }
        }
    };
    Rec {
        start,
        latency: sent.elapsed(),
        status,
        backend,
        error,
    }
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak: minutes long; run with --ignored (WARMPATH_SOAK_SECS, default 600)"]
async fn soak_with_a_killed_and_a_hung_engine() {
    let secs: u64 = std::env::var("WARMPATH_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(600);
    let total = Duration::from_secs(secs);
    let dir = std::env::temp_dir().join(format!("warmpath-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model_dir = dir.join("tokenizer");
    warmpath_core::tokenize::tiny::write_model_dir(&model_dir).unwrap();

    let mut sims = Vec::new();
    for _ in 0..ENGINES {
        sims.push(Sim::spawn().await);
    }
    let config = dir.join("router.yaml");
    std::fs::write(&config, router_yaml(&model_dir, &sims)).unwrap();
    let router = spawn_router(&config, &dir.join("router.log")).await;
    let router_pid = router.child.id().unwrap();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap();
    let readyz = format!("{}/readyz", router.url);
    poll::poll(
        "router ready",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let r = client.get(&readyz).send().await.ok()?;
            r.status().is_success().then_some(())
        },
    )
    .await;

    // Capacity from the time model and the prompt's real length.
    let chat_url = format!("{}/v1/chat/completions", router.url);
    let warm: Value = client
        .post(&chat_url)
        .json(&chat(0))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let prompt = warm["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    let time = TimeModel::default().scaled(TIME_SCALE);
    let per_engine = 1000.0 / time.prefill_ms(prompt);
    let decode_bound = f64::from(time.max_batch) * 1000.0 / time.decode_ms(MAX_TOKENS).max(1.0);
    assert!(decode_bound > 4.0 * per_engine, "decode would limit first");
    let rate = |live: usize| 0.8 * per_engine * live as f64;
    println!(
        "soak: {secs} s, {ENGINES} engines, prompt {prompt} tokens, capacity {per_engine:.2} req/s per engine, \
         rate {:.1}/{:.1}/{:.1} req/s with 4/3/2 engines serving",
        rate(4),
        rate(3),
        rate(2)
    );

    let metrics_url = format!("{}/metrics", router.url);
    let t0 = Instant::now();
    let (kill_at, hang_at) = (total / 3, total * 2 / 3);
    let (mut killed, mut hung): (Option<Duration>, Option<Duration>) = (None, None);
    let (mut eject_killed, mut eject_hung): (Option<Duration>, Option<Duration>) = (None, None);
    let mut rss: Vec<(Duration, u64)> = Vec::new();
    let mut recs: Vec<Rec> = Vec::new();
    let mut inflight = JoinSet::new();
    let mut sample = tokio::time::interval(Duration::from_secs(1));
    let mut next = tokio::time::Instant::now();
    let mut n: u64 = 1;
    while t0.elapsed() < total {
        let live = ENGINES - usize::from(killed.is_some()) - usize::from(hung.is_some());
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {
                inflight.spawn(send(client.clone(), chat_url.clone(), n, t0));
                n += 1;
                // Open loop: the schedule does not wait for answers.
                next += Duration::from_secs_f64(1.0 / rate(live));
            }
            Some(r) = inflight.join_next() => recs.push(r.unwrap()),
            _ = sample.tick() => {
                let now = t0.elapsed();
                rss.push((now, rss_kib(router_pid)));
                if killed.is_none() && now >= kill_at {
                    signal(sims[KILLED].pid(), "KILL");
                    killed = Some(t0.elapsed());
                }
                if hung.is_none() && now >= hang_at {
                    signal(sims[HUNG].pid(), "STOP");
                    hung = Some(t0.elapsed());
                }
                let text = match client.get(&metrics_url).timeout(Duration::from_secs(1)).send().await {
                    Ok(r) => r.text().await.unwrap_or_default(),
                    Err(_) => String::new(),
                };
                {
                    if killed.is_some() && eject_killed.is_none()
                        && healthy(&text, &format!("e{KILLED}")) == Some(0.0) {
                        eject_killed = Some(t0.elapsed());
                    }
                    if hung.is_some() && eject_hung.is_none()
                        && healthy(&text, &format!("e{HUNG}")) == Some(0.0) {
                        eject_hung = Some(t0.elapsed());
                    }
                }
            }
        }
    }
    // Answers still in flight: each has the client's 20 s deadline.
    while let Some(r) = inflight.join_next().await {
        recs.push(r.unwrap());
    }
    rss.push((t0.elapsed(), rss_kib(router_pid)));
    signal(sims[HUNG].pid(), "CONT");

    // Report.
    let ms = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64() * 1e3);
    let ok: Vec<&Rec> = recs.iter().filter(|r| r.status == Some(200)).collect();
    let failed: Vec<&Rec> = recs.iter().filter(|r| r.status != Some(200)).collect();
    let mut lat: Vec<Duration> = ok.iter().map(|r| r.latency).collect();
    lat.sort();
    let first_min = Duration::from_secs(60).min(total / 3);
    let first_max = rss
        .iter()
        .filter(|(t, _)| *t <= first_min)
        .map(|(_, k)| *k)
        .max()
        .unwrap();
    let (rss_start, rss_end) = (rss[0].1, rss[rss.len() - 1].1);
    let rss_max = rss.iter().map(|(_, k)| *k).max().unwrap();
    let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
    for r in &failed {
        let kind = format!(
            "{} on {}",
            r.status
                .map_or("client error".to_owned(), |s| s.to_string()),
            if r.backend.is_empty() {
                "-"
            } else {
                &r.backend
            }
        );
        *kinds.entry(kind).or_default() += 1;
    }
    println!(
        "soak: {} requests, {} ok, {} failed {kinds:?}",
        recs.len(),
        ok.len(),
        failed.len()
    );
    println!(
        "soak: kill at {:.0} ms, ejected at {:.0} ms; hang at {:.0} ms, ejected at {:.0} ms",
        ms(killed),
        ms(eject_killed),
        ms(hung),
        ms(eject_hung)
    );
    println!(
        "soak: client latency of successes p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        pct(&lat, 1.0)
    );
    println!(
        "soak: router RSS start {} KiB, first-minute max {first_max} KiB, max {rss_max} KiB, end {rss_end} KiB ({} samples)",
        rss_start,
        rss.len()
    );
    for r in failed.iter().take(5) {
        println!(
            "soak: failure at {:?} after {:?}: {:?} on {:?}: {}",
            r.start, r.latency, r.status, r.backend, r.error
        );
    }

    // Assertions.
    let (killed, hung) = (killed.unwrap(), hung.unwrap());
    let eject_killed = eject_killed.expect("the killed engine was never ejected");
    let eject_hung = eject_hung.expect("the hung engine was never ejected");
    assert!(eject_killed - killed < Duration::from_secs(15));
    assert!(eject_hung - hung < Duration::from_secs(15));
    let slack = Duration::from_secs(1);
    let before = Duration::from_millis(FIRST_BYTE_MS + 500);
    for r in &failed {
        let (fault, ejected) = match r.backend.as_str() {
            b if b == format!("e{KILLED}") => (killed, eject_killed),
            b if b == format!("e{HUNG}") => (hung, eject_hung),
            _ => panic!("a failure not on a faulty backend: {r:?}"),
        };
        assert!(
            r.start + before >= fault && r.start <= ejected + slack,
            "a failure outside its backend's ejection window \
             ({fault:?}..{ejected:?}): {r:?}"
        );
    }
    let after = eject_hung.max(eject_killed) + slack;
    let late = failed.iter().filter(|r| r.start > after).count();
    assert_eq!(late, 0, "failures after both ejections");
    assert!(
        rss_end <= first_max + 30 * 1024,
        "router RSS grew: end {rss_end} KiB, first-minute max {first_max} KiB"
    );
    drop(router);
    drop(sims);
    let _ = std::fs::remove_dir_all(&dir);
}

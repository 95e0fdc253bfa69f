//! End-to-end tests of live pool membership on the real `warmpath-router`
//! binary: the admin API adds, removes and drains backends under load, and
//! SIGHUP applies backend additions and removals; under kv_aware, warm
//! prefixes stay where they are cached through an add and a drain, and the
//! policy keeps its placements (raw agent streams fill the index). Everything
//! on 127.0.0.1.

use crate::{raw_agent, support};

use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;

/// Percent-encodes a worker id for a path segment.
fn seg(id: &str) -> String {
    id.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Where a router listens.
trait Listening {
    fn url(&self, path: &str) -> String;
}

impl Listening for RouterProcess {
    fn url(&self, path: &str) -> String {
        RouterProcess::url(self, path)
    }
}

struct Url(std::net::SocketAddr);

impl Listening for Url {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.0)
    }
}

/// The router binary with its log (RUST_LOG=info, no colours) in `log`.
async fn spawn_logged(
    args: &[&str],
    log: &std::path::Path,
) -> (tokio::process::Child, std::net::SocketAddr) {
    let err = std::fs::File::create(log).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_warmpath-router"))
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let addr = support::listen_addr(&mut child).await;
    (child, addr)
}

async fn members(c: &TestClient, r: &impl Listening) -> Vec<Value> {
    let v = get_url(c, &r.url("/admin/pools/m/backends")).await;
    assert_eq!(v.status, 200, "{:?}", v.body);
    v.json()["backends"].as_array().unwrap().clone()
}

fn ids(members: &[Value]) -> Vec<String> {
    members
        .iter()
        .map(|m| m["worker_id"].as_str().unwrap().to_owned())
        .collect()
}

/// Clients sending completions back to back until stopped; counts answers
/// that were not 200.
struct Load {
    stop: Arc<AtomicBool>,
    failed: Arc<AtomicU32>,
    sent: Arc<AtomicU32>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(r: &RouterProcess, clients: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(AtomicU32::new(0));
        let sent = Arc::new(AtomicU32::new(0));
        let tasks = (0..clients)
            .map(|i| {
                let (stop, failed, sent) = (stop.clone(), failed.clone(), sent.clone());
                let url = r.url("/v1/completions");
                tokio::spawn(async move {
                    let c = client();
                    let mut n = 0u32;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let body = json!({"model": "m", "prompt": format!("client {i} request {n}"),
                                          "x_hold_ms": 5});
                        let reply = post(&c, &url, &body, &[]).await;
                        sent.fetch_add(1, Ordering::Relaxed);
                        if reply.status != 200 {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            failed,
            sent,
            tasks,
        }
    }

    async fn stop(self) -> (u32, u32) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
        (
            self.sent.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_are_added_removed_and_drained_under_load() {
    let bs = backends(3).await;
    let r = router(&bs[..2], &["--strategy", "least_outstanding"]).await;
    let c = client();
    assert_eq!(ids(&members(&c, &r).await), [bs[0].url(), bs[1].url()]);
    let load = Load::start(&r, 4);
    eventually("load reaches both backends", || {
        bs[0].count() > 0 && bs[1].count() > 0
    })
    .await;

    // Add b2 under load: it takes traffic.
    let added_at = Instant::now();
    let add = post(
        &c,
        &r.url("/admin/pools/m/backends"),
        &json!({"url": bs[2].url(), "worker_id": "b2"}),
        &[],
    )
    .await;
    assert_eq!(add.status, 201, "{:?}", add.body);
    assert_eq!(add.json()["origin"], "admin");
    assert_eq!(add.json()["verified"], true, "probed once before answering");
    eventually("the new backend takes requests", || {
        bs[2].requests().iter().any(|q| q.path == "/v1/completions")
    })
    .await;
    let first_request = added_at.elapsed();
    println!("NUMBER new backend first request after {first_request:?} (POST to its first proxied request)");
    let dup = post(
        &c,
        &r.url("/admin/pools/m/backends"),
        &json!({"url": bs[2].url(), "worker_id": "b2"}),
        &[],
    )
    .await;
    assert_eq!(dup.error(409)["code"], "duplicate_worker_id");

    // Remove b0 under load: no request fails.
    let del = send(
        &c,
        request(
            "DELETE",
            &r.url(&format!("/admin/pools/m/backends/{}", seg(&bs[0].url()))),
            "",
            &[],
        ),
    )
    .await;
    assert_eq!(del.status, 200, "{:?}", del.body);
    let b0_after_removal = bs[0].count();
    let more = bs[1].count() + 40;
    eventually("load goes on without b0", || bs[1].count() > more).await;
    let (sent, failed) = load.stop().await;
    assert_eq!(
        failed, 0,
        "{failed} of {sent} requests failed during add/remove"
    );
    assert!(
        bs[0].count() <= b0_after_removal + 4,
        "at most the requests in flight at the removal reached b0 after it"
    );
    assert_eq!(ids(&members(&c, &r).await), [bs[1].url(), "b2".to_owned()]);

    // Drain the backend serving a stream, mid-stream: the stream completes,
    // no new request lands there, then it is removed.
    let stream = tokio::spawn({
        let url = r.url("/v1/completions");
        async move {
            post_frames(
                &client(),
                &url,
                &json!({"model": "m", "prompt": "long", "stream": true,
                        "x_chunks": 6, "x_delay_ms": 150}),
            )
            .await
        }
    });
    let serving = poll::poll(
        "the stream to start",
        Duration::from_secs(10),
        Duration::from_millis(5),
        async || {
            let v = members(&c, &r).await;
            v.iter()
                .find(|m| m["in_flight"] == 1)
                .map(|m| m["worker_id"].as_str().unwrap().to_owned())
        },
    )
    .await;
    let (drained, other_id) = if serving == "b2" {
        (&bs[2], bs[1].url())
    } else {
        (&bs[1], "b2".to_owned())
    };
    let drain = post(
        &c,
        &r.url(&format!("/admin/pools/m/backends/{}/drain", seg(&serving))),
        &json!({}),
        &[],
    )
    .await;
    assert_eq!(drain.status, 202, "{:?}", drain.body);
    let listed = members(&c, &r).await;
    let d = listed
        .iter()
        .find(|m| m["worker_id"] == serving.as_str())
        .unwrap();
    assert_eq!(d["draining"], true);
    let before = drained.count();
    for i in 0..10 {
        let reply = post(
            &c,
            &r.url("/v1/completions"),
            &json!({"model": "m", "prompt": format!("during drain {i}")}),
            &[],
        )
        .await;
        assert_eq!(reply.status, 200);
        assert_eq!(
            reply.backend(),
            other_id,
            "nothing new on a draining backend"
        );
    }
    assert_eq!(drained.count(), before);
    let (status, _, frames, err) = stream.await.unwrap();
    assert_eq!(status, 200);
    assert!(err.is_none(), "the drained stream completed: {err:?}");
    let body: Vec<u8> = frames.concat();
    assert!(
        String::from_utf8_lossy(&body).ends_with("data: [DONE]\n\n"),
        "whole stream"
    );
    poll::poll(
        "the drained backend to be removed",
        Duration::from_secs(10),
        Duration::from_millis(10),
        async || (!ids(&members(&c, &r).await).contains(&serving)).then_some(()),
    )
    .await;
    // The last serving backend is kept.
    let last = ids(&members(&c, &r).await).pop().unwrap();
    let refused = post(
        &c,
        &r.url(&format!("/admin/pools/m/backends/{}/drain", seg(&last))),
        &json!({}),
        &[],
    )
    .await;
    assert_eq!(refused.error(409)["code"], "last_backend");
    let metrics = get_url(&c, &r.url("/metrics")).await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(
        text.contains(r#"warmpath_pool_membership_changes_total{pool="m",op="drain"} 1"#),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_membership_needs_the_admin_token_and_names_bad_input() {
    let bs = backends(1).await;
    let r = router(&bs, &["--admin-token", "sekrit"]).await;
    let c = client();
    let url = r.url("/admin/pools/m/backends");
    let no = send(&c, request("GET", &url, "", &[])).await;
    assert_eq!(no.status, 401);
    let auth = [("authorization", "Bearer sekrit")];
    let bad = post(&c, &url, &json!({"uri": "x"}), &auth).await;
    assert_eq!(bad.error(400)["code"], "invalid_json");
    let bad = post(&c, &url, &json!({"url": "ftp://x"}), &auth).await;
    assert_eq!(bad.error(400)["code"], "invalid_backend");
    let unknown = post(
        &c,
        &r.url("/admin/pools/other/backends"),
        &json!({"url": "http://127.0.0.1:1"}),
        &auth,
    )
    .await;
    assert_eq!(unknown.status, 404);
    let gone = send(&c, request("DELETE", &format!("{url}/nope"), "", &auth)).await;
    assert_eq!(gone.error(404)["code"], "unknown_worker_id");
    let put = send(
        &c,
        request(
            "PUT",
            &r.url("/admin/pools/m/strategy"),
            r#"{"strategy":"random"}"#,
            &auth,
        ),
    )
    .await;
    assert_eq!(put.status, 200, "the strategy route still works");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_adds_and_drains_backends_and_warns_once_for_the_rest() {
    let bs = backends(3).await;
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("router.yaml");
    let write = |urls: &[&TestBackend], block_size: usize| {
        let list: Vec<String> = urls
            .iter()
            .map(|b| format!("{{url: '{}'}}", b.url()))
            .collect();
        std::fs::write(
            &cfg,
            format!(
                "pools:\n  - model: m\n    strategy: least_outstanding\n    block_size: {block_size}\n    backends: [{}]\n",
                list.join(", ")
            ),
        )
        .unwrap()
    };
    write(&[&bs[0], &bs[1]], 16);
    let log = dir.path().join("router.log");
    let (mut child, addr) = spawn_logged(&["--config", cfg.to_str().unwrap()], &log).await;
    let r = Url(addr);
    let c = client();
    // An admin-added member is not the configuration's to remove.
    let add = post(
        &c,
        &r.url("/admin/pools/m/backends"),
        &json!({"url": "http://127.0.0.1:9", "worker_id": "extra"}),
        &[],
    )
    .await;
    assert_eq!(add.status, 201);
    write(&[&bs[1], &bs[2]], 32);
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &child.id().unwrap().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    poll::poll(
        "SIGHUP to add b2 and remove b0",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || {
            let have = ids(&members(&c, &r).await);
            (have == [bs[1].url(), "extra".to_owned(), bs[2].url()]).then_some(())
        },
    )
    .await;
    let body = json!({"model": "m", "prompt": "x"});
    let mut seen = std::collections::HashSet::new();
    for _ in 0..20 {
        let reply = post(&c, &r.url("/v1/completions"), &body, &[]).await;
        seen.insert(reply.backend().to_owned());
    }
    assert!(seen.contains(&bs[2].url()), "{seen:?}");
    assert!(!seen.contains(&bs[0].url()), "b0 drained: {seen:?}");
    child.kill().await.unwrap();
    let log = std::fs::read_to_string(&log).unwrap();
    let warns: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("reload"))
        .collect();
    assert_eq!(
        warns.len(),
        1,
        "one WARN line for what a reload could not apply: {log}"
    );
    assert!(warns[0].contains("block_size changed"), "{}", warns[0]);
}

/// Blocks of the kv_aware churn test's prefixes (128 tokens of block size 4).
const CHURN_BS: usize = 4;

/// Prompt `k` of the churn test: 128 tokens (32 blocks), the first one its
/// own; from `SHORT` on, 32 tokens (a cold prefill that weighs little).
fn churn_tokens(k: usize) -> Vec<u32> {
    let len = if k >= SHORT { 31 } else { 127 };
    std::iter::once(200 + k as u32).chain(0..len).collect()
}

const SHORT: usize = 6;

fn churn_prompt(k: usize, hold_ms: u64) -> Value {
    json!({"model": "m", "prompt": churn_tokens(k), "max_tokens": 1, "x_hold_ms": hold_ms})
}

/// The router-side block hashes of prompt `k`.
fn churn_chain(k: usize) -> Vec<u64> {
    warmpath_core::hash_tokens(
        warmpath_core::HashSeed::new("m", "", ""),
        CHURN_BS,
        &churn_tokens(k),
    )
    .iter()
    .map(|h| h.0)
    .collect()
}

/// Which of `bs` received prompt `k` first (its first token tells).
fn received(bs: &[TestBackend], k: usize) -> Option<String> {
    let first = 200 + k as u64;
    bs.iter()
        .find(|b| {
            b.requests()
                .iter()
                .any(|q| q.json()["prompt"][0].as_u64() == Some(first))
        })
        .map(|b| b.name().to_owned())
}

/// One answer of the churn load: (phase when sent, prompt, backend,
/// decision, status).
type Answer = (u8, usize, String, String, u16);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_aware_keeps_warm_prefixes_through_an_add_and_a_drain_under_load() {
    let dir = tempfile::tempdir().unwrap();
    warmpath_core::tokenize::tiny::write_model_dir(dir.path()).unwrap();
    let bs = backends(4).await;
    let member = |b: &TestBackend| format!("{{url: '{}', worker_id: {}}}", b.url(), b.name());
    // No rebalancing moves (they would move a warm prefix on purpose); the
    // agents stay fresh for the whole test.
    let yaml = format!(
        "grpc_listen: 127.0.0.1:0\ningest: {{stale_after_ms: 600000}}\npools:\n  - model: m\n    strategy: kv_aware\n    tokenizer: {}\n    block_size: {CHURN_BS}\n    kv: {{rebalance_slack: null}}\n    backends: [{}, {}, {}]\n",
        dir.path().display(),
        member(&bs[0]),
        member(&bs[1]),
        member(&bs[2]),
    );
    let r = raw_agent::Router::start(dir.path(), &yaml).await;
    let c = client();
    let url = format!("{}/v1/completions", r.http);
    let admin = format!("{}/admin/pools/m/backends", r.http);

    // Six prefixes, placed cold, then published by their backends' agents.
    let prefixes = SHORT;
    let mut home = Vec::new();
    for k in 0..prefixes {
        let a = post(&c, &url, &churn_prompt(k, 0), &[]).await;
        assert_eq!(a.status, 200);
        home.push(a.backend().to_owned());
    }
    let mut agents = Vec::new();
    for b in &bs[..3] {
        let mine: Vec<u64> = (0..prefixes)
            .filter(|&k| home[k] == b.name())
            .flat_map(churn_chain)
            .collect();
        assert!(!mine.is_empty(), "cold placement spread: {home:?}");
        let blocks = mine.len() as u64;
        agents.push(raw_agent::agent(&r.grpc, b.name(), &mine, None).await);
        poll::poll(
            "the agent's snapshot",
            Duration::from_secs(10),
            Duration::from_millis(20),
            async || (r.blocks(&c, b.name()).await == blocks).then_some(()),
        )
        .await;
    }
    for (k, at) in home.iter().enumerate() {
        let a = post(&c, &url, &churn_prompt(k, 0), &[]).await;
        assert_eq!((a.backend(), a.decision()), (at.as_str(), "kv_match"));
    }
    let blocks_before: Vec<u64> = {
        let mut v = Vec::new();
        for b in &bs[..3] {
            v.push(r.blocks(&c, b.name()).await);
        }
        v
    };

    // Two clients cycle through the warm prefixes; each answer is kept
    // with the phase it was sent in.
    let phase = Arc::new(std::sync::atomic::AtomicU8::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(parking_lot::Mutex::new(Vec::<Answer>::new()));
    let clients: Vec<_> = (0..2)
        .map(|i| {
            let (phase, stop, answers, url) =
                (phase.clone(), stop.clone(), answers.clone(), url.clone());
            tokio::spawn(async move {
                let c = client();
                let mut n = i;
                while !stop.load(Ordering::Relaxed) {
                    let k = n % prefixes;
                    n += 1;
                    let at = phase.load(Ordering::Relaxed);
                    let a = post(&c, &url, &churn_prompt(k, 5), &[]).await;
                    let (b, d) = if a.status == 200 {
                        (a.backend().to_owned(), a.decision().to_owned())
                    } else {
                        Default::default()
                    };
                    answers.lock().push((at, k, b, d, a.status.as_u16()));
                }
            })
        })
        .collect();
    let answered = |n: usize| {
        let answers = answers.clone();
        move || answers.lock().len() >= n
    };
    eventually("the load to run", answered(40)).await;

    // A cold prefix whose first request is still prefilling when a backend
    // is added (held 5 s, far past its placement's few sticky decisions):
    // its next request follows it.
    let sticky = prefixes;
    let held = tokio::spawn({
        let url = url.clone();
        async move { post(&client(), &url, &churn_prompt(sticky, 5000), &[]).await }
    });
    let placed = poll::poll(
        "the held request to reach a backend",
        Duration::from_secs(10),
        Duration::from_millis(10),
        async || received(&bs[..3], sticky),
    )
    .await;
    let add = post(
        &c,
        &admin,
        &json!({"url": bs[3].url(), "worker_id": "b3"}),
        &[],
    )
    .await;
    assert_eq!(add.status, 201, "{:?}", add.body);
    phase.store(1, Ordering::Relaxed);
    let again = post(&c, &url, &churn_prompt(sticky, 0), &[]).await;
    assert_eq!(
        (again.backend(), again.decision()),
        (placed.as_str(), "prefix_hash"),
        "a placement still prefilling is kept across the add"
    );

    // The new backend takes the next cold prefixes: the others carry the
    // six warm ones' load.
    let mut cold_on_new = 0;
    let fresh = [prefixes + 1, prefixes + 2];
    for &k in &fresh {
        let a = post(&c, &url, &churn_prompt(k, 0), &[]).await;
        assert_eq!(a.status, 200);
        cold_on_new += usize::from(a.backend() == "b3");
    }
    assert_eq!(cold_on_new, fresh.len(), "new cold prefixes go to b3");
    let n = answers.lock().len();
    eventually("load after the add", answered(n + 40)).await;

    // Drain a backend that holds warm prefixes (not the held prefix's).
    let drained = bs[..3]
        .iter()
        .map(|b| b.name().to_owned())
        .find(|b| *b != placed)
        .unwrap();
    let drain = post(&c, &format!("{admin}/{drained}/drain"), &json!({}), &[]).await;
    assert_eq!(drain.status, 202, "{:?}", drain.body);
    phase.store(2, Ordering::Relaxed);
    poll::poll(
        "the drained backend to be removed",
        Duration::from_secs(10),
        Duration::from_millis(10),
        async || {
            (!ids(&members(&c, &Url(addr_of(&r.http))).await).contains(&drained)).then_some(())
        },
    )
    .await;
    phase.store(3, Ordering::Relaxed);
    let n = answers.lock().len();
    eventually("load after the removal", answered(n + 60)).await;
    stop.store(true, Ordering::Relaxed);
    for t in clients {
        t.await.unwrap();
    }
    assert_eq!(held.await.unwrap().status, 200);

    let answers = answers.lock().clone();
    let failed = answers.iter().filter(|a| a.4 != 200).count();
    assert_eq!(failed, 0, "{failed} of {} requests failed", answers.len());
    let mut kept = 0;
    let mut replaced = std::collections::BTreeMap::<String, usize>::new();
    for (at, k, backend, decision, _) in &answers {
        if home[*k] != drained {
            assert_eq!(
                (backend.as_str(), decision.as_str()),
                (home[*k].as_str(), "kv_match"),
                "prefix {k} (phase {at}) stays where it is cached"
            );
            kept += 1;
        } else if *at >= 2 {
            assert_ne!(backend, &drained, "nothing new on the drained backend");
            *replaced.entry(backend.clone()).or_default() += 1;
        }
    }
    assert!(
        !replaced.is_empty(),
        "the drained backend's prefixes re-placed"
    );
    // The remaining workers' index is untouched.
    for (i, b) in bs[..3].iter().enumerate() {
        if b.name() != drained {
            assert_eq!(r.blocks(&c, b.name()).await, blocks_before[i]);
        }
    }
    let warm_moved = answers
        .iter()
        .filter(|a| home[a.1] != drained && a.2 != home[a.1])
        .count();
    println!(
        "NUMBER kv_aware churn: {} answers, 0 failed; warm prefixes on remaining backends: {kept} answers, {warm_moved} off their home; \
         the drained backend's prefixes after the drain went to {replaced:?}; new cold prefixes on the added backend: {cold_on_new} of {}; homes {home:?}, drained {drained}",
        answers.len(),
        fresh.len()
    );
    drop(agents);
}

fn addr_of(http: &str) -> std::net::SocketAddr {
    http.trim_start_matches("http://").parse().unwrap()
}

//! The router's agent ingest end to end, with the real `warmpath-agent`
//! binary and the real router (`warmpath_router::start`, configured through
//! its command-line flags): TLS with a certificate made at test time (rcgen),
//! the shared token over TLS, an agent that does not trust the router, a
//! block-size mismatch, and two router replicas converging to the same index.
#![allow(clippy::unwrap_used)]

#[path = "support/poll.rs"]
mod poll;

use clap::Parser;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;
use warmpath_agent::vllm::{
    BlockRemoved, BlockStored, EngineBlockHash, KvEvent, KvEventPublisher, PublisherConfig,
};
use warmpath_core::{hash_tokens, BlockHash, CacheIndex, HashSeed};

const BS: u32 = 4;

/// A child process killed on drop; its stdout+stderr go to `log`.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Certs {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

/// A CA and a `localhost` certificate it signed, written as PEM into `dir`.
fn make_certs(dir: &Path) -> Certs {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "warmpath test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    let certs = Certs {
        ca: dir.join("ca.pem"),
        cert: dir.join("router.pem"),
        key: dir.join("router.key"),
    };
    std::fs::write(&certs.ca, ca.pem()).unwrap();
    std::fs::write(&certs.cert, leaf.pem()).unwrap();
    std::fs::write(&certs.key, key.serialize_pem()).unwrap();
    certs
}

async fn publisher() -> KvEventPublisher {
    let mut cfg = PublisherConfig::new("tcp://127.0.0.1:0");
    cfg.replay_endpoint = Some("tcp://127.0.0.1:0".into());
    KvEventPublisher::bind(cfg).await.unwrap()
}

/// The agent binary for `worker` on `p`, with `extra` flags (routers, TLS,
/// token), logging into `dir/<worker>-<n>.log`.
fn agent(dir: &Path, worker: &str, p: &KvEventPublisher, extra: &[String]) -> Proc {
    let log = (0..)
        .map(|n| dir.join(format!("{worker}-{n}.log")))
        .find(|p| !p.exists())
        .unwrap();
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_warmpath-agent"))
        .args(["--worker-id", worker, "--model", "m"])
        .args(["--engine-url", "http://127.0.0.1:9"])
        .args(["--kv-events", p.endpoint()])
        .args(["--kv-replay", p.replay_endpoint().unwrap()])
        .args(["--listen", "127.0.0.1:0", "--load-interval-ms", "0"])
        .args(extra)
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .env_remove("WARMPATH_AGENT_TOKEN")
        .stdout(Stdio::from(out.try_clone().unwrap()))
        .stderr(Stdio::from(out))
        .spawn()
        .unwrap();
    Proc { child, log }
}

/// The router as its binary would run with `flags` (plus a pool "m" of
/// block size 4 whose backends are `workers`).
async fn router(flags: &[String], workers: &[&str]) -> warmpath_router::RunningRouter {
    let mut args: Vec<String> = [
        "warmpath-router",
        "--listen",
        "127.0.0.1:0",
        "--model",
        "m",
        "--block-size",
        "4",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend_from_slice(flags);
    let cli = warmpath_router::Cli::try_parse_from(args).unwrap();
    let mut config = cli.load().unwrap();
    config.pools[0].backends = workers
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let mut b =
                warmpath_router::config::BackendConfig::new(format!("http://127.0.0.1:{}", 9 + i));
            b.worker_id = Some((*w).to_owned());
            b
        })
        .collect();
    warmpath_router::start(config, CancellationToken::new())
        .await
        .unwrap()
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

fn index(r: &warmpath_router::RunningRouter) -> Arc<CacheIndex> {
    r.index("m").unwrap()
}

fn blocks(r: &warmpath_router::RunningRouter, worker: &str) -> u64 {
    let idx = index(r);
    idx.worker_slot(worker).map_or(0, |s| idx.block_count(s))
}

/// One BlockStored of tokens `toks` (a new chain when `parent` is None).
fn stored(first_hash: u64, parent: Option<u64>, toks: std::ops::Range<u32>, bs: u32) -> KvEvent {
    let toks: Vec<u32> = toks.collect();
    let n = toks.len() as u64 / u64::from(bs);
    KvEvent::BlockStored(BlockStored {
        block_hashes: (0..n)
            .map(|i| EngineBlockHash::Int(first_hash + i))
            .collect(),
        parent_block_hash: parent.map(EngineBlockHash::Int),
        token_ids: toks,
        block_size: bs,
        ..Default::default()
    })
}

/// The router-side hashes of the chain of tokens 0..n.
fn wp(n: u32) -> Vec<BlockHash> {
    hash_tokens(
        HashSeed::new("m", "", ""),
        BS as usize,
        &(0..n).collect::<Vec<_>>(),
    )
}

/// Polls `cond` for up to `limit`, publishing an empty batch on each
/// publisher between polls (a gap is only seen when the next batch comes).
async fn wait_until(
    what: &str,
    limit: Duration,
    pubs: &[&KvEventPublisher],
    mut cond: impl FnMut() -> bool,
) {
    poll::poll(what, limit, Duration::from_millis(100), async || {
        if cond() {
            return Some(());
        }
        for p in pubs {
            p.publish(vec![]).await.unwrap();
        }
        None
    })
    .await
}

async fn metrics_text(http: SocketAddr) -> String {
    reqwest::get(format!("http://{http}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_ingest_accepts_trusted_agents_with_the_token_and_refuses_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_certs(dir.path());
    let r = router(
        &[
            "--grpc-listen".into(),
            "127.0.0.1:0".into(),
            "--agent-token".into(),
            "tok".into(),
            "--agent-tls-cert".into(),
            certs.cert.display().to_string(),
            "--agent-tls-key".into(),
            certs.key.display().to_string(),
        ],
        &["good", "untrusting", "wrong-token", "no-token", "plain"],
    )
    .await;
    let url = format!("https://127.0.0.1:{}", r.grpc_addr.unwrap().port());
    let ca = certs.ca.display().to_string();
    let trusted = s(&[
        "--router",
        &url,
        "--router-ca",
        &ca,
        "--tls-domain",
        "localhost",
    ]);
    let pubs = [
        publisher().await,
        publisher().await,
        publisher().await,
        publisher().await,
        publisher().await,
    ];
    let with = |extra: &[&str]| -> Vec<String> {
        let mut v = trusted.clone();
        v.extend(s(extra));
        v
    };
    let d = dir.path();
    let good = agent(d, "good", &pubs[0], &with(&["--agent-token", "tok"]));
    // No --router-ca: the system roots do not know the test CA.
    let untrusting = agent(
        d,
        "untrusting",
        &pubs[1],
        &s(&[
            "--router",
            &url,
            "--tls-domain",
            "localhost",
            "--agent-token",
            "tok",
        ]),
    );
    let wrong = agent(
        d,
        "wrong-token",
        &pubs[2],
        &with(&["--agent-token", "nope"]),
    );
    let none = agent(d, "no-token", &pubs[3], &with(&[]));
    // Plain HTTP/2 to the TLS port.
    let plain_url = format!("http://127.0.0.1:{}", r.grpc_addr.unwrap().port());
    let plain = agent(
        d,
        "plain",
        &pubs[4],
        &s(&["--router", &plain_url, "--agent-token", "tok"]),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    for p in &pubs {
        p.publish(vec![stored(100, None, 0..16, BS)]).await.unwrap();
    }
    let all: Vec<&KvEventPublisher> = pubs.iter().collect();
    wait_until(
        "the trusted agent's blocks",
        Duration::from_secs(30),
        &all,
        || blocks(&r, "good") == 4,
    )
    .await;
    let idx = index(&r);
    let slot = idx.worker_slot("good").unwrap();
    assert_eq!(idx.longest_match(&wp(16)).of(slot).unwrap().blocks, 4);

    wait_until(
        "every refused agent to log why",
        Duration::from_secs(30),
        &all,
        || {
            untrusting.output().contains("TLS with the router failed")
                && wrong.output().contains("wrong agent token")
                && none.output().contains("wrong agent token")
                && plain.output().contains("router link down")
        },
    )
    .await;
    for (name, p) in [
        ("untrusting", &untrusting),
        ("wrong-token", &wrong),
        ("plain", &plain),
    ] {
        let out = p.output();
        let why = out
            .lines()
            .find(|l| l.contains("ERROR") || l.contains("WARN"));
        eprintln!("{name}: {}", why.unwrap_or("?"));
    }
    let u = untrusting.output();
    assert!(
        u.contains("certificate") || u.contains("Certificate"),
        "{u}"
    );
    for w in ["untrusting", "wrong-token", "no-token", "plain"] {
        assert_eq!(blocks(&r, w), 0, "{w} must not reach the index");
    }
    let m = metrics_text(r.http_addr).await;
    assert!(
        m.contains("warmpath_ingest_refused_total{reason=\"auth\"}"),
        "the router counts token refusals"
    );
    assert!(good.output().contains("router link up"));
    r.shutdown();
    r.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_size_mismatch_is_loud_on_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let r = router(&s(&["--grpc-listen", "127.0.0.1:0"]), &["w"]).await;
    let url = format!("http://{}", r.grpc_addr.unwrap());
    let p = publisher().await;
    let a = agent(dir.path(), "w", &p, &s(&["--router", &url]));
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The engine's blocks hold 8 tokens; the router's pool 4.
    p.publish(vec![stored(1, None, 0..16, 8)]).await.unwrap();
    let cache_index = || async {
        reqwest::get(format!("http://{}/cache-index", r.http_addr))
            .await
            .unwrap()
            .json::<serde_json::Value>()
            .await
            .unwrap()
    };
    wait_until(
        "the agent to report the mismatch",
        Duration::from_secs(30),
        &[&p],
        || a.output().contains("block size mismatch"),
    )
    .await;
    let v = cache_index().await;
    let refused = v.to_string();
    assert!(
        refused.contains("block size mismatch"),
        "/cache-index shows it: {refused}"
    );
    let m = metrics_text(r.http_addr).await;
    assert!(m.contains("warmpath_ingest_refused_total{reason=\"block_size\"}"));
    assert_eq!(blocks(&r, "w"), 0);
    r.shutdown();
    r.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_router_replicas_converge_to_the_same_index() {
    let dir = tempfile::tempdir().unwrap();
    let flags = s(&["--grpc-listen", "127.0.0.1:0"]);
    let ra = router(&flags, &["w1", "w2"]).await;
    let rb = router(&flags, &["w1", "w2"]).await;
    let (ga, gb) = (ra.grpc_addr.unwrap(), rb.grpc_addr.unwrap());
    let routers = s(&[
        "--router",
        &format!("http://{ga}"),
        "--router",
        &format!("http://{gb}"),
    ]);
    let (p1, p2) = (publisher().await, publisher().await);
    let _a1 = agent(dir.path(), "w1", &p1, &routers);
    let _a2 = agent(dir.path(), "w2", &p2, &routers);
    tokio::time::sleep(Duration::from_millis(300)).await;

    // w1: tokens 0..32 in two events, then drops its last two blocks.
    p1.publish(vec![stored(100, None, 0..16, BS)])
        .await
        .unwrap();
    p1.publish(vec![stored(104, Some(103), 16..32, BS)])
        .await
        .unwrap();
    p2.publish(vec![stored(500, None, 0..24, BS)])
        .await
        .unwrap();
    p1.publish(vec![KvEvent::BlockRemoved(BlockRemoved {
        block_hashes: vec![EngineBlockHash::Int(106), EngineBlockHash::Int(107)],
        medium: None,
        group_idx: None,
    })])
    .await
    .unwrap();
    let want = [("w1", 6u64), ("w2", 6u64)];
    let converged = |a: &warmpath_router::RunningRouter, b: &warmpath_router::RunningRouter| {
        want.iter()
            .all(|(w, n)| blocks(a, w) == *n && blocks(b, w) == *n)
    };
    wait_until(
        "both replicas",
        Duration::from_secs(30),
        &[&p1, &p2],
        || converged(&ra, &rb),
    )
    .await;

    // Replica B restarts on its port and misses events meanwhile; its
    // snapshots make it equal to A again.
    rb.shutdown();
    rb.wait().await;
    p2.publish(vec![stored(506, Some(505), 24..32, BS)])
        .await
        .unwrap();
    let mut cli_flags = s(&["--grpc-listen"]);
    cli_flags.push(gb.to_string());
    let rb = router(&cli_flags, &["w1", "w2"]).await;
    let want2 = [("w1", 6u64), ("w2", 8u64)];
    wait_until(
        "the restarted replica",
        Duration::from_secs(30),
        &[&p1, &p2],
        || {
            want2
                .iter()
                .all(|(w, n)| blocks(&ra, w) == *n && blocks(&rb, w) == *n)
        },
    )
    .await;
    // Same entries, not just the same counts.
    let chain = wp(32);
    for w in ["w1", "w2"] {
        let (ia, ib) = (index(&ra), index(&rb));
        let ma = ia
            .longest_match(&chain)
            .of(ia.worker_slot(w).unwrap())
            .unwrap()
            .blocks;
        let mb = ib
            .longest_match(&chain)
            .of(ib.worker_slot(w).unwrap())
            .unwrap()
            .blocks;
        assert_eq!(ma, mb, "{w}: replicas disagree");
        assert_eq!(ma, if w == "w1" { 6 } else { 8 });
    }
    ra.shutdown();
    rb.shutdown();
}

async fn agent_status(http: SocketAddr) -> serde_json::Value {
    let v: serde_json::Value = reqwest::get(format!("http://{http}/cache-index"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["pools"][0]["workers"][0]["agent"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_agent_restarts_and_the_index_is_complete_again() {
    let dir = tempfile::tempdir().unwrap();
    let r = router(&s(&["--grpc-listen", "127.0.0.1:0"]), &["w"]).await;
    let routers = s(&["--router", &format!("http://{}", r.grpc_addr.unwrap())]);
    let p = publisher().await;
    let a = agent(dir.path(), "w", &p, &routers);
    tokio::time::sleep(Duration::from_millis(300)).await;
    p.publish(vec![stored(100, None, 0..16, BS)]).await.unwrap();
    p.publish(vec![stored(104, Some(103), 16..32, BS)])
        .await
        .unwrap();
    wait_until(
        "the first agent's blocks",
        Duration::from_secs(30),
        &[&p],
        || blocks(&r, "w") == 8,
    )
    .await;
    let first_epoch = agent_status(r.http_addr).await["epoch"].as_u64().unwrap();

    // SIGKILL: no goodbye. The engine goes on caching meanwhile.
    drop(a);
    p.publish(vec![stored(108, Some(107), 32..40, BS)])
        .await
        .unwrap();
    let restarted = Instant::now();
    let _a = agent(dir.path(), "w", &p, &routers);
    // The new agent knows nothing; it catches up from the engine's replay
    // buffer (seq 0 on), and its snapshot (a new epoch) replaces the old
    // agent's entries.
    wait_until(
        "the restarted agent's blocks",
        Duration::from_secs(30),
        &[&p],
        || blocks(&r, "w") == 10,
    )
    .await;
    let took = restarted.elapsed();
    let st = agent_status(r.http_addr).await;
    assert!(st["epoch"].as_u64().unwrap() > first_epoch, "{st}");
    assert_eq!(st["connected"], true);
    let idx = index(&r);
    let slot = idx.worker_slot("w").unwrap();
    assert_eq!(idx.longest_match(&wp(40)).of(slot).unwrap().blocks, 10);
    eprintln!("index complete again {took:?} after the agent restart");
    r.shutdown();
    r.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_agent_goes_stale_then_is_dropped_after_the_configured_deadlines() {
    let dir = tempfile::tempdir().unwrap();
    let r = router(
        &s(&[
            "--grpc-listen",
            "127.0.0.1:0",
            "--agent-stale-after-ms",
            "400",
            "--agent-drop-after-ms",
            "1500",
        ]),
        &["w"],
    )
    .await;
    let routers = s(&["--router", &format!("http://{}", r.grpc_addr.unwrap())]);
    let p = publisher().await;
    let a = agent(dir.path(), "w", &p, &routers);
    tokio::time::sleep(Duration::from_millis(300)).await;
    p.publish(vec![stored(100, None, 0..16, BS)]).await.unwrap();
    wait_until("the agent's blocks", Duration::from_secs(30), &[&p], || {
        blocks(&r, "w") == 4
    })
    .await;
    drop(a);
    let worker = || async {
        let v: serde_json::Value = reqwest::get(format!("http://{}/cache-index", r.http_addr))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        v["pools"][0]["workers"][0].clone()
    };
    let start = Instant::now();
    let mut saw_stale_with_blocks = false;
    loop {
        let w = worker().await;
        if w["stale"] == true && w["blocks"].as_u64() == Some(4) {
            saw_stale_with_blocks = true;
        }
        if w["blocks"].as_u64() == Some(0) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "never dropped: {w}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        saw_stale_with_blocks,
        "stale (entries kept, not counted) before dropped"
    );
    assert!(
        start.elapsed() >= Duration::from_millis(1000),
        "dropped before drop_after"
    );
    r.shutdown();
    r.wait().await;
}

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
    drop(a);
    let _a = agent(dir.path(), "a", &p, &with(&token_a));
    wait_until(
        "the restarted agent's stream",
        Duration::from_secs(30),
        &[&p],
        || blocks(&r, "a") == 10,
    )
    .await;
    let mut st = agent_status(r.http_addr).await;
    for _ in 0..100 {
        if st["connected"] == true && st["refused"].is_null() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        st = agent_status(r.http_addr).await;
    }
    assert_eq!(st["connected"], true, "{st}");
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

//! The router's agent ingest end to end, with the real `warmpath-agent`
//! binary and the real router (`warmpath_router::start`, configured through
//! its command-line flags): TLS with a certificate made at test time (rcgen),
//! the shared token over TLS, an agent that does not trust the router, a
//! block-size mismatch, and two router replicas converging to the same index.

use crate::ingest;

use ingest::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use warmpath_vllm_events::{BlockRemoved, EngineBlockHash, KvEvent, KvEventPublisher};

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

/// The fleet's agent secret: each agent presents its worker's credential.
const SECRET: &str = "fleet-secret";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_ingest_accepts_trusted_agents_with_their_credential_and_refuses_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_certs(dir.path());
    let r = router(
        &[
            "--grpc-listen".into(),
            "127.0.0.1:0".into(),
            "--agent-secret".into(),
            SECRET.into(),
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
    let token = |worker: &str| warmpath_proto::worker_token(SECRET, worker);
    let good = agent(
        d,
        "good",
        &pubs[0],
        &with(&["--agent-token", &token("good")]),
    );
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
            &token("untrusting"),
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
        &s(&["--router", &plain_url, "--agent-token", &token("plain")]),
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
                && wrong.output().contains("malformed agent credential")
                && none.output().contains("malformed agent credential")
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
    // Dropped after 12 stale deadlines (4.8 s of silence).
    assert!(
        start.elapsed() >= Duration::from_millis(4000),
        "dropped before 12 stale deadlines"
    );
    r.shutdown();
    r.wait().await;
}

/// A well-shaped per-worker credential that names no worker: it passes
/// every check the router can make before the Hello.
fn garbage_credential() -> String {
    format!("wp1-{}", "0".repeat(64))
}

/// Issue 38 item 2: a peer opening many streams with credentials it cannot
/// back is capped before authentication (RESOURCE_EXHAUSTED past the
/// per-address cap; a malformed credential is refused at once), while a real
/// agent keeps publishing, and the slots come back once the peer leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_flooding_unauthenticated_streams_is_capped_and_a_real_agent_keeps_publishing() {
    use raw::*;
    let secret = "fleet-secret";
    let r = router(
        &s(&["--grpc-listen", "127.0.0.1:0", "--agent-secret", secret]),
        &["a", "b"],
    )
    .await;
    let grpc = r.grpc_addr.unwrap();
    let real = ingest_client(grpc).await;
    let tok_a = warmpath_proto::worker_token(secret, "a");
    let (tx_a, _answers_a) = raw_stream_on(
        &real,
        Some(&tok_a),
        vec![hello("a"), snapshot(1, &[1, 2, 3])],
    )
    .await
    .unwrap();
    wait_until("a's snapshot", Duration::from_secs(10), &[], || {
        blocks(&r, "a") == 3
    })
    .await;

    // Not the shape `--print-agent-token` prints: refused before the Hello.
    for bad in ["wp1-garbage", "wp1-", &format!("wp1-{}", "G".repeat(64))] {
        let e = raw_stream_on(&real, Some(bad), vec![]).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{bad}: {e:?}");
    }

    // The attacker: 40 streams on one connection, each waiting for a Hello
    // that never comes.
    let attacker = ingest_client(grpc).await;
    let garbage = garbage_credential();
    let (mut held, mut exhausted) = (Vec::new(), 0);
    for _ in 0..40 {
        match raw_stream_on(&attacker, Some(&garbage), vec![]).await {
            Ok(s) => held.push(s),
            Err(e) => {
                assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
                exhausted += 1;
            }
        }
    }
    assert!(
        held.len() <= 16 && exhausted >= 24,
        "{} streams held before authentication, {exhausted} refused",
        held.len()
    );

    // The real agent's deltas still apply during the attack.
    tx_a.send(stored(2, &[4, 5])).await.unwrap();
    wait_until(
        "a's delta during the attack",
        Duration::from_secs(5),
        &[],
        || blocks(&r, "a") == 5,
    )
    .await;

    // The attacker leaves: another agent from the same address gets in.
    drop(held);
    drop(attacker);
    let tok_b = warmpath_proto::worker_token(secret, "b");
    let _b = poll::poll(
        "b admitted",
        Duration::from_secs(10),
        Duration::from_millis(100),
        async || {
            raw_stream_on(&real, Some(&tok_b), vec![hello("b"), snapshot(1, &[7, 8])])
                .await
                .ok()
        },
    )
    .await;
    wait_until("b's snapshot", Duration::from_secs(10), &[], || {
        blocks(&r, "b") == 2
    })
    .await;
    let m = metrics_text(r.http_addr).await;
    assert!(
        m.contains("warmpath_ingest_refused_total{reason=\"streams\"}"),
        "the capped streams are counted"
    );
    r.shutdown();
}

/// Issue 38 item 2: a refused Hello with a huge worker id that carries a
/// newline is logged short and escaped (no forged line), at most once per
/// 10 s for a burst, and its refusal is short too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_hellos_are_logged_short_escaped_and_at_most_every_10_s() {
    use raw::*;
    let logs = captured_logs();
    let secret = "fleet-secret";
    let r = router(
        &s(&["--grpc-listen", "127.0.0.1:0", "--agent-secret", secret]),
        &["a"],
    )
    .await;
    let grpc = r.grpc_addr.unwrap();
    let client = ingest_client(grpc).await;
    let huge = format!("evil-4c1f\nFORGED-LINE {}", "x".repeat(1 << 20));
    for _ in 0..20 {
        let (_tx, mut answers) =
            raw_stream_on(&client, Some(&garbage_credential()), vec![hello(&huge)])
                .await
                .unwrap();
        let m = tokio::time::timeout(Duration::from_secs(10), answers.message())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let reason = match m.msg {
            Some(warmpath_proto::v1::router_message::Msg::Refused(f)) => f.reason,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert!(reason.len() < 512, "refusal of {} bytes", reason.len());
    }
    // A real agent is not affected.
    let tok = warmpath_proto::worker_token(secret, "a");
    let (_tx, _answers) = raw_stream_on(&client, Some(&tok), vec![hello("a"), snapshot(1, &[9])])
        .await
        .unwrap();
    wait_until("a's snapshot", Duration::from_secs(10), &[], || {
        blocks(&r, "a") == 1
    })
    .await;
    let text = String::from_utf8_lossy(&logs.lock()).into_owned();
    let ours: Vec<&str> = text.lines().filter(|l| l.contains("evil-4c1f")).collect();
    assert_eq!(ours.len(), 1, "one line for the burst: {ours:#?}");
    assert!(ours[0].len() < 1024, "a line of {} bytes", ours[0].len());
    assert!(ours[0].contains("evil-4c1f\\nFORGED-LINE"), "{}", ours[0]);
    assert!(
        !text.lines().any(|l| l.starts_with("FORGED-LINE")),
        "a forged log line"
    );
    r.shutdown();
}

/// Issue 38 item 7: an authenticated agent bursting snapshots and clears is
/// paced (each deferred, none dropped: every snapshot is acknowledged and
/// the last state wins), the throttling is counted, and the router stays
/// responsive: /health answers and another agent's deltas apply meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_bursting_snapshots_and_clears_is_paced_and_loses_nothing() {
    use raw::*;
    let r = router(&s(&["--grpc-listen", "127.0.0.1:0"]), &["a", "b"]).await;
    let grpc = r.grpc_addr.unwrap();
    let client = ingest_client(grpc).await;
    let (tx_b, _answers_b) = raw_stream_on(&client, None, vec![hello("b"), snapshot(1, &[1])])
        .await
        .unwrap();
    wait_until("b's snapshot", Duration::from_secs(10), &[], || {
        blocks(&r, "b") == 1
    })
    .await;

    // a: twelve snapshots and two clears at once, then a last delta. The
    // Hello and the first seven snapshots are the burst a connecting agent
    // gets; the rest go at one a second.
    let set = |seq: u64| -> Vec<u64> { (0..2000).map(|i| seq << 32 | i).collect() };
    let mut burst = vec![hello("a")];
    for seq in 1..=12 {
        burst.push(snapshot(seq, &set(seq)));
    }
    burst.push(cleared(13));
    burst.push(stored(14, &[70, 71, 72]));
    burst.push(cleared(15));
    burst.push(stored(16, &[90, 91]));
    let started = Instant::now();
    let (_tx_a, mut answers_a) = raw_stream_on(&client, None, burst).await.unwrap();

    // Meanwhile: /livez answers, and b's delta applies.
    let http = reqwest::Client::new();
    let mut slowest = Duration::ZERO;
    tx_b.send(stored(2, &[2, 3])).await.unwrap();
    let mut b_applied = None;
    while started.elapsed() < Duration::from_secs(2) {
        let t = Instant::now();
        let h = http
            .get(format!("http://{}/livez", r.http_addr))
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap();
        assert!(h.status().is_success());
        slowest = slowest.max(t.elapsed());
        if b_applied.is_none() && blocks(&r, "b") == 3 {
            b_applied = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        slowest < Duration::from_millis(500),
        "/health took {slowest:?}"
    );
    assert!(b_applied.is_some(), "b's delta did not apply within 2 s");

    // Every snapshot is acknowledged, in order: deferred, not dropped.
    let mut acked = Vec::new();
    while acked.last() != Some(&12) {
        let m = tokio::time::timeout(Duration::from_secs(15), answers_a.message())
            .await
            .expect("the snapshots were acknowledged")
            .unwrap()
            .unwrap();
        match m.msg {
            Some(warmpath_proto::v1::router_message::Msg::Ack(a)) => acked.push(a.seq),
            Some(warmpath_proto::v1::router_message::Msg::Refused(f)) => {
                panic!("refused: {}", f.reason)
            }
            _ => {}
        }
    }
    assert_eq!(acked, (1..=12).collect::<Vec<u64>>());
    // The last word wins: cleared, stored 2 blocks.
    wait_until("a's final state", Duration::from_secs(10), &[], || {
        blocks(&r, "a") == 2
    })
    .await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(5),
        "fifteen replacements in {took:?}: not paced"
    );
    let throttled = metric(
        r.http_addr,
        "warmpath_ingest_throttled_total{kind=\"snapshot\"}",
    )
    .await;
    assert!(throttled >= 4.0, "throttled snapshots counted: {throttled}");
    let cleared_n = metric(
        r.http_addr,
        "warmpath_ingest_throttled_total{kind=\"cleared\"}",
    )
    .await;
    assert!(cleared_n >= 2.0, "throttled clears counted: {cleared_n}");
    r.shutdown();
}

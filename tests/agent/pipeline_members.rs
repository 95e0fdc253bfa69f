//! Membership and router replicas end to end, with the real `warmpath-agent`
//! binary and the real router (`warmpath_router::start`): a worker removed
//! through the admin API loses its index entries while the others keep
//! theirs and its agent is refused; an agent given `--router dns://NAME:PORT`
//! follows the name from one router replica to two and back to one, each
//! replica's index complete within 1 s of the change. The DNS server is
//! hickory-server on 127.0.0.1, started here.

use crate::{dns, ingest};

use ingest::*;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

fn connected(status: &serde_json::Value) -> bool {
    status["connected"] == true
}

async fn agent_of(r: &warmpath_router::RunningRouter, worker: &str) -> serde_json::Value {
    let v: serde_json::Value = reqwest::get(format!("http://{}/cache-index", r.http_addr))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["pools"][0]["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["worker_id"] == worker)
        .map(|w| w["agent"].clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_worker_is_dropped_from_the_index_and_its_agent_refused() {
    let dir = tempfile::tempdir().unwrap();
    let r = router(&s(&["--grpc-listen", "127.0.0.1:0"]), &["w1", "w2"]).await;
    let routers = s(&["--router", &format!("http://{}", r.grpc_addr.unwrap())]);
    let (p1, p2) = (publisher().await, publisher().await);
    let a1 = agent(dir.path(), "w1", &p1, &routers);
    let _a2 = agent(dir.path(), "w2", &p2, &routers);
    tokio::time::sleep(Duration::from_millis(300)).await;
    p1.publish(vec![stored(100, None, 0..16, BS)])
        .await
        .unwrap();
    p2.publish(vec![stored(500, None, 0..24, BS)])
        .await
        .unwrap();
    wait_until(
        "both workers' blocks",
        Duration::from_secs(30),
        &[&p1, &p2],
        || blocks(&r, "w1") == 4 && blocks(&r, "w2") == 6,
    )
    .await;
    let idx = index(&r);
    let w2 = idx.worker_slot("w2").unwrap();
    let before = idx.longest_match(&wp(24)).of(w2).unwrap().blocks;

    let del = reqwest::Client::new()
        .delete(format!("http://{}/admin/pools/m/backends/w1", r.http_addr))
        .send()
        .await
        .unwrap();
    assert_eq!(del.status(), 200);
    assert_eq!(idx.worker_slot("w1"), None, "w1's entries are dropped");
    assert_eq!(
        idx.longest_match(&wp(24)).of(w2).unwrap().blocks,
        before,
        "w2's are not"
    );
    assert_eq!(blocks(&r, "w2"), 6);
    // The agent is told why on its next message (a heartbeat at the latest),
    // and its reconnects are refused: not a backend any more.
    wait_until(
        "w1's agent to be refused",
        Duration::from_secs(30),
        &[&p1],
        || a1.output().contains("was removed from pool"),
    )
    .await;
    let text = metrics_text(r.http_addr).await;
    assert!(
        text.contains(r#"warmpath_ingest_refused_total{reason="removed"} 1"#),
        "{text}"
    );
    r.shutdown();
    r.wait().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_follows_dns_router_replicas_from_one_to_two_to_one() {
    let dir = tempfile::tempdir().unwrap();
    let dns = dns::TestDns::start().await;
    let ra = router(&s(&["--grpc-listen", "127.0.0.1:0"]), &["w"]).await;
    let port = ra.grpc_addr.unwrap().port();
    // The second replica on the same port of another loopback address, as
    // two pods behind one headless Service.
    let rb = router(&s(&["--grpc-listen", &format!("127.0.0.2:{port}")]), &["w"]).await;
    let (one, two) = (Ipv4Addr::new(127, 0, 0, 1), Ipv4Addr::new(127, 0, 0, 2));
    dns.set_a("routers.test.", &[one]).await;
    let p = publisher().await;
    let router_flag = format!("dns://routers.test.:{port}");
    let ns = dns.addr.to_string();
    let a = agent(
        dir.path(),
        "w",
        &p,
        &s(&[
            "--router",
            &router_flag,
            "--router-nameserver",
            &ns,
            "--router-dns-interval-ms",
            "100",
        ]),
    );
    p.publish(vec![stored(100, None, 0..16, BS)]).await.unwrap();
    p.publish(vec![stored(104, Some(103), 16..32, BS)])
        .await
        .unwrap();
    let log = a.log.clone();
    let failed = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(20)).await;
        eprintln!(
            "agent log so far:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    });
    wait_until("replica A's index", Duration::from_secs(30), &[&p], || {
        blocks(&ra, "w") == 8
    })
    .await;
    failed.abort();
    assert_eq!(blocks(&rb, "w"), 0, "B is not in the answer yet");

    dns.set_a("routers.test.", &[one, two]).await;
    let changed = Instant::now();
    poll_blocks(&rb, 8).await;
    let took = changed.elapsed();
    println!("NUMBER new router replica held the full index {took:?} after the DNS change (interval 100 ms)");
    assert!(
        took < Duration::from_secs(1),
        "B complete {took:?} after the change"
    );
    let idx = index(&rb);
    let slot = idx.worker_slot("w").unwrap();
    assert_eq!(idx.longest_match(&wp(32)).of(slot).unwrap().blocks, 8);

    // A leaves the answer: its stream is dropped, B keeps receiving.
    dns.set_a("routers.test.", &[two]).await;
    ingest::poll::poll(
        "the agent to drop replica A",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || (!connected(&agent_of(&ra, "w").await)).then_some(()),
    )
    .await;
    p.publish(vec![stored(108, Some(107), 32..40, BS)])
        .await
        .unwrap();
    let changed = Instant::now();
    poll_blocks(&rb, 10).await;
    assert!(changed.elapsed() < Duration::from_secs(1));
    assert_eq!(blocks(&ra, "w"), 8, "A no longer hears from the agent");
    assert!(connected(&agent_of(&rb, "w").await));
    ra.shutdown();
    rb.shutdown();
}

/// Polls (every 5 ms, up to 5 s) until `r` holds `n` blocks of worker `w`.
async fn poll_blocks(r: &warmpath_router::RunningRouter, n: u64) {
    ingest::poll::poll(
        "the replica's index",
        Duration::from_secs(5),
        Duration::from_millis(5),
        async || (blocks(r, "w") == n).then_some(()),
    )
    .await;
}

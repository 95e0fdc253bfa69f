//! Per-worker agent identity (issue 17 item 1) on the router binary, against
//! the forged-agent attack of the issue: an agent holding a valid credential
//! (here b's) sends a Hello for live worker `a` with a newer epoch. Before
//! per-worker credentials, any holder of the shared token could do so: the
//! forged stream replaced a's entries and locked the real agent out. Now it
//! is refused after its Hello, logged and counted, a's entries and stream
//! stay, and a's own restart (its credential, a newer epoch) takes over.
//!
//! The router binary runs as a process with `agent_secret`; raw gRPC
//! streams play the agents (`tests/pipeline_agent.rs` has the real agent
//! binary against the router library).
#![allow(clippy::unwrap_used)]

#[path = "support/raw_agent.rs"]
mod raw_agent;
mod support;

use raw_agent::{agent_as, Router};
use std::time::Duration;
use support::poll::poll;
use support::*;
use warmpath_proto::v1::{
    agent_message::Msg, delta, router_message, AgentMessage, Delta, RouterMessage, Stored,
};

const SECRET: &str = "the-router-secret";

async fn first_answer(answers: &mut tonic::Streaming<RouterMessage>) -> Option<RouterMessage> {
    tokio::time::timeout(Duration::from_secs(10), answers.message())
        .await
        .expect("no answer within 10 s")
        .unwrap()
}

/// The router binary with `agent_secret`, workers `a` and `b` on one test
/// backend; keep the folder and backend alive with it.
async fn router() -> (Router, TestClient, tempfile::TempDir, TestBackend) {
    let dir = tempfile::tempdir().unwrap();
    let backend = TestBackend::start("b0").await;
    let yaml = format!(
        "grpc_listen: 127.0.0.1:0\nagent_secret: {SECRET}\npools:\n  - model: m\n    block_size: 4\n    backends: [{{url: '{0}', worker_id: a}}, {{url: '{0}', worker_id: b}}]\n",
        backend.url()
    );
    let r = Router::start(dir.path(), &yaml).await;
    (r, client(), dir, backend)
}

/// Worker a's agent with its credential, once its snapshot of `blocks` is in.
async fn agent_a(
    r: &Router,
    c: &TestClient,
    blocks: &[u64],
) -> (
    tokio::sync::mpsc::Sender<AgentMessage>,
    tonic::Streaming<RouterMessage>,
) {
    let token_a = warmpath_proto::worker_token(SECRET, "a");
    let stream = agent_as(&r.grpc, "a", 1, Some(&token_a), blocks, None)
        .await
        .unwrap();
    poll(
        "a's snapshot",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || (r.blocks(c, "a").await == blocks.len() as u64).then_some(()),
    )
    .await;
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_hello_for_a_live_worker_is_refused_and_its_own_restart_takes_over() {
    let (r, c, _dir, _backend) = router().await;
    let token_a = warmpath_proto::worker_token(SECRET, "a");
    let token_b = warmpath_proto::worker_token(SECRET, "b");
    let (tx_a, _answers_a) = agent_a(&r, &c, &[1, 2, 3, 4]).await;

    // b's own credential claiming a, with a newer epoch and forged entries.
    let (_tx_f, mut forged) = agent_as(&r.grpc, "a", u64::MAX, Some(&token_b), &[9, 10], None)
        .await
        .unwrap();
    match first_answer(&mut forged).await.and_then(|m| m.msg) {
        Some(router_message::Msg::Refused(refused)) => {
            assert!(
                refused.reason.contains("does not name worker \"a\""),
                "{}",
                refused.reason
            );
            assert!(!refused.retryable);
        }
        other => panic!("the forged Hello was not refused: {other:?}"),
    }
    // No credential, or one of the wrong form: not even a stream.
    for t in [None, Some("guess")] {
        let e = agent_as(&r.grpc, "a", u64::MAX, t, &[9], None)
            .await
            .map(|_| ())
            .unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{t:?}: {e}");
    }
    // A made-up credential of the right form: refused after its Hello.
    let (_tx_g, mut guessed) = agent_as(
        &r.grpc,
        "a",
        u64::MAX,
        Some(&format!("wp1-{}", "0".repeat(64))),
        &[9],
        None,
    )
    .await
    .unwrap();
    assert!(
        matches!(
            first_answer(&mut guessed).await.and_then(|m| m.msg),
            Some(router_message::Msg::Refused(_))
        ),
        "a guessed credential was not refused"
    );
    // a kept its entries, and its stream still applies.
    assert_eq!(r.blocks(&c, "a").await, 4);
    tx_a.send(AgentMessage {
        msg: Some(Msg::Delta(Delta {
            seq: 2,
            op: Some(delta::Op::Stored(Stored {
                parent: None,
                hashes: vec![5],
                tier: 1,
            })),
            observed_unix_micros: 0,
            prefix_closed: false,
        })),
    })
    .await
    .unwrap();
    poll(
        "a's next delta",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || (r.blocks(&c, "a").await == 5).then_some(()),
    )
    .await;
    let refused = "warmpath_ingest_refused_total{reason=\"identity\"} ";
    assert!(r.metric(&c, refused).await >= 1.0);

    // a restarts with its own credential: the newer epoch takes over.
    let (_tx_a2, _answers_a2) = agent_as(&r.grpc, "a", 2, Some(&token_a), &[7, 8, 9], None)
        .await
        .unwrap();
    poll(
        "the restarted agent's snapshot",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || (r.blocks(&c, "a").await == 3).then_some(()),
    )
    .await;
}

/// Decision facts between router replicas ride the agents' streams: with
/// `agent_secret` set, the router takes only facts signed with the key every
/// replica derives from it. An agent with a valid credential that sends a
/// fact of its own making (or alters one) is dropped and counted; a fact
/// signed as a replica signs it counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cannot_forge_another_replicas_decision() {
    use warmpath_proto::v1::{decided::Phase, Decided};
    let (r, c, _dir, _backend) = router().await;
    let (tx_a, _answers_a) = agent_a(&r, &c, &[1, 2]).await;
    let fact = |request: u64| Decided {
        router: 0x5eed,
        request,
        phase: Phase::Start as i32,
        model: "m".into(),
        prefix_key: 77,
        chain_blocks: 8,
        prefill_blocks: 8,
        home: "b".into(),
        home_moved: true,
        copies: Vec::new(),
        mac: Vec::new(),
    };
    let send = async |d: Decided| {
        tx_a.send(AgentMessage {
            msg: Some(Msg::Decided(d)),
        })
        .await
        .unwrap();
    };
    let count = async |direction: &str| {
        r.metric(
            &c,
            &format!("warmpath_replica_facts_total{{pool=\"m\",direction=\"{direction}\"}} "),
        )
        .await
    };
    // Unsigned, and signed under a secret the routers do not hold.
    send(fact(1)).await;
    let mut wrong = fact(2);
    wrong.mac = warmpath_proto::fact_mac(&warmpath_proto::fact_key("guessed"), &wrong);
    send(wrong).await;
    poll(
        "two forged facts counted",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || (count("forged").await == 2.0).then_some(()),
    )
    .await;
    assert_eq!(count("received").await, 0.0);
    // Signed as a replica of this fleet signs it: taken.
    let key = warmpath_proto::fact_key(SECRET);
    let mut good = fact(3);
    good.mac = warmpath_proto::fact_mac(&key, &good);
    send(good).await;
    poll(
        "the signed fact received",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || (count("received").await == 1.0).then_some(()),
    )
    .await;
    assert_eq!(count("forged").await, 2.0);
}

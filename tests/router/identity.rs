//! Per-worker agent identity (issue 17 item 1) on the router binary, against
//! the forged-agent attack of the issue: an agent holding a valid credential
//! (here b's) sends a Hello for live worker `a` with a newer epoch. Before
//! per-worker credentials, any holder of the shared token could do so: the
//! forged stream replaced a's entries and locked the real agent out. Now it
//! is refused after its Hello, logged and counted, a's entries and stream
//! stay, and a's own restart (its credential, a newer epoch) takes over.
//!
//! The router binary runs as a process with `agent_secret`; raw gRPC
//! streams play the agents (`tests/agent/pipeline_agent.rs` has the real agent
//! binary against the router library).

use crate::{raw_agent, support};

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
        copies: Vec::new(),
        mac: Vec::new(),
    };
    let send = async |d: Decided| {
        tx_a.send(AgentMessage {
            msg: Some(Msg::Decision(prost::Message::encode_to_vec(&d).into())),
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
    // Bytes that are no decision at all: dropped as malformed.
    tx_a.send(AgentMessage {
        msg: Some(Msg::Decision(vec![0xff; 16].into())),
    })
    .await
    .unwrap();
    poll(
        "the malformed decision counted",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || (count("malformed").await == 1.0).then_some(()),
    )
    .await;
    assert_eq!(count("received").await, 1.0);
}

/// A Kubernetes API server for pod tokens: TokenReview answers as the real
/// one gives them (authenticated only for the asked audience, the pod bound
/// in `extra`), pods by name, a token whose review hangs, and a count of
/// reviews per token.
#[cfg(feature = "kubernetes")]
mod api {
    use axum::extract::{Path, State};
    use axum::http::StatusCode;
    use axum::response::{IntoResponse, Response};
    use axum::routing::{get, post};
    use axum::Json;
    use parking_lot::Mutex;
    use serde_json::{json, Value};
    use std::collections::HashMap;
    use std::sync::Arc;

    /// A token bound to pod `pod-a` (uid `uid-a`) of namespace `default`.
    pub(super) const POD_A: &str = "eyJhbGciOi.eyJwb2QiOiJh.c2lnLWE";
    /// Bound to a pod of another namespace.
    pub(super) const OTHER_NS: &str = "eyJhbGciOi.eyJucyI6ImV2.c2lnLWV2aWw";
    /// Bound to an earlier pod named `pod-a` (another uid).
    pub(super) const OLD_POD_A: &str = "eyJhbGciOi.eyJvbGQiOiJh.c2lnLW9sZA";
    /// Its review never answers.
    pub(super) const HANGS: &str = "eyJhbGciOi.eyJoYW5nIjox.c2lnLWhhbmc";

    #[derive(Default)]
    pub(super) struct Seen {
        pub reviews: Mutex<HashMap<String, usize>>,
    }

    fn review(token: &str, audiences: &[String]) -> Value {
        let bound = |ns: &str, pod: &str, uid: &str| {
            json!({"authenticated": true, "audiences": ["warmpath"], "user": {
                "username": format!("system:serviceaccount:{ns}:vllm"),
                "extra": {
                    "authentication.kubernetes.io/pod-name": [pod],
                    "authentication.kubernetes.io/pod-uid": [uid]}}})
        };
        let status = match token {
            _ if !audiences.iter().any(|a| a == "warmpath") => {
                json!({"authenticated": false, "error": "token audiences [\"warmpath\"] is invalid for the target audiences"})
            }
            POD_A => bound("default", "pod-a", "uid-a"),
            OTHER_NS => bound("evil", "pod-a", "uid-e"),
            OLD_POD_A => bound("default", "pod-a", "uid-old"),
            _ => json!({"authenticated": false, "error": "invalid bearer token\nforged: line"}),
        };
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
               "metadata": {}, "spec": {"token": token}, "status": status})
    }

    async fn reviews(State(seen): State<Arc<Seen>>, Json(body): Json<Value>) -> Response {
        let token = body["spec"]["token"].as_str().unwrap_or("").to_owned();
        let audiences: Vec<String> =
            serde_json::from_value(body["spec"]["audiences"].clone()).unwrap_or_default();
        *seen.reviews.lock().entry(token.clone()).or_default() += 1;
        if token == HANGS {
            tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        }
        (StatusCode::CREATED, Json(review(&token, &audiences))).into_response()
    }

    async fn pod(Path((ns, name)): Path<(String, String)>) -> Response {
        if ns == "default" && name == "pod-a" {
            return Json(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "pod-a", "namespace": "default", "uid": "uid-a"},
                "status": {"podIP": "10.1.0.5", "podIPs": [{"ip": "10.1.0.5"}, {"ip": "fd00::5"}]}}))
            .into_response();
        }
        (
            StatusCode::NOT_FOUND,
            Json(json!({"apiVersion": "v1", "kind": "Status",
            "metadata": {}, "status": "Failure", "reason": "NotFound", "code": 404,
            "message": format!("pods \"{name}\" not found")})),
        )
            .into_response()
    }

    /// Serves on loopback; returns its URL and what it saw.
    pub(super) async fn start() -> (String, Arc<Seen>) {
        let seen = Arc::new(Seen::default());
        let app = axum::Router::new()
            .route("/apis/authentication.k8s.io/v1/tokenreviews", post(reviews))
            .route("/api/v1/namespaces/{ns}/pods/{name}", get(pod))
            .with_state(Arc::clone(&seen));
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(l, app).await });
        (url, seen)
    }

    /// A kubeconfig for `url`, namespace `default`, written into `dir`.
    pub(super) fn kubeconfig(dir: &std::path::Path, url: &str) -> String {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: t, cluster: {{server: '{url}'}}}}]\nusers: [{{name: t, user: {{}}}}]\ncontexts: [{{name: t, context: {{cluster: t, user: t, namespace: default}}}}]\ncurrent-context: t\n"
            ),
        )
        .unwrap();
        path.to_str().unwrap().to_owned()
    }
}

/// The refusal the router answers a stream with, after its Hello.
#[cfg(feature = "kubernetes")]
async fn refusal(answers: &mut tonic::Streaming<RouterMessage>) -> warmpath_proto::v1::Refused {
    match first_answer(answers).await.and_then(|m| m.msg) {
        Some(router_message::Msg::Refused(r)) => r,
        other => panic!("not refused: {other:?}"),
    }
}

/// In Kubernetes an engine pod holds no secret of the routers': its agent
/// presents the pod's projected ServiceAccount token, which the router has
/// the API server review, and may then publish only for that pod (by name
/// or by one of its IPs). Another pod's worker, a pod of another namespace,
/// a replaced pod, a token for another audience and a made-up token are
/// refused; a review that hangs is refused in time while a per-worker
/// credential keeps working; a reconnecting pod is not reviewed again.
#[cfg(feature = "kubernetes")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_token_speaks_only_for_its_own_pod() {
    let (url, seen) = api::start().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = api::kubeconfig(dir.path(), &url);
    let backend = TestBackend::start("b0").await;
    let ids = ["http://10.1.0.5:8000", "pod-a", "http://10.1.0.6:8000", "b"];
    let backends: Vec<String> = ids
        .iter()
        .map(|id| format!("{{url: '{}', worker_id: '{id}'}}", backend.url()))
        .collect();
    let yaml = format!(
        "grpc_listen: 127.0.0.1:0\nagent_secret: {SECRET}\ningest:\n  pod_token_audience: warmpath\npools:\n  - model: m\n    block_size: 4\n    backends: [{}]\n",
        backends.join(", ")
    );
    let r = Router::start_with_env(dir.path(), &yaml, &[("KUBECONFIG", &kubeconfig)]).await;
    let c = client();
    let has = async |worker: &str, n: u64| {
        poll(
            &format!("{worker}'s snapshot"),
            Duration::from_secs(10),
            Duration::from_millis(20),
            async || (r.blocks(&c, worker).await == n).then_some(()),
        )
        .await
    };

    // The pod, by its IP and by its name.
    let (_a1, _) = agent_as(&r.grpc, ids[0], 1, Some(api::POD_A), &[1, 2, 3], None)
        .await
        .unwrap();
    has(ids[0], 3).await;
    let (_a2, _) = agent_as(&r.grpc, ids[1], 1, Some(api::POD_A), &[4, 5], None)
        .await
        .unwrap();
    has(ids[1], 2).await;

    // The same token for another pod's worker: refused for good.
    let (_f, mut forged) = agent_as(&r.grpc, ids[2], 1, Some(api::POD_A), &[9], None)
        .await
        .unwrap();
    let why = refusal(&mut forged).await;
    assert!(
        why.reason
            .contains("names pod \"pod-a\", not worker \"http://10.1.0.6:8000\""),
        "{}",
        why.reason
    );
    assert!(!why.retryable);

    // Another namespace, a replaced pod, a made-up token: refused, with
    // the API server's own words escaped.
    for (token, says) in [
        (
            api::OTHER_NS,
            "in namespace \"evil\", not the routers' (default)",
        ),
        (api::OLD_POD_A, "replaced by another of the same name"),
        (
            "eyJhbGciOi.bWFkZSB1cA.bm9wZQ",
            "did not authenticate the pod token: \"invalid bearer token\\nforged: line\"",
        ),
    ] {
        let (_t, mut answers) = agent_as(&r.grpc, ids[2], 1, Some(token), &[9], None)
            .await
            .unwrap();
        let why = refusal(&mut answers).await;
        assert!(why.reason.contains(says), "{token}: {}", why.reason);
    }
    assert_eq!(r.blocks(&c, ids[2]).await, 0);
    // Not a token's shape at all: no stream.
    let e = agent_as(&r.grpc, ids[2], 1, Some("not a token"), &[9], None)
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);

    // A review that hangs holds its stream only until the deadline, and
    // a per-worker credential is served meanwhile.
    let started = std::time::Instant::now();
    let (_h, mut hung) = agent_as(&r.grpc, ids[2], 1, Some(api::HANGS), &[9], None)
        .await
        .unwrap();
    let token_b = warmpath_proto::worker_token(SECRET, "b");
    let (_b, _) = agent_as(&r.grpc, "b", 1, Some(&token_b), &[6, 7], None)
        .await
        .unwrap();
    has("b", 2).await;
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let why = refusal(&mut hung).await;
    assert!(
        why.reason.contains("could not be reviewed"),
        "{}",
        why.reason
    );
    assert!(why.retryable);
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "{:?}",
        started.elapsed()
    );

    // The pod reconnects (a newer epoch): its kept answer serves, no review.
    let (_a3, _) = agent_as(&r.grpc, ids[0], 2, Some(api::POD_A), &[8], None)
        .await
        .unwrap();
    has(ids[0], 1).await;
    assert_eq!(seen.reviews.lock()[api::POD_A], 1);
    let accepted = "warmpath_ingest_pod_token_reviews_total{outcome=\"accepted\"} ";
    assert_eq!(r.metric(&c, accepted).await, 1.0);
    let refused = "warmpath_ingest_pod_token_reviews_total{outcome=\"refused\"} ";
    assert_eq!(r.metric(&c, refused).await, 3.0);
}

/// A router told to review pod tokens with no way to reach an API server
/// does not start, and says which key asked for it.
#[cfg(feature = "kubernetes")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_tokens_without_an_api_server_stop_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("router.yaml");
    std::fs::write(
        &cfg,
        "grpc_listen: 127.0.0.1:0\ningest:\n  pod_token_audience: warmpath\npools:\n  - model: m\n    backends: [{url: 'http://127.0.0.1:9'}]\n",
    )
    .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_warmpath-router"))
        .args(["--listen", "127.0.0.1:0", "--config", cfg.to_str().unwrap()])
        .env("KUBECONFIG", dir.path().join("missing"))
        .env("HOME", dir.path())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out)
        .await
        .unwrap()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ingest.pod_token_audience"), "{err}");
}

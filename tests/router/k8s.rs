//! End-to-end test of Kubernetes EndpointSlice discovery on the real
//! `warmpath-router` binary. No API server can run here, so a small one on
//! 127.0.0.1 serves the list+watch requests kube-rs makes, from the
//! hand-written fixtures in tests/fixtures/k8s/ (the API's JSON shapes,
//! resourceVersions, a bookmark, a `410 Gone` error event). The engines
//! are test backends on 127.0.0.2.. (one port, as pods behind a Service).
//!
//! Covered: a not-ready endpoint becoming ready (add), a slice split in
//! two (nothing drained), a slice deleted (remove) with a terminating
//! endpoint skipped, the server ending the watch (resumed from the last
//! resourceVersion), `410 Gone` (relisted), an unreachable API server, a
//! pod-name worker id whose pod comes back at another IP, and a pod not
//! ready within its grace (back at once) and past it (removed).

use crate::support;

use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::routing::get;
use bytes::Bytes;
use futures::StreamExt;
use parking_lot::Mutex;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::*;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/k8s");
const SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices";

/// What the fake API server saw and what it serves next.
#[derive(Default)]
struct ApiState {
    /// Each request: its query string and `Authorization` header.
    seen: Mutex<Vec<(String, String)>>,
    /// The body of every list from now on.
    list: Mutex<String>,
    /// The open watch's event lines; dropping it ends the watch.
    watch: Mutex<Option<mpsc::UnboundedSender<String>>>,
}

struct TestApi {
    addr: SocketAddr,
    state: Arc<ApiState>,
    port: u16,
}

async fn slices(
    State(st): State<Arc<ApiState>>,
    RawQuery(q): RawQuery,
    headers: HeaderMap,
) -> axum::response::Response {
    let q = q.unwrap_or_default();
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    st.seen.lock().push((q.clone(), auth));
    let json = [("content-type", "application/json")];
    if !q.split('&').any(|kv| kv == "watch=true") {
        return (json, st.list.lock().clone()).into_response();
    }
    let (tx, rx) = mpsc::unbounded_channel::<String>();
    *st.watch.lock() = Some(tx);
    let lines = tokio_stream::wrappers::UnboundedReceiverStream::new(rx)
        .map(|l| Ok::<_, std::io::Error>(Bytes::from(l + "\n")));
    (json, Body::from_stream(lines)).into_response()
}

impl TestApi {
    async fn start(port: u16) -> Self {
        let state = Arc::new(ApiState::default());
        let app = axum::Router::new()
            .route(SLICES, get(slices))
            .with_state(Arc::clone(&state));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let api = TestApi { addr, state, port };
        api.set_list("list-1000.json");
        api
    }

    /// A fixture with the engines' real port for the recorded 8000.
    fn fixture(&self, name: &str) -> String {
        let text = std::fs::read_to_string(format!("{FIXTURES}/{name}")).unwrap();
        let port = self.port.to_string();
        text.replace("\"port\": 8000", &format!("\"port\": {port}"))
            .replace("\"port\":8000", &format!("\"port\":{port}"))
    }

    fn set_list(&self, name: &str) {
        *self.state.list.lock() = self.fixture(name);
    }

    fn requests(&self) -> Vec<(String, String)> {
        self.state.seen.lock().clone()
    }

    fn watches(&self) -> Vec<String> {
        let seen = self.requests();
        seen.into_iter()
            .map(|(q, _)| q)
            .filter(|q| q.contains("watch=true"))
            .collect()
    }

    fn lists(&self) -> usize {
        self.requests().len() - self.watches().len()
    }

    /// Waits for the `n`th watch to be open; returns its query.
    async fn watch_open(&self, n: usize) -> String {
        poll::poll(
            &format!("watch #{n} to open"),
            Duration::from_secs(10),
            Duration::from_millis(10),
            async || {
                let w = self.watches();
                (w.len() >= n && self.state.watch.lock().is_some()).then(|| w[n - 1].clone())
            },
        )
        .await
    }

    /// Sends a fixture's event lines on the open watch.
    fn send(&self, name: &str) {
        let text = self.fixture(name);
        let guard = self.state.watch.lock();
        let tx = guard.as_ref().expect("a watch is open");
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            tx.send(line.to_owned()).unwrap();
        }
    }

    /// Sends a fixture's event lines `gap` apart, as a controller writes
    /// two objects one after the other.
    async fn send_paced(&self, name: &str, gap: Duration) {
        let text = self.fixture(name);
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let tx = self.state.watch.lock().clone().expect("a watch is open");
            tx.send(line.to_owned()).unwrap();
            tokio::time::sleep(gap).await;
        }
    }

    /// Ends the open watch, as the server does at `timeoutSeconds`.
    fn close_watch(&self) {
        self.state.watch.lock().take();
    }
}

/// Backends on 127.0.0.2..=127.0.0.(1+n), all on one port.
async fn pods(n: u8) -> Vec<TestBackend> {
    'again: for _ in 0..20 {
        let first = TcpListener::bind("127.0.0.2:0").await.unwrap();
        let port = first.local_addr().unwrap().port();
        let mut ls = vec![first];
        for i in 3..(2 + n) {
            match TcpListener::bind((format!("127.0.0.{i}").as_str(), port)).await {
                Ok(l) => ls.push(l),
                Err(_) => continue 'again, // taken there: another port
            }
        }
        return ls
            .into_iter()
            .enumerate()
            .map(|(i, l)| TestBackend::on(&format!("pod{i}"), l))
            .collect();
    }
    panic!("no port free on every loopback address");
}

/// Every member, draining or not: (worker id, draining).
async fn members(c: &TestClient, r: &RouterProcess) -> Vec<(String, bool)> {
    let v = get_url(c, &r.url("/admin/pools/m/backends")).await.json();
    let mut out: Vec<(String, bool)> = v["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["worker_id"].as_str().unwrap().to_owned(),
                m["draining"] == true,
            )
        })
        .collect();
    out.sort();
    out
}

async fn serving(c: &TestClient, r: &RouterProcess) -> Vec<String> {
    members(c, r)
        .await
        .into_iter()
        .filter(|(_, d)| !d)
        .map(|(id, _)| id)
        .collect()
}

/// A kubeconfig in `dir` whose current context is the test API server at
/// `api` (plain http), with the bearer token in `token` if given.
fn kubeconfig(
    dir: &std::path::Path,
    api: SocketAddr,
    token: Option<&std::path::Path>,
) -> std::path::PathBuf {
    let user = token.map_or("{}".to_owned(), |t| {
        format!("{{tokenFile: {}}}", t.display())
    });
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster: {{server: 'http://{api}'}}\nusers:\n- name: test\n  user: {user}\ncontexts:\n- name: test\n  context: {{cluster: test, user: test}}\ncurrent-context: test\n"
        ),
    )
    .unwrap();
    path
}

/// The router binary with `yaml` as its config, its `KUBECONFIG` naming
/// the test API server at `api` (files in `dir`).
async fn router_on(
    dir: &std::path::Path,
    yaml: &str,
    api: SocketAddr,
    token: Option<&std::path::Path>,
) -> RouterProcess {
    let cfg = dir.join("router.yaml");
    std::fs::write(&cfg, yaml).unwrap();
    let kc = kubeconfig(dir, api, token);
    RouterProcess::spawn_env(
        &["--config", cfg.to_str().unwrap()],
        &[("KUBECONFIG", kc.to_str().unwrap())],
    )
    .await
}

async fn follows(c: &TestClient, r: &RouterProcess, want: &[&TestBackend]) -> Duration {
    let mut want: Vec<String> = want.iter().map(|b| b.url()).collect();
    want.sort();
    let t = Instant::now();
    poll::poll(
        &format!("the pool to follow the slices to {want:?}"),
        Duration::from_secs(10),
        Duration::from_millis(5),
        async || (serving(c, r).await == want).then_some(()),
    )
    .await;
    t.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_follows_endpointslices_through_splits_removals_and_reconnects() {
    let bs = pods(4).await;
    let api = TestApi::start(bs[0].addr.port()).await;
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    // As a service account token file: no trailing newline (kube-rs sends
    // the file as it is).
    std::fs::write(&token, "test-token").unwrap();
    let r = router_on(
        dir.path(),
        "pools:\n  - model: m\n    strategy: least_outstanding\n    discovery:\n      - kubernetes:\n          namespace: default\n          service: vllm-engines\n          port_name: http\n",
        api.addr,
        Some(&token),
    )
    .await;
    let c = client();

    // Listed before the router listens: the ready endpoint only.
    assert_eq!(serving(&c, &r).await, [bs[0].url()]);
    let reply = post(
        &c,
        &r.url("/v1/completions"),
        &serde_json::json!({"model": "m", "prompt": "x"}),
        &[],
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(bs[0].count(), 1);
    let (q, auth) = api.requests()[0].clone();
    assert!(
        q.contains("labelSelector=kubernetes.io%2Fservice-name%3Dvllm-engines"),
        "{q}"
    );
    assert_eq!(auth, "Bearer test-token");

    // The watch starts where the watcher's own list ended.
    let w = api.watch_open(1).await;
    assert!(w.contains("resourceVersion=1000"), "{w}");
    assert!(w.contains("allowWatchBookmarks=true"), "{w}");
    assert!(w.contains("timeoutSeconds=290"), "{w}");

    // A not-ready endpoint becomes ready: added.
    api.send("watch-1-ready.jsonl");
    let took = follows(&c, &r, &[&bs[0], &bs[1]]).await;
    println!("NUMBER k8s add followed in {took:?} (settle 200 ms)");
    // The round's status is written after its members are: wait for it, so
    // the add is counted in `before`.
    let before = poll::poll(
        "the add's round to be counted",
        Duration::from_secs(10),
        Duration::from_millis(5),
        async || {
            let st = discovery_status(&c, &r).await;
            (st["last_result"].as_array().map_or(0, Vec::len) == 2).then_some(st)
        },
    )
    .await;

    // A split: pod 1 moves to a new slice, its old slice updated 50 ms
    // before the new one is created. Applied together (settle 200 ms),
    // nothing is drained.
    api.send_paced("watch-2-split.jsonl", Duration::from_millis(50))
        .await;
    poll::poll(
        "the split to be applied",
        Duration::from_secs(10),
        Duration::from_millis(10),
        async || {
            let now = discovery_status(&c, &r).await;
            (now["resolutions"].as_u64() > before["resolutions"].as_u64()).then_some(())
        },
    )
    .await;
    let mut want = vec![(bs[0].url(), false), (bs[1].url(), false)];
    want.sort();
    assert_eq!(members(&c, &r).await, want, "a split drains nothing");
    assert_eq!(discovery_status(&c, &r).await["changes"], before["changes"]);

    // The new slice deleted: pod 1 goes; pod 2 appears terminating: skipped.
    api.send("watch-3-remove.jsonl");
    let took = follows(&c, &r, &[&bs[0]]).await;
    println!("NUMBER k8s remove followed in {took:?} (settle 200 ms)");

    // The server ends the watch: it resumes from the last resourceVersion.
    api.close_watch();
    let w = api.watch_open(2).await;
    assert!(w.contains("resourceVersion=1012"), "{w}");
    let lists = api.lists();

    // 410 Gone: the watcher relists and applies the new list (pod 3's
    // conditions are missing: ready).
    api.set_list("list-2000.json");
    api.send("watch-4-gone.jsonl");
    let took = follows(&c, &r, &[&bs[0], &bs[3]]).await;
    println!("NUMBER k8s relist after 410 followed in {took:?} (settle 200 ms)");
    assert_eq!(api.lists(), lists + 1, "one relist");
    let w = api.watch_open(3).await;
    assert!(w.contains("resourceVersion=2000"), "{w}");
    // As after the add: the round's status lands after its members.
    let want = serde_json::json!([bs[0].url(), bs[3].url()]);
    let st = poll::poll(
        "the relist's round to be counted",
        Duration::from_secs(10),
        Duration::from_millis(5),
        async || {
            let st = discovery_status(&c, &r).await;
            (st["last_result"] == want).then_some(st)
        },
    )
    .await;
    assert_eq!(st["provider"], "kubernetes:default/vllm-engines");
    assert!(st["errors"].as_u64().unwrap() >= 1, "the 410 counts: {st}");
    assert!(st["last_error"].is_null(), "cleared by the relist: {st}");
    let text = String::from_utf8_lossy(&get_url(&c, &r.url("/metrics")).await.body).into_owned();
    assert!(
        text.contains(
            r#"warmpath_discovery_backends{pool="m",provider="kubernetes:default/vllm-engines"} 2"#
        ),
        "{text}"
    );
    assert!(
        text.contains(r#"warmpath_discovery_rounds_total{pool="m",provider="kubernetes:default/vllm-engines",result="error"}"#),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_api_server_is_reported_and_empties_nothing() {
    let bs = pods(1).await;
    // A port nothing listens on: every connect is refused.
    let gone = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let api = gone.local_addr().unwrap();
    drop(gone);
    let dir = tempfile::tempdir().unwrap();
    let r = router_on(dir.path(), &format!(
        "pools:\n  - model: m\n    backends: [{{url: {}}}]\n    discovery:\n      - kubernetes:\n          service: vllm-engines\n          port_name: http\n",
        bs[0].url(),
    ), api, None).await;
    let c = client();
    let st = poll::poll(
        "the provider to report the watch's failures",
        Duration::from_secs(10),
        Duration::from_millis(10),
        async || {
            let st = discovery_status(&c, &r).await;
            (st["errors"].as_u64().unwrap_or(0) >= 3).then_some(st)
        },
    )
    .await;
    assert!(st["last_error"].is_string(), "{st}");
    assert_eq!(st["resolutions"], 0, "{st}");
    assert_eq!(
        serving(&c, &r).await,
        [bs[0].url()],
        "the static member stays"
    );
    let reply = post(
        &c,
        &r.url("/v1/completions"),
        &serde_json::json!({"model": "m", "prompt": "x"}),
        &[],
    )
    .await;
    assert_eq!(reply.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_back_at_another_ip_is_served_at_its_new_url() {
    let bs = pods(2).await;
    let api = TestApi::start(bs[0].addr.port()).await;
    let dir = tempfile::tempdir().unwrap();
    let r = router_on(
        dir.path(),
        "pools:\n  - model: m\n    discovery:\n      - kubernetes:\n          service: vllm-engines\n          port_name: http\n",
        api.addr,
        None,
    )
    .await;
    let c = client();
    let urls = async || -> Vec<(String, String)> {
        let v = get_url(&c, &r.url("/admin/pools/m/backends")).await.json();
        v["backends"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["draining"] == false)
            .map(|m| {
                (
                    m["worker_id"].as_str().unwrap().to_owned(),
                    m["url"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    assert_eq!(urls().await, [(bs[0].url(), bs[0].url())]);
    api.watch_open(1).await;
    // A StatefulSet pod restarted: the same name at a new address, so a new
    // worker id (its URL; its cache is cold anyway) and the old one drains.
    api.send("watch-5-moved.jsonl");
    poll::poll(
        "the pod's new address to serve alone",
        Duration::from_secs(10),
        Duration::from_millis(10),
        async || (urls().await == [(bs[1].url(), bs[1].url())]).then_some(()),
    )
    .await;
    let reply = post(
        &c,
        &r.url("/v1/completions"),
        &serde_json::json!({"model": "m", "prompt": "x"}),
        &[],
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!((bs[0].count(), bs[1].count()), (0, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_back_within_its_grace_returns_at_once_and_one_gone_longer_is_removed() {
    let bs = pods(2).await;
    let api = TestApi::start(bs[0].addr.port()).await;
    let dir = tempfile::tempdir().unwrap();
    // Probes every 50 ms: the last set is applied again every 250 ms (5
    // probe intervals), and a member's grace is 3 of those.
    let r = Arc::new(
        router_on(
            dir.path(),
            "health: {probe_interval_ms: 50}\npools:\n  - model: m\n    strategy: least_outstanding\n    discovery:\n      - kubernetes:\n          service: vllm-engines\n          port_name: http\n",
            api.addr,
            None,
        )
        .await,
    );
    let c = client();
    api.watch_open(1).await;
    api.send("watch-1-ready.jsonl");
    follows(&c, &r, &[&bs[0], &bs[1]]).await;
    // A request held on each engine (least_outstanding spreads them). The
    // second is sent once the first is held: two picks at once could both
    // see idle engines and land together (the pick and the in-flight count
    // are not one step).
    let mut held = Vec::new();
    for n in 1..=2 {
        let (c2, r2) = (c.clone(), Arc::clone(&r));
        held.push(tokio::spawn(async move {
            post(
                &c2,
                &r2.url("/v1/completions"),
                &serde_json::json!({"model": "m", "prompt": "x", "x_hold": "release"}),
                &[],
            )
            .await
            .status
        }));
        poll::poll(
            "the request held",
            Duration::from_secs(10),
            Duration::from_millis(5),
            async || (bs[0].active() + bs[1].active() >= n).then_some(()),
        )
        .await;
    }
    poll::poll(
        "a held request on pod 1",
        Duration::from_secs(10),
        Duration::from_millis(10),
        async || (bs[1].active() >= 1).then_some(()),
    )
    .await;
    // Pod 1 fails its readiness probe (out of rotation: its request is in
    // flight) and passes again before that request ends, within its grace
    // (3 resyncs): back in rotation at once, the same member.
    api.send("watch-6-not-ready.jsonl");
    follows(&c, &r, &[&bs[0]]).await;
    let rounds = discovery_status(&c, &r).await["resolutions"].as_u64();
    api.send("watch-1-ready.jsonl");
    // The ready answer is applied while pod 1's request is still held.
    poll::poll(
        "the ready answer's round",
        Duration::from_secs(10),
        Duration::from_millis(5),
        async || (discovery_status(&c, &r).await["resolutions"].as_u64() > rounds).then_some(()),
    )
    .await;
    assert_eq!(bs[1].active(), 1, "pod 1's request still held");
    let mut both = vec![bs[0].url(), bs[1].url()];
    both.sort();
    assert_eq!(
        serving(&c, &r).await,
        both,
        "back in rotation before its request ended"
    );
    let removed = r#"warmpath_pool_membership_changes_total{pool="m",op="remove"} "#;
    let text = String::from_utf8_lossy(&get_url(&c, &r.url("/metrics")).await.body).into_owned();
    assert_eq!(metric_value(&text, removed), None, "never removed: {text}");
    bs.iter().for_each(TestBackend::release);
    for h in held {
        assert_eq!(h.await.unwrap(), 200);
    }
    // Not ready for longer than its grace: removed by a resync after it.
    let gone_at = Instant::now();
    api.send("watch-6-not-ready.jsonl");
    poll::poll(
        "pod 1 removed",
        Duration::from_secs(20),
        Duration::from_millis(10),
        async || {
            let ms = members(&c, &r).await;
            (!ms.iter().any(|(id, _)| *id == bs[1].url())).then_some(())
        },
    )
    .await;
    let took = gone_at.elapsed();
    assert!(
        took >= Duration::from_millis(750),
        "removed {took:?} after it went not ready: within its grace (3 x resync 250 ms)"
    );
    println!("NUMBER k8s endpoint not ready past its grace removed after {took:?} (resync 250 ms)");
    let text = String::from_utf8_lossy(&get_url(&c, &r.url("/metrics")).await.body).into_owned();
    assert_eq!(metric_value(&text, removed), Some(1.0), "{text}");
}

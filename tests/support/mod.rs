//! Shared helpers of the router's end-to-end tests: a real HTTP test backend
//! that records what it receives and streams SSE, a small HTTP client, and a
//! handle on the real `warmpath-router` binary.
#![allow(dead_code, clippy::unwrap_used)]

pub(crate) mod poll;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post as route_post};
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

/// One request the backend received.
#[derive(Clone, Debug)]
pub(crate) struct Recorded {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Recorded {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

#[derive(Debug, Default)]
struct BackendState {
    name: String,
    model: String,
    adapters: Vec<String>,
    /// `/v1/models` cards replacing the plain ones, when set.
    cards: Mutex<Option<Value>>,
    log: Mutex<Vec<Recorded>>,
    healthy: AtomicBool,
    cancelled: AtomicU32,
    active: AtomicU32,
    /// Set by [`TestBackend::release`]; `x_hold: "release"` waits for it.
    released: tokio::sync::watch::Sender<bool>,
    /// Requests whose connection closed before they were answered.
    abandoned: AtomicU32,
    /// When set, every route answers 401 without `Authorization: Bearer`
    /// this key (vLLM's `--api-key`).
    api_key: Mutex<Option<String>>,
}

/// A held request: uncounted from `active` when it ends, and counted as
/// abandoned when its handler is dropped before it answers (the router
/// closed the connection: its client left).
struct Abandon<'a>(&'a BackendState, bool);

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
        if !self.1 {
            self.0.abandoned.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The 401 an engine started with `--api-key` answers a request without it.
fn refused_key(st: &BackendState, headers: &HeaderMap) -> Option<Response> {
    let key = st.api_key.lock().clone()?;
    let given = headers.get("authorization").and_then(|v| v.to_str().ok());
    (given != Some(format!("Bearer {key}").as_str())).then(|| {
        (
            StatusCode::UNAUTHORIZED,
            axum::Json(json!({"error": "Unauthorized"})),
        )
            .into_response()
    })
}

/// A test engine on 127.0.0.1:0. Request bodies may carry test knobs:
/// `x_status` (reply status), `x_hold_ms` (wait before answering),
/// `x_hold: "release"` (wait until [`TestBackend::release`], so a test
/// holds a request for as long as its checks take, however slow the
/// machine), `x_chunks` (SSE chunks, default 3), `x_delay_ms` (between
/// chunks).
pub(crate) struct TestBackend {
    pub addr: SocketAddr,
    state: Arc<BackendState>,
    server: Mutex<Option<JoinHandle<()>>>,
}

/// The exact SSE bytes backend `name` streams for `chunks` chunks.
pub(crate) fn sse_chunks(name: &str, chunks: usize) -> Vec<String> {
    let mut out: Vec<String> = (0..chunks)
        .map(|i| {
            format!(
                "data: {}\n\n",
                json!({"id": "cmpl-test", "backend": name,
                       "choices": [{"index": 0, "delta": {"content": format!("tok{i} ")}}]})
            )
        })
        .collect();
    out.push("data: [DONE]\n\n".to_owned());
    out
}

async fn handle(
    State(st): State<Arc<BackendState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let refused = refused_key(&st, &headers);
    st.log.lock().push(Recorded {
        path: uri.to_string(),
        headers,
        body: body.clone(),
    });
    if let Some(r) = refused {
        return r;
    }
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let num = |k: &str, d: u64| v.get(k).and_then(Value::as_u64).unwrap_or(d);
    let hold = num("x_hold_ms", 0);
    st.active.fetch_add(1, Ordering::SeqCst);
    let mut abandon = Abandon(&st, false);
    if hold > 0 {
        tokio::time::sleep(Duration::from_millis(hold)).await;
    }
    if v.get("x_hold").and_then(Value::as_str) == Some("release") {
        let _ = st.released.subscribe().wait_for(|open| *open).await;
    }
    abandon.1 = true;
    drop(abandon);
    let status = StatusCode::from_u16(num("x_status", 200) as u16).unwrap();
    if v.get("stream").and_then(Value::as_bool) == Some(true) {
        let chunks = sse_chunks(&st.name, num("x_chunks", 3) as usize);
        let delay = num("x_delay_ms", 0);
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let st2 = Arc::clone(&st);
        tokio::spawn(async move {
            for c in chunks {
                if tx.send(Ok(Bytes::from(c))).await.is_err() {
                    st2.cancelled.fetch_add(1, Ordering::SeqCst);
                    return;
                }
                if delay > 0 {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                }
            }
            // Dropping `tx` here ends the body.
        });
        let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
        return (
            status,
            [
                ("content-type", "text/event-stream"),
                ("cache-control", "no-cache"),
            ],
            Body::from_stream(stream),
        )
            .into_response();
    }
    let reply = json!({"id": "cmpl-test", "object": "chat.completion", "backend": st.name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": format!("hello from {}", st.name)},
                     "finish_reason": "stop"}]});
    (status, axum::Json(reply)).into_response()
}

async fn health(State(st): State<Arc<BackendState>>, headers: HeaderMap) -> StatusCode {
    if let Some(r) = refused_key(&st, &headers) {
        return r.status();
    }
    if st.healthy.load(Ordering::SeqCst) {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn models(State(st): State<Arc<BackendState>>, headers: HeaderMap) -> Response {
    if let Some(r) = refused_key(&st, &headers) {
        return r;
    }
    models_list(&st).into_response()
}

fn models_list(st: &BackendState) -> axum::Json<Value> {
    if let Some(cards) = st.cards.lock().clone() {
        return axum::Json(json!({"object": "list", "data": cards}));
    }
    let mut data = vec![json!({"id": st.model, "object": "model", "parent": null})];
    for a in &st.adapters {
        data.push(json!({"id": a, "object": "model", "parent": st.model}));
    }
    axum::Json(json!({"object": "list", "data": data}))
}

impl TestBackend {
    pub(crate) async fn start(name: &str) -> Self {
        Self::start_with(name, "m", &[]).await
    }

    /// A backend serving `model` and LoRA `adapters` (listed in /v1/models).
    pub(crate) async fn start_with(name: &str, model: &str, adapters: &[&str]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Self::serve(name, model, adapters, listener)
    }

    /// A backend serving model `m` on `listener` (e.g. another loopback
    /// address, as a pod IP).
    pub(crate) fn on(name: &str, listener: TcpListener) -> Self {
        Self::serve(name, "m", &[], listener)
    }

    fn serve(name: &str, model: &str, adapters: &[&str], listener: TcpListener) -> Self {
        let state = Arc::new(BackendState {
            name: name.to_owned(),
            model: model.to_owned(),
            adapters: adapters.iter().map(|a| (*a).to_owned()).collect(),
            healthy: AtomicBool::new(true),
            ..Default::default()
        });
        let app = Router::new()
            .route("/v1/chat/completions", route_post(handle))
            .route("/v1/completions", route_post(handle))
            .route("/invocations", route_post(handle))
            .route("/v1/embeddings", route_post(handle))
            .route("/v1/responses", route_post(handle))
            .route("/tokenize", route_post(handle))
            .route("/detokenize", route_post(handle))
            .route("/pooling", route_post(handle))
            .route("/classify", route_post(handle))
            .route("/score", route_post(handle))
            .route("/v1/score", route_post(handle))
            .route("/rerank", route_post(handle))
            .route("/v1/rerank", route_post(handle))
            .route("/v2/rerank", route_post(handle))
            .route("/health", get(health))
            .route("/v1/models", get(models))
            .with_state(Arc::clone(&state));
        let addr = listener.local_addr().unwrap();
        // Own accept loop: aborting the task drops the JoinSet, which aborts
        // every connection at once (a killed engine).
        let server = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let svc = TowerToHyperService::new(app.clone());
                conns.spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
                while conns.try_join_next().is_some() {}
            }
        });
        TestBackend {
            addr,
            state,
            server: Mutex::new(Some(server)),
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) fn name(&self) -> &str {
        &self.state.name
    }

    /// This backend as a pool member, its name as the worker id.
    pub(crate) fn config(&self) -> warmpath_router::config::BackendConfig {
        warmpath_router::config::BackendConfig {
            url: self.url(),
            worker_id: Some(self.name().to_owned()),
            api_key: None,
        }
    }

    pub(crate) fn requests(&self) -> Vec<Recorded> {
        self.state.log.lock().clone()
    }

    pub(crate) fn count(&self) -> usize {
        self.state.log.lock().len()
    }

    /// Streams the client abandoned.
    pub(crate) fn cancelled(&self) -> u32 {
        self.state.cancelled.load(Ordering::SeqCst)
    }

    /// Requests currently held (`x_hold_ms`, `x_hold`).
    pub(crate) fn active(&self) -> u32 {
        self.state.active.load(Ordering::SeqCst)
    }

    /// Makes `/v1/models` answer exactly these cards.
    pub(crate) fn set_cards(&self, cards: Value) {
        *self.state.cards.lock() = Some(cards);
    }

    /// Requests whose connection closed before they were answered (the
    /// router cancelled them upstream).
    pub(crate) fn abandoned(&self) -> u32 {
        self.state.abandoned.load(Ordering::SeqCst)
    }

    /// Demands `Authorization: Bearer key` on every route, as vLLM's
    /// `--api-key` does.
    pub(crate) fn require_key(&self, key: &str) {
        *self.state.api_key.lock() = Some(key.to_owned());
    }

    /// Lets every `x_hold: "release"` request answer, now and from now on.
    pub(crate) fn release(&self) {
        self.state.released.send_replace(true);
    }

    pub(crate) fn set_healthy(&self, ok: bool) {
        self.state.healthy.store(ok, Ordering::SeqCst);
    }

    /// Kills the server and every open connection.
    pub(crate) fn kill(&self) {
        if let Some(h) = self.server.lock().take() {
            h.abort();
        }
    }
}

impl Drop for TestBackend {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A reply read to its end.
#[derive(Debug)]
pub(crate) struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub(crate) fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .map(|v| v.to_str().unwrap())
            .unwrap_or_else(|| panic!("no {name} header in {:?}", self.headers))
    }

    pub(crate) fn backend(&self) -> &str {
        self.header("x-warmpath-backend")
    }

    pub(crate) fn decision(&self) -> &str {
        self.header("x-warmpath-decision")
    }

    /// Asserts an OpenAI-shaped error with `status`; returns its `error` object.
    pub(crate) fn error(&self, status: u16) -> Value {
        assert_eq!(
            self.status.as_u16(),
            status,
            "{:?}",
            String::from_utf8_lossy(&self.body)
        );
        let e = self.json()["error"].clone();
        assert!(e["message"].is_string() && e["type"].is_string(), "{e}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{e}");
        e
    }
}

pub(crate) type TestClient =
    Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

pub(crate) fn client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

pub(crate) fn request(
    method: &str,
    url: &str,
    body: impl Into<Bytes>,
    headers: &[(&str, &str)],
) -> hyper::Request<Full<Bytes>> {
    let mut b = hyper::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.header("content-type", "application/json")
        .body(Full::new(body.into()))
        .unwrap()
}

/// Sends and reads the whole answer.
pub(crate) async fn send(c: &TestClient, req: hyper::Request<Full<Bytes>>) -> Reply {
    let resp = c.request(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub(crate) async fn post(
    c: &TestClient,
    url: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> Reply {
    send(c, request("POST", url, body.to_string(), headers)).await
}

/// The value of the first `/metrics` line starting with `line_start` (the
/// series and its labels, then a space), if any.
pub(crate) fn metric_value(text: &str, line_start: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(line_start)?.trim().parse().ok())
}

pub(crate) async fn get_url(c: &TestClient, url: &str) -> Reply {
    send(c, request("GET", url, Bytes::new(), &[])).await
}

/// Sends and reads the body frame by frame: (status, headers, frames, error).
pub(crate) async fn post_frames(
    c: &TestClient,
    url: &str,
    body: &Value,
) -> (StatusCode, HeaderMap, Vec<Bytes>, Option<String>) {
    let resp = c
        .request(request("POST", url, body.to_string(), &[]))
        .await
        .unwrap();
    let (parts, mut body) = resp.into_parts();
    let mut frames = Vec::new();
    let mut err = None;
    while let Some(f) = body.frame().await {
        match f {
            Ok(f) => {
                if let Ok(d) = f.into_data() {
                    frames.push(d);
                }
            }
            Err(e) => {
                err = Some(e.to_string());
                break;
            }
        }
    }
    (parts.status, parts.headers, frames, err)
}

/// Polls `cond` every 10 ms for up to 10 s.
pub(crate) async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let (limit, every) = (Duration::from_secs(10), Duration::from_millis(10));
    poll::poll(what, limit, every, async || cond().then_some(())).await
}

/// A chat request whose first `prefix` characters are fixed by `seed`.
pub(crate) fn chat(model: &str, seed: &str, tail: &str) -> Value {
    json!({"model": model, "messages": [
        {"role": "system", "content": format!("{seed} ").repeat(2048 / (seed.len() + 1) + 1)},
        {"role": "user", "content": tail},
    ]})
}

/// The address a router process prints first on its piped stdout
/// (`listening on http://ADDR`); the rest of stdout is drained so the router
/// never blocks on a full pipe.
pub(crate) async fn listen_addr(child: &mut tokio::process::Child) -> SocketAddr {
    let stdout = child.stdout.take().expect("stdout must be piped");
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("router did not start within 30 s")
        .unwrap()
        .expect("router exited before listening");
    let addr = line
        .strip_prefix("listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .parse()
        .unwrap();
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    addr
}

/// The real router binary, started on 127.0.0.1:0.
pub(crate) struct RouterProcess {
    child: tokio::process::Child,
    pub addr: SocketAddr,
    logs: Option<Arc<Mutex<Vec<u8>>>>,
}

/// The first pool's first discovery provider's status (`/cache-index`).
pub(crate) async fn discovery_status(c: &TestClient, r: &RouterProcess) -> Value {
    let v = get_url(c, &r.url("/cache-index")).await.json();
    v["pools"][0]["discovery"][0].clone()
}

impl RouterProcess {
    pub(crate) async fn spawn(args: &[&str]) -> Self {
        Self::spawn_env(args, &[]).await
    }

    /// [`RouterProcess::spawn`] with extra environment variables.
    pub(crate) async fn spawn_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_warmpath-router"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let addr = listen_addr(&mut child).await;
        RouterProcess {
            child,
            addr,
            logs: None,
        }
    }

    /// [`RouterProcess::spawn_env`] logging everything (`RUST_LOG=debug`)
    /// to stderr, which a task drains into [`RouterProcess::logs`].
    pub(crate) async fn spawn_logged(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_warmpath-router"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "debug")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let addr = listen_addr(&mut child).await;
        let logs = Arc::new(Mutex::new(Vec::new()));
        let mut err = child.stderr.take().unwrap();
        let sink = Arc::clone(&logs);
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            let mut buf = [0u8; 8192];
            while let Ok(n) = err.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                sink.lock().extend_from_slice(&buf[..n]);
            }
        });
        RouterProcess {
            child,
            addr,
            logs: Some(logs),
        }
    }

    /// What a [`RouterProcess::spawn_logged`] router wrote to stderr so far.
    pub(crate) fn logs(&self) -> String {
        let logs = self.logs.as_ref().expect("started with spawn_logged");
        String::from_utf8_lossy(&logs.lock()).into_owned()
    }

    /// The binary with `yaml` as its router.yaml, read at start-up only (its
    /// directory goes after).
    pub(crate) async fn from_yaml(yaml: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("router.yaml");
        std::fs::write(&cfg, yaml).unwrap();
        Self::spawn(&["--config", cfg.to_str().unwrap()]).await
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id().unwrap()
    }

    /// Sends `signal` (a `kill` name such as `HUP`) to the process.
    fn signal(&self, signal: &str) {
        let ok = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill -{signal} failed");
    }

    /// Sends SIGTERM and waits (up to 10 s) for the process to exit.
    pub(crate) async fn terminate(mut self) -> std::process::ExitStatus {
        self.signal("TERM");
        tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .expect("router did not exit within 10 s of SIGTERM")
            .unwrap()
    }

    /// Sends SIGHUP (config reload).
    pub(crate) fn hangup(&self) {
        self.signal("HUP");
    }
}

/// The real router binary from a router.yaml: top-level `sections`, then
/// pool `m` with `pool` (indented lines such as `    strategy: random`) over
/// `backends`. The file is read at start-up only; its directory goes after.
pub(crate) async fn yaml_router(
    sections: &str,
    pool: &str,
    backends: &[&TestBackend],
) -> RouterProcess {
    let urls: Vec<String> = backends
        .iter()
        .map(|b| format!("{{url: '{}'}}", b.url()))
        .collect();
    let yaml = format!(
        "{sections}\npools:\n  - model: m\n{pool}\n    backends: [{}]\n",
        urls.join(", ")
    );
    RouterProcess::from_yaml(&yaml).await
}

/// Asserts that every backend of `r`'s first pool is ejected: none in
/// rotation, `/health` 503. (Requests would still reach them: panic routing.)
pub(crate) async fn assert_all_ejected(c: &TestClient, r: &RouterProcess) {
    let v = get_url(c, &r.url("/readyz")).await.json();
    assert_eq!(v["pools"][0]["in_rotation"].as_u64(), Some(0), "{v}");
    assert_eq!(get_url(c, &r.url("/health")).await.status, 503);
}

/// Runs the real binary to completion with `args`: (exit success, stderr).
pub(crate) async fn run_to_exit(args: &[&str]) -> (bool, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_warmpath-router"))
        .args(args)
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `n` test backends named `b0`, `b1`, … serving model `m`.
pub(crate) async fn backends(n: usize) -> Vec<TestBackend> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(TestBackend::start(&format!("b{i}")).await);
    }
    out
}

/// The real router binary over `bs` as pool `m`, with `extra` flags.
pub(crate) async fn router(bs: &[TestBackend], extra: &[&str]) -> RouterProcess {
    let urls: Vec<String> = bs.iter().map(TestBackend::url).collect();
    let mut args = vec!["--model", "m"];
    for u in &urls {
        args.push("--backend");
        args.push(u);
    }
    args.extend_from_slice(extra);
    RouterProcess::spawn(&args).await
}

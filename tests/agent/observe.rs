//! Observe mode over real sockets on 127.0.0.1: client -> agent proxy -> a tiny
//! axum engine, and agent -> test router (gRPC).

use crate::common;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use common::{wait_for, TestRouter};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use warmpath_agent::{Agent, AgentConfig, AgentError, Mode};
use warmpath_core::tokenize::{tiny, ChatTokenizer};
use warmpath_core::{hash_tokens, Expect, HashSeed, Request};
use warmpath_proto::v1::Tier;

const GPU: i32 = Tier::Gpu as i32;
const CHAT_JSON: &str = r#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello \u00e9 world"},"finish_reason":"stop"}]}"#;
const SSE: [&str; 3] = [
    "data: {\"choices\":[{\"index\":0,\"text\":\"he\"}]}\n\n",
    "data: {\"choices\":[{\"index\":0,\"text\":\"llo\"}]}\n\n",
    "data: [DONE]\n\n",
];

/// A tiny engine: records request bodies, answers chat (JSON) and completions
/// (SSE when `stream`), refuses bodies containing "reject-me" with 400.
#[derive(Clone, Default)]
struct Engine {
    seen: Arc<Mutex<Vec<(HeaderMap, Bytes)>>>,
}

async fn completion(
    axum::extract::State(e): axum::extract::State<Engine>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    e.seen.lock().unwrap().push((headers, body.clone()));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    if body.windows(9).any(|w| w == b"reject-me") {
        return (StatusCode::BAD_REQUEST, "no").into_response();
    }
    if v["stream"] == true {
        let chunks = SSE.map(|c| Ok::<_, Infallible>(Bytes::from_static(c.as_bytes())));
        return Response::builder()
            .header("content-type", "text/event-stream")
            .header("x-engine", "tiny")
            .body(Body::from_stream(futures::stream::iter(chunks)))
            .unwrap();
    }
    Response::builder()
        .header("content-type", "application/json")
        .header("x-engine", "tiny")
        .body(Body::from(CHAT_JSON))
        .unwrap()
}

async fn start_engine() -> (SocketAddr, Engine) {
    let engine = Engine::default();
    let app = Router::new()
        .route("/v1/chat/completions", post(completion))
        .route("/v1/completions", post(completion))
        .route("/health", get(|| async { "engine ok" }))
        .with_state(engine.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (addr, engine)
}

fn config(engine: SocketAddr, tokenizer: &Path, routers: Vec<String>) -> AgentConfig {
    let mut c = AgentConfig::new("w1", "m", &format!("http://{engine}/"), "");
    c.mode = Mode::Observe;
    c.tokenizer = Some(tokenizer.to_owned());
    c.routers = routers;
    c.load_interval = Duration::ZERO;
    c.link.backoff_min = Duration::from_millis(20);
    c.link.backoff_max = Duration::from_millis(200);
    c
}

/// What the router should hold for `body`: computed from core directly.
fn expected(dir: &Path, body: &serde_json::Value, expect: Expect, tenant: &str) -> Vec<u64> {
    let tok = ChatTokenizer::load(dir).unwrap();
    let req = Request::from_slice(body.to_string().as_bytes(), expect).unwrap();
    let ids = tok.encode_request(&req).unwrap();
    let hashes = hash_tokens(HashSeed::new("m", "", tenant), 16, &ids);
    assert!(hashes.len() >= 3, "test prompts span several blocks");
    hashes.into_iter().map(|h| h.0).collect()
}

fn holds(router: &TestRouter, hashes: &[u64]) -> bool {
    let v = router.view();
    hashes.iter().all(|h| v.blocks.contains(&(*h, GPU)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_through_the_proxy_reach_the_router_and_bytes_pass_through() {
    let dir = tempfile::tempdir().unwrap();
    tiny::write_model_dir(dir.path()).unwrap();
    let (engine_addr, engine) = start_engine().await;
    let router = TestRouter::start("127.0.0.1:0".parse().unwrap(), None).await;
    let agent = Agent::start(config(engine_addr, dir.path(), vec![router.url()]), None)
        .await
        .unwrap();
    let proxy = format!("http://{}", agent.http_addr());
    let client = reqwest::Client::new();

    // Refused by the engine: forwarded, answered, never mirrored.
    let rejected = serde_json::json!({"model": "m", "prompt": format!("reject-me {}", tiny::corpus_slice(5000, 600))});
    let r = client
        .post(format!("{proxy}/v1/completions"))
        .body(rejected.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.bytes().await.unwrap(), "no");

    // Chat, not streamed, tenant from the header only: a route, not a
    // cache (the engine isolates by cache_salt alone), so hashed unsalted.
    let chat = serde_json::json!({"model": "m", "messages": [
        {"role": "system", "content": tiny::corpus_slice(0, 600)},
        {"role": "user", "content": "and so?"}]});
    let r = client
        .post(format!("{proxy}/v1/chat/completions"))
        .header("x-prefix-aware-id", "acme")
        .header("content-type", "application/json")
        .body(chat.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-engine"], "tiny");
    assert_eq!(r.headers()["content-type"], "application/json");
    assert_eq!(r.bytes().await.unwrap(), CHAT_JSON.as_bytes());

    // Completion, streamed, tenant from cache_salt.
    let comp = serde_json::json!({"model": "m", "stream": true, "cache_salt": "globex",
        "prompt": tiny::corpus_slice(2000, 600)});
    let r = client
        .post(format!("{proxy}/v1/completions?trace=1"))
        .body(comp.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    assert_eq!(r.bytes().await.unwrap(), SSE.concat().as_bytes());

    // The engine got the bodies byte for byte, headers included.
    {
        let seen = engine.seen.lock().unwrap();
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[1].1, chat.to_string().as_bytes());
        assert_eq!(seen[1].0["x-prefix-aware-id"], "acme");
        assert_eq!(seen[2].1, comp.to_string().as_bytes());
    }

    let want_chat = expected(dir.path(), &chat, Expect::Chat, "");
    let want_comp = expected(dir.path(), &comp, Expect::Completion, "globex");
    wait_for(
        "the router holds both prompts' blocks",
        || holds(&router, &want_chat) && holds(&router, &want_comp),
        || async {},
    )
    .await;
    let view = router.view();
    assert_eq!(
        view.blocks.len(),
        want_chat.len() + want_comp.len(),
        "nothing else, rejected prompt not mirrored"
    );
    assert_eq!(view.seq_errors, 0);
    assert_eq!(view.hellos.last().unwrap().block_size, 16);
    let want_rejected = expected(dir.path(), &rejected, Expect::Completion, "");
    assert!(!want_rejected
        .iter()
        .any(|h| view.blocks.contains(&(*h, GPU))));

    // Other paths go to the engine; the agent's own pages live under /warmpath/.
    let health = client.get(format!("{proxy}/health")).send().await.unwrap();
    assert_eq!(health.text().await.unwrap(), "engine ok");
    let missing = client
        .get(format!("{proxy}/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404, "the engine's answer, passed through");
    let own: serde_json::Value = client
        .get(format!("{proxy}/warmpath/health"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(own["observe"]["observed"], 2);
    assert_eq!(own["observe"]["forwarded"], 5);
    assert_eq!(own["blocks"], (want_chat.len() + want_comp.len()) as u64);

    agent.shutdown().await;
    router.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mirror_evicts_and_the_router_follows() {
    let dir = tempfile::tempdir().unwrap();
    tiny::write_model_dir(dir.path()).unwrap();
    let (engine_addr, _engine) = start_engine().await;
    let router = TestRouter::start("127.0.0.1:0".parse().unwrap(), None).await;
    let a = serde_json::json!({"model": "m", "prompt": tiny::corpus_slice(0, 600)});
    let b = serde_json::json!({"model": "m", "prompt": tiny::corpus_slice(3000, 600)});
    let (want_a, want_b) = (
        expected(dir.path(), &a, Expect::Completion, ""),
        expected(dir.path(), &b, Expect::Completion, ""),
    );
    let mut cfg = config(engine_addr, dir.path(), vec![router.url()]);
    cfg.cache_blocks = want_b.len(); // room for one prompt only
    let agent = Agent::start(cfg, None).await.unwrap();
    let proxy = format!("http://{}", agent.http_addr());
    let client = reqwest::Client::new();
    for body in [&a, &b] {
        let r = client
            .post(format!("{proxy}/v1/completions"))
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.bytes().await.unwrap(), CHAT_JSON.as_bytes());
    }
    wait_for(
        "b replaced a",
        || {
            holds(&router, &want_b)
                && !want_a
                    .iter()
                    .any(|h| router.view().blocks.contains(&(*h, GPU)))
        },
        || async {},
    )
    .await;
    assert_eq!(router.view().blocks.len(), want_b.len());
    assert_eq!(
        agent.observe_stats().blocks_evicted.get(),
        want_a.len().min(want_b.len()) as u64
    );
    agent.shutdown().await;
    router.stop().await;
}

#[tokio::test]
async fn observe_mode_refuses_to_start_without_a_usable_tokenizer() {
    let engine: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut c = config(engine, Path::new("/nonexistent/tokenizer"), vec![]);
    c.tokenizer = None;
    let e = Agent::start(c.clone(), None).await.unwrap_err();
    assert!(
        matches!(e, AgentError::Config(_)) && e.to_string().contains("--tokenizer"),
        "{e}"
    );
    c.tokenizer = Some("/nonexistent/tokenizer".into());
    let e = Agent::start(c, None).await.unwrap_err();
    assert!(matches!(e, AgentError::Tokenizer { .. }), "{e}");
}

#[tokio::test]
async fn an_unreachable_engine_is_a_502() {
    let dir = tempfile::tempdir().unwrap();
    tiny::write_model_dir(dir.path()).unwrap();
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let agent = Agent::start(config(closed, dir.path(), vec![]), None)
        .await
        .unwrap();
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", agent.http_addr()))
        .body(r#"{"model":"m","prompt":"hi"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "engine_unavailable");
    assert_eq!(agent.observe_stats().engine_errors.get(), 1);
    assert_eq!(agent.observe_stats().observed.get(), 0);
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_streams_through_the_proxy_add_under_5_ms_at_p99() {
    use axum::serve::ListenerExt;
    use futures::StreamExt;
    use std::time::Instant;
    let dir = tempfile::tempdir().unwrap();
    tiny::write_model_dir(dir.path()).unwrap();
    // An engine that streams its chunks 2 ms apart from sockets with
    // TCP_NODELAY: a delayed-ACK stall (~40 ms) can then only be the agent's.
    async fn trickle() -> Response {
        let chunks = futures::stream::iter(SSE).then(|c| async move {
            tokio::time::sleep(Duration::from_millis(2)).await;
            Ok::<_, Infallible>(Bytes::from_static(c.as_bytes()))
        });
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from_stream(chunks))
            .unwrap()
    }
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let engine_addr = l.local_addr().unwrap();
    let l = l.tap_io(|t| t.set_nodelay(true).unwrap());
    let app = Router::new().route("/v1/completions", post(trickle));
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    let router = TestRouter::start("127.0.0.1:0".parse().unwrap(), None).await;
    let agent = Agent::start(config(engine_addr, dir.path(), vec![router.url()]), None)
        .await
        .unwrap();
    let body =
        serde_json::json!({"model": "m", "prompt": "hello there", "stream": true}).to_string();
    let client = reqwest::Client::new();
    let direct = format!("http://{engine_addr}/v1/completions");
    let proxied = format!("http://{}/v1/completions", agent.http_addr());
    let time = async |url: &str| {
        let t = Instant::now();
        let r = client.post(url).body(body.clone()).send().await.unwrap();
        let got = r.bytes().await.unwrap();
        assert!(got.ends_with(b"data: [DONE]\n\n"), "{got:?}");
        t.elapsed()
    };
    // Interleaved, on one keep-alive connection to each; the first few warm up.
    let (mut d, mut p) = (Vec::new(), Vec::new());
    for i in 0..105 {
        let (a, b) = (time(&direct).await, time(&proxied).await);
        if i >= 5 {
            d.push(a);
            p.push(b);
        }
    }
    d.sort();
    p.sort();
    // p99 against p99: a loaded machine's scheduling jitter hits both paths
    // alike, while a delayed-ACK stall (~40 ms) hits every proxied request.
    let at = |v: &[Duration]| v[(v.len() * 99).div_ceil(100) - 1];
    let (p99, direct99) = (at(&p), at(&d));
    let added = p99.saturating_sub(direct99);
    eprintln!(
        "direct p50 {:?} p99 {direct99:?}, proxied p50 {:?} p99 {p99:?}, added at p99 {added:?}",
        d[d.len() / 2],
        p[p.len() / 2]
    );
    assert!(added < Duration::from_millis(5), "added {added:?} at p99");
}

/// Reads `c` until the peer closes it or `limit` passes: what it sent, and
/// whether it closed.
async fn read_to_close(c: &mut tokio::net::TcpStream, limit: Duration) -> (String, bool) {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let until = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(until, c.read(&mut buf)).await {
            Err(_) => return (String::from_utf8_lossy(&got).into_owned(), false),
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into_owned(), true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// A chat request through the proxy on a fresh client: the engine's answer.
async fn chat_through(proxy: SocketAddr) -> reqwest::Response {
    let chat = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    reqwest::Client::new()
        .post(format!("http://{proxy}/v1/chat/completions"))
        .body(chat.to_string())
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slowloris_head_and_an_idle_keep_alive_are_closed_while_others_are_served() {
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;
    let dir = tempfile::tempdir().unwrap();
    tiny::write_model_dir(dir.path()).unwrap();
    let (engine_addr, _engine) = start_engine().await;
    let mut cfg = config(engine_addr, dir.path(), vec![]);
    cfg.http.header_timeout = Duration::from_millis(400);
    cfg.http.idle_timeout = Duration::from_millis(1500);
    let agent = Agent::start(cfg, None).await.unwrap();
    let addr = agent.http_addr();

    // Half a head, then nothing: closed after the header deadline, with no
    // answer (the request never began).
    let t = std::time::Instant::now();
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-le")
        .await
        .unwrap();
    // Another client is served meanwhile.
    let r = chat_through(addr).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap(), CHAT_JSON.as_bytes());
    let (_, closed) = read_to_close(&mut slow, Duration::from_secs(5)).await;
    assert!(closed, "a half-sent head still open after 5 s");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(380),
        "closed too early: {took:?}"
    );

    // A connection that sends nothing at all is a head that never came.
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let (_, closed) = read_to_close(&mut silent, Duration::from_secs(5)).await;
    assert!(closed, "a silent connection still open after 5 s");

    // A keep-alive connection: answered, then idle. Not closed at the header
    // deadline (it owes no head), closed at the idle one.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET /warmpath/livez HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let t = std::time::Instant::now();
    let (answer, closed) = read_to_close(&mut idle, Duration::from_secs(5)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(closed, "an idle keep-alive connection still open after 5 s");
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(1400),
        "closed before the idle deadline: {took:?}"
    );

    // And a keep-alive client that keeps talking keeps its connection.
    let client = reqwest::Client::new();
    for _ in 0..3 {
        let r = client
            .get(format!("http://{addr}/warmpath/livez"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_get_a_503_at_once_and_service_resumes_when_slots_free() {
    use tokio::io::AsyncWriteExt;
    use tokio::net::TcpStream;
    let dir = tempfile::tempdir().unwrap();
    tiny::write_model_dir(dir.path()).unwrap();
    let (engine_addr, _engine) = start_engine().await;
    let mut cfg = config(engine_addr, dir.path(), vec![]);
    cfg.http.max_connections = 3;
    cfg.http.header_timeout = Duration::from_millis(1500);
    let agent = Agent::start(cfg, None).await.unwrap();
    let addr = agent.http_addr();

    // Three slowloris connections take every slot.
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut c = TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET /warmpath/livez HTTP/1.1\r\n")
            .await
            .unwrap();
        held.push(c);
    }
    // One more: refused at once, with an answer that says why.
    let t = std::time::Instant::now();
    let mut over = TcpStream::connect(addr).await.unwrap();
    let (answer, closed) = read_to_close(&mut over, Duration::from_secs(5)).await;
    assert!(
        closed && t.elapsed() < Duration::from_secs(1),
        "{:?}",
        t.elapsed()
    );
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );
    assert!(answer.contains("too many connections"), "{answer}");

    // The header deadline frees the slots: a normal client is served again.
    let mut served = None;
    for _ in 0..50 {
        let r = reqwest::Client::new()
            .post(format!("http://{addr}/v1/chat/completions"))
            .body(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#)
            .timeout(Duration::from_secs(5))
            .send()
            .await;
        if let Ok(r) = r {
            if r.status() == 200 {
                served = Some(r.bytes().await.unwrap());
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(served.as_deref(), Some(CHAT_JSON.as_bytes()));
    for mut c in held {
        let (_, closed) = read_to_close(&mut c, Duration::from_secs(5)).await;
        assert!(closed, "a slowloris slot was never freed");
    }
    agent.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_only_tenants_prompt_mirrored_by_the_agent_matches_on_the_router() {
    use clap::Parser;
    use warmpath_router::config::{BackendConfig, Isolation};
    let dir = tempfile::tempdir().unwrap();
    tiny::write_model_dir(dir.path()).unwrap();
    let (engine_addr, engine) = start_engine().await;
    // The router must name the agent's proxy before the agent starts.
    let agent_addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let tokenizer = dir.path().to_str().unwrap();
    let cli = warmpath_router::Cli::try_parse_from([
        "warmpath-router",
        "--listen",
        "127.0.0.1:0",
        "--grpc-listen",
        "127.0.0.1:0",
        "--model",
        "m",
        "--block-size",
        "16",
        "--tokenizer",
        tokenizer,
    ])
    .unwrap();
    let mut rc = cli.load().unwrap();
    rc.pools[0].tenants.isolation = Isolation::RouteOnly;
    let mut b = BackendConfig::new(format!("http://{agent_addr}"));
    b.worker_id = Some("w1".into());
    rc.pools[0].backends = vec![b];
    let router = warmpath_router::start(rc, tokio_util::sync::CancellationToken::new())
        .await
        .unwrap();
    let mut cfg = config(
        engine_addr,
        dir.path(),
        vec![format!("http://{}", router.grpc_addr.unwrap())],
    );
    cfg.listen = agent_addr;
    let agent = Agent::start(cfg, None).await.unwrap();

    // A tenant-tagged chat through the router, to the agent, to the engine.
    let chat = serde_json::json!({"model": "m", "messages": [
        {"role": "system", "content": tiny::corpus_slice(0, 600)},
        {"role": "user", "content": "and so?"}]});
    let client = reqwest::Client::new();
    let front = format!("http://{}", router.http_addr);
    let r = client
        .post(format!("{front}/v1/chat/completions"))
        .header("x-prefix-aware-id", "acme")
        .header("content-type", "application/json")
        .body(chat.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.bytes().await.unwrap(), CHAT_JSON.as_bytes());
    {
        let seen = engine.seen.lock().unwrap();
        let forwarded: serde_json::Value = serde_json::from_slice(&seen[0].1).unwrap();
        assert!(
            forwarded.get("cache_salt").is_none(),
            "route_only: the engine shares its cache"
        );
    }

    // The router's own preview of the same request for the same tenant
    // matches every block the agent mirrored and published.
    let want = expected(dir.path(), &chat, Expect::Chat, "").len() as u64;
    let mut last = serde_json::Value::Null;
    for _ in 0..100 {
        last = client
            .post(format!("{front}/cache-index/query"))
            .header("x-prefix-aware-id", "acme")
            .header("content-type", "application/json")
            .body(chat.to_string())
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if last["workers"][0]["matched_blocks"] == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(last["tenant"], "acme", "{last}");
    assert_eq!(last["blocks"], want, "{last}");
    assert_eq!(last["workers"][0]["matched_blocks"], want, "{last}");
    agent.shutdown().await;
    router.shutdown();
    router.wait().await;
}

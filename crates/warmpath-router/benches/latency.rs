//! Added latency of the router: the same ~8000-token chat request sent
//! directly to a zero-delay backend and through the router (`kv_aware`,
//! tokenization on), interleaved, at a fixed open-loop rate. Every request
//! shares the long system prompt and asks a question of its own (as users
//! do), so the short question is tokenized afresh each time while the long
//! prompt comes from the tokenizer's segment cache.
//!
//! ```text
//! cargo bench -p warmpath-router --bench latency -- [--rate 200] [--requests 2000] [--tokens 8000] [--strategy kv_aware] [--shape system|llama31|rag] [--bare-proxy] [--backends 1] [--ingest] [--agents]
//! ```
//!
//! `--backends N` puts N zero-delay backends (each its own listener) in the
//! pool, so the router's per-request work over its backends shows; the
//! direct half goes to the first.
//!
//! `--ingest` has the agent ingest listen; `--agents` also connects one
//! hand-made agent stream per backend (Hello, an empty snapshot, a load), so
//! routing reads agent entries as in a fleet whose engines all have agents.
//! `--warm C` makes the first C backends' snapshots hold the document's
//! blocks (every request then matches them on C workers), `--filler B`
//! gives every backend's snapshot B blocks of chains no request asks for
//! (an index far larger than the CPU caches, as in a fleet), and `--open`
//! says the snapshots are not prefix-closed, so the router's index walk
//! probes every block instead of skipping ahead.
//!
//! `--shape` picks the request and template: `system` (the default: the
//! document is the system prompt, the tiny model's Llama-3.0-style template),
//! `llama31` (the same chat through a template shaped like Llama 3.1
//! Instruct's: system-message extraction, a date header, tool branches;
//! `benches/data/llama31_template.jinja`) or `rag` (no system prompt: the
//! document and the question share one user message, so the long text
//! repeats with a different tail).
//!
//! `--strategy random` gives the cost of the router's hop without
//! tokenization or hashing. `--bare-proxy` sends the routed half through the
//! smallest proxy hyper allows instead of the router (read the body, forward
//! it on a pooled connection, pass the answer back): the floor any HTTP
//! proxy pays for the extra hop on this machine.
//!
//! Latency is measured from the moment a request is sent to the end of its
//! response body, on one pooled keep-alive client. Everything (client,
//! router, backend) shares this process and the machine's cores, so the
//! numbers include that contention.
#![allow(clippy::unwrap_used)]

// The router binary's allocator (src/main.rs), so that the in-process
// router here runs as the binary does.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::json;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use warmpath_core::tokenize::{tiny, ChatTokenizer};
use warmpath_core::{Expect, Request};
use warmpath_proto::v1::{agent_message::Msg, AgentMessage, Hello, Load, RouterMessage};
use warmpath_proto::CacheEventsClient;
use warmpath_router::config::{BackendConfig, PoolConfig, RouterConfig};

const REPLY: &str = r#"{"id":"cmpl-bench","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}"#;

async fn zero_delay_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let svc = service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                    // Read the whole request, as an engine would.
                    let _ = req.into_body().collect().await;
                    Ok::<_, Infallible>(
                        hyper::Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from_static(REPLY.as_bytes())))
                            .unwrap(),
                    )
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// The smallest proxy hyper allows: read the body, send it on a pooled
/// keep-alive connection, pass the answer back. No routing, no metrics, no
/// axum — the floor under the router's own hop on this machine.
async fn bare_proxy(backend: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.set_nodelay(true);
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(http);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            stream.set_nodelay(true).unwrap();
            let client = client.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let client = client.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let body = body
                            .collect()
                            .await
                            .map_err(std::io::Error::other)?
                            .to_bytes();
                        let up =
                            hyper::Request::post(format!("http://{backend}{}", parts.uri.path()))
                                .header("content-type", "application/json")
                                .body(Full::new(body))
                                .unwrap();
                        client.request(up).await.map_err(std::io::Error::other)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

/// The bare proxy's work behind axum (`axum::serve`, a `Router` with one
/// POST route, the body read through axum's `Body`): what axum adds.
async fn bare_axum_proxy(backend: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.set_nodelay(true);
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(http);
    let handler = move |body: axum::body::Body| {
        let client = client.clone();
        async move {
            let body = body.collect().await.unwrap().to_bytes();
            let up = hyper::Request::post(format!("http://{backend}/v1/chat/completions"))
                .header("content-type", "application/json")
                .body(Full::new(body))
                .unwrap();
            let resp = client.request(up).await.unwrap();
            resp.map(axum::body::Body::new)
        }
    };
    let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(handler));
    use axum::serve::ListenerExt;
    let listener = listener.tap_io(|tcp| tcp.set_nodelay(true).unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// A hand-made agent stream for `worker` (Hello, an empty snapshot, one
/// engine load), held open while the returned parts live, so the router's
/// agent maps have an entry per backend as in a fleet with agents.
async fn agent_stream(
    grpc: SocketAddr,
    worker: &str,
    blocks: Vec<warmpath_proto::v1::Block>,
    prefix_closed: bool,
) -> (
    tokio::sync::mpsc::Sender<AgentMessage>,
    tonic::Streaming<RouterMessage>,
) {
    let mut client = CacheEventsClient::connect(format!("http://{grpc}"))
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let snapshot = warmpath_proto::snapshot_chunks(1, &blocks, prefix_closed)
        .into_iter()
        .map(Msg::Snapshot);
    let msgs = [Msg::Hello(Hello {
        worker_id: worker.into(),
        endpoint: worker.into(),
        model: "m".into(),
        block_size: 16,
        epoch: 1,
        agent_version: "latency bench".into(),
        dp_rank: 0,
        partial: false,
    })]
    .into_iter()
    .chain(snapshot)
    .chain([Msg::Load(Load {
        running: 0,
        waiting: 0,
        kv_usage: 0.0,
        engine_up: true,
        capacity_blocks: 0,
        partial: false,
    })]);
    let req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let sending = tokio::spawn({
        let tx = tx.clone();
        async move {
            for m in msgs {
                tx.send(AgentMessage { msg: Some(m) }).await.unwrap();
            }
        }
    });
    let mut answers = client.publish(req).await.unwrap().into_inner();
    sending.await.unwrap();
    // The snapshot's ack: the router took the stream.
    let first = tokio::time::timeout(Duration::from_secs(10), answers.message())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(
            first.and_then(|m| m.msg),
            Some(warmpath_proto::v1::router_message::Msg::Ack(_))
        ),
        "agent stream for {worker} not taken"
    );
    (tx, answers)
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What each request looks like (`--shape`).
#[derive(Clone, Copy, PartialEq)]
enum Shape {
    System,
    Llama31,
    Rag,
}

impl Shape {
    fn from_args() -> Shape {
        let args: Vec<String> = std::env::args().collect();
        match args
            .iter()
            .position(|a| a == "--shape")
            .and_then(|i| args.get(i + 1))
            .map_or("system", String::as_str)
        {
            "system" => Shape::System,
            "llama31" => Shape::Llama31,
            "rag" => Shape::Rag,
            other => panic!("--shape {other}: expected system, llama31 or rag"),
        }
    }

    fn name(self) -> &'static str {
        match self {
            Shape::System => "system",
            Shape::Llama31 => "llama31",
            Shape::Rag => "rag",
        }
    }

    /// The chat body for a document and a question.
    fn body(self, doc: &str, question: &str) -> serde_json::Value {
        match self {
            Shape::System | Shape::Llama31 => {
                json!({"model": "m", "max_tokens": 1, "messages": [
                    {"role": "system", "content": doc},
                    {"role": "user", "content": question}]})
            }
            Shape::Rag => json!({"model": "m", "max_tokens": 1, "messages": [
                {"role": "user", "content": format!("{doc}\n\n{question}")}]}),
        }
    }
}

/// The tiny model's files, with the Llama-3.1-shaped template for that shape.
fn write_model(dir: &std::path::Path, shape: Shape) {
    tiny::write_model_dir(dir).unwrap();
    if shape == Shape::Llama31 {
        let path = dir.join("tokenizer_config.json");
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        config["chat_template"] = include_str!("data/llama31_template.jinja").into();
        std::fs::write(&path, config.to_string()).unwrap();
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let rate = arg("--rate", 200).max(1);
    let n = arg("--requests", 2000).max(10);
    let tokens = arg("--tokens", 8000);
    let args: Vec<String> = std::env::args().collect();
    let strategy: warmpath_core::Strategy = args
        .iter()
        .position(|a| a == "--strategy")
        .and_then(|i| args.get(i + 1))
        .map_or("kv_aware", String::as_str)
        .parse()
        .unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let fleet = arg("--backends", 1).max(1);
    rt.block_on(run(rate, n, tokens, strategy, Shape::from_args(), fleet));
}

async fn run(
    rate: usize,
    n: usize,
    target_tokens: usize,
    strategy: warmpath_core::Strategy,
    shape: Shape,
    fleet: usize,
) {
    const SLOT: &str = "Summarise the document above in one sentence.";
    let dir = tempfile::tempdir().unwrap();
    write_model(dir.path(), shape);
    let tok = ChatTokenizer::load(dir.path()).unwrap();
    // Grow the document until the request is ~target_tokens tokens.
    let mut doc = String::new();
    let mut at = 0;
    let body = loop {
        let body = shape.body(&doc, SLOT);
        let req = Request::from_slice(body.to_string().as_bytes(), Expect::Chat).unwrap();
        if tok.encode_request(&req).unwrap().len() >= target_tokens {
            break body;
        }
        doc.push_str(&tiny::corpus_slice(at, 512));
        at += 509;
    };
    let req = Request::from_slice(body.to_string().as_bytes(), Expect::Chat).unwrap();
    let ntok = tok.encode_request(&req).unwrap().len();
    // Each request's body: the same JSON with a question of its own.
    let text = body.to_string();
    let at = text.find(SLOT).unwrap();
    let (head, tail) = (&text[..at], &text[at + SLOT.len()..]);
    let body_for = |i: usize| -> Bytes {
        Bytes::from(format!(
            "{head}Question {i}: what does the document above say about topic {}?{tail}",
            i * 7919 % 1000
        ))
    };
    let body = body_for(0);

    let mut addrs = Vec::with_capacity(fleet);
    for _ in 0..fleet {
        addrs.push(zero_delay_backend().await);
    }
    let backend = addrs[0];
    let mut pool = PoolConfig::new("m");
    pool.tokenizer = Some(dir.path().to_owned());
    pool.strategy = Some(strategy);
    pool.backends = addrs
        .iter()
        .map(|a| BackendConfig::new(format!("http://{a}")))
        .collect();
    // `--ingest`: the agent ingest listens (no agent connects), so each
    // request reads the agents' maps for every backend; `--agents` also
    // connects one agent stream per backend.
    let with_agents = std::env::args().any(|a| a == "--agents");
    let ingest = with_agents || std::env::args().any(|a| a == "--ingest");
    let config = RouterConfig {
        listen: "127.0.0.1:0".into(),
        grpc_listen: ingest.then(|| "127.0.0.1:0".into()),
        pools: vec![pool],
        ..Default::default()
    };
    let router = warmpath_router::start(config, CancellationToken::new())
        .await
        .unwrap();
    let warm = arg("--warm", 0);
    let filler = arg("--filler", 0);
    let closed = !std::env::args().any(|a| a == "--open");
    // The document's blocks: the common start of two requests' chains.
    let chain_of = |b: &Bytes| {
        let r = Request::from_slice(b, Expect::Chat).unwrap();
        let ids = tok.encode_request(&r).unwrap();
        warmpath_core::hash_tokens(warmpath_core::HashSeed::new("m", "", ""), 16, &ids)
    };
    let (c0, c1) = (chain_of(&body_for(0)), chain_of(&body_for(1)));
    let shared = c0.iter().zip(&c1).take_while(|(a, b)| a == b).count();
    let as_blocks = |hs: &[warmpath_core::BlockHash]| -> Vec<warmpath_proto::v1::Block> {
        hs.iter()
            .enumerate()
            .map(|(i, h)| warmpath_proto::v1::Block {
                hash: h.0,
                parent: i.checked_sub(1).map(|p| hs[p].0),
                tier: warmpath_proto::v1::Tier::Gpu as i32,
            })
            .collect()
    };
    let _agents = if with_agents {
        let grpc = router.grpc_addr.unwrap();
        let mut held = Vec::with_capacity(fleet);
        for (k, a) in addrs.iter().enumerate() {
            let mut blocks = if k < warm {
                as_blocks(&c0[..shared])
            } else {
                Vec::new()
            };
            // Chains of 512 blocks no request asks for.
            for c in 0..filler.div_ceil(512) {
                let seed = warmpath_core::HashSeed::new("m", "", &format!("filler {k} {c}"));
                let toks: Vec<u32> = (0..512 * 16).collect();
                let hs = warmpath_core::hash_tokens(seed, 16, &toks);
                blocks.extend(as_blocks(&hs[..(filler - c * 512).min(512)]));
            }
            held.push(agent_stream(grpc, &format!("http://{a}"), blocks, closed).await);
        }
        if warm > 0 {
            println!(
                "{warm} backend(s) hold the document's {shared} blocks, every backend {filler} more; prefix-closed: {closed}"
            );
        }
        held
    } else {
        Vec::new()
    };
    let direct_url = format!("http://{backend}/v1/chat/completions");
    let bare = std::env::args().any(|a| a == "--bare-proxy");
    let bare_axum = std::env::args().any(|a| a == "--bare-axum");
    let routed_addr = if bare_axum {
        bare_axum_proxy(backend).await
    } else if bare {
        bare_proxy(backend).await
    } else {
        router.http_addr
    };
    let routed_url = format!("http://{routed_addr}/v1/chat/completions");
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let client = Arc::new(client);

    let once = |url: String, body: Bytes| {
        let client = Arc::clone(&client);
        async move {
            let req = hyper::Request::post(url)
                .header("content-type", "application/json")
                .body(Full::new(body))
                .unwrap();
            let t = Instant::now();
            let resp = client.request(req).await.unwrap();
            assert!(resp.status().is_success());
            let _ = resp.into_body().collect().await.unwrap();
            t.elapsed().as_secs_f64() * 1e3
        }
    };
    // Warm up connections and the tokenizer's segment cache.
    for i in 0..50 {
        once(direct_url.clone(), body_for(n + i)).await;
        once(routed_url.clone(), body_for(n + i)).await;
    }
    if warm > 0 {
        // The router sees the warm blocks as the bench computed them.
        let req = hyper::Request::post(format!("http://{}/cache-index/query", router.http_addr))
            .header("content-type", "application/json")
            .body(Full::new(body_for(0)))
            .unwrap();
        let resp = client.request(req).await.unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
        let best = v["workers"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|w| w["matched_blocks"].as_u64())
            .max();
        assert_eq!(best, Some(shared as u64), "the router's match: {v}");
    }
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(2 * n);
    for i in 0..n {
        let t = start + period * i as u32;
        let body = body_for(i);
        let (d, r) = (
            once(direct_url.clone(), body.clone()),
            once(routed_url.clone(), body),
        );
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(t).await;
            (0, d.await)
        }));
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep_until(t + period / 2).await;
            (1, r.await)
        }));
    }
    let (mut direct, mut routed) = (Vec::new(), Vec::new());
    for t in tasks {
        let (which, ms) = t.await.unwrap();
        if which == 0 {
            direct.push(ms)
        } else {
            routed.push(ms)
        }
    }
    direct.sort_by(f64::total_cmp);
    routed.sort_by(f64::total_cmp);
    println!(
        "{} added latency: {n} requests each way, {rate}/s, {ntok}-token chat request ({} bytes), shape {}, strategy {}, {fleet} backend(s)",
        if bare_axum {
            "bare axum proxy"
        } else if bare {
            "bare hyper proxy"
        } else {
            "router"
        },
        body.len(),
        shape.name(),
        strategy.as_str()
    );
    println!(
        "{:>8} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "max ms"
    );
    for (name, v) in [("direct", &direct), ("routed", &routed)] {
        println!(
            "{name:>8} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
            pct(v, 0.5),
            pct(v, 0.9),
            pct(v, 0.99),
            pct(v, 0.999),
            v[v.len() - 1]
        );
    }
    println!(
        "{:>8} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
        "added",
        pct(&routed, 0.5) - pct(&direct, 0.5),
        pct(&routed, 0.9) - pct(&direct, 0.9),
        pct(&routed, 0.99) - pct(&direct, 0.99),
        pct(&routed, 0.999) - pct(&direct, 0.999)
    );
    // The router's own view of where the time goes (means per phase).
    let req = hyper::Request::get(format!("http://{}/metrics", router.http_addr))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let text = client
        .request(req)
        .await
        .unwrap()
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes();
    let text = String::from_utf8_lossy(&text);
    let series = |suffix: &str, phase: &str| -> f64 {
        text.lines()
            .find(|l| {
                l.starts_with(&format!("warmpath_router_overhead_seconds_{suffix}"))
                    && l.contains(&format!("phase=\"{phase}\""))
            })
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    // Quantiles from the histogram's buckets: the upper bound of the bucket
    // holding the quantile.
    let quantile = |phase: &str, q: f64, count: f64| -> Option<f64> {
        let prefix = "warmpath_router_overhead_seconds_bucket{";
        text.lines()
            .filter(|l| l.starts_with(prefix) && l.contains(&format!("phase=\"{phase}\"")))
            .filter_map(|l| {
                let le = l
                    .split("le=\"")
                    .nth(1)?
                    .split('"')
                    .next()?
                    .parse::<f64>()
                    .ok()?;
                let n = l.rsplit(' ').next()?.parse::<f64>().ok()?;
                Some((le, n))
            })
            .find(|&(_, n)| n >= q * count)
            .map(|(le, _)| le)
    };
    for phase in ["parse", "tokenize", "hash", "lookup", "pick"] {
        let (sum, count) = (series("sum", phase), series("count", phase));
        if count > 0.0 {
            let ms = |v: Option<f64>| v.map_or("?".to_owned(), |v| format!("{:.3}", v * 1e3));
            println!(
                "router phase {phase:>8}: mean {:.3} ms, p50 <= {} ms, p99 <= {} ms over {count} requests",
                sum / count * 1e3,
                ms(quantile(phase, 0.5, count)),
                ms(quantile(phase, 0.99, count)),
            );
        }
    }
    router.shutdown();
}

//! Helpers of the agent/ingest end-to-end tests (`pipeline_ingest`,
//! `pipeline_agent`): the real agent binary over a vLLM-compatible publisher,
//! the router as its binary runs, and the index views the tests read.
#![allow(dead_code, clippy::unwrap_used)]

pub(crate) use crate::poll;

use clap::Parser;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use warmpath_core::{hash_tokens, BlockHash, CacheIndex, HashSeed};
use warmpath_vllm_events::{
    BlockStored, EngineBlockHash, KvEvent, KvEventPublisher, PublisherConfig,
};

pub(crate) const BS: u32 = 4;

/// A child process killed on drop; its stdout+stderr go to `log`.
pub(crate) struct Proc {
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub(crate) fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) async fn publisher() -> KvEventPublisher {
    let mut cfg = PublisherConfig::new("tcp://127.0.0.1:0");
    cfg.replay_endpoint = Some("tcp://127.0.0.1:0".into());
    KvEventPublisher::bind(cfg).await.unwrap()
}

/// The agent binary for `worker` of model "m" on `p`, with `extra` flags
/// (routers, TLS, token), logging into `dir/<worker>-<n>.log`.
pub(crate) fn agent(dir: &Path, worker: &str, p: &KvEventPublisher, extra: &[String]) -> Proc {
    agent_of(dir, worker, "m", p, extra)
}

/// [`agent`] serving `model`.
pub(crate) fn agent_of(
    dir: &Path,
    worker: &str,
    model: &str,
    p: &KvEventPublisher,
    extra: &[String],
) -> Proc {
    let log = (0..)
        .map(|n| dir.join(format!("{worker}-{n}.log")))
        .find(|p| !p.exists())
        .unwrap();
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_warmpath-agent"))
        .args(["--worker-id", worker, "--model", model])
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
pub(crate) async fn router(flags: &[String], workers: &[&str]) -> warmpath_router::RunningRouter {
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

pub(crate) fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

pub(crate) fn index(r: &warmpath_router::RunningRouter) -> Arc<CacheIndex> {
    r.index("m").unwrap()
}

pub(crate) fn blocks(r: &warmpath_router::RunningRouter, worker: &str) -> u64 {
    let idx = index(r);
    idx.worker_slot(worker).map_or(0, |s| idx.block_count(s))
}

/// One BlockStored of tokens `toks` (a new chain when `parent` is None).
pub(crate) fn stored(
    first_hash: u64,
    parent: Option<u64>,
    toks: std::ops::Range<u32>,
    bs: u32,
) -> KvEvent {
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
pub(crate) fn wp(n: u32) -> Vec<BlockHash> {
    hash_tokens(
        HashSeed::new("m", "", ""),
        BS as usize,
        &(0..n).collect::<Vec<_>>(),
    )
}

/// Polls `cond` for up to `limit`, publishing an empty batch on each
/// publisher between polls (a gap is only seen when the next batch comes).
pub(crate) async fn wait_until(
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

pub(crate) async fn metrics_text(http: SocketAddr) -> String {
    reqwest::get(format!("http://{http}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

pub(crate) async fn agent_status(http: SocketAddr) -> serde_json::Value {
    let v: serde_json::Value = reqwest::get(format!("http://{http}/cache-index"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    v["pools"][0]["workers"][0]["agent"].clone()
}

/// What the in-process routers log at WARN and above, captured from the
/// first call on (one global subscriber per test binary; every router of
/// the binary writes into it, so a test filters by a marker of its own).
pub(crate) fn captured_logs() -> Arc<parking_lot::Mutex<Vec<u8>>> {
    static LOGS: std::sync::OnceLock<Arc<parking_lot::Mutex<Vec<u8>>>> = std::sync::OnceLock::new();
    Arc::clone(LOGS.get_or_init(|| {
        let buf = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let w = Arc::clone(&buf);
        let sub = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || LogWriter(Arc::clone(&w)))
            .finish();
        let _ = tracing::subscriber::set_global_default(sub);
        buf
    }))
}

struct LogWriter(Arc<parking_lot::Mutex<Vec<u8>>>);

impl std::io::Write for LogWriter {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Raw agent messages, as a misbehaving agent writes them (pool "m", block
/// size [`BS`]; hashes go into the index as they are).
pub(crate) mod raw {
    use warmpath_proto::v1::{
        agent_message::Msg, delta, AgentMessage, Block, Cleared, Delta, Hello, SnapshotChunk,
        Stored,
    };

    fn msg(m: Msg) -> AgentMessage {
        AgentMessage { msg: Some(m) }
    }

    pub(crate) fn hello(worker: &str) -> AgentMessage {
        msg(Msg::Hello(Hello {
            worker_id: worker.into(),
            endpoint: "http://127.0.0.1:1".into(),
            model: "m".into(),
            block_size: super::BS,
            epoch: 1,
            agent_version: "raw".into(),
            ..Default::default()
        }))
    }

    /// A whole snapshot in one chunk.
    pub(crate) fn snapshot(seq: u64, hashes: &[u64]) -> AgentMessage {
        msg(Msg::Snapshot(SnapshotChunk {
            seq,
            chunk_index: 0,
            first: true,
            last: true,
            total_blocks: hashes.len() as u64,
            prefix_closed: false,
            blocks: hashes
                .iter()
                .map(|h| Block {
                    hash: *h,
                    parent: None,
                    tier: 1,
                })
                .collect(),
        }))
    }

    pub(crate) fn stored(seq: u64, hashes: &[u64]) -> AgentMessage {
        msg(Msg::Delta(Delta {
            seq,
            op: Some(delta::Op::Stored(Stored {
                parent: None,
                hashes: hashes.to_vec(),
                tier: 1,
            })),
            ..Default::default()
        }))
    }

    pub(crate) fn cleared(seq: u64) -> AgentMessage {
        msg(Msg::Delta(Delta {
            seq,
            op: Some(delta::Op::Cleared(Cleared {})),
            ..Default::default()
        }))
    }
}

/// A raw agent stream on `client`'s connection, with `token` as its bearer
/// and `first` sent at once. The router's refusal before reading anything
/// is the `Err`.
pub(crate) async fn raw_stream_on(
    client: &warmpath_proto::CacheEventsClient<tonic::transport::Channel>,
    token: Option<&str>,
    first: Vec<warmpath_proto::v1::AgentMessage>,
) -> Result<
    (
        tokio::sync::mpsc::Sender<warmpath_proto::v1::AgentMessage>,
        tonic::Streaming<warmpath_proto::v1::RouterMessage>,
    ),
    tonic::Status,
> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    for m in first {
        tx.send(m).await.unwrap();
    }
    let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    if let Some(t) = token {
        req.metadata_mut()
            .insert("authorization", warmpath_proto::bearer(t).parse().unwrap());
    }
    let answers = client.clone().publish(req).await?.into_inner();
    Ok((tx, answers))
}

/// A client of the ingest at `grpc` (one connection, shared by its clones).
pub(crate) async fn ingest_client(
    grpc: SocketAddr,
) -> warmpath_proto::CacheEventsClient<tonic::transport::Channel> {
    warmpath_proto::CacheEventsClient::connect(format!("http://{grpc}"))
        .await
        .unwrap()
}

/// The value of the series `line_start` (name and labels) in `/metrics`.
pub(crate) async fn metric(http: SocketAddr, line_start: &str) -> f64 {
    metrics_text(http)
        .await
        .lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

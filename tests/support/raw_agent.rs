//! A raw agent stream and the router binary as a process, for the tests of
//! issue 17 (bounded index, stale views) that play a misbehaving or dying
//! agent. Included with `#[path]`.
#![allow(dead_code, clippy::unwrap_used)]

use super::support::{get_url, metric_value, TestClient};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use warmpath_proto::v1::{
    agent_message::Msg, AgentMessage, Block, Hello, Load, RouterMessage, SnapshotChunk,
};

pub(crate) struct Router {
    child: tokio::process::Child,
    pub http: String,
    pub grpc: String,
}

impl Router {
    /// The router binary with `yaml` (which sets `grpc_listen`) as its
    /// config file, written into `dir`.
    pub(crate) async fn start(dir: &std::path::Path, yaml: &str) -> Self {
        Self::start_with_env(dir, yaml, &[]).await
    }

    /// [`Router::start`] with more environment variables.
    pub(crate) async fn start_with_env(
        dir: &std::path::Path,
        yaml: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let cfg = dir.join("router.yaml");
        std::fs::write(&cfg, yaml).unwrap();
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_warmpath-router"))
            .args(["--listen", "127.0.0.1:0", "--config", cfg.to_str().unwrap()])
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(30), lines.next_line())
                .await
                .expect("router did not start within 30 s")
                .unwrap()
                .expect("router exited before listening")
        };
        let http = next().await.replace("listening on ", "");
        let grpc = next().await.replace("grpc listening on ", "");
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Router { child, http, grpc }
    }

    pub(crate) fn rss(&self) -> u64 {
        let pid = self.child.id().unwrap();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .unwrap()
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap();
        kb * 1024
    }

    /// `VmRSS`, `RssAnon` and `RssFile` of `/proc/PID/status`, for messages.
    pub(crate) fn mem(&self) -> String {
        let pid = self.child.id().unwrap();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .filter(|l| {
                l.starts_with("VmRSS") || l.starts_with("RssAnon") || l.starts_with("RssFile")
            })
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub(crate) async fn metric(&self, c: &TestClient, line_start: &str) -> f64 {
        let m = get_url(c, &format!("{}/metrics", self.http)).await;
        metric_value(&String::from_utf8_lossy(&m.body), line_start).unwrap_or(0.0)
    }

    pub(crate) async fn blocks(&self, c: &TestClient, worker: &str) -> u64 {
        let v = get_url(c, &format!("{}/cache-index", self.http))
            .await
            .json();
        v["pools"][0]["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["worker_id"] == worker)
            .unwrap()["blocks"]
            .as_u64()
            .unwrap()
    }
}

/// A raw agent stream for `worker`: Hello, a snapshot of `blocks` (seq 1),
/// and `Load` with `capacity` when given. Keep the returned pair alive;
/// dropping it is the agent dying (its stream closes).
pub(crate) async fn agent(
    grpc: &str,
    worker: &str,
    blocks: &[u64],
    capacity: Option<u64>,
) -> (mpsc::Sender<AgentMessage>, tonic::Streaming<RouterMessage>) {
    agent_as(grpc, worker, 1, None, blocks, capacity)
        .await
        .unwrap()
}

/// [`agent`] with its Hello's `epoch` and a bearer `token`; a stream the
/// router refuses before reading its Hello is the `Err`.
pub(crate) async fn agent_as(
    grpc: &str,
    worker: &str,
    epoch: u64,
    token: Option<&str>,
    blocks: &[u64],
    capacity: Option<u64>,
) -> Result<(mpsc::Sender<AgentMessage>, tonic::Streaming<RouterMessage>), tonic::Status> {
    let mut client = warmpath_proto::CacheEventsClient::connect(grpc.to_owned())
        .await
        .unwrap();
    let (tx, rx) = mpsc::channel(4);
    let msg = |m| AgentMessage { msg: Some(m) };
    tx.send(msg(Msg::Hello(Hello {
        worker_id: worker.into(),
        endpoint: "http://127.0.0.1:1".into(),
        model: "m".into(),
        block_size: 4,
        epoch,
        agent_version: "raw".into(),
        ..Default::default()
    })))
    .await
    .unwrap();
    tx.send(msg(Msg::Snapshot(SnapshotChunk {
        seq: 1,
        chunk_index: 0,
        first: true,
        last: true,
        total_blocks: blocks.len() as u64,
        prefix_closed: false,
        blocks: blocks
            .iter()
            .map(|h| Block {
                hash: *h,
                parent: None,
                tier: 1,
            })
            .collect(),
    })))
    .await
    .unwrap();
    if let Some(c) = capacity {
        tx.send(msg(Msg::Load(Load {
            engine_up: true,
            capacity_blocks: c,
            ..Default::default()
        })))
        .await
        .unwrap();
    }
    let mut req = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    if let Some(t) = token {
        req.metadata_mut()
            .insert("authorization", warmpath_proto::bearer(t).parse().unwrap());
    }
    let answers = client.publish(req).await?.into_inner();
    Ok((tx, answers))
}

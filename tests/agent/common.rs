//! A test router: a real tonic `CacheEvents` server on 127.0.0.1:0 that applies
//! what agents publish the way the .proto says, checking the seq rules.
#![allow(clippy::unwrap_used, dead_code)]

pub(crate) use crate::poll;

use std::collections::HashSet;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use warmpath_proto::v1::{
    agent_message::Msg, delta, router_message, AgentMessage, Refused, RouterMessage,
};
use warmpath_proto::{CacheEvents, CacheEventsServer};

/// What the test router believes about the one worker publishing to it.
#[derive(Debug, Default, Clone)]
pub(crate) struct View {
    pub hellos: Vec<warmpath_proto::v1::Hello>,
    pub blocks: HashSet<(u64, i32)>,
    pub last_seq: Option<u64>,
    pub snapshots: u64,
    pub deltas: u64,
    pub seq_errors: u64,
    pub loads: u64,
    pub streams: u64,
    pub tokens: Vec<Option<String>>,
    partial: Option<HashSet<(u64, i32)>>,
}

#[derive(Clone)]
struct Recorder {
    view: Arc<Mutex<View>>,
    refuse_block_size: Option<u32>,
    /// Asks for this many snapshots at once after the first one arrives.
    resend_flood: u32,
    /// Ends every open stream when the router "dies" (aborting the server task
    /// alone would leave hyper's connection tasks running).
    stop: CancellationToken,
}

type Out = Pin<Box<dyn Stream<Item = Result<RouterMessage, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl CacheEvents for Recorder {
    type PublishStream = Out;

    async fn publish(
        &self,
        req: tonic::Request<tonic::Streaming<AgentMessage>>,
    ) -> Result<tonic::Response<Out>, tonic::Status> {
        let token = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        {
            let mut v = self.view.lock().unwrap();
            v.streams += 1;
            v.tokens.push(token);
        }
        let mut inbound = req.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let view = self.view.clone();
        let refuse = self.refuse_block_size;
        let flood = self.resend_flood;
        let stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                let m = tokio::select! {
                    _ = stop.cancelled() => return,
                    m = inbound.next() => m,
                };
                let Some(Ok(m)) = m else { return };
                let mut v = view.lock().unwrap();
                match m.msg {
                    Some(Msg::Hello(h)) => {
                        if let Some(bs) = refuse {
                            if h.block_size != 0 && h.block_size != bs {
                                drop(v);
                                let _ = tx
                                    .send(Ok(RouterMessage {
                                        msg: Some(router_message::Msg::Refused(Refused {
                                            reason: format!(
                                                "block size {} != pool block size {bs}",
                                                h.block_size
                                            ),
                                            retryable: false,
                                        })),
                                    }))
                                    .await;
                                return;
                            }
                        }
                        v.hellos.push(h);
                    }
                    Some(Msg::Snapshot(s)) => {
                        if s.first {
                            v.partial = Some(HashSet::new());
                        }
                        if let Some(p) = v.partial.as_mut() {
                            p.extend(s.blocks.iter().map(|b| (b.hash, b.tier)));
                        }
                        if s.last {
                            v.blocks = v.partial.take().unwrap_or_default();
                            v.last_seq = Some(s.seq);
                            v.snapshots += 1;
                            if v.snapshots == 1 && flood > 0 {
                                // Queued without waiting: the channel takes
                                // what fits, the rest are sent from a task.
                                let tx = tx.clone();
                                tokio::spawn(async move {
                                    for _ in 0..flood {
                                        let ask = router_message::Msg::ResendSnapshot(
                                            warmpath_proto::v1::ResendSnapshot {
                                                reason: "test flood".into(),
                                            },
                                        );
                                        let m = RouterMessage { msg: Some(ask) };
                                        if tx.send(Ok(m)).await.is_err() {
                                            return;
                                        }
                                    }
                                });
                            }
                        }
                    }
                    Some(Msg::Delta(d)) => {
                        v.deltas += 1;
                        match v.last_seq {
                            Some(l) if d.seq == l + 1 => {}
                            _ => {
                                v.seq_errors += 1;
                                continue;
                            }
                        }
                        v.last_seq = Some(d.seq);
                        match d.op {
                            Some(delta::Op::Stored(s)) => {
                                for h in s.hashes {
                                    v.blocks.insert((h, s.tier));
                                }
                            }
                            Some(delta::Op::Removed(r)) => {
                                for h in r.hashes {
                                    v.blocks.remove(&(h, r.tier));
                                }
                            }
                            Some(delta::Op::Cleared(_)) => v.blocks.clear(),
                            None => {}
                        }
                    }
                    Some(Msg::Load(_)) => v.loads += 1,
                    Some(Msg::Heartbeat(_) | Msg::Decision(_)) | None => {}
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

/// A running test router.
pub(crate) struct TestRouter {
    pub addr: SocketAddr,
    pub view: Arc<Mutex<View>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl TestRouter {
    pub(crate) async fn start(addr: SocketAddr, refuse_block_size: Option<u32>) -> TestRouter {
        Self::start_with(addr, refuse_block_size, 0).await
    }

    /// [`TestRouter::start`] that asks for `resend_flood` snapshots at once
    /// after the first one.
    pub(crate) async fn start_with(
        addr: SocketAddr,
        refuse_block_size: Option<u32>,
        resend_flood: u32,
    ) -> TestRouter {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let view = Arc::new(Mutex::new(View::default()));
        let stop = CancellationToken::new();
        let rec = Recorder {
            view: view.clone(),
            refuse_block_size,
            resend_flood,
            stop: stop.clone(),
        };
        let s = stop.clone();
        let task = tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(CacheEventsServer::new(rec))
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), s.cancelled_owned())
                .await
                .unwrap();
        });
        TestRouter {
            addr,
            view,
            stop,
            task,
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) fn view(&self) -> View {
        self.view.lock().unwrap().clone()
    }

    pub(crate) async fn stop(self) {
        self.stop.cancel();
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Polls `cond` every 50 ms for up to 20 s, calling `poke` between polls (tests
/// publish an empty batch so a slow-joining subscriber sees traffic).
pub(crate) async fn wait_for<F, P, Fut>(what: &str, mut cond: F, mut poke: P)
where
    F: FnMut() -> bool,
    P: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (limit, every) = (Duration::from_secs(20), Duration::from_millis(50));
    poll::poll(what, limit, every, async || {
        if cond() {
            return Some(());
        }
        poke().await;
        None
    })
    .await
}

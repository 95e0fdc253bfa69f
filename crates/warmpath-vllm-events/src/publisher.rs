//! A vLLM-compatible KV-event publisher (`ZmqEventPublisher` of
//! `vllm/distributed/kv_events.py`): a PUB socket sending `[topic, seq u64 BE,
//! payload]`, and an optional ROUTER replay socket that answers a DEALER's
//! `["", start_seq]` with every buffered batch from there, then an end marker
//! (seq `u64::MAX`, empty payload). Test knobs reproduce what a deployment does
//! to a subscriber (lost batches, gaps, restarts, garbage).

use crate::encode::encode_batch;
use crate::event::{KvEvent, KvEventBatch, PayloadForm};
use crate::wire::{endpoint_for_bind, parse_replay_request, END_OF_REPLAY};
use bytes::Bytes;
use futures::StreamExt;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};
use thiserror::Error;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use zeromq::{PubSocket, RouterSocket, Socket, SocketEvent, SocketRecv, SocketSend, ZmqMessage};

/// Batches kept for replay (vLLM's default).
const REPLAY_BUFFER: usize = 10_000;

/// How to set up a [`KvEventPublisher`].
#[derive(Clone, Debug)]
pub struct PublisherConfig {
    /// Where the PUB socket binds, e.g. `tcp://127.0.0.1:0` or vLLM's `tcp://*:5557`
    /// (`*` binds every interface).
    pub endpoint: String,
    /// Where the replay ROUTER binds; `None`: no replay (vLLM's default).
    pub replay_endpoint: Option<String>,
    /// The topic frame (vLLM's default is empty).
    pub topic: String,
    /// Payload layout: map (vLLM >= 0.24, default) or array (<= 0.23).
    pub form: PayloadForm,
    /// Whether replay replies carry the topic frame (vLLM >= 0.26).
    pub with_topic_in_replay: bool,
}

impl PublisherConfig {
    /// vLLM 0.33 defaults on `endpoint`, without replay.
    pub fn new(endpoint: impl Into<String>) -> Self {
        PublisherConfig {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            form: PayloadForm::Map,
            with_topic_in_replay: true,
        }
    }
}

/// Why publishing failed.
#[derive(Debug, Error)]
pub enum PublisherError {
    /// A socket could not bind. Retrying makes sense only after the address is freed.
    #[error("kv-event publisher could not bind {endpoint}: {source}")]
    Bind {
        endpoint: String,
        source: zeromq::ZmqError,
    },
    /// Sending on the PUB socket failed (retryable).
    #[error("kv-event publisher could not send: {0}")]
    Send(#[source] zeromq::ZmqError),
    #[error("kv-event publisher: a raw message needs at least one frame")]
    EmptyMessage,
    /// `ipc://*` (a wildcard path) is not supported by the `zeromq` crate; name
    /// the socket file. Retrying does not help.
    #[error("kv-event publisher cannot bind {0}: name the ipc socket file")]
    WildcardIpc(String),
}

struct Live {
    socket: PubSocket,
    next_seq: u64,
}

/// A running publisher. Dropping it stops the replay task and closes the sockets.
pub struct KvEventPublisher {
    live: tokio::sync::Mutex<Live>,
    ring: Arc<Mutex<VecDeque<(u64, Bytes)>>>,
    config: PublisherConfig,
    endpoint: String,
    replay_endpoint: Option<String>,
    cancel: CancellationToken,
    replay_task: Option<JoinHandle<()>>,
    accepted: Arc<AtomicU64>,
}

impl std::fmt::Debug for KvEventPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvEventPublisher")
            .field("endpoint", &self.endpoint)
            .field("replay_endpoint", &self.replay_endpoint)
            .field("topic", &self.config.topic)
            .finish_non_exhaustive()
    }
}

impl Drop for KvEventPublisher {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(t) = self.replay_task.take() {
            t.abort();
        }
    }
}

impl KvEventPublisher {
    /// Binds the PUB socket (and the replay ROUTER when configured). Port 0 picks
    /// a free port; read it back with [`Self::endpoint`] / [`Self::replay_endpoint`].
    pub async fn bind(config: PublisherConfig) -> Result<Self, PublisherError> {
        for ep in std::iter::once(&config.endpoint).chain(&config.replay_endpoint) {
            // The crate reaches a `todo!()` on it.
            if ep.trim() == "ipc://*" {
                return Err(PublisherError::WildcardIpc(ep.clone()));
            }
        }
        let mut socket = PubSocket::new();
        // Before binding, so every accepted subscriber is seen.
        let socket_events = socket.monitor();
        let endpoint = bind_to(&mut socket, &config.endpoint).await?;
        let ring = Arc::new(Mutex::new(VecDeque::new()));
        let cancel = CancellationToken::new();
        let accepted = Arc::new(AtomicU64::new(0));
        // Ends with the socket (its monitor closes) or on drop.
        let counting = count_subscribers(socket_events, accepted.clone(), cancel.clone());
        tokio::spawn(counting);
        let (replay_endpoint, replay_task) = match &config.replay_endpoint {
            None => (None, None),
            Some(ep) => {
                let mut router = RouterSocket::new();
                let bound = bind_to(&mut router, ep).await?;
                let task = tokio::spawn(serve_replay(
                    router,
                    ring.clone(),
                    config.topic.clone(),
                    config.with_topic_in_replay,
                    cancel.clone(),
                ));
                (Some(bound), Some(task))
            }
        };
        tracing::info!(%endpoint, replay = ?replay_endpoint, "kv-event publisher bound");
        Ok(KvEventPublisher {
            live: tokio::sync::Mutex::new(Live {
                socket,
                next_seq: 0,
            }),
            ring,
            config,
            endpoint,
            replay_endpoint,
            cancel,
            replay_task,
            accepted,
        })
    }

    /// Subscriber connections the PUB socket accepted so far (a subscriber that
    /// reconnects counts again).
    pub fn subscribers_accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// The bound PUB endpoint, port resolved (e.g. `tcp://127.0.0.1:41234`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The bound replay endpoint, port resolved, if replay is on.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Publishes `events` as one batch stamped now; returns its sequence number.
    pub async fn publish(&self, events: Vec<KvEvent>) -> Result<u64, PublisherError> {
        self.publish_payload(self.encode(events)).await
    }

    /// Sends `payload` verbatim (a test knob for garbage or truncated msgpack)
    /// under the next sequence number; returns it.
    pub async fn publish_payload(&self, payload: Bytes) -> Result<u64, PublisherError> {
        let mut live = self.live.lock().await;
        let seq = live.next_seq;
        self.remember(seq, payload.clone());
        let mut msg = ZmqMessage::from(Bytes::from(self.config.topic.clone().into_bytes()));
        msg.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
        msg.push_back(payload);
        live.socket.send(msg).await.map_err(PublisherError::Send)?;
        live.next_seq += 1;
        Ok(seq)
    }

    /// Test knob: takes a sequence number and keeps the batch in the replay
    /// buffer, but does not send it live (a message a subscriber missed).
    pub async fn publish_unsent(&self, events: Vec<KvEvent>) -> u64 {
        let payload = self.encode(events);
        let mut live = self.live.lock().await;
        let seq = live.next_seq;
        self.remember(seq, payload);
        live.next_seq += 1;
        seq
    }

    /// Test knob: skips `n` sequence numbers that nobody can replay.
    pub async fn skip_seq(&self, n: u64) {
        let mut live = self.live.lock().await;
        live.next_seq = live.next_seq.saturating_add(n);
    }

    /// Test knob: behaves like a restarted engine (sequence back to 0, replay
    /// buffer emptied).
    pub async fn restart(&self) {
        let mut live = self.live.lock().await;
        live.next_seq = 0;
        self.ring.lock().clear();
    }

    /// Test knob: sends arbitrary frames on the PUB socket (garbage, truncated
    /// payloads, wrong frame counts). Does not consume a sequence number.
    pub async fn send_raw(&self, frames: Vec<Bytes>) -> Result<(), PublisherError> {
        let msg = ZmqMessage::try_from(frames).map_err(|_| PublisherError::EmptyMessage)?;
        let mut live = self.live.lock().await;
        live.socket.send(msg).await.map_err(PublisherError::Send)
    }

    /// The sequence number the next batch gets.
    pub async fn next_seq(&self) -> u64 {
        self.live.lock().await.next_seq
    }

    /// `events` as one batch stamped now, encoded.
    fn encode(&self, events: Vec<KvEvent>) -> Bytes {
        let now = SystemTime::now().duration_since(UNIX_EPOCH);
        let ts = now.map_or(0.0, |d| d.as_secs_f64());
        let batch = KvEventBatch {
            ts,
            events,
            dp_rank: Some(0),
        };
        Bytes::from(encode_batch(&batch, self.config.form))
    }

    fn remember(&self, seq: u64, payload: Bytes) {
        if self.replay_endpoint.is_none() {
            return;
        }
        let mut ring = self.ring.lock();
        if ring.len() >= REPLAY_BUFFER {
            ring.pop_front();
        }
        ring.push_back((seq, payload));
    }
}

/// Binds `socket` where vLLM's `endpoint` says; returns the bound endpoint.
async fn bind_to(socket: &mut impl Socket, endpoint: &str) -> Result<String, PublisherError> {
    let bound = socket.bind(&endpoint_for_bind(endpoint)).await;
    bound
        .map(|ep| ep.to_string())
        .map_err(|source| PublisherError::Bind {
            endpoint: endpoint.to_owned(),
            source,
        })
}

async fn count_subscribers(
    mut events: futures::channel::mpsc::Receiver<SocketEvent>,
    accepted: Arc<AtomicU64>,
    cancel: CancellationToken,
) {
    loop {
        let ev = tokio::select! {
            _ = cancel.cancelled() => return,
            ev = events.next() => ev,
        };
        match ev {
            None => return,
            Some(SocketEvent::Accepted(peer, _)) => {
                accepted.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(%peer, "kv-event subscriber connected");
            }
            Some(_) => {}
        }
    }
}

async fn serve_replay(
    mut router: RouterSocket,
    ring: Arc<Mutex<VecDeque<(u64, Bytes)>>>,
    topic: String,
    with_topic: bool,
    cancel: CancellationToken,
) {
    loop {
        let req = tokio::select! {
            _ = cancel.cancelled() => return,
            r = router.recv() => r,
        };
        let req = match req {
            Ok(r) => r.into_vec(),
            Err(e) => {
                tracing::warn!(error = %e, "replay socket receive failed");
                continue;
            }
        };
        // [identity, "", start_seq]
        let Some(identity) = req.first().cloned() else {
            continue;
        };
        let Some(start) = parse_replay_request(&req[1..]) else {
            tracing::warn!(frames = req.len(), "malformed replay request ignored");
            continue;
        };
        let batches: Vec<(u64, Bytes)> = ring
            .lock()
            .iter()
            .filter(|(s, _)| *s >= start)
            .cloned()
            .collect();
        tracing::debug!(start, n = batches.len(), "serving replay");
        let reply = |seq: u64, payload: Bytes| {
            let mut m = ZmqMessage::from(identity.clone());
            m.push_back(Bytes::new());
            if with_topic {
                m.push_back(Bytes::from(topic.clone().into_bytes()));
            }
            m.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
            m.push_back(payload);
            m
        };
        for (seq, payload) in batches {
            if let Err(e) = router.send(reply(seq, payload)).await {
                tracing::warn!(error = %e, "replay client left mid-replay");
                break;
            }
        }
        if let Err(e) = router.send(reply(END_OF_REPLAY, Bytes::new())).await {
            tracing::warn!(error = %e, "replay end marker not delivered");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wildcard_ipc_endpoint_is_an_error_not_a_panic() {
        let r = KvEventPublisher::bind(PublisherConfig::new("ipc://*")).await;
        assert!(matches!(r, Err(PublisherError::WildcardIpc(_))), "{r:?}");
        let mut c = PublisherConfig::new("tcp://127.0.0.1:0");
        c.replay_endpoint = Some("ipc://*".into());
        let r = KvEventPublisher::bind(c).await;
        assert!(matches!(r, Err(PublisherError::WildcardIpc(_))), "{r:?}");
    }
}

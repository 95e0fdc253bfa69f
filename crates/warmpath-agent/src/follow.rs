//! Following one engine rank: ZMQ SUB on its event endpoint, DEALER replay,
//! sequence handling, decoding, and feeding the [`EngineTracker`] into the [`Hub`].
//!
//! Sequence rules (vLLM counts batches from 0 in each engine process):
//! - next expected: apply;
//! - a duplicate (`seq == last`): ignore;
//! - a gap (`seq > last + 1`): ask the replay endpoint for `last + 1..`, apply
//!   what it returns in order; if it cannot fill the gap (no replay endpoint, the
//!   batches left its buffer, it is down), count an unrecovered gap and make every
//!   router link send a fresh snapshot;
//! - a backwards jump (`seq < last`): the engine restarted; forget this rank's
//!   blocks, then catch up from seq 0 through the replay endpoint if there is one.
//!
//! On start, once subscribed, the agent asks the replay endpoint for everything
//! the engine still buffers, so a warm engine's cache is learned without
//! waiting for its next event; live batches the replay already held are then
//! skipped. Without a replay endpoint (or when that replay fails) the first
//! live message triggers a catch-up from 0, and so does (at most every 10 s) a
//! `BlockStored` whose parent is unknown.
//! Replaying batches already applied is harmless: the tracker only reports real
//! transitions.
//!
//! The SUB socket is made once per rank and reconnects by itself (`zeromq`
//! 0.6 and later re-dial a lost publisher with backoff and re-send the
//! subscription), so an idle engine costs nothing and a restarted one is
//! followed again on its own; batches published meanwhile show up as a gap or
//! a backwards jump, handled as above. Its monitor only feeds logs and the
//! reconnect count. Replays run in their own task with a deadline, so a
//! replay endpoint that never answers is a failed replay, not a stuck rank.
//!
//! Both sockets reach the engine through a [`crate::zmtp_guard`] relay on
//! 127.0.0.1, which ends a connection whose peer announces a frame over
//! [`DecodeLimits::max_payload_bytes`] before `zeromq` reserves it.

use crate::hub::Hub;
use crate::replay::{replay, ReplayLimits};
use crate::stats::Stats;
use crate::tracker::EngineTracker;
use crate::vllm::wire::parse_live;
use crate::vllm::{decode_batch_with, DecodeLimits, KvEventBatch};
use bytes::Bytes;
use futures::StreamExt;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use zeromq::{Socket, SocketEvent, SocketRecv, SubSocket};

/// How to follow one rank.
#[derive(Clone, Debug)]
pub struct FollowConfig {
    /// The rank's event endpoint, e.g. `tcp://127.0.0.1:5557`.
    pub endpoint: String,
    /// The rank's replay endpoint, if the engine has one.
    pub replay_endpoint: Option<String>,
    /// Topic prefix to subscribe to (empty: everything).
    pub topic: String,
    /// Data-parallel rank (for logs and metrics).
    pub rank: u16,
    /// Give up on a replay after this long.
    pub replay_timeout: Duration,
    /// Most batches accepted from one replay.
    pub max_replay_batches: usize,
    /// Most payload bytes accepted from one replay (the batches are held
    /// until it ends).
    pub max_replay_bytes: usize,
    /// Decoder caps.
    pub limits: DecodeLimits,
}

impl FollowConfig {
    /// Defaults for `endpoint`.
    pub fn new(endpoint: impl Into<String>) -> Self {
        FollowConfig {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            rank: 0,
            replay_timeout: Duration::from_secs(3),
            max_replay_batches: 100_000,
            max_replay_bytes: 256 << 20,
            limits: DecodeLimits::default(),
        }
    }
}

struct Follower {
    cfg: FollowConfig,
    tracker: EngineTracker,
    hub: Arc<Hub>,
    stats: Arc<Stats>,
    last: Option<u64>,
    /// The last seq of the start-up replay, while live batches it already
    /// held may still arrive (published between subscribing and the replay).
    replayed_at_start: Option<u64>,
    /// Where replays dial: the guard's endpoint for the replay endpoint.
    replay_at: Option<String>,
    /// Whether the start-up replay ran (the SUB socket is re-created when the
    /// engine is silent; the buffer is read once).
    buffer_read: bool,
    last_parent_replay: Option<Instant>,
    pending_parent: bool,
    rank_label: String,
    /// When refused blocks were last logged (at most every 10 s).
    refusal_logged: Option<Instant>,
}

/// Follows one rank until `cancel` fires.
pub async fn follow_rank(
    cfg: FollowConfig,
    tracker: EngineTracker,
    hub: Arc<Hub>,
    stats: Arc<Stats>,
    mut restarts: watch::Receiver<u64>,
    cancel: CancellationToken,
) {
    let rank_label = cfg.rank.to_string();
    // The guards live as long as this rank is followed.
    let guards = cancel.child_token();
    let _stop_guards = guards.clone().drop_guard();
    let max_frame = cfg.limits.max_payload_bytes as u64;
    let events_at = guarded(&cfg.endpoint, max_frame, &guards).await;
    let replay_at = match &cfg.replay_endpoint {
        Some(ep) => Some(guarded(ep, max_frame, &guards).await),
        None => None,
    };
    let mut f = Follower {
        replay_at,
        cfg,
        tracker,
        hub,
        stats,
        last: None,
        replayed_at_start: None,
        buffer_read: false,
        last_parent_replay: None,
        pending_parent: false,
        refusal_logged: None,
        rank_label,
    };
    let mut following = false;
    loop {
        let mut sub = SubSocket::new();
        // Before connecting, so the first `Connected` is seen too.
        let mut socket_events = sub.monitor();
        let connected = tokio::select! {
            _ = cancel.cancelled() => return,
            r = sub.connect(&events_at) => r,
        };
        if let Err(e) = connected {
            following = false;
            // The crate keeps dialling a refused port for its connect timeout
            // (30 s); this is that timeout or a bad endpoint.
            tracing::warn!(endpoint = %f.cfg.endpoint, error = %e, "cannot connect to engine events; retrying");
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
            }
        }
        if let Err(e) = sub.subscribe(&f.cfg.topic).await {
            following = false;
            tracing::warn!(error = %e, "subscribe failed; reconnecting");
            continue;
        }
        // INFO once per change of state (first subscription, or after a
        // failure); the quiet re-subscriptions of a silent engine are DEBUG.
        if std::mem::replace(&mut following, true) {
            tracing::debug!(endpoint = %f.cfg.endpoint, rank = f.cfg.rank, "following engine events again");
        } else {
            tracing::info!(endpoint = %f.cfg.endpoint, rank = f.cfg.rank, "following engine events");
        }
        if !std::mem::replace(&mut f.buffer_read, true) {
            // Once, after the first subscription: nothing published from now
            // on is missed.
            tokio::select! {
                _ = cancel.cancelled() => return,
                () = f.learn_buffered() => {}
            }
        }
        let mut connects = 0u64;
        loop {
            let msg = tokio::select! {
                _ = cancel.cancelled() => return,
                Ok(()) = restarts.changed() => {
                    f.forget_engine();
                    f.learn_buffered().await;
                    continue;
                }
                Some(ev) = socket_events.next() => {
                    f.on_socket_event(ev, &mut connects);
                    continue;
                }
                r = sub.recv() => r,
            };
            match msg {
                // The socket dropped that peer and re-dials it by itself.
                Err(e) => tracing::warn!(
                    rank = f.cfg.rank,
                    error = %e,
                    "event socket receive failed; reconnecting"
                ),
                Ok(m) => f.on_live(m.into_vec()).await,
            }
        }
    }
}

/// The endpoint to dial for `target`: a [`crate::zmtp_guard`] relay's, or
/// `target` itself when none could start (logged).
async fn guarded(target: &str, max_frame: u64, cancel: &CancellationToken) -> String {
    match crate::zmtp_guard::start(target, max_frame, cancel.clone()).await {
        Ok(g) => g.endpoint,
        Err(e) => {
            tracing::error!(endpoint = %target, error = %e,
                "cannot start the frame guard; connecting without it (an oversized frame can abort the agent)");
            target.to_owned()
        }
    }
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

impl Follower {
    /// Logs the SUB socket's own disconnects and reconnects (the socket
    /// re-dials by itself); `connects` counts this socket's connections.
    fn on_socket_event(&mut self, ev: SocketEvent, connects: &mut u64) {
        match ev {
            SocketEvent::Connected(..) => {
                *connects += 1;
                if *connects > 1 {
                    self.stats.event_reconnects.inc();
                    metrics::counter!("warmpath_agent_event_reconnects_total").increment(1);
                    tracing::info!(
                        endpoint = %self.cfg.endpoint,
                        rank = self.cfg.rank,
                        "reconnected to engine events"
                    );
                }
            }
            SocketEvent::Disconnected(_) => tracing::info!(
                endpoint = %self.cfg.endpoint,
                rank = self.cfg.rank,
                "engine events publisher went away; reconnecting"
            ),
            _ => {}
        }
    }

    async fn on_live(&mut self, frames: Vec<Bytes>) {
        let Some((seq, payload)) = parse_live(&frames) else {
            self.stats.bad_frames.inc();
            metrics::counter!("warmpath_agent_bad_messages_total", "reason" => "frames")
                .increment(1);
            tracing::warn!(
                frames = frames.len(),
                "event message is not [topic, seq(8 bytes), payload]; skipped"
            );
            return;
        };
        if let Some(r) = self.replayed_at_start {
            if seq <= r {
                tracing::debug!(seq, "batch already applied from the start-up replay");
                return;
            }
            self.replayed_at_start = None;
        }
        match self.last {
            None => {
                if seq > 0 {
                    self.catch_up(0, seq).await;
                }
            }
            Some(last) if seq == last.wrapping_add(1) => {}
            Some(last) if seq == last => {
                tracing::debug!(seq, "duplicate batch ignored");
                return;
            }
            Some(last) if seq < last => {
                tracing::warn!(
                    last,
                    seq,
                    rank = self.cfg.rank,
                    "engine sequence went backwards: engine restarted; resetting this rank"
                );
                self.stats.engine_restarts.inc();
                metrics::counter!("warmpath_agent_engine_restarts_total").increment(1);
                let removed = self.tracker.clear();
                self.hub.apply(removed, now_micros());
                self.last = None;
                if seq > 0 {
                    self.catch_up(0, seq).await;
                }
            }
            Some(last) => {
                tracing::warn!(
                    last,
                    seq,
                    rank = self.cfg.rank,
                    "sequence gap in engine events"
                );
                self.stats.gaps.inc();
                metrics::counter!("warmpath_agent_seq_gaps_total").increment(1);
                self.catch_up(last + 1, seq).await;
            }
        }
        self.apply(seq, &payload);
        if self.stats_take_unknown_parent() {
            self.catch_up(0, seq.saturating_add(1)).await;
        }
    }

    /// Whether an unknown parent in the last batch warrants a catch-up replay.
    fn stats_take_unknown_parent(&mut self) -> bool {
        if self.cfg.replay_endpoint.is_none() || !self.pending_parent {
            self.pending_parent = false;
            return false;
        }
        self.pending_parent = false;
        let due = self
            .last_parent_replay
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(10));
        if due {
            self.last_parent_replay = Some(Instant::now());
        }
        due
    }

    /// The engine restarted (seen by the load scraper): its blocks are gone,
    /// and its sequence starts again.
    fn forget_engine(&mut self) {
        let removed = self.tracker.clear();
        self.hub.apply(removed, now_micros());
        self.last = None;
        self.replayed_at_start = None;
        self.stats.engine_restarts.inc();
        tracing::warn!(
            rank = self.cfg.rank,
            "engine restarted: its blocks are forgotten"
        );
    }

    fn replay_limits(&self) -> ReplayLimits {
        ReplayLimits {
            deadline: self.cfg.replay_timeout,
            max_batches: self.cfg.max_replay_batches,
            max_bytes: self.cfg.max_replay_bytes,
        }
    }

    /// Applies every batch the replay endpoint still buffers (a warm engine's
    /// cache at agent start). A failure only logs: the first live batch then
    /// catches up as before.
    async fn learn_buffered(&mut self) {
        let (Some(ep), Some(at)) = (self.cfg.replay_endpoint.clone(), self.replay_at.clone())
        else {
            return;
        };
        match replay(&at, 0, self.replay_limits()).await {
            Ok(batches) => {
                self.stats.replays_ok.inc();
                metrics::counter!("warmpath_agent_replays_total", "result" => "ok").increment(1);
                let n = batches.len();
                for (seq, payload) in batches {
                    if self.last.is_none_or(|l| seq > l) {
                        self.apply(seq, &payload);
                    }
                }
                self.replayed_at_start = self.last;
                if n > 0 {
                    tracing::info!(
                        batches = n,
                        rank = self.cfg.rank,
                        "learned the engine's buffered events"
                    );
                }
            }
            Err(why) => {
                self.stats.replays_failed.inc();
                metrics::counter!("warmpath_agent_replays_total", "result" => "failed")
                    .increment(1);
                tracing::warn!(endpoint = %ep, %why, "start-up replay failed; learning from live events");
            }
        }
    }

    /// Replays `from..until` and applies it; on failure to reach `until` (or
    /// without a replay endpoint) counts an unrecovered gap and forces snapshots.
    async fn catch_up(&mut self, from: u64, until: u64) {
        let mut reached = self.last.map_or(from, |l| l.saturating_add(1));
        // Catching up after a (re)start: whatever the buffer still holds helps.
        let mut tolerate_first_hole = self.last.is_none();
        if let (Some(ep), Some(at)) = (self.cfg.replay_endpoint.clone(), self.replay_at.clone()) {
            match replay(&at, from, self.replay_limits()).await {
                Ok(batches) => {
                    self.stats.replays_ok.inc();
                    metrics::counter!("warmpath_agent_replays_total", "result" => "ok")
                        .increment(1);
                    for (seq, payload) in batches {
                        if seq >= until {
                            break;
                        }
                        if seq > reached {
                            if !tolerate_first_hole {
                                break; // a hole in the replay itself
                            }
                            reached = seq;
                        }
                        tolerate_first_hole = false;
                        self.apply(seq, &payload);
                        reached = reached.max(seq.saturating_add(1));
                    }
                }
                Err(why) => {
                    self.stats.replays_failed.inc();
                    metrics::counter!("warmpath_agent_replays_total", "result" => "failed")
                        .increment(1);
                    tracing::warn!(endpoint = %ep, %why, "replay failed");
                }
            }
        }
        if reached < until && (from > 0 || self.last.is_some()) {
            self.stats.gaps_unrecovered.inc();
            metrics::counter!("warmpath_agent_seq_gaps_unrecovered_total").increment(1);
            tracing::warn!(
                from = reached,
                until,
                "engine events lost for good; routers get a fresh snapshot"
            );
            self.hub.force_snapshot();
        }
    }

    fn apply(&mut self, seq: u64, payload: &[u8]) {
        self.last = Some(seq);
        let batch: KvEventBatch = match decode_batch_with(payload, &self.cfg.limits) {
            Ok(b) => b,
            Err(e) => {
                self.stats.bad_payloads.inc();
                metrics::counter!("warmpath_agent_bad_messages_total", "reason" => e.kind())
                    .increment(1);
                tracing::warn!(seq, error = %e, "undecodable kv-event batch skipped");
                return;
            }
        };
        self.stats.batches.inc();
        metrics::counter!("warmpath_agent_batches_total", "rank" => self.rank_label.clone())
            .increment(1);
        let out = self.tracker.apply_batch(&batch);
        if out.unknown_parents > 0 {
            self.stats.unknown_parents.add(out.unknown_parents);
            metrics::counter!("warmpath_agent_unknown_parent_total").increment(out.unknown_parents);
            self.pending_parent = true;
        }
        if out.unresolved > 0 {
            self.stats.unresolved.add(out.unresolved);
            metrics::counter!("warmpath_agent_unresolved_offload_total").increment(out.unresolved);
        }
        if out.refused > 0 {
            metrics::counter!("warmpath_agent_blocks_refused_total").increment(out.refused);
            let now = Instant::now();
            let quiet = self
                .refusal_logged
                .is_some_and(|t| now.duration_since(t) < Duration::from_secs(10));
            if !quiet {
                self.refusal_logged = Some(now);
                tracing::warn!(
                    refused = out.refused,
                    rank = self.cfg.rank,
                    max = crate::tracker::MAX_BLOCKS,
                    "the engine reports more blocks than any engine holds; new ones refused"
                );
            }
        }
        if out.malformed > 0 {
            self.stats.malformed.add(out.malformed);
            metrics::counter!("warmpath_agent_bad_messages_total", "reason" => "malformed_event")
                .increment(out.malformed);
        }
        self.stats.blocks_hashed.add(out.blocks_hashed);
        if let Some(bs) = out.block_size_learned {
            if let Some(old) = self.hub.block_size().filter(|o| *o != bs) {
                tracing::error!(
                    old,
                    new = bs,
                    rank = self.cfg.rank,
                    "engine ranks disagree on block size"
                );
                metrics::counter!("warmpath_agent_block_size_mismatch_total").increment(1);
            }
            self.hub.set_block_size(bs);
        }
        self.hub.apply(out.changes, now_micros());
    }
}

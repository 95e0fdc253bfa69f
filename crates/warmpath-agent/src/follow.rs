//! Following one engine rank: ZMQ SUB and DEALER replay, both through a
//! [`crate::zmtp_guard`] relay; the sequence rules (restart, duplicate, gap:
//! docs/agent.md, "Agent"); decoding into the [`EngineTracker`] and the [`Hub`].

use crate::hub::Hub;
use crate::replay::{replay, ReplayLimits};
use crate::stats::Stats;
use crate::tracker::EngineTracker;
use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use metrics::counter;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use warmpath_edge::LogEvery;
use warmpath_vllm_events::wire::parse_live;
use warmpath_vllm_events::{decode_batch, DecodeLimits, KvEventBatch};
use zeromq::{Socket, SocketEvent, SocketRecv, SubSocket};

/// How to follow one rank: its endpoints and the topic prefix.
#[derive(Clone, Debug)]
pub struct FollowConfig {
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    pub topic: String,
    pub rank: u16,
}

/// What one replay may take (the batches are held until it ends).
const REPLAY_LIMITS: ReplayLimits = ReplayLimits {
    deadline: Duration::from_secs(3),
    max_batches: 100_000,
    max_bytes: 256 << 20,
};

/// How many recently applied batches' digests a rank keeps, to tell a
/// duplicate (a replay overlapping live batches: those published during the
/// replay's round trip, a few seconds at most) from a restarted engine.
/// 64 KiB per rank.
pub const APPLIED_WINDOW: usize = 4096;

/// An empty slot of the applied window (`u64::MAX` is the replay's end
/// marker, never a batch).
const NO_BATCH: (u64, u64) = (u64::MAX, 0);

struct Follower {
    cfg: FollowConfig,
    tracker: EngineTracker,
    hub: Arc<Hub>,
    stats: Arc<Stats>,
    last: Option<u64>,
    /// `(seq, payload digest)` of recently applied batches, at `seq % len`.
    applied: Box<[(u64, u64)]>,
    /// Keys the digests (random per rank: an engine cannot aim collisions).
    digest_key: RandomState,
    /// The SUB socket lost its connection since the last batch: the next
    /// batch may come from another engine process.
    reconnected: bool,
    /// Where replays dial: the guard's endpoint for the replay endpoint.
    replay_at: Option<String>,
    /// Whether the start-up replay ran (once, though the socket may be re-made).
    buffer_read: bool,
    last_parent_replay: Option<Instant>,
    pending_parent: bool,
    rank_label: String,
    /// Refused blocks are logged at most every 10 s.
    refusal_log: LogEvery,
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
    // The guards live as long as this rank is followed.
    let guards = cancel.child_token();
    let _stop_guards = guards.clone().drop_guard();
    let max_frame = DecodeLimits::default().max_payload_bytes as u64;
    let events_at = guarded(&cfg.endpoint, max_frame, &guards).await;
    let replay_at = match &cfg.replay_endpoint {
        Some(ep) => Some(guarded(ep, max_frame, &guards).await),
        None => None,
    };
    let mut f = Follower::new(cfg, tracker, hub, stats, replay_at);
    loop {
        // A socket made again (after a failed subscribe) is a new connection.
        f.reconnected |= f.last.is_some();
        let mut sub = SubSocket::new();
        // Before connecting, so the first `Connected` is seen too.
        let mut socket_events = sub.monitor();
        let connected = tokio::select! {
            _ = cancel.cancelled() => return,
            r = sub.connect(&events_at) => r,
        };
        if let Err(e) = connected {
            // The crate keeps dialling a refused port for its connect timeout
            // (30 s); this is that timeout or a bad endpoint.
            tracing::warn!(endpoint = %f.cfg.endpoint, error = %e, "cannot connect to engine events; retrying");
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
            }
        }
        if let Err(e) = sub.subscribe(&f.cfg.topic).await {
            tracing::warn!(error = %e, "subscribe failed; reconnecting");
            continue;
        }
        tracing::info!(endpoint = %f.cfg.endpoint, rank = f.cfg.rank, "following engine events");
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
                Err(e) => {
                    f.reconnected = true;
                    tracing::warn!(
                        rank = f.cfg.rank,
                        error = %e,
                        "event socket receive failed; reconnecting"
                    );
                }
                Ok(m) => {
                    // A disconnect is queued before the socket re-dials: seen
                    // here before any batch of the new connection.
                    while let Some(Some(ev)) = socket_events.next().now_or_never() {
                        f.on_socket_event(ev, &mut connects);
                    }
                    f.on_live(m.into_vec()).await
                }
            }
        }
    }
}

/// The endpoint to dial for `target`: a [`crate::zmtp_guard`] relay's, or
/// `target` itself when none could start (logged).
async fn guarded(target: &str, max_frame: u64, cancel: &CancellationToken) -> String {
    match crate::zmtp_guard::start(target, max_frame, cancel.clone()).await {
        Ok(endpoint) => endpoint,
        Err(e) => {
            tracing::error!(endpoint = %target, error = %e,
                "cannot start the frame guard; connecting without it (an oversized frame can abort the agent)");
            target.to_owned()
        }
    }
}

impl Follower {
    fn new(
        cfg: FollowConfig,
        tracker: EngineTracker,
        hub: Arc<Hub>,
        stats: Arc<Stats>,
        replay_at: Option<String>,
    ) -> Self {
        Follower {
            replay_at,
            rank_label: cfg.rank.to_string(),
            cfg,
            tracker,
            hub,
            stats,
            last: None,
            applied: vec![NO_BATCH; APPLIED_WINDOW].into_boxed_slice(),
            digest_key: RandomState::new(),
            reconnected: false,
            buffer_read: false,
            last_parent_replay: None,
            pending_parent: false,
            refusal_log: LogEvery::default(),
        }
    }

    /// Logs the SUB socket's own disconnects and reconnects (the socket
    /// re-dials by itself); `connects` counts this socket's connections.
    fn on_socket_event(&mut self, ev: SocketEvent, connects: &mut u64) {
        let (endpoint, rank) = (&self.cfg.endpoint, self.cfg.rank);
        match ev {
            SocketEvent::Connected(..) => {
                *connects += 1;
                if *connects > 1 {
                    // Normally marked by the `Disconnected` before it.
                    self.reconnected = true;
                    self.stats.event_reconnects.inc();
                    counter!("warmpath_agent_event_reconnects_total").increment(1);
                    tracing::info!(%endpoint, rank, "reconnected to engine events");
                }
            }
            SocketEvent::Disconnected(_) => {
                self.reconnected = true;
                tracing::info!(%endpoint, rank, "engine events publisher went away");
            }
            _ => {}
        }
    }

    async fn on_live(&mut self, frames: Vec<Bytes>) {
        let Some((seq, payload)) = parse_live(&frames) else {
            self.stats.bad_frames.inc();
            counter!("warmpath_agent_bad_messages_total", "reason" => "frames").increment(1);
            tracing::warn!(
                frames = frames.len(),
                "event message is not [topic, seq(8 bytes), payload]; skipped"
            );
            return;
        };
        let reconnected = std::mem::take(&mut self.reconnected);
        // Whether the batches before `seq` are to be learned from the start.
        let prev = self.last;
        let from_start = match prev {
            None => true,
            Some(last) if seq <= last => {
                if self.applied_as(seq) == Some(self.digest(&payload)) {
                    tracing::debug!(seq, "batch already applied (a replay overlapped it)");
                    return;
                }
                self.restarted(last, seq, "sequence went back to one not applied from it");
                true
            }
            Some(last) if reconnected && !self.same_engine(last, seq).await => {
                self.restarted(last, seq, "events reconnected from another engine process");
                true
            }
            Some(last) if seq == last.wrapping_add(1) => false,
            Some(last) => {
                let rank = self.cfg.rank;
                tracing::warn!(last, seq, rank, "sequence gap in engine events");
                self.stats.gaps.inc();
                counter!("warmpath_agent_seq_gaps_total").increment(1);
                self.catch_up(last + 1, seq).await;
                false
            }
        };
        if from_start && seq > 0 {
            self.catch_up(0, seq).await;
        }
        self.apply(seq, &payload);
        if self.parent_replay_due() {
            self.catch_up(0, seq.saturating_add(1)).await;
        }
    }

    /// Whether an unknown parent in the last batch warrants a catch-up
    /// replay (at most one every 10 s).
    fn parent_replay_due(&mut self) -> bool {
        let due = std::mem::take(&mut self.pending_parent)
            && self.replay_at.is_some()
            && self
                .last_parent_replay
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(10));
        if due {
            self.last_parent_replay = Some(Instant::now());
        }
        due
    }

    /// The engine restarted (seen by the load scraper, or in the event
    /// stream): its blocks are gone, and its sequence starts again.
    fn forget_engine(&mut self) {
        let removed = self.tracker.clear();
        self.hub.apply(removed, warmpath_proto::unix_micros());
        self.last = None;
        self.applied.fill(NO_BATCH);
        self.stats.engine_restarts.inc();
        counter!("warmpath_agent_engine_restarts_total").increment(1);
        let rank = self.cfg.rank;
        tracing::warn!(rank, "engine restarted: its blocks are forgotten");
    }

    /// The event stream showed a restart at `seq` (`why`): forget the engine.
    fn restarted(&mut self, last: u64, seq: u64, why: &str) {
        tracing::warn!(last, seq, rank = self.cfg.rank, "engine restarted: {why}");
        self.forget_engine();
    }

    fn digest(&self, payload: &[u8]) -> u64 {
        self.digest_key.hash_one(payload)
    }

    /// The digest of the batch applied as `seq`, if still in the window.
    fn applied_as(&self, seq: u64) -> Option<u64> {
        let (s, d) = self.applied[(seq % APPLIED_WINDOW as u64) as usize];
        (s == seq).then_some(d)
    }

    /// After a reconnection, whether the publisher sending `seq` (above
    /// `last`) is the process `last` came from: its replay buffer still
    /// holds `last` with the bytes applied. Without a replay endpoint only
    /// a batch that continues the sequence is trusted: a restarted engine's
    /// would need exactly `last + 1` batches published, all missed, and any
    /// gap means lost events either way.
    async fn same_engine(&mut self, last: u64, seq: u64) -> bool {
        if self.replay_at.is_none() {
            return seq == last.wrapping_add(1);
        }
        let failed = "replay after a reconnection failed; taken as a restart";
        let batches = self.replay_from(last, failed).await.unwrap_or_default();
        let first = batches.first();
        first.is_some_and(|(s, p)| *s == last && self.applied_as(last) == Some(self.digest(p)))
    }

    /// The batches the replay endpoint holds from `from` on, counted; `None`
    /// without a replay endpoint, or when the replay failed (logged: `failed`).
    async fn replay_from(&mut self, from: u64, failed: &str) -> Option<Vec<(u64, Bytes)>> {
        let at = self.replay_at.as_ref()?;
        match replay(at, from, REPLAY_LIMITS).await {
            Ok(batches) => {
                self.stats.replays_ok.inc();
                counter!("warmpath_agent_replays_total", "result" => "ok").increment(1);
                Some(batches)
            }
            Err(why) => {
                counter!("warmpath_agent_replays_total", "result" => "failed").increment(1);
                let endpoint = self.cfg.replay_endpoint.as_deref().unwrap_or_default();
                tracing::warn!(%endpoint, %why, "{failed}");
                None
            }
        }
    }

    /// Applies every batch the replay endpoint still buffers (a warm engine's
    /// cache at agent start). A failure only logs: the first live batch then
    /// catches up as before.
    async fn learn_buffered(&mut self) {
        let failed = "start-up replay failed; learning from live events";
        let Some(batches) = self.replay_from(0, failed).await else {
            return;
        };
        let n = batches.len();
        for (seq, payload) in batches {
            if self.last.is_none_or(|l| seq > l) {
                self.apply(seq, &payload);
            }
        }
        if n > 0 {
            let rank = self.cfg.rank;
            tracing::info!(batches = n, rank, "learned the engine's buffered events");
        }
    }

    /// Replays `from..until` and applies it; on failure to reach `until` (or
    /// without a replay endpoint) counts an unrecovered gap and forces snapshots.
    async fn catch_up(&mut self, from: u64, until: u64) {
        let mut reached = self.last.map_or(from, |l| l.saturating_add(1));
        // Catching up after a (re)start: whatever the buffer still holds helps.
        let mut tolerate_first_hole = self.last.is_none();
        let batches = self.replay_from(from, "replay failed").await;
        for (seq, payload) in batches.unwrap_or_default() {
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
        if reached < until && (from > 0 || self.last.is_some()) {
            self.stats.gaps_unrecovered.inc();
            counter!("warmpath_agent_seq_gaps_unrecovered_total").increment(1);
            tracing::warn!(
                from = reached,
                until,
                "engine events lost; routers get a fresh snapshot"
            );
            self.hub.force_snapshot();
        }
    }

    fn apply(&mut self, seq: u64, payload: &[u8]) {
        self.last = Some(seq);
        self.applied[(seq % APPLIED_WINDOW as u64) as usize] = (seq, self.digest(payload));
        let batch: KvEventBatch = match decode_batch(payload) {
            Ok(b) => b,
            Err(e) => {
                self.stats.bad_payloads.inc();
                counter!("warmpath_agent_bad_messages_total", "reason" => e.kind()).increment(1);
                tracing::warn!(seq, error = %e, "undecodable kv-event batch skipped");
                return;
            }
        };
        self.stats.batches.inc();
        counter!("warmpath_agent_batches_total", "rank" => self.rank_label.clone()).increment(1);
        let out = self.tracker.apply_batch(&batch);
        if out.unknown_parents > 0 {
            self.stats.unknown_parents.add(out.unknown_parents);
            counter!("warmpath_agent_unknown_parent_total").increment(out.unknown_parents);
            self.pending_parent = true;
        }
        if out.unresolved > 0 {
            counter!("warmpath_agent_unresolved_offload_total").increment(out.unresolved);
        }
        if out.refused > 0 {
            counter!("warmpath_agent_blocks_refused_total").increment(out.refused);
            if let Some(suppressed) = self.refusal_log.ready() {
                tracing::warn!(
                    refused = out.refused,
                    suppressed,
                    rank = self.cfg.rank,
                    max = crate::tracker::MAX_BLOCKS,
                    "the engine reports more blocks than any engine holds; new ones refused"
                );
            }
        }
        if out.malformed > 0 {
            counter!("warmpath_agent_bad_messages_total", "reason" => "malformed_event")
                .increment(out.malformed);
        }
        if let Some(bs) = out.block_size_learned {
            if let Some(old) = self.hub.block_size().filter(|o| *o != bs) {
                let rank = self.cfg.rank;
                tracing::error!(old, new = bs, rank, "engine ranks disagree on block size");
                counter!("warmpath_agent_block_size_mismatch_total").increment(1);
            }
            self.hub.set_block_size(bs);
        }
        self.hub.apply(out.changes, warmpath_proto::unix_micros());
    }
}

#[cfg(test)]
#[path = "follow_tests.rs"]
mod tests;

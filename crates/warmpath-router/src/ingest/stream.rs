//! One agent stream's state machine: a worker's snapshot and ordered deltas
//! applied to its pool's index, gaps answered. No I/O, so every rule is unit-tested.

use super::agents::{AgentKey, Agents, Live};
use super::directory::IngestPool;
use std::sync::Arc;
use warmpath_core::index::{Overflow, Stored};
use warmpath_core::{BlockHash, Tier, WorkerSlot};
use warmpath_edge::LogEvery;
use warmpath_proto::v1::{
    self, agent_message::Msg, delta::Op, router_message, AgentMessage, RouterMessage,
};

/// Acknowledge applied deltas at least this often.
const ACK_EVERY: u64 = 256;

/// Why a stream is refused; the text goes to the agent and the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) reason: String,
    pub(crate) retryable: bool,
}

impl Refusal {
    /// A refusal the agent should not retry.
    pub(crate) fn fatal(reason: impl Into<String>) -> Self {
        Refusal {
            reason: reason.into(),
            retryable: false,
        }
    }

    /// A refusal the agent may retry (with backoff).
    pub(crate) fn retry(reason: impl Into<String>) -> Self {
        Refusal {
            retryable: true,
            ..Refusal::fatal(reason)
        }
    }

    pub(crate) fn answer(&self) -> RouterMessage {
        RouterMessage {
            msg: Some(router_message::Msg::Refused(v1::Refused {
                reason: self.reason.clone(),
                retryable: self.retryable,
            })),
        }
    }
}

fn tier(t: i32) -> Tier {
    match v1::Tier::try_from(t).unwrap_or(v1::Tier::Unspecified) {
        v1::Tier::Cpu => Tier::Cpu,
        v1::Tier::Disk => Tier::Disk,
        v1::Tier::Gpu | v1::Tier::Unspecified => Tier::Gpu,
    }
}

fn hashes(raw: &[u64]) -> Vec<BlockHash> {
    raw.iter().map(|h| BlockHash(*h)).collect()
}

fn resend(reason: impl Into<String>) -> RouterMessage {
    RouterMessage {
        msg: Some(router_message::Msg::ResendSnapshot(v1::ResendSnapshot {
            reason: reason.into(),
        })),
    }
}

fn ack(seq: u64) -> RouterMessage {
    RouterMessage {
        msg: Some(router_message::Msg::Ack(v1::Ack { seq })),
    }
}

struct PendingSnapshot {
    seq: u64,
    next_chunk: u32,
    total: u64,
    /// Blocks received, including those beyond the worker's cap.
    received: u64,
    /// At most the worker's cap of them: the rest is refused on arrival.
    blocks: Vec<(u64, Tier)>,
}

/// The stream's metric handles, looked up once instead of per message.
struct Counters {
    snapshot_chunks: metrics::Counter,
    snapshot_blocks: metrics::Counter,
    deltas: metrics::Counter,
    stored_blocks: metrics::Counter,
    removed_blocks: metrics::Counter,
    lag: metrics::Histogram,
}

/// A stream after a valid Hello.
pub(crate) struct WorkerStream {
    pool: IngestPool,
    agents: Arc<Agents>,
    key: AgentKey,
    slot: WorkerSlot,
    epoch: u64,
    pub(crate) stream_id: u64,
    /// This worker's per-message status (atomics: no registry lock).
    pub(crate) live: Arc<Live>,
    counters: Counters,
    /// Seq of the last applied snapshot/delta; `None` until a snapshot lands.
    applied: Option<u64>,
    pending: Option<PendingSnapshot>,
    unacked: u64,
    /// Refused blocks are logged at most once every 10 s; `unreported` since the last line.
    refusal_log: LogEvery,
    unreported: u64,
}

impl WorkerStream {
    /// Validates a Hello and registers the worker. `Err` = refuse the stream.
    pub(crate) fn open(
        pool: IngestPool,
        agents: Arc<Agents>,
        hello: &v1::Hello,
        now_ms: u64,
    ) -> Result<Self, Refusal> {
        if hello.worker_id.is_empty() || hello.worker_id.len() > 256 {
            return Err(Refusal::fatal("worker_id must be 1 to 256 bytes"));
        }
        let key = AgentKey {
            model: hello.model.clone(),
            worker_id: hello.worker_id.clone(),
        };
        if let Some(known) = &pool.known_workers {
            if !known.contains(&hello.worker_id) {
                metrics::counter!("warmpath_ingest_refused_total", "reason" => "worker_id")
                    .increment(1);
                return Err(Refusal::fatal(format!(
                        "worker id {:?} is not a backend of pool {:?} (its worker_ids: {}); set --worker-id to the backend's worker_id (default: its url)",
                        hello.worker_id,
                        hello.model,
                        known.join(", ")
                    )));
            }
        }
        check_block_size(&pool, hello.block_size)
            .inspect_err(|r| agents.refused(&key, &r.reason))?;
        let (stream_id, live) = agents.claim(&key, hello, now_ms).map_err(|reason| {
            agents.refused(&key, &reason);
            Refusal::fatal(reason)
        })?;
        let slot = pool
            .index
            .register_worker(&hello.worker_id)
            .map_err(|e| Refusal::fatal(e.to_string()))?;
        // Heard now; entries of an older epoch keep serving until the new snapshot replaces them.
        let _ = pool.index.mark_heard(slot, now_ms);
        if pool.index.worker_cap(slot).is_none() {
            let _ = pool
                .index
                .set_worker_cap(slot, Some(pool.bounds.worker_cap(None)));
        }
        Ok(WorkerStream {
            pool,
            agents,
            key,
            slot,
            epoch: hello.epoch,
            stream_id,
            live,
            counters: Counters {
                snapshot_chunks: metrics::counter!("warmpath_ingest_messages_total", "kind" => "snapshot_chunk"),
                snapshot_blocks: metrics::counter!("warmpath_ingest_blocks_total", "op" => "snapshot"),
                deltas: metrics::counter!("warmpath_ingest_messages_total", "kind" => "delta"),
                stored_blocks: metrics::counter!("warmpath_ingest_blocks_total", "op" => "stored"),
                removed_blocks: metrics::counter!("warmpath_ingest_blocks_total", "op" => "removed"),
                lag: metrics::histogram!("warmpath_ingest_lag_seconds"),
            },
            applied: None,
            pending: None,
            unacked: 0,
            refusal_log: LogEvery::default(),
            unreported: 0,
        })
    }

    pub(crate) fn owns(&self) -> bool {
        self.live.owned_by(self.stream_id)
    }

    /// Marks the worker disconnected (its entries stay until stale).
    pub(crate) fn close(&self) {
        self.agents.disconnect(&self.key, self.stream_id);
    }

    /// Applies one message; returns what to answer.
    pub(crate) fn on_message(
        &mut self,
        msg: AgentMessage,
        now_ms: u64,
        now_unix_micros: u64,
    ) -> Result<Vec<RouterMessage>, Refusal> {
        if !self.owns() {
            if self.live.removed() {
                metrics::counter!("warmpath_ingest_refused_total", "reason" => "removed")
                    .increment(1);
                return Err(Refusal::fatal(format!(
                    "worker {:?} was removed from pool {:?}",
                    self.key.worker_id, self.key.model
                )));
            }
            return Err(Refusal::retry("another stream took over this worker"));
        }
        let _ = self.pool.index.mark_heard(self.slot, now_ms);
        self.live.heard(now_ms);
        let Some(msg) = msg.msg else {
            return Ok(vec![]);
        };
        match msg {
            Msg::Hello(h) => self.on_hello(&h),
            Msg::Snapshot(chunk) => Ok(self.on_snapshot(chunk)),
            Msg::Delta(d) => Ok(self.on_delta(d, now_unix_micros)),
            Msg::Load(mut l) => {
                // The policy models no more of the cache than the index would hold.
                l.capacity_blocks = l.capacity_blocks.min(self.pool.bounds.max_worker_blocks());
                self.agents.set_load(&self.key, &l);
                let capacity = (l.capacity_blocks > 0).then_some(l.capacity_blocks);
                let cap = self.pool.bounds.worker_cap(capacity);
                let _ = self.pool.index.set_worker_cap(self.slot, Some(cap));
                Ok(vec![])
            }
            // A decision is applied by the stream's driver (it needs the pool's policy).
            Msg::Heartbeat(_) | Msg::Decision(_) => Ok(vec![]),
        }
    }

    fn on_hello(&mut self, h: &v1::Hello) -> Result<Vec<RouterMessage>, Refusal> {
        if h.worker_id != self.key.worker_id || h.model != self.key.model || h.epoch != self.epoch {
            return Err(Refusal::fatal(
                "a repeated Hello may only change block_size",
            ));
        }
        if let Err(r) = check_block_size(&self.pool, h.block_size) {
            // Entries hashed with another block size could only mislead.
            let _ = self.pool.index.clear_worker(self.slot);
            self.agents.refused(&self.key, &r.reason);
            return Err(r);
        }
        self.agents.set_block_size(&self.key, h.block_size);
        // A changed block size invalidates the entries; a snapshot follows.
        let _ = self.pool.index.clear_worker(self.slot);
        self.applied = None;
        self.pending = None;
        Ok(vec![])
    }

    fn on_snapshot(&mut self, c: v1::SnapshotChunk) -> Vec<RouterMessage> {
        self.counters.snapshot_chunks.increment(1);
        if c.first {
            self.pending = Some(PendingSnapshot {
                seq: c.seq,
                next_chunk: 0,
                total: c.total_blocks,
                received: 0,
                // The announced total is the agent's word: reserve at most the cap.
                blocks: Vec::with_capacity(c.total_blocks.min(self.cap()).min(1 << 22) as usize),
            });
        }
        let cap = self.cap() as usize;
        let Some(p) = self.pending.as_mut() else {
            return vec![resend("snapshot chunk without a first chunk")];
        };
        if p.seq != c.seq || p.next_chunk != c.chunk_index {
            self.pending = None;
            self.applied = None;
            return vec![resend("snapshot chunks out of order")];
        }
        p.next_chunk += 1;
        p.received += c.blocks.len() as u64;
        let room = cap.saturating_sub(p.blocks.len());
        let over = c.blocks.len().saturating_sub(room);
        p.blocks
            .extend(c.blocks.iter().take(room).map(|b| (b.hash, tier(b.tier))));
        if over > 0 {
            self.refused(over as u64, Overflow::WorkerCap);
        }
        if !c.last {
            return vec![];
        }
        let Some(p) = self.pending.take() else {
            return vec![];
        };
        if p.received != p.total {
            self.applied = None;
            return vec![resend(format!(
                "snapshot had {} blocks, announced {}",
                p.received, p.total
            ))];
        }
        let index = Arc::clone(&self.pool.index);
        // The claim is withdrawn while the set is replaced (index `closure`).
        let _ = index.set_prefix_closed(self.slot, false);
        let _ = index.clear_worker(self.slot);
        for t in Tier::ALL {
            let hs: Vec<BlockHash> = p
                .blocks
                .iter()
                .filter(|(_, bt)| *bt == t)
                .map(|(h, _)| BlockHash(*h))
                .collect();
            if !hs.is_empty() {
                if let Ok(st) = index.store_bounded(self.slot, t, &hs) {
                    self.note(st);
                }
            }
        }
        // Blocks dropped past the worker's cap leave holes the claim cannot cover.
        if c.prefix_closed && p.blocks.len() as u64 == p.received {
            let _ = index.set_prefix_closed(self.slot, true);
        }
        self.counters.snapshot_blocks.increment(p.total);
        self.applied = Some(p.seq);
        self.unacked = 0;
        self.live.applied(p.seq, true);
        vec![ack(p.seq)]
    }

    fn on_delta(&mut self, d: v1::Delta, now_unix_micros: u64) -> Vec<RouterMessage> {
        self.counters.deltas.increment(1);
        let Some(last) = self.applied else {
            // Waiting for the snapshot we asked for (or that is coming).
            return vec![];
        };
        if d.seq <= last {
            return vec![]; // duplicate
        }
        if d.seq != last + 1 {
            metrics::counter!("warmpath_ingest_gaps_total").increment(1);
            tracing::warn!(worker = %self.key.worker_id, expected = last + 1, got = d.seq, "delta gap; asking for a snapshot");
            self.applied = None;
            self.pending = None;
            return vec![resend(format!(
                "delta gap: expected seq {}, got {}",
                last + 1,
                d.seq
            ))];
        }
        let index = Arc::clone(&self.pool.index);
        // A delta that leaves the set open withdraws the claim before it
        // applies; one that leaves it closed makes the claim after.
        if !d.prefix_closed {
            let _ = index.set_prefix_closed(self.slot, false);
        }
        match d.op {
            Some(Op::Stored(s)) => {
                self.counters.stored_blocks.increment(s.hashes.len() as u64);
                if let Ok(st) = index.store_bounded(self.slot, tier(s.tier), &hashes(&s.hashes)) {
                    self.note(st);
                }
            }
            Some(Op::Removed(r)) => {
                self.counters
                    .removed_blocks
                    .increment(r.hashes.len() as u64);
                let _ = index.remove(self.slot, Some(tier(r.tier)), &hashes(&r.hashes));
            }
            Some(Op::Cleared(_)) => {
                let _ = index.clear_worker(self.slot);
            }
            None => {}
        }
        if d.prefix_closed {
            let _ = index.set_prefix_closed(self.slot, true);
        }
        if d.observed_unix_micros > 0 {
            let lag = now_unix_micros.saturating_sub(d.observed_unix_micros) as f64 / 1e6;
            self.counters.lag.record(lag);
            self.live.lag(lag);
        }
        self.applied = Some(d.seq);
        self.live.applied(d.seq, false);
        self.unacked += 1;
        if self.unacked >= ACK_EVERY {
            self.unacked = 0;
            return vec![ack(d.seq)];
        }
        vec![]
    }

    /// The most entries this worker may hold now.
    fn cap(&self) -> u64 {
        self.pool
            .index
            .worker_cap(self.slot)
            .unwrap_or_else(|| self.pool.bounds.worker_cap(None))
    }

    fn note(&mut self, st: Stored) {
        if let Some(why) = st.reason.filter(|_| st.refused > 0) {
            self.refused(st.refused as u64, why);
        }
    }

    /// Counts refused blocks and logs them, at most once every 10 s.
    fn refused(&mut self, n: u64, why: Overflow) {
        metrics::counter!("warmpath_ingest_refused_blocks_total", "pool" => self.pool.model.clone(), "reason" => why.as_str())
            .increment(n);
        self.unreported += n;
        if self.refusal_log.ready().is_none() {
            return;
        }
        let blocks = std::mem::take(&mut self.unreported);
        let index = &self.pool.index;
        tracing::warn!(
            worker = %self.key.worker_id,
            blocks,
            reason = why.as_str(),
            worker_cap = self.cap(),
            held = index.block_count(self.slot),
            pool_entries = index.entries(),
            max_entries = self.pool.bounds.max_entries,
            "index bound reached: blocks refused (worker_capacity: the engine's reported capacity x 1.25, at most a quarter of index.max_entries; max_entries: the pool's index.max_entries)"
        );
    }
}

impl Drop for WorkerStream {
    /// A stream dropped without [`WorkerStream::close`] (a panic) disconnects too.
    fn drop(&mut self) {
        self.close();
    }
}

fn check_block_size(pool: &IngestPool, block_size: u32) -> Result<(), Refusal> {
    if block_size != 0 && block_size as usize != pool.block_size {
        metrics::counter!("warmpath_ingest_refused_total", "reason" => "block_size").increment(1);
        return Err(Refusal::fatal(format!(
                "block size mismatch: the agent reports {block_size} tokens per block, the router's pool uses {}; hashes could never match",
                pool.block_size
            )));
    }
    Ok(())
}

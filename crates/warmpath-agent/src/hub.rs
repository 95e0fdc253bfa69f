//! The worker's published block set (the union of its ranks', refcounted) and
//! its fan-out: numbered [`Delta`]s into each router's bounded [`Sink`]. An
//! overflowing sink trades its queue for a snapshot (a slow router costs a
//! snapshot, never unbounded memory); snapshots are taken under the lock that
//! numbers deltas, so one at seq S is exact. Decisions a router shares are
//! queued for the others, bounded and cleared on reconnect (only fresh ones matter).

use crate::closure::Closure;
use crate::tracker::Change;
use crate::tracker::FastMap;
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use tokio::sync::Notify;
use warmpath_core::BlockHash;
use warmpath_proto::v1::{delta, Block, Cleared, Delta, Removed, Stored, Tier};

/// The largest decision passed on to other routers.
const MAX_DECIDED_BYTES: usize = 64 << 10;

/// The most bytes of decision facts queued for one router.
const MAX_DECIDED_QUEUE_BYTES: usize = 4 << 20;

/// A router link's queue: deltas not yet sent, or a snapshot request.
#[derive(Debug)]
pub struct Sink {
    /// The router's URL, for logs and metrics.
    pub(crate) name: String,
    capacity: usize,
    state: Mutex<SinkState>,
    /// Woken when there is work.
    pub(crate) notify: Notify,
}

#[derive(Debug, Default)]
struct SinkState {
    deltas: VecDeque<Delta>,
    /// Other routers' decisions to pass on to this one, and their bytes.
    decided: VecDeque<Bytes>,
    decided_bytes: usize,
    /// Whether the last work taken was facts.
    decided_last: bool,
    needs_snapshot: bool,
    hello_changed: bool,
}

/// What a router link should send next.
#[derive(Debug)]
pub enum Work {
    /// A new Hello (block size learned or changed), then a snapshot.
    Hello,
    /// A full snapshot as of `seq`.
    Snapshot {
        seq: u64,
        blocks: Vec<Block>,
        prefix_closed: bool,
    },
    /// Queued deltas, in order.
    Deltas(Vec<Delta>),
    /// Other router replicas' decisions, to pass on unchanged.
    Decided(Vec<Bytes>),
}

impl Sink {
    /// Forgets the other routers' decisions queued for this one (its
    /// stream is new: it knows nothing of what they were about).
    pub fn clear_decided(&self) {
        let mut st = self.state.lock();
        st.decided.clear();
        st.decided_bytes = 0;
    }

    /// Asks for a snapshot before anything else (new stream, router request).
    pub fn request_snapshot(&self) {
        let mut s = self.state.lock();
        s.needs_snapshot = true;
        s.deltas.clear();
        drop(s);
        self.notify.notify_one();
    }
}

#[derive(Debug)]
struct Held {
    parent: Option<BlockHash>,
    refs: u32,
}

#[derive(Debug, Default)]
struct Inner {
    blocks: FastMap<(BlockHash, i32), Held>,
    closure: Closure,
    seq: u64,
    block_size: Option<u32>,
    sinks: Vec<Arc<Sink>>,
}

/// The hub, empty at seq 0. Shared as `Arc`.
#[derive(Debug, Default)]
pub struct Hub {
    inner: Mutex<Inner>,
}

impl Hub {
    /// Registers a router link's queue holding at most `capacity` deltas.
    pub fn add_sink(&self, name: impl Into<String>, capacity: usize) -> Arc<Sink> {
        let sink = Arc::new(Sink {
            name: name.into(),
            capacity: capacity.max(1),
            state: Mutex::new(SinkState {
                needs_snapshot: true,
                ..Default::default()
            }),
            notify: Notify::new(),
        });
        self.inner.lock().sinks.push(sink.clone());
        sink
    }

    /// Drops a router link's queue (the replica went away).
    pub fn remove_sink(&self, sink: &Arc<Sink>) {
        self.inner.lock().sinks.retain(|s| !Arc::ptr_eq(s, sink));
    }

    /// The current seq, block count and learned block size.
    pub fn status(&self) -> (u64, usize, Option<u32>) {
        let i = self.inner.lock();
        (i.seq, i.blocks.len(), i.block_size)
    }

    pub fn block_size(&self) -> Option<u32> {
        self.inner.lock().block_size
    }

    /// Records the engine's block size; a change makes every link re-send Hello
    /// and a snapshot.
    pub fn set_block_size(&self, bs: u32) {
        let mut i = self.inner.lock();
        if i.block_size == Some(bs) {
            return;
        }
        i.block_size = Some(bs);
        for s in &i.sinks {
            s.state.lock().hello_changed = true;
            s.request_snapshot();
        }
    }

    /// Every link sends a fresh snapshot (after an unrecoverable engine gap).
    pub fn force_snapshot(&self) {
        for s in &self.inner.lock().sinks {
            s.request_snapshot();
        }
    }

    /// Applies rank changes; returns how many deltas were emitted.
    pub fn apply(&self, changes: Vec<Change>, observed_unix_micros: u64) -> usize {
        let mut guard = self.inner.lock();
        let i = &mut *guard;
        let gpu = Tier::Gpu as i32;
        let mut emitted = 0;
        for c in changes {
            let op = match c {
                Change::Stored {
                    parent,
                    hashes,
                    tier,
                } => {
                    let mut fresh = Vec::with_capacity(hashes.len());
                    for (k, h) in hashes.iter().enumerate() {
                        let p = if k == 0 { parent } else { Some(hashes[k - 1]) };
                        let e = i
                            .blocks
                            .entry((*h, tier as i32))
                            .or_insert(Held { parent: p, refs: 0 });
                        e.refs += 1;
                        if e.refs == 1 {
                            fresh.push(*h);
                            let (parent, blocks) = (e.parent, &i.blocks);
                            i.closure
                                .added(*h, parent, tier, |x| blocks.contains_key(&(x, gpu)));
                        }
                    }
                    if fresh.is_empty() {
                        continue;
                    }
                    // `parent` stays exact only when the whole segment is new.
                    let parent = parent.filter(|_| fresh.len() == hashes.len());
                    delta::Op::Stored(Stored {
                        parent: parent.map(|p| p.0),
                        hashes: fresh.iter().map(|h| h.0).collect(),
                        tier: tier as i32,
                    })
                }
                Change::Removed { hashes, tier } => {
                    let mut gone = Vec::with_capacity(hashes.len());
                    for h in hashes {
                        let key = (h, tier as i32);
                        if let Some(e) = i.blocks.get_mut(&key) {
                            e.refs -= 1;
                            if e.refs == 0 {
                                let parent = e.parent;
                                i.blocks.remove(&key);
                                gone.push(h.0);
                                let blocks = &i.blocks;
                                i.closure
                                    .removed(h, parent, tier, |x| blocks.contains_key(&(x, gpu)));
                            }
                        }
                    }
                    if gone.is_empty() {
                        continue;
                    }
                    if i.blocks.is_empty() && gone.len() > 1 {
                        delta::Op::Cleared(Cleared {})
                    } else {
                        delta::Op::Removed(Removed {
                            hashes: gone,
                            tier: tier as i32,
                        })
                    }
                }
            };
            i.seq += 1;
            emitted += 1;
            let d = Delta {
                seq: i.seq,
                op: Some(op),
                observed_unix_micros,
                prefix_closed: i.closure.is_closed(),
            };
            for s in &i.sinks {
                let mut st = s.state.lock();
                if st.needs_snapshot {
                    continue; // the snapshot will include it
                }
                if st.deltas.len() >= s.capacity {
                    st.deltas.clear();
                    st.needs_snapshot = true;
                    metrics::counter!("warmpath_agent_deltas_coalesced_total", "router" => s.name.clone())
                        .increment(1);
                    tracing::warn!(router = %s.name, "router is slow: queued deltas coalesced into a snapshot");
                } else {
                    st.deltas.push_back(d.clone());
                }
                drop(st);
                s.notify.notify_one();
            }
        }
        metrics::gauge!("warmpath_agent_blocks").set(i.blocks.len() as f64);
        emitted
    }

    /// Queues `d`, the bytes of a decision the router behind `from` made,
    /// for every other router; returns how many it was queued for. A full
    /// queue (by count or by bytes) drops its oldest; a decision larger than
    /// `MAX_DECIDED_BYTES` (a router's are a few hundred bytes, a hot
    /// prefix's copies listed) is not passed on at all.
    pub fn share(&self, from: &Sink, d: &Bytes) -> usize {
        let size = d.len();
        if size > MAX_DECIDED_BYTES {
            metrics::counter!("warmpath_agent_decisions_dropped_total").increment(1);
            return 0;
        }
        let i = self.inner.lock();
        let mut n = 0;
        for s in i.sinks.iter().filter(|s| !std::ptr::eq(s.as_ref(), from)) {
            let mut st = s.state.lock();
            while st.decided.len() >= s.capacity
                || (!st.decided.is_empty() && st.decided_bytes + size > MAX_DECIDED_QUEUE_BYTES)
            {
                if let Some(old) = st.decided.pop_front() {
                    st.decided_bytes -= old.len();
                }
                metrics::counter!("warmpath_agent_decisions_dropped_total").increment(1);
            }
            st.decided_bytes += size;
            st.decided.push_back(d.clone());
            drop(st);
            s.notify.notify_one();
            n += 1;
        }
        n
    }

    /// Takes the next piece of work for `sink`, if any.
    pub fn take_work(&self, sink: &Sink) -> Option<Work> {
        let i = self.inner.lock();
        let mut st = sink.state.lock();
        if st.hello_changed {
            st.hello_changed = false;
            return Some(Work::Hello);
        }
        // Other routers' facts go first, but never twice in a row while this
        // router's block updates wait: a stream of facts cannot starve them.
        let blocks_wait = st.needs_snapshot || !st.deltas.is_empty();
        if !st.decided.is_empty() && (!st.decided_last || !blocks_wait) {
            st.decided_last = true;
            st.decided_bytes = 0;
            return Some(Work::Decided(st.decided.drain(..).collect()));
        }
        st.decided_last = false;
        if st.needs_snapshot {
            st.needs_snapshot = false;
            st.deltas.clear();
            let blocks = i
                .blocks
                .iter()
                .map(|((h, t), held)| Block {
                    hash: h.0,
                    parent: held.parent.map(|p| p.0),
                    tier: *t,
                })
                .collect();
            return Some(Work::Snapshot {
                seq: i.seq,
                blocks,
                prefix_closed: i.closure.is_closed(),
            });
        }
        if st.deltas.is_empty() {
            return None;
        }
        Some(Work::Deltas(st.deltas.drain(..).collect()))
    }

    /// Whether `(hash, tier)` is held.
    #[cfg(test)]
    pub fn contains(&self, hash: BlockHash, tier: Tier) -> bool {
        self.inner.lock().blocks.contains_key(&(hash, tier as i32))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_decision_goes_to_every_other_router_first_and_bounded() {
        let hub = Hub::default();
        let (a, b, c) = (
            hub.add_sink("a", 2),
            hub.add_sink("b", 2),
            hub.add_sink("c", 2),
        );
        for s in [&a, &b, &c] {
            while hub.take_work(s).is_some() {}
        }
        // Opaque to the agent: any bytes are relayed as they came.
        let fact = |request: u64| Bytes::from(format!("fact {request}"));
        assert_eq!(hub.share(&a, &fact(1)), 2);
        assert!(hub.take_work(&a).is_none(), "not back to its sender");
        match hub.take_work(&b) {
            Some(Work::Decided(ds)) => assert_eq!(ds, vec![fact(1)]),
            w => panic!("{w:?}"),
        }
        // A full queue drops its oldest fact; a new stream forgets them all.
        for r in 2..=4 {
            hub.share(&a, &fact(r));
        }
        match hub.take_work(&b) {
            Some(Work::Decided(ds)) => assert_eq!(ds, vec![fact(3), fact(4)]),
            w => panic!("{w:?}"),
        }
        c.clear_decided();
        assert!(hub.take_work(&c).is_none());
    }

    #[test]
    fn a_stream_of_facts_does_not_starve_block_updates() {
        let hub = Hub::default();
        let (a, b) = (hub.add_sink("a", 64), hub.add_sink("b", 64));
        for s in [&a, &b] {
            while hub.take_work(s).is_some() {}
        }
        // Opaque to the agent: any bytes are relayed as they came.
        let fact = |request: u64| Bytes::from(format!("fact {request}"));
        hub.share(&a, &fact(1));
        hub.apply(vec![stored(&[1], Tier::Gpu)], 0);
        assert!(matches!(hub.take_work(&b), Some(Work::Decided(_))));
        // A new fact arrived meanwhile: the waiting delta goes first.
        hub.share(&a, &fact(2));
        assert!(matches!(hub.take_work(&b), Some(Work::Deltas(_))));
        assert!(matches!(hub.take_work(&b), Some(Work::Decided(ds)) if ds == vec![fact(2)]));
        assert!(hub.take_work(&b).is_none());
    }

    #[test]
    fn decision_facts_are_bounded_in_bytes() {
        let hub = Hub::default();
        let (a, b) = (hub.add_sink("a", 1 << 20), hub.add_sink("b", 1 << 20));
        for s in [&a, &b] {
            while hub.take_work(s).is_some() {}
        }
        // The request number, then padding up to `bytes`.
        let fact = |request: u64, bytes: usize| {
            let mut b = request.to_le_bytes().to_vec();
            b.resize(bytes.max(8), 0xff);
            Bytes::from(b)
        };
        // Too large to pass on.
        assert_eq!(hub.share(&a, &fact(1, MAX_DECIDED_BYTES + 1)), 0);
        assert!(hub.take_work(&b).is_none());
        // 100 facts of 60 KiB: the queue keeps the newest that fit in its bytes.
        for r in 0..100 {
            assert_eq!(hub.share(&a, &fact(r, 60 << 10)), 1);
        }
        match hub.take_work(&b) {
            Some(Work::Decided(ds)) => {
                let bytes: usize = ds.iter().map(Bytes::len).sum();
                assert!(bytes <= MAX_DECIDED_QUEUE_BYTES, "{bytes}");
                assert!(ds.len() >= 60, "{}", ds.len());
                assert_eq!(
                    ds.last().map(|d| d[..8].to_vec()),
                    Some(99u64.to_le_bytes().to_vec())
                );
            }
            w => panic!("{w:?}"),
        }
        // The count starts afresh after a drain.
        assert_eq!(hub.share(&a, &fact(100, 10)), 1);
        assert!(matches!(hub.take_work(&b), Some(Work::Decided(ds)) if ds.len() == 1));
    }

    fn stored(hs: &[u64], tier: Tier) -> Change {
        Change::Stored {
            parent: None,
            hashes: hs.iter().map(|h| BlockHash(*h)).collect(),
            tier,
        }
    }

    fn removed(hs: &[u64], tier: Tier) -> Change {
        Change::Removed {
            hashes: hs.iter().map(|h| BlockHash(*h)).collect(),
            tier,
        }
    }

    #[test]
    fn snapshot_then_numbered_deltas() {
        let hub = Hub::default();
        let sink = hub.add_sink("r", 8);
        hub.apply(vec![stored(&[1, 2], Tier::Gpu)], 0);
        let Some(Work::Snapshot { seq, blocks, .. }) = hub.take_work(&sink) else {
            panic!("a new sink starts with a snapshot")
        };
        assert_eq!((seq, blocks.len()), (1, 2));
        hub.apply(vec![stored(&[3], Tier::Gpu), removed(&[1], Tier::Gpu)], 0);
        let Some(Work::Deltas(d)) = hub.take_work(&sink) else {
            panic!()
        };
        assert_eq!(d.iter().map(|d| d.seq).collect::<Vec<_>>(), vec![2, 3]);
        assert!(hub.take_work(&sink).is_none());
    }

    /// Each delta says whether the set is prefix-closed once it is applied,
    /// and so does a snapshot.
    #[test]
    fn deltas_and_snapshots_say_whether_the_set_is_prefix_closed() {
        let hub = Hub::default();
        let sink = hub.add_sink("r", 64);
        let closed_after = |hub: &Hub, changes: Vec<Change>| {
            hub.apply(changes, 0);
            let flags: Vec<bool> = match hub.take_work(&sink) {
                Some(Work::Snapshot { prefix_closed, .. }) => vec![prefix_closed],
                Some(Work::Deltas(ds)) => ds.iter().map(|d| d.prefix_closed).collect(),
                w => panic!("{w:?}"),
            };
            flags
        };
        let seg = |parent: Option<u64>, hs: &[u64], tier: Tier| Change::Stored {
            parent: parent.map(BlockHash),
            hashes: hs.iter().map(|h| BlockHash(*h)).collect(),
            tier,
        };
        // The first work is the snapshot: a chain from its root.
        assert_eq!(
            closed_after(&hub, vec![seg(None, &[1, 2], Tier::Gpu)]),
            [true]
        );
        // A segment below a block not held is an orphan until it comes.
        assert_eq!(
            closed_after(&hub, vec![seg(Some(3), &[4], Tier::Gpu)]),
            [false]
        );
        assert_eq!(
            closed_after(&hub, vec![seg(Some(2), &[3], Tier::Gpu)]),
            [true]
        );
        // Evicting a parent before its child breaks it; the child going
        // mends it.
        assert_eq!(
            closed_after(
                &hub,
                vec![removed(&[3], Tier::Gpu), removed(&[4], Tier::Gpu)]
            ),
            [false, true]
        );
        // A block on another tier: never closed while it is there.
        assert_eq!(closed_after(&hub, vec![stored(&[2], Tier::Cpu)]), [false]);
        hub.force_snapshot();
        assert!(matches!(
            hub.take_work(&sink),
            Some(Work::Snapshot {
                prefix_closed: false,
                ..
            })
        ));
        assert_eq!(closed_after(&hub, vec![removed(&[2], Tier::Cpu)]), [true]);
    }

    #[test]
    fn ranks_holding_the_same_block_are_refcounted() {
        let hub = Hub::default();
        assert_eq!(hub.apply(vec![stored(&[1], Tier::Gpu)], 0), 1);
        assert_eq!(
            hub.apply(vec![stored(&[1], Tier::Gpu)], 0),
            0,
            "second rank: no delta"
        );
        assert_eq!(
            hub.apply(vec![removed(&[1], Tier::Gpu)], 0),
            0,
            "still on one rank"
        );
        assert!(hub.contains(BlockHash(1), Tier::Gpu));
        assert_eq!(hub.apply(vec![removed(&[1], Tier::Gpu)], 0), 1);
        assert!(!hub.contains(BlockHash(1), Tier::Gpu));
    }

    #[test]
    fn a_slow_sink_coalesces_into_a_snapshot() {
        let hub = Hub::default();
        let sink = hub.add_sink("slow", 2);
        assert!(matches!(hub.take_work(&sink), Some(Work::Snapshot { .. })));
        for h in 0..5 {
            hub.apply(vec![stored(&[h], Tier::Gpu)], 0);
        }
        let Some(Work::Snapshot { seq, blocks, .. }) = hub.take_work(&sink) else {
            panic!("overflow must turn into a snapshot")
        };
        assert_eq!((seq, blocks.len()), (5, 5));
    }

    #[test]
    fn emptying_the_set_sends_cleared() {
        let hub = Hub::default();
        let sink = hub.add_sink("r", 8);
        hub.apply(vec![stored(&[1, 2], Tier::Gpu)], 0);
        hub.take_work(&sink);
        hub.apply(vec![removed(&[1, 2], Tier::Gpu)], 0);
        let Some(Work::Deltas(d)) = hub.take_work(&sink) else {
            panic!()
        };
        assert!(matches!(d[0].op, Some(delta::Op::Cleared(_))));
    }

    #[test]
    fn learning_the_block_size_resends_hello_and_snapshot() {
        let hub = Hub::default();
        let sink = hub.add_sink("r", 8);
        hub.take_work(&sink);
        hub.set_block_size(16);
        assert!(matches!(hub.take_work(&sink), Some(Work::Hello)));
        assert!(matches!(hub.take_work(&sink), Some(Work::Snapshot { .. })));
        hub.set_block_size(16);
        assert!(hub.take_work(&sink).is_none(), "same size: nothing to do");
    }
}

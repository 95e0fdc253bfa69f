//! Router replicas share each routing decision through the agents
//! (docs/replicas.md): [`Peers`] is routing's `DecisionSink` (its picks go
//! out) and `DecisionSource` (the others' requests count), and hands each
//! remote start to the ingest for the pool's policy; routing never waits on a peer.

use crate::routing::share::{DecisionSink, DecisionSource, Fact, SharedRequest};
use parking_lot::{Mutex, RwLock};
use prost::Message;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use warmpath_edge::LogEvery;
use warmpath_proto::v1::{self, decided::Phase, router_message, RouterMessage};

/// The outbound half of an agent stream (what the ingest answers on).
pub(crate) type StreamTx = mpsc::Sender<Result<RouterMessage, tonic::Status>>;

/// Remote requests kept per worker at most (a peer never finishing cannot grow memory).
const MAX_REMOTE: usize = 65_536;

/// The most prefill blocks one remote request counts for.
const MAX_PREFILL: u64 = u32::MAX as u64;

/// A remote request older than this is forgotten (its `finished` was lost).
const MAX_REMOTE_AGE: Duration = Duration::from_secs(900);

/// How often old remote requests are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// One remote request: its prefill still predicted (0 once prefilled).
#[derive(Debug)]
struct Remote {
    prefill: u64,
    at: Instant,
}

/// One agent stream that carries facts for its worker.
#[derive(Debug)]
struct Link {
    stream: u64,
    tx: StreamTx,
    remote: Mutex<Remotes>,
    in_flight: AtomicU32,
    pending: AtomicU64,
}

#[derive(Debug)]
struct Remotes {
    by_request: HashMap<(u64, u64), Remote>,
    swept: Instant,
}

impl Link {
    fn release(&self, r: &Remote, finished: bool) {
        self.pending.fetch_sub(r.prefill, Ordering::Relaxed);
        if finished {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// Decision sharing of one router process (module docs).
#[derive(Debug)]
pub(crate) struct Peers {
    /// This process's id in the facts it sends (random).
    instance: u64,
    enabled: AtomicBool,
    next_request: AtomicU64,
    /// Set by the first other replica's start counted on a link.
    counted: AtomicBool,
    /// model -> worker id -> its stream's link.
    links: RwLock<HashMap<String, HashMap<String, Link>>>,
    /// The key facts are signed and checked with (from `agent_secret`).
    key: std::sync::OnceLock<[u8; 32]>,
    /// Forged facts are logged at most every 10 s (each is counted).
    forged_log: LogEvery,
}

impl Default for Peers {
    fn default() -> Self {
        Peers {
            instance: rand::random(),
            enabled: AtomicBool::new(true),
            next_request: AtomicU64::new(0),
            counted: AtomicBool::new(false),
            links: RwLock::new(HashMap::new()),
            key: std::sync::OnceLock::new(),
            forged_log: LogEvery::default(),
        }
    }
}

/// The largest decision accepted from an agent.
const MAX_FACT_BYTES: usize = 64 << 10;

fn facts(model: &str, direction: &'static str) -> metrics::Counter {
    metrics::counter!("warmpath_replica_facts_total", "pool" => model.to_owned(), "direction" => direction)
}

impl Peers {
    /// Turns sharing on or off (`ingest.share_decisions`); on by default.
    pub(crate) fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    /// Signs every fact sent with `key` and takes only facts signed with it:
    /// an agent relays facts but cannot forge one.
    pub(crate) fn sign_with(&self, key: [u8; 32]) {
        let _ = self.key.set(key);
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// `n` streams of pool `model` are up; they carry decisions only while sharing is on.
    fn gauge(&self, model: &str, n: usize) {
        let n = if self.enabled() { n } else { 0 };
        metrics::gauge!("warmpath_replica_sharing_up", "pool" => model.to_owned()).set(n as f64);
    }

    /// Stream `stream` of `worker` is up: facts go out on `tx` and arriving ones count.
    pub(crate) fn attach(&self, model: &str, worker: &str, stream: u64, tx: StreamTx) {
        let mut all = self.links.write();
        let map = all.entry(model.to_owned()).or_default();
        map.insert(
            worker.to_owned(),
            Link {
                stream,
                tx,
                remote: Mutex::new(Remotes {
                    by_request: HashMap::new(),
                    swept: Instant::now(),
                }),
                in_flight: AtomicU32::new(0),
                pending: AtomicU64::new(0),
            },
        );
        self.gauge(model, map.len());
    }

    /// Stream `stream` ended: unless taken over, its remote requests are forgotten.
    pub(crate) fn detach(&self, model: &str, worker: &str, stream: u64) {
        let mut all = self.links.write();
        let Some(map) = all.get_mut(model) else {
            return;
        };
        if map.get(worker).is_none_or(|l| l.stream != stream) {
            return;
        }
        if let Some(l) = map.remove(worker) {
            let forgotten = l.remote.lock().by_request.len();
            if self.enabled() {
                tracing::info!(
                    forgotten,
                    "decision sharing through this agent stopped: other replicas' requests on its backend are forgotten and this router decides for it on its own view"
                );
            }
        }
        self.gauge(model, map.len());
    }

    /// Applies a relayed decision; returns it when it is a `start` for the policy.
    pub(crate) fn receive(
        &self,
        model: &str,
        worker: &str,
        stream: u64,
        bytes: &[u8],
    ) -> Option<v1::Decided> {
        if !self.enabled() {
            return None;
        }
        let decoded = (bytes.len() <= MAX_FACT_BYTES).then(|| v1::Decided::decode(bytes));
        let Some(Ok(d)) = decoded else {
            facts(model, "malformed").increment(1);
            return None;
        };
        (d.router != self.instance && self.apply(model, worker, stream, &d)).then_some(d)
    }

    /// [`Self::receive`] of a decoded fact: whether it is a `start` to record.
    fn apply(&self, model: &str, worker: &str, stream: u64, d: &v1::Decided) -> bool {
        let all = self.links.read();
        let Some(l) = all
            .get(model)
            .and_then(|m| m.get(worker))
            .filter(|l| l.stream == stream)
        else {
            return false;
        };
        if let Some(key) = self.key.get() {
            if !warmpath_proto::fact_signed(key, d) {
                facts(model, "forged").increment(1);
                if let Some(suppressed) = self.forged_log.ready() {
                    tracing::warn!(pool = model, worker, suppressed, "a relayed decision fact is not signed with the fleet's key: dropped (an agent altered it, or a replica without this agent_secret sent it)");
                }
                return false;
            }
        }
        facts(model, "received").increment(1);
        let id = (d.router, d.request);
        let now = Instant::now();
        let mut r = l.remote.lock();
        if now.duration_since(r.swept) >= SWEEP_EVERY {
            r.swept = now;
            r.by_request.retain(|_, x| {
                let fresh = now.duration_since(x.at) <= MAX_REMOTE_AGE;
                if !fresh {
                    l.release(x, true);
                }
                fresh
            });
        }
        match d.phase() {
            Phase::Start => {
                if r.by_request.len() >= MAX_REMOTE || r.by_request.contains_key(&id) {
                    return false;
                }
                // Capped as the policy caps it (u32), so the sum cannot wrap.
                let prefill = d.prefill_blocks.min(MAX_PREFILL);
                r.by_request.insert(id, Remote { prefill, at: now });
                self.counted.store(true, Ordering::Release);
                l.in_flight.fetch_add(1, Ordering::Relaxed);
                l.pending.fetch_add(prefill, Ordering::Relaxed);
                true
            }
            Phase::Prefilled => {
                if let Some(x) = r.by_request.get_mut(&id) {
                    l.release(x, false);
                    x.prefill = 0;
                }
                false
            }
            Phase::Finished => {
                if let Some(x) = r.by_request.remove(&id) {
                    l.release(&x, true);
                }
                false
            }
            Phase::Unspecified => false,
        }
    }

    /// Sends one fact about `worker` to its agent; dropped when its queue is full.
    fn send(&self, model: &str, worker: &str, mut d: v1::Decided) {
        if let Some(key) = self.key.get() {
            d.mac = warmpath_proto::fact_mac(key, &d);
        }
        let all = self.links.read();
        let Some(l) = all.get(model).and_then(|m| m.get(worker)) else {
            facts(model, "unsent").increment(1);
            return;
        };
        let msg = RouterMessage {
            msg: Some(router_message::Msg::Decision(d.encode_to_vec().into())),
        };
        match l.tx.try_send(Ok(msg)) {
            Ok(()) => facts(model, "sent").increment(1),
            Err(_) => facts(model, "dropped").increment(1),
        }
    }

    /// Shares a pick of pool `model`: the `start` now, the guard the rest.
    fn share(self: &Arc<Self>, model: &str, fact: Fact) -> Option<ShareGuard> {
        if !self.enabled() {
            return None;
        }
        let request = self.next_request.fetch_add(1, Ordering::Relaxed);
        let d = v1::Decided {
            router: self.instance,
            request,
            phase: Phase::Start as i32,
            model: model.to_owned(),
            prefix_key: fact.prefix_key,
            chain_blocks: fact.chain_blocks,
            prefill_blocks: fact.prefill_blocks,
            home: fact.home,
            copies: fact.copies,
            mac: Vec::new(),
        };
        self.send(model, &fact.worker, d);
        Some(ShareGuard {
            peers: Arc::clone(self),
            model: model.to_owned(),
            worker: fact.worker,
            request,
            prefilled: false,
        })
    }

    fn phase(&self, g: &ShareGuard, phase: Phase) {
        let d = v1::Decided {
            router: self.instance,
            request: g.request,
            phase: phase as i32,
            model: g.model.clone(),
            ..Default::default()
        };
        self.send(&g.model, &g.worker, d);
    }
}

/// The incoming half: other replicas' requests, counted on their links.
impl DecisionSource for Peers {
    fn remote_load(&self, model: &str, worker: &str) -> (u32, u64) {
        // Nothing counted anywhere: skip the lock (read per backend per request).
        if !self.counts_remote() {
            return (0, 0);
        }
        let all = self.links.read();
        all.get(model)
            .and_then(|m| m.get(worker))
            .map_or((0, 0), |l| {
                (
                    l.in_flight.load(Ordering::Relaxed),
                    l.pending.load(Ordering::Relaxed),
                )
            })
    }

    fn counts_remote(&self) -> bool {
        self.counted.load(Ordering::Acquire)
    }
}

/// The outgoing half: a pick's `start` now, its guard the rest.
impl DecisionSink for Arc<Peers> {
    fn start(&self, model: &str, fact: Fact) -> Option<Box<dyn SharedRequest>> {
        Some(Box::new(self.share(model, fact)?))
    }
}

/// The rest of one shared request: `prefilled` when told, `finished` on drop.
#[derive(Debug)]
pub(crate) struct ShareGuard {
    peers: Arc<Peers>,
    model: String,
    worker: String,
    request: u64,
    prefilled: bool,
}

impl SharedRequest for ShareGuard {
    fn prefilled(&mut self) {
        if !std::mem::replace(&mut self.prefilled, true) {
            self.peers.phase(self, Phase::Prefilled);
        }
    }
}

impl Drop for ShareGuard {
    fn drop(&mut self) {
        self.peers.phase(self, Phase::Finished);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// `receive` of `d` as its router sends it: whether it is a start to record.
    fn recv(p: &Peers, stream: u64, d: &v1::Decided) -> bool {
        p.receive("m", "w", stream, &d.encode_to_vec()).is_some()
    }

    fn fact(router: u64, request: u64, phase: Phase, prefill: u64) -> v1::Decided {
        v1::Decided {
            router,
            request,
            phase: phase as i32,
            prefill_blocks: prefill,
            ..Default::default()
        }
    }

    #[test]
    fn remote_requests_count_until_finished_and_go_with_their_stream() {
        let p = Peers::default();
        let (tx, _rx) = mpsc::channel(4);
        p.attach("m", "w", 7, tx);
        assert!(recv(&p, 7, &fact(1, 1, Phase::Start, 30)));
        assert!(recv(&p, 7, &fact(1, 2, Phase::Start, 10)));
        // A repeated start, its own echo and another stream's fact count nothing.
        assert!(!recv(&p, 7, &fact(1, 2, Phase::Start, 10)));
        assert!(!recv(&p, 7, &fact(p.instance, 3, Phase::Start, 10)));
        assert!(!recv(&p, 8, &fact(1, 4, Phase::Start, 10)));
        assert_eq!(p.remote_load("m", "w"), (2, 40));
        recv(&p, 7, &fact(1, 1, Phase::Prefilled, 0));
        assert_eq!(p.remote_load("m", "w"), (2, 10));
        recv(&p, 7, &fact(1, 1, Phase::Finished, 0));
        recv(&p, 7, &fact(1, 1, Phase::Finished, 0));
        assert_eq!(p.remote_load("m", "w"), (1, 10));
        // Another stream's end leaves it; its own end forgets the rest.
        p.detach("m", "w", 8);
        assert_eq!(p.remote_load("m", "w"), (1, 10));
        p.detach("m", "w", 7);
        assert_eq!(p.remote_load("m", "w"), (0, 0));
        assert!(!recv(&p, 7, &fact(1, 5, Phase::Start, 10)));
    }

    #[test]
    fn with_a_key_only_facts_signed_with_it_count_and_sent_ones_are_signed() {
        let p = Arc::new(Peers::default());
        let key = warmpath_proto::fact_key("fleet secret");
        p.sign_with(key);
        let (tx, mut rx) = mpsc::channel(4);
        p.attach("m", "w", 7, tx);
        let signed = |mut d: v1::Decided| {
            d.mac = warmpath_proto::fact_mac(&key, &d);
            d
        };
        // Unsigned, signed under another secret, or altered after signing:
        // dropped, nothing counted.
        assert!(!recv(&p, 7, &fact(1, 1, Phase::Start, 30)));
        let other = warmpath_proto::fact_key("another secret");
        let mut d = fact(1, 1, Phase::Start, 30);
        d.mac = warmpath_proto::fact_mac(&other, &d);
        assert!(!recv(&p, 7, &d));
        let mut altered = signed(fact(1, 1, Phase::Start, 30));
        altered.prefill_blocks = u64::MAX;
        assert!(!recv(&p, 7, &altered));
        assert_eq!(p.remote_load("m", "w"), (0, 0));
        // Signed: counted.
        assert!(recv(&p, 7, &signed(fact(1, 1, Phase::Start, 30))));
        assert_eq!(p.remote_load("m", "w"), (1, 30));
        // What this router sends carries its mac.
        let guard = p.share(
            "m",
            Fact {
                worker: "w".into(),
                prefix_key: 5,
                ..Fact::default()
            },
        );
        let Ok(RouterMessage {
            msg: Some(router_message::Msg::Decision(sent)),
        }) = rx.try_recv().unwrap()
        else {
            panic!("a decision")
        };
        let sent = v1::Decided::decode(sent).unwrap();
        assert!(warmpath_proto::fact_signed(&key, &sent));
        drop(guard);
    }

    #[test]
    fn bytes_that_are_no_fact_count_nothing() {
        let p = Peers::default();
        let (tx, _rx) = mpsc::channel(4);
        p.attach("m", "w", 7, tx);
        // Not a protobuf message, and a real one past the size bound.
        assert!(p.receive("m", "w", 7, &[0xff; 16]).is_none());
        let mut big = fact(1, 1, Phase::Start, 30);
        big.model = "m".repeat(MAX_FACT_BYTES);
        assert!(p.receive("m", "w", 7, &big.encode_to_vec()).is_none());
        assert_eq!(p.remote_load("m", "w"), (0, 0));
        assert!(recv(&p, 7, &fact(1, 1, Phase::Start, 30)));
        assert_eq!(p.remote_load("m", "w"), (1, 30));
    }

    #[test]
    fn a_peers_huge_prefill_is_capped_and_released_whole() {
        let p = Peers::default();
        let (tx, _rx) = mpsc::channel(4);
        p.attach("m", "w", 7, tx);
        assert!(recv(&p, 7, &fact(1, 1, Phase::Start, u64::MAX)));
        assert!(recv(&p, 7, &fact(1, 2, Phase::Start, u64::MAX)));
        assert_eq!(p.remote_load("m", "w"), (2, 2 * MAX_PREFILL));
        recv(&p, 7, &fact(1, 1, Phase::Finished, 0));
        assert_eq!(p.remote_load("m", "w"), (1, MAX_PREFILL));
        recv(&p, 7, &fact(1, 2, Phase::Prefilled, 0));
        assert_eq!(p.remote_load("m", "w"), (1, 0));
    }

    #[test]
    fn off_means_nothing_counts() {
        let p = Peers::default();
        p.set_enabled(false);
        let (tx, _rx) = mpsc::channel(4);
        p.attach("m", "w", 1, tx);
        assert!(!recv(&p, 1, &fact(1, 1, Phase::Start, 30)));
        assert_eq!(p.remote_load("m", "w"), (0, 0));
    }
}

//! What a backend is known to be carrying: the [`Load`] this router put on it
//! and the [`EngineCell`] its agent reported, atomics that count their changes,
//! so a snapshot's [`Board`] reads a backend again only when one moved.

use crate::http::clock::monotonic_ms;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;
use warmpath_core::{BackendLoad, EngineLoad};

/// Engine load older than this is not used for routing.
pub(crate) const LOAD_FRESH_MS: u64 = 5_000;

/// Engine load reported by agents, as routing reads it.
pub(crate) trait AgentLoads: Send + Sync {
    /// Bumped whenever [`engine_cell`](Self::engine_cell) may answer differently.
    fn cell_generation(&self) -> u64;

    /// The cell holding `worker_id`'s reported load in pool `model`.
    fn engine_cell(&self, model: &str, worker_id: &str) -> Option<Arc<EngineCell>>;

    /// The latest load reported for `worker_id`, if fresh (the status page).
    fn engine_load(&self, model: &str, worker_id: &str) -> Option<EngineLoad> {
        self.engine_cell(model, worker_id)?.fresh(monotonic_ms())
    }
}

/// The load this router put on one backend, and whether it is draining.
#[derive(Debug)]
pub(crate) struct Load {
    in_flight_gauge: metrics::Gauge,
    in_flight: AtomicU32,
    pending_prefill: AtomicU64,
    draining: AtomicBool,
    /// Woken when a draining backend's last request ends.
    idle: Notify,
    /// Bumped after every change of what routing reads of the backend.
    changes: AtomicU64,
}

impl Load {
    /// No load on backend `id` of pool `model` yet.
    pub(crate) fn new(model: &str, id: &str) -> Self {
        Load {
            in_flight_gauge: metrics::gauge!("warmpath_backend_in_flight", "pool" => model.to_owned(), "backend" => id.to_owned()),
            in_flight: AtomicU32::new(0),
            pending_prefill: AtomicU64::new(0),
            draining: AtomicBool::new(false),
            idle: Notify::new(),
            changes: AtomicU64::new(0),
        }
    }

    /// Read before the values, so a change racing the read shows next time.
    pub(crate) fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// Counts a change of what routing reads, after it is made.
    pub(crate) fn changed(&self) {
        self.changes.fetch_add(1, Ordering::Release);
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Takes it out of rotation for removal; false when it already was.
    pub(crate) fn start_draining(&self) -> bool {
        let started = !self.draining.swap(true, Ordering::AcqRel);
        self.changed();
        started
    }

    /// Returns once no request is in flight here (at once when none is).
    pub(crate) async fn wait_idle(&self) {
        loop {
            // Registered before the check, so a guard dropped meanwhile wakes it.
            let notified = self.idle.notified();
            if self.in_flight() == 0 {
                return;
            }
            notified.await;
        }
    }

    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Predicted prefill blocks of routed requests still waiting for a first byte.
    pub(crate) fn pending_prefill_blocks(&self) -> u64 {
        self.pending_prefill.load(Ordering::Relaxed)
    }

    /// Counts a request in flight with `prefill_blocks` predicted uncached blocks.
    pub(crate) fn begin(&self, prefill_blocks: u64) {
        let n = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.pending_prefill
            .fetch_add(prefill_blocks, Ordering::Relaxed);
        self.changed();
        self.in_flight_gauge.set(f64::from(n));
    }

    /// A request's first byte came: its `prefill_blocks` (> 0) are done.
    pub(crate) fn prefilled(&self, prefill_blocks: u64) {
        self.pending_prefill
            .fetch_sub(prefill_blocks, Ordering::Relaxed);
        self.changed();
    }

    /// A request ended; returns how many are still in flight.
    pub(crate) fn end(&self) -> u32 {
        let n = self.in_flight.fetch_sub(1, Ordering::Relaxed) - 1;
        self.changed();
        self.in_flight_gauge.set(f64::from(n));
        n
    }

    /// Wakes [`Load::wait_idle`] when `in_flight` is 0 and it is draining.
    pub(crate) fn ended(&self, in_flight: u32) {
        if in_flight == 0 && self.is_draining() {
            self.idle.notify_waiters();
        }
    }

    /// The backend left its pool: its in-flight gauge reads 0.
    pub(crate) fn retire(&self) {
        self.in_flight_gauge.set(0.0);
    }
}

const HAS_LOAD: u8 = 1;
const UP_KNOWN: u8 = 2;
const DOWN: u8 = 4;

/// One worker's latest engine load as its agent reported it (separate atomics:
/// a read racing a report may mix two reports' fields, which routing tolerates).
#[derive(Debug, Default)]
pub(crate) struct EngineCell {
    running: AtomicU32,
    waiting: AtomicU32,
    kv_usage_bits: AtomicU32,
    /// 0: unknown.
    capacity_blocks: AtomicU64,
    flags: AtomicU8,
    /// [`monotonic_ms`] of the report.
    at_ms: AtomicU64,
    /// Bumped after every `set` and `claimed`.
    changes: AtomicU64,
}

impl EngineCell {
    pub(crate) fn set(&self, load: EngineLoad, engine_up: bool, at_ms: u64) {
        self.running.store(load.running, Ordering::Relaxed);
        self.waiting.store(load.waiting, Ordering::Relaxed);
        self.kv_usage_bits
            .store(load.kv_usage.to_bits(), Ordering::Relaxed);
        self.capacity_blocks
            .store(load.capacity_blocks.unwrap_or(0), Ordering::Relaxed);
        self.at_ms.store(at_ms, Ordering::Relaxed);
        let f = HAS_LOAD | UP_KNOWN | if engine_up { 0 } else { DOWN };
        self.flags.store(f, Ordering::Release);
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// A new stream took the worker; a new agent run (`keep_load` false) forgets the load.
    pub(crate) fn claimed(&self, keep_load: bool) {
        let keep = if keep_load { HAS_LOAD } else { 0 };
        self.flags.fetch_and(keep, Ordering::AcqRel);
        self.changes.fetch_add(1, Ordering::Release);
    }

    /// Read before the fields, so a report racing the read shows next time.
    fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// The last load reported, however old.
    pub(crate) fn last(&self) -> Option<EngineLoad> {
        let f = self.flags.load(Ordering::Acquire);
        (f & HAS_LOAD != 0).then(|| EngineLoad {
            running: self.running.load(Ordering::Relaxed),
            waiting: self.waiting.load(Ordering::Relaxed),
            kv_usage: f32::from_bits(self.kv_usage_bits.load(Ordering::Relaxed)),
            capacity_blocks: Some(self.capacity_blocks.load(Ordering::Relaxed)).filter(|c| *c > 0),
        })
    }

    /// Whether the engine answered the agent's last scrape.
    pub(crate) fn engine_up(&self) -> Option<bool> {
        let f = self.flags.load(Ordering::Acquire);
        (f & UP_KNOWN != 0).then_some(f & DOWN == 0)
    }

    /// The load routing may use at `now_ms`, with the last millisecond it stays fresh.
    fn fresh_until(&self, now_ms: u64) -> Option<(EngineLoad, u64)> {
        let until = self
            .at_ms
            .load(Ordering::Relaxed)
            .saturating_add(LOAD_FRESH_MS);
        (now_ms <= until && self.engine_up() != Some(false))
            .then(|| self.last())
            .flatten()
            .map(|l| (l, until))
    }

    pub(crate) fn fresh(&self, now_ms: u64) -> Option<EngineLoad> {
        self.fresh_until(now_ms).map(|(l, _)| l)
    }
}

/// A pool member as the board reads it (implemented by `Backend`).
pub(crate) trait Member {
    fn load(&self) -> &Load;
    /// Its worker id, the agents' key.
    fn worker(&self) -> &str;
    /// Whether its health lets it take requests (not ejected).
    fn healthy(&self) -> bool;
}

/// The loads of one policy snapshot's members, kept between picks.
#[derive(Debug, Default)]
pub(crate) struct Board(Mutex<Kept>);

#[derive(Debug, Default)]
struct Kept {
    loads: Vec<BackendLoad>,
    /// What each position was read at.
    seen: Vec<Seen>,
    /// The agent registry's cell generation the cells are of.
    generation: Option<u64>,
    /// The last millisecond every engine report in `loads` is fresh.
    until_ms: u64,
    /// Whether the last tracked pick saw `loads` but for the positions in `changed`.
    known: bool,
    changed: Vec<usize>,
}

#[derive(Debug, Default)]
struct Seen {
    own: u64,
    cell: Option<Arc<EngineCell>>,
    cell_changes: u64,
}

impl Board {
    /// Calls `pick` with every member's load now, under the board's lock; a
    /// `tracked` pick gets the positions changed since the last tracked one.
    pub(crate) fn with<M: Member, R>(
        &self,
        model: &str,
        members: &[Arc<M>],
        agents: Option<&dyn AgentLoads>,
        now_ms: u64,
        tracked: bool,
        pick: impl FnOnce(&[BackendLoad], Option<&[usize]>) -> R,
    ) -> R {
        let mut guard = self.0.lock();
        let k = &mut *guard;
        let generation = agents.map(|a| a.cell_generation());
        let relook = k.seen.len() != members.len() || k.generation != generation;
        if relook {
            k.seen = members
                .iter()
                .map(|m| Seen {
                    cell: agents.and_then(|a| a.engine_cell(model, m.worker())),
                    ..Seen::default()
                })
                .collect();
            k.loads.resize(members.len(), BackendLoad::default());
            k.generation = generation;
        }
        let whole = relook || now_ms > k.until_ms;
        if whole {
            k.until_ms = u64::MAX;
            k.known = false;
        }
        for (i, m) in members.iter().enumerate() {
            let s = &mut k.seen[i];
            // The counts first: a change racing the read shows next time.
            let own = m.load().changes();
            let cell_changes = s.cell.as_ref().map_or(0, |c| c.changes());
            if whole || own != s.own || cell_changes != s.cell_changes {
                (s.own, s.cell_changes) = (own, cell_changes);
                let fresh = s.cell.as_ref().and_then(|c| c.fresh_until(now_ms));
                k.until_ms = k.until_ms.min(fresh.map_or(u64::MAX, |(_, u)| u));
                k.loads[i] = BackendLoad {
                    eligible: m.healthy() && !m.load().is_draining(),
                    in_flight: m.load().in_flight(),
                    pending_prefill_blocks: m.load().pending_prefill_blocks(),
                    engine: fresh.map(|(l, _)| l),
                };
                if k.known {
                    k.changed.push(i);
                }
            }
        }
        let changed = (tracked && k.known).then_some(&k.changed[..]);
        let r = pick(&k.loads, changed);
        k.known = tracked;
        k.changed.clear();
        r
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::{BackendConfig, BackendUrl};
    use crate::routing::backend::{Backend, FlightGuard, Origin};
    use proptest::prelude::*;

    fn load(running: u32) -> EngineLoad {
        EngineLoad {
            running,
            waiting: 2,
            kv_usage: 0.25,
            capacity_blocks: Some(900),
        }
    }

    #[test]
    fn a_report_reads_back_while_fresh_and_up() {
        let c = EngineCell::default();
        assert_eq!(c.fresh(10), None, "nothing reported");
        assert_eq!(c.engine_up(), None);
        c.set(load(3), true, 1_000);
        assert_eq!(c.fresh(1_000 + LOAD_FRESH_MS), Some(load(3)));
        assert_eq!(c.fresh(1_001 + LOAD_FRESH_MS), None, "too old");
        assert_eq!(c.last(), Some(load(3)), "the status view keeps it");
        c.set(load(4), false, 2_000);
        assert_eq!(c.fresh(2_000), None, "engine down");
        assert_eq!(c.engine_up(), Some(false));
        let unknown = EngineLoad {
            capacity_blocks: None,
            ..load(1)
        };
        c.set(unknown, true, 3_000);
        assert_eq!(c.fresh(3_000), Some(unknown));
    }

    #[test]
    fn a_claim_forgets_up_and_a_new_run_forgets_the_load() {
        let c = EngineCell::default();
        c.set(load(3), false, 1_000);
        c.claimed(true);
        assert_eq!(c.engine_up(), None);
        assert_eq!(c.fresh(1_000), Some(load(3)), "same run: the load stays");
        c.claimed(false);
        assert_eq!(c.last(), None);
        assert_eq!(c.fresh(1_000), None);
    }

    /// An agent registry of one cell per worker `w{i}`, counting lookups.
    struct Registry {
        generation: AtomicU64,
        cells: Vec<Arc<EngineCell>>,
        lookups: AtomicU64,
    }

    impl AgentLoads for Registry {
        fn cell_generation(&self) -> u64 {
            self.generation.load(Ordering::Acquire)
        }

        fn engine_cell(&self, _model: &str, worker_id: &str) -> Option<Arc<EngineCell>> {
            self.lookups.fetch_add(1, Ordering::Relaxed);
            let i: usize = worker_id.strip_prefix('w')?.parse().ok()?;
            self.cells.get(i).cloned()
        }
    }

    fn fleet(n: usize) -> (Vec<Arc<Backend>>, Registry) {
        let backends = (0..n)
            .map(|i| {
                let cfg = BackendConfig {
                    url: format!("http://127.0.0.1:{}", 1000 + i),
                    worker_id: Some(format!("w{i}")),
                    api_key: None,
                };
                let url = BackendUrl::parse(&cfg.url).unwrap();
                Arc::new(Backend::new("m", &cfg, url, i as u16, Origin::Config))
            })
            .collect();
        let reg = Registry {
            generation: AtomicU64::new(1),
            cells: (0..n).map(|_| Arc::new(EngineCell::default())).collect(),
            lookups: AtomicU64::new(0),
        };
        (backends, reg)
    }

    /// Every load read afresh, as a board read whole reads it.
    fn whole(backends: &[Arc<Backend>], reg: &Registry, now_ms: u64) -> Vec<BackendLoad> {
        backends
            .iter()
            .enumerate()
            .map(|(i, b)| BackendLoad {
                eligible: b.health.is_healthy() && !b.load.is_draining(),
                in_flight: b.load.in_flight(),
                pending_prefill_blocks: b.load.pending_prefill_blocks(),
                engine: reg.cells[i].fresh(now_ms),
            })
            .collect()
    }

    fn engine(running: u32) -> EngineLoad {
        EngineLoad {
            running,
            waiting: 0,
            kv_usage: 0.5,
            capacity_blocks: Some(100),
        }
    }

    type Read = (Vec<BackendLoad>, Option<Vec<usize>>);

    fn read(board: &Board, bs: &[Arc<Backend>], reg: &Registry, now: u64, tracked: bool) -> Read {
        board.with("m", bs, Some(reg), now, tracked, |l, c| {
            (l.to_vec(), c.map(<[usize]>::to_vec))
        })
    }

    #[test]
    fn a_pick_reads_again_only_what_changed() {
        let (backends, reg) = fleet(4);
        let board = Board::default();
        let (_, changed) = read(&board, &backends, &reg, 0, true);
        assert_eq!(changed, None, "the first read is whole");
        assert_eq!(read(&board, &backends, &reg, 0, true).1, Some(vec![]));
        let g = backends[2].begin(7);
        let (loads, changed) = read(&board, &backends, &reg, 0, true);
        assert_eq!(changed, Some(vec![2]));
        assert_eq!(
            (loads[2].in_flight, loads[2].pending_prefill_blocks),
            (1, 7)
        );
        reg.cells[1].set(engine(3), true, 10);
        assert_eq!(read(&board, &backends, &reg, 10, true).1, Some(vec![1]));
        drop(g);
        assert!(backends[3].load.start_draining());
        let (loads, changed) = read(&board, &backends, &reg, 10, true);
        assert_eq!(changed, Some(vec![2, 3]));
        assert!(!loads[3].eligible);
        assert_eq!(loads, whole(&backends, &reg, 10));
        assert_eq!(reg.lookups.load(Ordering::Relaxed), 4, "looked up once");
    }

    #[test]
    fn a_report_that_goes_stale_or_a_new_generation_reads_everything() {
        let (backends, reg) = fleet(3);
        let board = Board::default();
        reg.cells[0].set(engine(2), true, 0);
        read(&board, &backends, &reg, 0, true);
        let last = LOAD_FRESH_MS;
        let (loads, changed) = read(&board, &backends, &reg, last, true);
        assert_eq!(changed, Some(vec![]));
        assert_eq!(loads[0].engine, Some(engine(2)), "fresh to its last ms");
        let (loads, changed) = read(&board, &backends, &reg, last + 1, true);
        assert_eq!(changed, None);
        assert_eq!(loads[0].engine, None, "stale one ms later");
        reg.generation.fetch_add(1, Ordering::Release);
        assert_eq!(read(&board, &backends, &reg, last + 1, true).1, None);
        assert_eq!(reg.lookups.load(Ordering::Relaxed), 6, "looked up again");
        let g = backends[1].begin(0);
        read(&board, &backends, &reg, last + 1, false);
        drop(g);
        let (loads, changed) = read(&board, &backends, &reg, last + 1, true);
        assert_eq!(changed, None, "the policy saw other loads since");
        assert_eq!(loads, whole(&backends, &reg, last + 1));
        assert_eq!(
            read(&board, &backends, &reg, last + 1, true).1,
            Some(vec![])
        );
    }

    proptest! {
        /// Under random load changes, claims, ejections, drains, time and
        /// untracked picks, the board's loads are the loads read whole, and
        /// each tracked change list names every position whose load differs
        /// from the last tracked pick's.
        #[test]
        fn the_board_is_the_whole_read(
            ops in proptest::collection::vec((0u8..11, 0usize..5, 0u64..3000), 1..120),
        ) {
            let (backends, reg) = fleet(5);
            let board = Board::default();
            let mut guards: Vec<FlightGuard> = Vec::new();
            let mut now = 0u64;
            let mut last: Option<Vec<BackendLoad>> = None;
            for &(op, i, x) in &ops {
                match op {
                    0 => guards.push(backends[i].begin(x)),
                    1 if !guards.is_empty() => drop(guards.swap_remove(i % guards.len())),
                    2 if !guards.is_empty() => {
                        let at = i % guards.len();
                        guards[at].first_byte();
                    }
                    3 => {
                        backends[i].failed(1);
                    }
                    4 => {
                        backends[i].probe_passed(true);
                    }
                    5 => {
                        backends[i].load.start_draining();
                    }
                    6 => reg.cells[i].set(engine(x as u32), x % 7 != 0, now),
                    7 => reg.cells[i].claimed(x % 2 == 0),
                    8 => now += x * 3,
                    9 => {
                        let (loads, _) = read(&board, &backends, &reg, now, false);
                        prop_assert_eq!(&loads, &whole(&backends, &reg, now));
                    }
                    _ => {
                        reg.generation.fetch_add(1, Ordering::Release);
                    }
                }
                let (loads, changed) = read(&board, &backends, &reg, now, true);
                prop_assert_eq!(&loads, &whole(&backends, &reg, now));
                if op == 9 {
                    prop_assert_eq!(changed.clone(), None);
                }
                if let (Some(before), Some(changed)) = (&last, &changed) {
                    for (p, (a, b)) in before.iter().zip(&loads).enumerate() {
                        prop_assert!(a == b || changed.contains(&p), "{p} changed unnamed");
                    }
                }
                last = Some(loads);
            }
        }
    }
}

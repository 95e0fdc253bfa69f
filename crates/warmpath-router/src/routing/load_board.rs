//! The loads a `kv_aware` pick reads, kept between requests: only the
//! backends whose load changed since the last pick are read again, and the
//! policy is told which ones (`Loads::changed`).
//!
//! Why: building every backend's [`BackendLoad`] per request (its
//! counters, and its worker's load cell through the backend's cell cache
//! and its lock) and having the policy compare the whole slice made the
//! `pick` phase the router's largest at 1000 backends (BENCHMARKS.md).
//! Each backend and each load cell counts its changes
//! ([`Load::changes`](crate::routing::backend::load::Load::changes), [`LoadCell::changes`]); the board keeps the
//! counts it last read per position and reads a position again only when
//! one moved: two atomic loads per backend instead of a lock and a dozen.
//!
//! Time changes a load too: an engine report stops counting
//! [`LOAD_FRESH_MS`](crate::routing::load_cell::LOAD_FRESH_MS) after it arrived.
//! The board keeps the earliest such moment among the reports it holds and
//! reads every load again once it passed, so a stale report is dropped
//! exactly when a whole read would drop it.
//!
//! What the board does not track, routing reads whole as before
//! (`route::loads`): a request that excludes backends (a retry), one for
//! an adapter, and loads other router replicas share
//! ([`AgentLoads::remote_loads`]). After such a pick, a new agent registry
//! generation or a first use, the board reads every load and the policy
//! compares them all (`Loads::changed` is `None`), so a change list is always relative
//! to the loads the policy last saw.

use crate::routing::backend::Backend;
use crate::routing::load_cell::LoadCell;
use crate::routing::loads::AgentLoads;
use parking_lot::Mutex;
use std::sync::Arc;
use warmpath_core::{BackendLoad, EngineLoad};

/// A backend's load as routing reads it: `eligible` as the caller decided
/// (health, draining and whatever the request excludes), `engine` its
/// worker's fresh report, `remote` other replicas' (in flight, pending
/// prefill blocks) there.
pub(crate) fn load_of(
    b: &Backend,
    eligible: bool,
    engine: Option<EngineLoad>,
    remote: (u32, u64),
) -> BackendLoad {
    BackendLoad {
        eligible,
        in_flight: b.load.in_flight().saturating_add(remote.0),
        pending_prefill_blocks: b.load.pending_prefill_blocks().saturating_add(remote.1),
        engine,
    }
}

/// The loads of one policy snapshot's backends (module docs).
#[derive(Debug, Default)]
pub(crate) struct LoadBoard(Mutex<Board>);

#[derive(Debug, Default)]
struct Board {
    /// Whether `loads` are the loads the policy last saw.
    valid: bool,
    loads: Vec<BackendLoad>,
    seen: Vec<Seen>,
    /// The agent registry's cell generation when read (0: no registry).
    generation: u64,
    /// Whether there was a registry.
    agents: bool,
    /// The last millisecond every engine report in `loads` is fresh.
    until_ms: u64,
    /// Positions read again for the pick under way.
    changed: Vec<usize>,
}

/// What a position was read at.
#[derive(Debug, Default)]
struct Seen {
    backend: u64,
    cell: Option<Arc<LoadCell>>,
    cell_changes: u64,
}

impl LoadBoard {
    /// Calls `pick` with every backend's load now and the positions read
    /// again since the last call (`None`: all were, compare every load),
    /// under the board's lock, so no other pick's change list can slip in
    /// between. `pick` must hand exactly these loads to the policy.
    pub(crate) fn with<R>(
        &self,
        model: &str,
        backends: &[Arc<Backend>],
        agents: Option<&dyn AgentLoads>,
        now_ms: u64,
        pick: impl FnOnce(&[BackendLoad], Option<&[usize]>) -> R,
    ) -> R {
        let mut guard = self.0.lock();
        let b = &mut *guard;
        let generation = agents.map_or(0, |a| a.cell_generation());
        let whole = !b.valid
            || b.loads.len() != backends.len()
            || b.generation != generation
            || b.agents != agents.is_some()
            || now_ms > b.until_ms;
        b.changed.clear();
        if whole {
            b.loads.clear();
            b.seen.clear();
            b.until_ms = u64::MAX;
            for be in backends {
                let cell = agents.and_then(|a| be.load_cell(model, a));
                let (load, seen, until) = read(be, cell, now_ms);
                b.loads.push(load);
                b.seen.push(seen);
                b.until_ms = b.until_ms.min(until);
            }
            (b.generation, b.agents) = (generation, agents.is_some());
        } else {
            for (i, be) in backends.iter().enumerate() {
                let s = &b.seen[i];
                let cell_moved = s
                    .cell
                    .as_ref()
                    .is_some_and(|c| c.changes() != s.cell_changes);
                if be.load.changes() != s.backend || cell_moved {
                    let cell = b.seen[i].cell.take();
                    let (load, seen, until) = read(be, cell, now_ms);
                    b.loads[i] = load;
                    b.seen[i] = seen;
                    b.until_ms = b.until_ms.min(until);
                    b.changed.push(i);
                }
            }
        }
        b.valid = true;
        pick(&b.loads, (!whole).then_some(&b.changed[..]))
    }

    /// Runs `pick`, which hands the policy loads the board did not give
    /// it, under the board's lock, so no board pick runs between it and
    /// the board's next read, which reads and compares every load.
    pub(crate) fn bypass<R>(&self, pick: impl FnOnce() -> R) -> R {
        let mut b = self.0.lock();
        b.valid = false;
        pick()
    }
}

/// `b`'s load for the board, what it was read at, and the last millisecond
/// its engine report counts (`u64::MAX` when it has none).
fn read(b: &Backend, cell: Option<Arc<LoadCell>>, now_ms: u64) -> (BackendLoad, Seen, u64) {
    // The counts first: a change racing the read shows next time.
    let backend = b.load.changes();
    let cell_changes = cell.as_ref().map_or(0, |c| c.changes());
    let fresh = cell.as_ref().and_then(|c| c.fresh_until(now_ms));
    let until = fresh.map_or(u64::MAX, |(_, u)| u);
    let eligible = b.health.is_healthy() && !b.load.is_draining();
    let load = load_of(b, eligible, fresh.map(|(l, _)| l), (0, 0));
    let seen = Seen {
        backend,
        cell,
        cell_changes,
    };
    (load, seen, until)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::{BackendConfig, BackendUrl};
    use crate::routing::backend::{FlightGuard, Origin};
    use proptest::prelude::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// An agent registry of one cell per worker `w{i}`.
    struct Registry {
        generation: AtomicU64,
        cells: Vec<Arc<LoadCell>>,
    }

    impl AgentLoads for Registry {
        fn cell_generation(&self) -> u64 {
            self.generation.load(Ordering::Acquire)
        }

        fn load_cell(&self, _model: &str, worker_id: &str) -> Option<Arc<LoadCell>> {
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
            cells: (0..n).map(|_| Arc::new(LoadCell::default())).collect(),
        };
        (backends, reg)
    }

    /// The loads read whole, as `route::loads` reads them for a request
    /// that excludes nothing.
    fn whole(backends: &[Arc<Backend>], reg: &Registry, now_ms: u64) -> Vec<BackendLoad> {
        backends
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let eligible = b.health.is_healthy() && !b.load.is_draining();
                load_of(b, eligible, reg.cells[i].fresh(now_ms), (0, 0))
            })
            .collect()
    }

    fn engine(running: u32) -> EngineLoad {
        EngineLoad {
            running,
            waiting: 0,
            kv_usage: 0.5,
            capacity_blocks: Some(100),
            partial: false,
        }
    }

    type Seen = (Vec<BackendLoad>, Option<Vec<usize>>);

    fn read(board: &LoadBoard, backends: &[Arc<Backend>], reg: &Registry, now: u64) -> Seen {
        board.with("m", backends, Some(reg), now, |l, c| {
            (l.to_vec(), c.map(<[usize]>::to_vec))
        })
    }

    #[test]
    fn a_pick_reads_again_only_what_changed() {
        let (backends, reg) = fleet(4);
        let board = LoadBoard::default();
        let (_, changed) = read(&board, &backends, &reg, 0);
        assert_eq!(changed, None, "the first read is whole");
        assert_eq!(read(&board, &backends, &reg, 0).1, Some(vec![]));
        let g = backends[2].begin(7);
        let (loads, changed) = read(&board, &backends, &reg, 0);
        assert_eq!(changed, Some(vec![2]));
        assert_eq!(
            (loads[2].in_flight, loads[2].pending_prefill_blocks),
            (1, 7)
        );
        reg.cells[1].set(engine(3), true, 10);
        assert_eq!(read(&board, &backends, &reg, 10).1, Some(vec![1]));
        drop(g);
        assert!(backends[3].load.start_draining());
        let (loads, changed) = read(&board, &backends, &reg, 10);
        assert_eq!(changed, Some(vec![2, 3]));
        assert!(!loads[3].eligible);
        assert_eq!(loads, whole(&backends, &reg, 10));
    }

    #[test]
    fn a_report_that_goes_stale_or_a_new_generation_reads_everything() {
        let (backends, reg) = fleet(3);
        let board = LoadBoard::default();
        reg.cells[0].set(engine(2), true, 0);
        read(&board, &backends, &reg, 0);
        let last = crate::routing::load_cell::LOAD_FRESH_MS;
        let (loads, changed) = read(&board, &backends, &reg, last);
        assert_eq!(changed, Some(vec![]));
        assert_eq!(loads[0].engine, Some(engine(2)), "fresh to its last ms");
        let (loads, changed) = read(&board, &backends, &reg, last + 1);
        assert_eq!(changed, None);
        assert_eq!(loads[0].engine, None, "stale one ms later");
        reg.generation.fetch_add(1, Ordering::Release);
        assert_eq!(read(&board, &backends, &reg, last + 1).1, None);
        board.bypass(|| ());
        assert_eq!(read(&board, &backends, &reg, last + 1).1, None);
        assert_eq!(read(&board, &backends, &reg, last + 1).1, Some(vec![]));
    }

    proptest! {
        /// Under random load changes, claims, ejections, drains and time,
        /// the board's loads are the loads read whole, and each change list
        /// names every position whose load differs from the last pick's.
        #[test]
        fn the_board_is_the_whole_read(
            ops in proptest::collection::vec((0u8..10, 0usize..5, 0u64..3000), 1..120),
        ) {
            let (backends, reg) = fleet(5);
            let board = LoadBoard::default();
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
                    _ => {
                        reg.generation.fetch_add(1, Ordering::Release);
                    }
                }
                let (loads, changed) = read(&board, &backends, &reg, now);
                prop_assert_eq!(&loads, &whole(&backends, &reg, now));
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

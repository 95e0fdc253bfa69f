//! `kv.rebalance_slack`: `kv_aware` evens the backends' expected loads by
//! **moving** a prefix, never by copying it.
//!
//! Why: below saturation each prefix stays where it is cached, so a backend's
//! share is the sum of its prefixes' popularities, fixed when they were
//! placed — before their popularity was known. A bound on recent share
//! (`kv.share_slack`) restores balance by starting second copies, and in a
//! fleet whose caches just hold the working set each copy evicts a prefix
//! that then misses. A move costs one cold prefill on the new home (and
//! whatever that evicts there, once); the old copy ages out of its former
//! home's LRU since no request touches it any more, which frees the room.
//!
//! What: on a warm request whose prefix is cached at its home `h` (published,
//! so never one still prefilling), with `L` the expected loads
//! ([`home`](super::home)), `mean` their mean over usable backends, `t` the
//! usable backend with the lowest `L`, `D = L_h - L_t` and `p` the prefix's
//! popularity, the request and the prefix's home go to `t` when
//!
//! - `L_h > (1 + rebalance_slack) * mean`,
//! - `0.15 D <= p <= 0.85 D`: the sum of squared deviations `2p(p - D)`
//!   falls by at least half of the best a single move could do (`p = D/2`),
//!   so `t` ends below `h`'s old load and `h` above `t`'s: no ping-pong;
//! - the prefix has had its home for `20 n` decisions (its popularity is
//!   an estimate worth acting on, and it has not just moved), the fleet has
//!   seen `10 n` requests, and the last move was `2 n` decisions ago.
//!
//! The next requests of a moved prefix follow it while its first request
//! there prefills (as a cold placement's do), and a copy left off its home
//! is charged as uncached in the miss term, so the stale copy is not chosen
//! over the new home once both hold it.

use super::home::Home;
use super::place::State;
use super::BackendLoad;

/// Which gaps [`State::propose_move`] acts on (module docs).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rebalance {
    /// Excess over the mean expected load that triggers a move.
    pub(crate) slack: f64,
    /// Backends in the snapshot.
    pub(crate) backends: u64,
}

impl Rebalance {
    /// Decisions a prefix keeps its home before it may move.
    fn cooldown(&self) -> u64 {
        20 * self.backends
    }
}

impl State {
    /// Where `home`'s prefix should move to even the expected loads, if
    /// anywhere (module docs). Its home must be usable and hold it.
    pub(crate) fn propose_move(
        &self,
        rb: &Rebalance,
        home: &Home,
        loads: &[BackendLoad],
        usable: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let n = rb.backends;
        if self.seq.saturating_sub(home.since) < rb.cooldown()
            || self
                .last_move
                .is_some_and(|m| self.seq.saturating_sub(m) < 2 * n)
        {
            return None;
        }
        let expected = self.homes.loads();
        let m = loads.len().min(expected.len());
        let mut total = 0.0;
        let mut count = 0u32;
        let mut low: Option<(usize, f64)> = None;
        for b in (0..m).filter(|&b| usable(b)) {
            total += expected[b];
            count += 1;
            if b != home.backend as usize && low.is_none_or(|(_, l)| expected[b] < l) {
                low = Some((b, expected[b]));
            }
        }
        // Decayed requests seen, in requests.
        if count < 2 || total / self.unit < 10.0 * n as f64 {
            return None;
        }
        let (t, lt) = low?;
        let lh = *expected.get(home.backend as usize)?;
        let mean = total / f64::from(count);
        let d = lh - lt;
        let fits = (0.15 * d..=0.85 * d).contains(&home.pop);
        (lh > (1.0 + rb.slack) * mean && fits).then_some(t)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::policy::place::Placer;
    use crate::policy::test_util::*;

    const RB: Rebalance = Rebalance {
        slack: 0.1,
        backends: 3,
    };

    /// Keys 1..=4 homed on backends 0, 0, 1, 2 with 40, 30, 20, 10
    /// requests, 100 decisions ago: expected loads 70 / 20 / 10.
    fn skewed() -> Placer {
        let p = Placer::new(&backends(3), 1e5);
        let mut s = p.lock();
        for (key, at, reqs) in [(1u64, 0usize, 40), (2, 0, 30), (3, 1, 20), (4, 2, 10)] {
            s.set_home(key, at, false);
            for _ in 0..reqs {
                s.record(key, at, 0);
            }
        }
        s.seq += 100;
        drop(s);
        p
    }

    #[test]
    fn a_prefix_that_fits_the_gap_moves_to_the_least_loaded() {
        let loads = idle(3);
        let p = skewed();
        let s = p.lock();
        let (k1, k2, k3) = (s.home(1).unwrap(), s.home(2).unwrap(), s.home(3).unwrap());
        // Mean 33: backend 0 is over it; D = 60, and 30 and 40 both fit
        // within 0.15 D ..= 0.85 D.
        assert_eq!(s.propose_move(&RB, &k2, &loads, |_| true), Some(2));
        assert_eq!(s.propose_move(&RB, &k1, &loads, |_| true), Some(2));
        // The least loaded is not usable: the next least.
        assert_eq!(s.propose_move(&RB, &k2, &loads, |b| b != 2), Some(1));
        // Backend 1 is below the mean: nothing of it moves.
        assert_eq!(s.propose_move(&RB, &k3, &loads, |_| true), None);
        // Within the slack: nothing moves.
        let wide = Rebalance { slack: 1.2, ..RB };
        assert_eq!(s.propose_move(&wide, &k2, &loads, |_| true), None);
    }

    #[test]
    fn moves_are_rare_never_of_a_fresh_home_nor_past_the_gap() {
        let loads = idle(3);
        let p = skewed();
        let mut s = p.lock();
        let k1 = s.home(1).unwrap();
        // A key homed moments ago never moves.
        s.set_home(5, 0, false);
        for _ in 0..5 {
            s.record(5, 0, 0);
        }
        let k5 = s.home(5).unwrap();
        assert_eq!(s.propose_move(&RB, &k5, &loads, |_| true), None);
        // Right after a move, no other one.
        s.set_home(2, 2, true);
        s.record(2, 2, 500);
        assert_eq!(s.propose_move(&RB, &k1, &loads, |_| true), None);
        // Loads 45 / 20 + 6 / 41 a few decisions later: backend 0 is still
        // over the mean, but key 1 (40) is more than 0.85 x the gap (19).
        for _ in 0..6 {
            s.record(99, 1, 0);
        }
        assert_eq!(s.propose_move(&RB, &k1, &loads, |_| true), None);
        assert_eq!(s.moves, 1);
    }

    #[test]
    fn no_move_before_the_fleet_has_seen_enough() {
        let p = Placer::new(&backends(3), 1e5);
        let mut s = p.lock();
        s.set_home(1, 0, false);
        for _ in 0..19 {
            s.record(1, 0, 0);
        }
        s.set_home(2, 0, false);
        for _ in 0..10 {
            s.record(2, 0, 0);
        }
        s.seq += 1000;
        // 29 requests < 10 x 3, although backend 0 has every one.
        let k2 = s.home(2).unwrap();
        assert_eq!(s.propose_move(&RB, &k2, &idle(3), |_| true), None);
        // Two more (the count decays a little): enough.
        s.record(1, 0, 0);
        s.record(1, 0, 0);
        assert_eq!(s.propose_move(&RB, &k2, &idle(3), |_| true), Some(1));
    }
}

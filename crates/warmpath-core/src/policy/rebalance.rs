//! The move rule of `kv_aware`'s balance stage (the formula: the `kv`
//! module docs): when a prefix leaves its home for the least loaded backend.
//!
//! Why moves, not copies: below saturation a backend's share is the sum of
//! its prefixes' popularities, fixed when they were placed, before their
//! popularity was known. Copies (a bound on each backend's recent share)
//! also even it, but in a fleet whose caches just hold the working set each
//! copy evicts a prefix that then misses. A move costs one cold prefill on
//! the new home (and what that evicts there, once); the old copy ages out
//! of its former home's LRU, which frees the room.
//!
//! The rule, with `L` the expected loads (the popularity homed on each
//! backend, [`home`](super::home)), `mean` their mean over usable backends, `t` the usable backend with the lowest
//! `L`, `D = L_h - L_t` and `p` the prefix's popularity: a warm request
//! whose prefix its home `h` holds (published, so never one still
//! prefilling) goes, with the prefix's home, to `t` when
//!
//! - `L_h > (1 + rebalance_slack) * mean`,
//! - `MOVE_FIT_MIN * min(D, mean) <= p <= MOVE_FIT_MAX * D` (no ping-pong,
//!   and no move too small to pay for its prefill),
//! - the prefix has had its home for `MOVE_COOLDOWN n` decisions, the fleet
//!   has seen `MOVE_WARMUP n` requests, and the last move was
//!   `MOVE_SPACING min(n, SPACING_BACKENDS)` decisions ago (the constants:
//!   `tuning`).
//!
//! A move swaps: the least popular prefix homed on `t` (the likeliest
//! victim of the moved blocks there) is reserved on `h`, whose room the
//! moved prefix's stale copy frees, so its next cold request goes there
//! instead of cascading through cold placement.

use super::fleet::{Fleet, Stamp};
use super::home::Home;
use super::place::State;
use super::tuning::{
    COPY_SLACK, FIT_BAND, MOVE_COOLDOWN, MOVE_FIT_MAX, MOVE_FIT_MIN, MOVE_SPACING, MOVE_WARMUP,
    SPACING_BACKENDS,
};
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
        MOVE_COOLDOWN * self.backends
    }
}

impl State {
    /// Whether the last move (this replica's or one it took from another)
    /// was under `MOVE_SPACING n` decisions ago, `n` backends counted up to
    /// `SPACING_BACKENDS`.
    pub(crate) fn moved_lately(&self, n: u64) -> bool {
        let wait = MOVE_SPACING * n.min(SPACING_BACKENDS);
        self.last_move
            .is_some_and(|m| self.seq.saturating_sub(m) < wait)
    }

    /// Where `home`'s prefix should move to even the expected loads, if
    /// anywhere (module docs). Its home must be usable and hold it.
    pub(crate) fn propose_move(
        &self,
        rb: &Rebalance,
        home: &Home,
        blocks: u32,
        loads: &[BackendLoad],
        usable: impl Fn(usize) -> bool,
    ) -> Option<usize> {
        let n = rb.backends;
        // A prefix with copies is spread, not moved (`replicas`).
        if home.count() > 1
            || self.seq.saturating_sub(home.since) < rb.cooldown()
            || self.moved_lately(n)
        {
            return None;
        }
        let m = loads.len().min(self.homes.loads().len());
        let fleet = self.fleet(n, m, &usable);
        // Decayed requests seen, in requests.
        if fleet.count < 2 || fleet.expected / self.unit < MOVE_WARMUP * n as f64 {
            return None;
        }
        let t = fleet.lowest_but(home.backend as usize)?;
        if home.backend as usize >= m {
            return None;
        }
        let load = self.homes.loads();
        let (lh, lt) = (load[home.backend as usize], load[t]);
        let mean = fleet.expected / f64::from(fleet.count);
        let d = lh - lt;
        let fits = (MOVE_FIT_MIN * d.min(mean)..=MOVE_FIT_MAX * d).contains(&home.pop);
        // Even shares are a means: a move that would evict hotter prefixes
        // at the target than the least-loss placement costs hit rate.
        let cheap = || self.evict_cost(t, home.key, blocks) <= FIT_BAND * f64::from(blocks);
        (lh > (1.0 + rb.slack) * mean && fits && cheap()).then_some(t)
    }

    /// Whether `home`'s prefix needs one more deliberate copy (`Some(true)`)
    /// or one fewer (`Some(false)`), by the **copy rule**: `k` holders of a
    /// prefix of popularity `p` carry `p / k` each, and each should carry
    /// no more than a fair share within part of the slack (`COPY_SLACK`,
    /// which leaves room for the holder's other homes), so a prefix gets
    ///
    /// ```text
    /// k = ceil(p / ((1 + COPY_SLACK * rebalance_slack) * mean))   (at most the usable backends)
    /// ```
    ///
    /// holders, `mean` the mean expected load of the usable backends: one
    /// more while `p / k` is above that bound, one fewer once `p / (k - 1)`
    /// would be at most the mean (the load fell). The count grows
    /// with the prefix's demand and the fleet, one copy per request of the
    /// prefix, without the waits between moves: a copy's effect on the
    /// model (`p / k` on each holder) is exact at once. A copy is only
    /// added once the prefix brought `MOVE_WARMUP` of its own requests per
    /// holder, so its popularity is an estimate worth acting on.
    pub(crate) fn replicas(
        &self,
        rb: &Rebalance,
        home: &Home,
        usable: impl Fn(usize) -> bool,
    ) -> Option<bool> {
        let k = home.count() as f64;
        let known = home.pop / (k * self.unit) >= MOVE_WARMUP;
        let fleet = self.fleet(rb.backends, self.homes.loads().len(), &usable);
        let count = fleet.count as usize;
        if count < 2 {
            return None;
        }
        let mean = fleet.expected / count as f64;
        let bound = (1.0 + COPY_SLACK * rb.slack) * mean;
        if known && home.pop / k > bound && home.count() < count {
            Some(true)
        } else if k > 1.0 && home.pop / (k - 1.0) <= mean {
            Some(false)
        } else {
            None
        }
    }

    /// The fleet summary over backends `0..m` ([`fleet`](super::fleet)):
    /// the last one while it stands, else a new pass.
    fn fleet(&self, n: u64, m: usize, usable: impl Fn(usize) -> bool) -> Fleet {
        let now = Stamp {
            seq: self.seq,
            unit: self.unit,
            m,
        };
        if let Some(f) = self.fleet.get() {
            if f.stands(&now, n, &usable) {
                return f;
            }
        }
        let f = Fleet::scan(now, &usable, self.homes.loads());
        self.fleet.set(Some(f));
        f
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::policy::place::{skew, Placer};
    use crate::policy::test_util::*;

    const RB: Rebalance = Rebalance {
        slack: 0.1,
        backends: 3,
    };

    /// Keys 1..=4 homed on backends 0, 0, 1, 2 with 40, 30, 20, 10
    /// requests, 100 decisions ago: expected loads 70 / 20 / 10.
    fn skewed() -> Placer {
        let p = Placer::new(&backends(3), 1e5);
        skew(&mut p.lock());
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
        assert_eq!(s.propose_move(&RB, &k2, 50, &loads, |_| true), Some(2));
        assert_eq!(s.propose_move(&RB, &k1, 50, &loads, |_| true), Some(2));
        // The least loaded is not usable: the next least.
        assert_eq!(s.propose_move(&RB, &k2, 50, &loads, |b| b != 2), Some(1));
        // Backend 1 is below the mean: nothing of it moves.
        assert_eq!(s.propose_move(&RB, &k3, 50, &loads, |_| true), None);
        // Within the slack: nothing moves.
        let wide = Rebalance { slack: 1.2, ..RB };
        assert_eq!(s.propose_move(&wide, &k2, 50, &loads, |_| true), None);
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
        assert_eq!(s.propose_move(&RB, &k5, 50, &loads, |_| true), None);
        // Right after a move, no other one.
        s.set_home(2, 2, true);
        s.record(2, 2, 500);
        assert_eq!(s.propose_move(&RB, &k1, 50, &loads, |_| true), None);
        // Loads 45 / 20 + 6 / 41 a few decisions later: backend 0 is still
        // over the mean, but key 1 (40) is more than 0.85 x the gap (19).
        for _ in 0..6 {
            s.record(99, 1, 0);
        }
        assert_eq!(s.propose_move(&RB, &k1, 50, &loads, |_| true), None);
        assert_eq!(s.moves, 1);
    }

    #[test]
    fn the_wait_between_moves_stops_growing_past_64_backends() {
        // 2 n decisions up to 64 backends, 128 beyond.
        for (n, wait) in [(3u64, 6u64), (64, 128), (65, 128), (1000, 128)] {
            let p = Placer::new(&backends(n as usize), 1e5);
            let mut s = p.lock();
            s.set_home(1, 0, true);
            s.seq += wait - 1;
            assert!(s.moved_lately(n), "{n} backends");
            s.seq += 1;
            assert!(!s.moved_lately(n), "{n} backends");
        }
    }

    #[test]
    fn a_large_fleets_summary_is_reused_until_a_home_changes() {
        let rb = Rebalance {
            slack: 0.4,
            backends: 1000,
        };
        let p = one_hot(1000, 50, 2);
        let mut s = p.lock();
        let h = s.home(1).unwrap();
        s.replicas(&rb, &h, |_| true);
        let taken = s.fleet.get().unwrap();
        // A decision later the same summary stands (1000 / 64 decisions).
        s.record(2, 1, 0);
        s.replicas(&rb, &h, |_| true);
        assert_eq!(s.fleet.get().unwrap(), taken);
        // A placement drops it; the next check takes a new one.
        s.set_home(5000, 3, false);
        assert!(s.fleet.get().is_none());
        s.replicas(&rb, &h, |_| true);
        assert_ne!(s.fleet.get().unwrap(), taken);
        // So do a move and a copy.
        s.move_home(5000, 3, 4);
        assert!(s.fleet.get().is_none());
        s.replicas(&rb, &h, |_| true);
        s.copy(1, Some(7));
        assert!(s.fleet.get().is_none());
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
        assert_eq!(s.propose_move(&RB, &k2, 50, &idle(3), |_| true), None);
        // Two more (the count decays a little): enough.
        s.record(1, 0, 0);
        s.record(1, 0, 0);
        assert_eq!(s.propose_move(&RB, &k2, 50, &idle(3), |_| true), Some(1));
    }

    /// A fleet of `n` whose backend 0 homes key 1 with `hot` of every 100
    /// requests; keys 2.. share the rest, one per other backend.
    fn one_hot(n: usize, hot: u32, rounds: u32) -> Placer {
        let p = Placer::new(&backends(n), 1e7);
        {
            let mut s = p.lock();
            for key in 1..n as u64 {
                s.set_home(key + 1, key as usize, false);
            }
            s.set_home(1, 0, false);
            for _ in 0..rounds {
                for i in 0..100u32 {
                    if i < hot {
                        s.record(1, 0, 0);
                    } else {
                        let key = 2 + u64::from(i) % (n as u64 - 1);
                        s.record(key, key as usize - 1, 0);
                    }
                }
            }
        }
        p
    }

    /// Copies `key` while [`State::replicas`] asks, each on the next
    /// backend; the holders it ends with.
    fn copy_while_asked(s: &mut State, rb: &Rebalance, key: u64) -> usize {
        let n = s.homes.loads().len();
        for b in 1..n {
            let h = s.home(key).unwrap();
            if s.replicas(rb, &h, |_| true) != Some(true) {
                break;
            }
            s.copy(key, Some(b));
        }
        s.home(key).unwrap().count()
    }

    #[test]
    fn copies_scale_with_demand_and_the_fleet() {
        let rb = |n: usize| Rebalance {
            slack: 0.4,
            backends: n as u64,
        };
        // Half the traffic of 20 backends: 10 even shares, 1 + 0.75 x 0.4
        // = 1.3 per holder at most: ceil(10 / 1.3) = 8 holders, past the
        // entry's own room.
        let p = one_hot(20, 50, 10);
        assert_eq!(copy_while_asked(&mut p.lock(), &rb(20), 1), 8);
        // On 200 backends, 100 even shares: 77 holders.
        let p = one_hot(200, 50, 100);
        assert_eq!(copy_while_asked(&mut p.lock(), &rb(200), 1), 77);
        // Each holder carries p / k, within COPY_SLACK of the slack.
        let s = p.lock();
        let mean = s.homes.loads().iter().sum::<f64>() / 200.0;
        let h = s.home(1).unwrap();
        assert!(h.pop / 77.0 <= 1.3 * mean && h.pop / 76.0 > 1.3 * mean);
        // Never more holders than backends: all 3 of 3 hold it.
        let p = one_hot(3, 99, 10);
        assert_eq!(copy_while_asked(&mut p.lock(), &rb(3), 1), 3);
        // A prefix within the slack of an even share gets none.
        let p = one_hot(20, 6, 10);
        assert_eq!(copy_while_asked(&mut p.lock(), &rb(20), 1), 1);
    }

    #[test]
    fn a_copy_waits_for_enough_requests_and_goes_when_the_load_falls() {
        let rb = Rebalance {
            slack: 0.4,
            backends: 20,
        };
        // Half of 44 requests: 22 of its own, so copies come while each
        // holder has had 10 of them (1 and 2 holders): 3, although its share
        // asks for 8.
        let p = one_hot(20, 50, 0);
        {
            let mut s = p.lock();
            for i in 0..44u64 {
                if i % 2 == 0 {
                    s.record(1, 0, 0);
                } else {
                    s.record(2 + i % 19, (1 + i % 19) as usize, 0);
                }
            }
        }
        let mut s = p.lock();
        assert_eq!(copy_while_asked(&mut s, &rb, 1), 3);
        // The others grow: it needs one backend again, its copies go, one
        // per request, the last one first.
        for _ in 0..40 {
            for key in 2..21u64 {
                s.record(key, key as usize - 1, 0);
            }
        }
        for left in [2, 1] {
            let h = s.home(1).unwrap();
            assert_eq!(s.replicas(&rb, &h, |_| true), Some(false));
            s.copy(1, None);
            assert_eq!(s.home(1).unwrap().count(), left);
        }
        let h = s.home(1).unwrap();
        assert_eq!(s.replicas(&rb, &h, |_| true), None);
    }

    #[test]
    fn a_gap_wider_than_the_mean_still_takes_a_fair_sized_prefix() {
        // Backend 0 holds key 1 (100 requests) and key 2 (10); 1 and 2 hold
        // nothing. D = 110, mean 37: key 1 is past 0.85 D and key 2 below
        // 0.15 D, yet key 2 is worth more than 15% of the mean.
        let p = Placer::new(&backends(3), 1e5);
        let mut s = p.lock();
        for (key, reqs) in [(1u64, 100), (2, 10)] {
            s.set_home(key, 0, false);
            for _ in 0..reqs {
                s.record(key, 0, 0);
            }
        }
        s.seq += 100;
        let loads = idle(3);
        let (k1, k2) = (s.home(1).unwrap(), s.home(2).unwrap());
        assert_eq!(s.propose_move(&RB, &k1, 50, &loads, |_| true), None);
        assert_eq!(s.propose_move(&RB, &k2, 50, &loads, |_| true), Some(1));
    }
}

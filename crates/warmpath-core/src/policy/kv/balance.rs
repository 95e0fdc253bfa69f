//! The `balance` stage: a prefix too hot for its holders gets one more copy, one too cold
//! for them loses one (docs/kv.md), over a fleet summary reused for a few decisions so a
//! large fleet is not scanned per warm request.

use super::candidates::Held;
use super::home::Home;
use super::tuning::{COPY_SLACK, COPY_WARMUP};
use super::{step, Fleet, KvAware, Rehome, Stamp, State, Step};
use crate::route::{BackendLoad, DecisionKind, RouteInput};

/// The warm step, or a copy made or dropped where the pick is a home holding the best match.
pub(super) fn copies(
    p: &KvAware,
    s: &State,
    input: &RouteInput<'_>,
    held: &Held,
    loads: &[BackendLoad],
    step: Step,
    copyable: Option<Home>,
) -> Step {
    let (Some(h), Some(slack)) = (copyable, p.kv.rebalance_slack) else {
        return step;
    };
    match s.replicas(slack, &h, |i| s.cands.usable(i)) {
        Some(true) => replicate(p, s, input, &h, held, loads).unwrap_or(step),
        Some(false) => Step {
            rehome: Rehome::Uncopy,
            ..step
        },
        None => step,
    }
}

/// One more copy of `home`'s prefix: the lowest cold cost among the backends not holding it.
fn replicate(
    p: &KvAware,
    s: &State,
    input: &RouteInput<'_>,
    home: &Home,
    held: &Held,
    loads: &[BackendLoad],
) -> Option<Step> {
    let mut holders: Vec<usize> = s.homes.holders(home).collect();
    holders.sort_unstable();
    let (t, _) = s.place(
        input.prefix_key,
        input.chain_blocks,
        loads,
        |i| s.cands.usable(i) && holders.binary_search(&i).is_err(),
        &p.ring,
        p.weights(),
        f64::from(input.chain_blocks),
    )?;
    Some(step(
        t,
        held.get(t),
        DecisionKind::Replicate,
        Rehome::Copy(t),
    ))
}

impl State {
    /// Whether `home`'s prefix needs one more copy (`Some(true)`) or one fewer (`Some(false)`).
    pub(crate) fn replicas(
        &self,
        slack: f64,
        home: &Home,
        usable: impl Fn(usize) -> bool,
    ) -> Option<bool> {
        let k = home.count() as f64;
        let known = home.pop / (k * self.unit) >= COPY_WARMUP;
        let fleet = self.fleet(&usable);
        let count = fleet.count as usize;
        if count < 2 {
            return None;
        }
        let mean = fleet.expected / count as f64;
        let bound = (1.0 + COPY_SLACK * slack) * mean;
        if known && home.pop / k > bound && home.count() < count {
            Some(true)
        } else if k > 1.0 && home.pop / (k - 1.0) <= mean {
            Some(false)
        } else {
            None
        }
    }

    /// The [`Fleet`] summary: the last one while it stands, else a new pass.
    fn fleet(&self, usable: impl Fn(usize) -> bool) -> Fleet {
        let m = self.homes.loads().len();
        let now = Stamp {
            seq: self.seq,
            unit: self.unit,
            m,
        };
        if let Some(f) = self.fleet.get().filter(|f| f.stands(&now, m as u64)) {
            return f;
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
    use crate::policy::kv::*;
    use crate::policy::test_util::*;
    use proptest::prelude::*;

    fn stamp(seq: u64, m: usize) -> Stamp {
        Stamp { seq, unit: 1.5, m }
    }

    #[test]
    fn it_is_reused_for_n_over_64_decisions_and_no_longer() {
        let loads = [4.0, 1.0, 3.0, 1.0];
        let f = Fleet::scan(stamp(10, 4), |_| true, &loads);
        // Up to 127 backends: this decision only.
        assert!(f.stands(&stamp(10, 4), 127));
        assert!(!f.stands(&stamp(11, 4), 127));
        // 1000 backends: 15 decisions.
        assert!(f.stands(&stamp(24, 4), 1000));
        assert!(!f.stands(&stamp(25, 4), 1000));
        // A rescale or another size: no.
        let rescaled = Stamp {
            unit: 1.0,
            ..stamp(10, 4)
        };
        assert!(!f.stands(&rescaled, 1000));
        let grown = Stamp {
            unit: 1.6,
            ..stamp(11, 4)
        };
        assert!(f.stands(&grown, 1000));
        assert!(!f.stands(&stamp(10, 3), 1000));
        // An older stamp than the summary (a reset): no.
        assert!(!f.stands(&stamp(9, 4), 1000));
    }

    proptest! {
        /// The summary is the plain pass: the count and the sums.
        #[test]
        fn the_summary_is_the_scan(
            fleet in proptest::collection::vec((0u8..6, any::<bool>()), 0..24),
        ) {
            let loads: Vec<f64> = fleet.iter().map(|&(l, _)| f64::from(l)).collect();
            let usable = |b: usize| fleet[b].1;
            let f = Fleet::scan(stamp(0, fleet.len()), usable, &loads);
            let ok: Vec<usize> = (0..fleet.len()).filter(|&b| usable(b)).collect();
            prop_assert_eq!(f.count as usize, ok.len());
            prop_assert_eq!(f.expected, ok.iter().map(|&b| loads[b]).sum::<f64>());
        }
    }

    #[test]
    fn a_large_fleets_summary_is_reused_until_a_home_changes() {
        let rb = 0.4;
        let p = one_hot(1000, 50, 2);
        let mut s = p.lock();
        let h = s.home(1).unwrap();
        s.replicas(rb, &h, |_| true);
        let taken = s.fleet.get().unwrap();
        // A decision later the same summary stands (1000 / 64 decisions).
        s.record(2, 1, 0);
        s.replicas(rb, &h, |_| true);
        assert_eq!(s.fleet.get().unwrap(), taken);
        // A placement drops it; the next check takes a new one.
        s.rehome(5000, Rehome::To(3));
        assert!(s.fleet.get().is_none());
        s.replicas(rb, &h, |_| true);
        assert_ne!(s.fleet.get().unwrap(), taken);
        // So does a copy.
        s.rehome(1, Rehome::Copy(7));
        assert!(s.fleet.get().is_none());
    }

    /// A fleet of `n` whose backend 0 homes key 1 with `hot` of every 100
    /// requests; keys 2.. share the rest, one per other backend.
    fn one_hot(n: usize, hot: u32, rounds: u32) -> Mutex<State> {
        let p = Mutex::new(State::new(&backends(n), 1e7));
        {
            let mut s = p.lock();
            for key in 1..n as u64 {
                s.rehome(key + 1, Rehome::To(key as usize));
            }
            s.rehome(1, Rehome::To(0));
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
    fn copy_while_asked(s: &mut State, rb: f64, key: u64) -> usize {
        let n = s.homes.loads().len();
        for b in 1..n {
            let h = s.home(key).unwrap();
            if s.replicas(rb, &h, |_| true) != Some(true) {
                break;
            }
            s.rehome(key, Rehome::Copy(b));
        }
        s.home(key).unwrap().count()
    }

    #[test]
    fn copies_scale_with_demand_and_the_fleet() {
        // Half the traffic of 20 backends: 10 even shares, 1 + 0.75 x 0.4
        // = 1.3 per holder at most: ceil(10 / 1.3) = 8 holders, past the
        // entry's own room.
        let p = one_hot(20, 50, 10);
        assert_eq!(copy_while_asked(&mut p.lock(), 0.4, 1), 8);
        // On 200 backends, 100 even shares: 77 holders.
        let p = one_hot(200, 50, 100);
        assert_eq!(copy_while_asked(&mut p.lock(), 0.4, 1), 77);
        // Each holder carries p / k, within COPY_SLACK of the slack.
        let s = p.lock();
        let mean = s.homes.loads().iter().sum::<f64>() / 200.0;
        let h = s.home(1).unwrap();
        assert!(h.pop / 77.0 <= 1.3 * mean && h.pop / 76.0 > 1.3 * mean);
        // Never more holders than backends: all 3 of 3 hold it.
        let p = one_hot(3, 99, 10);
        assert_eq!(copy_while_asked(&mut p.lock(), 0.4, 1), 3);
        // A prefix within the slack of an even share gets none.
        let p = one_hot(20, 6, 10);
        assert_eq!(copy_while_asked(&mut p.lock(), 0.4, 1), 1);
    }

    #[test]
    fn a_copy_waits_for_enough_requests_and_goes_when_the_load_falls() {
        let rb = 0.4;
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
        assert_eq!(copy_while_asked(&mut s, rb, 1), 3);
        // The others grow: it needs one backend again, its copies go, one
        // per request, the last one first.
        for _ in 0..40 {
            for key in 2..21u64 {
                s.record(key, key as usize - 1, 0);
            }
        }
        for left in [2, 1] {
            let h = s.home(1).unwrap();
            assert_eq!(s.replicas(rb, &h, |_| true), Some(false));
            s.rehome(1, Rehome::Uncopy);
            assert_eq!(s.home(1).unwrap().count(), left);
        }
        let h = s.home(1).unwrap();
        assert_eq!(s.replicas(rb, &h, |_| true), None);
    }
}

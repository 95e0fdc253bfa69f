//! Router replicas in the scale model (`--routers R`, docs/bench.md, "The
//! `scale` model"): each replica's own policy and load view, the engines' load
//! reports they share, and decisions shared after `--share-delay-ms`.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use warmpath_core::policy::{
    BackendLoad, Built, Decision, EngineLoad, Loads, PolicyError, RemoteDecision, RouteInput,
};

pub(super) struct RouterView {
    pub(super) policy: Built,
    /// What this replica counts in flight and predicts to prefill per
    /// instance, with the engines' last report.
    loads: Vec<BackendLoad>,
    /// Positions whose load changed since the last pick.
    changed: Vec<usize>,
    /// Every position may have changed (an engine report, the first pick).
    all_changed: bool,
    pick_rng: SmallRng,
}

impl RouterView {
    /// Installs `policy`, rebuilt over a membership change: it sees every load afresh.
    pub(super) fn rebuilt(&mut self, policy: Built) {
        self.policy = policy;
        self.all_changed = true;
        self.changed.clear();
    }

    /// A request routed to instance `i` with `prefill` blocks to compute.
    pub(super) fn start(&mut self, i: usize, prefill: u64) {
        let l = &mut self.loads[i];
        l.in_flight += 1;
        l.pending_prefill_blocks += prefill;
        self.changed.push(i);
    }

    /// A request's first token at instance `i`: its `prefill` is done.
    pub(super) fn prefilled(&mut self, i: usize, prefill: u64) {
        let l = &mut self.loads[i];
        l.pending_prefill_blocks = l.pending_prefill_blocks.saturating_sub(prefill);
        self.changed.push(i);
    }

    /// A request's last token at instance `i`.
    pub(super) fn finished(&mut self, i: usize) {
        let l = &mut self.loads[i];
        l.in_flight = l.in_flight.saturating_sub(1);
        self.changed.push(i);
    }

    /// The policy's pick, told which loads changed since its last one;
    /// `keyed`: ties go by the prefix key, so replicas of one state agree.
    pub(super) fn pick(
        &mut self,
        input: &RouteInput<'_>,
        keyed: bool,
    ) -> Result<Decision, PolicyError> {
        let mut by_key;
        let rng: &mut SmallRng = if keyed {
            by_key = SmallRng::seed_from_u64(input.prefix_key);
            &mut by_key
        } else {
            &mut self.pick_rng
        };
        let loads = Loads {
            all: &self.loads,
            changed: (!self.all_changed).then_some(&self.changed[..]),
        };
        let d = self.policy.policy.pick(input, &loads, rng);
        self.changed.clear();
        self.all_changed = false;
        d
    }
}

/// Every replica, the spread of requests over them and the load reports.
pub(super) struct Replicas {
    pub(super) views: Vec<RouterView>,
    spread: SmallRng,
    report_every_us: u64,
    next_report_us: u64,
    /// Facts on their way to the other replicas (`Event::Shared` indexes).
    facts: Vec<Option<Fact>>,
}

/// Which part of a request's life a shared fact tells.
#[derive(Clone, Debug)]
pub(super) enum Phase {
    /// Routed: the pick, and its predicted prefill blocks.
    Start(RemoteDecision),
    /// First token: its prefill is done.
    Prefilled(u64),
    /// Last token: no longer in flight.
    Finished,
}

/// One request's fact from replica `from` about instance `backend`.
#[derive(Clone, Debug)]
pub(super) struct Fact {
    pub(super) from: usize,
    pub(super) backend: usize,
    pub(super) phase: Phase,
}

impl Replicas {
    /// One policy per replica, built from the same snapshot.
    pub(super) fn new(
        policies: Vec<Built>,
        instances: usize,
        seed: u64,
        report_every_us: u64,
    ) -> Self {
        let views = policies
            .into_iter()
            .enumerate()
            .map(|(r, policy)| RouterView {
                policy,
                loads: vec![
                    BackendLoad {
                        eligible: true,
                        ..Default::default()
                    };
                    instances
                ],
                changed: Vec::new(),
                all_changed: true,
                pick_rng: SmallRng::seed_from_u64(seed ^ 0x5ca1e ^ (r as u64).wrapping_mul(0x9e37)),
            })
            .collect();
        Replicas {
            views,
            spread: SmallRng::seed_from_u64(seed ^ 0x7e91_1ca5),
            report_every_us,
            next_report_us: 0,
            facts: Vec::new(),
        }
    }

    /// Keeps `fact` until it is delivered; the index to schedule.
    pub(super) fn send(&mut self, fact: Fact) -> usize {
        self.facts.push(Some(fact));
        self.facts.len() - 1
    }

    /// Delivers fact `at` to every replica but its sender.
    pub(super) fn deliver(&mut self, at: usize) {
        let Some(f) = self.facts.get_mut(at).and_then(Option::take) else {
            return;
        };
        for (r, v) in self.views.iter_mut().enumerate() {
            if r == f.from || f.backend >= v.loads.len() {
                continue;
            }
            let i = f.backend;
            match &f.phase {
                Phase::Start(d) => {
                    if let Some(l) = &v.policy.learns {
                        l.observe_remote(d);
                    }
                    v.start(i, u64::from(d.prefill_blocks));
                }
                Phase::Prefilled(blocks) => v.prefilled(i, *blocks),
                Phase::Finished => v.finished(i),
            }
        }
    }

    pub(super) fn choose(&mut self) -> usize {
        match self.views.len() {
            0 | 1 => 0,
            n => self.spread.random_range(0..n),
        }
    }

    /// Publishes the engines' load (running or waiting) to every replica
    /// when a report is due (never with one router).
    pub(super) fn report_engines(
        &mut self,
        now_us: u64,
        in_flight: impl Fn(usize) -> u32,
        capacity: Option<u64>,
    ) {
        if self.views.len() < 2 || now_us < self.next_report_us {
            return;
        }
        self.next_report_us = now_us + self.report_every_us.max(1);
        let n = self.views.first().map_or(0, |v| v.loads.len());
        for i in 0..n {
            let engine = EngineLoad {
                running: in_flight(i),
                waiting: 0,
                kv_usage: 0.0,
                capacity_blocks: capacity,
            };
            for v in &mut self.views {
                v.loads[i].engine = Some(engine);
            }
        }
        for v in &mut self.views {
            v.all_changed = true;
            v.changed.clear();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use warmpath_core::policy::{build_policy, PolicyBackend, PolicyConfig};
    use warmpath_core::Strategy;

    fn replicas(n: usize) -> Replicas {
        let backends: Vec<PolicyBackend> = (0..3)
            .map(|i| PolicyBackend {
                id: format!("w{i}"),
                slot: i,
                capacity_blocks: None,
            })
            .collect();
        let policies = (0..n)
            .map(|_| {
                build_policy(Strategy::Random, &PolicyConfig::default(), &backends, None).unwrap()
            })
            .collect();
        Replicas::new(policies, 3, 1, 1000)
    }

    #[test]
    fn one_router_never_sees_an_engine_view() {
        let mut r = replicas(1);
        r.report_engines(5000, |_| 9, Some(10));
        assert_eq!(r.choose(), 0);
        assert!(r.views[0].loads.iter().all(|l| l.engine.is_none()));
    }

    #[test]
    fn a_fact_reaches_every_replica_but_its_sender() {
        let mut r = replicas(3);
        let start = r.send(Fact {
            from: 1,
            backend: 2,
            phase: Phase::Start(RemoteDecision {
                prefix_key: 5,
                backend: 2,
                chain_blocks: 10,
                prefill_blocks: 8,
                home: None,
            }),
        });
        r.deliver(start);
        r.deliver(start);
        let seen = |r: &Replicas| -> Vec<(u32, u64)> {
            r.views
                .iter()
                .map(|v| (v.loads[2].in_flight, v.loads[2].pending_prefill_blocks))
                .collect()
        };
        assert_eq!(
            seen(&r),
            [(1, 8), (0, 0), (1, 8)],
            "once each, not the sender"
        );
        let pre = r.send(Fact {
            from: 1,
            backend: 2,
            phase: Phase::Prefilled(8),
        });
        r.deliver(pre);
        assert_eq!(seen(&r), [(1, 0), (0, 0), (1, 0)]);
        let fin = r.send(Fact {
            from: 1,
            backend: 2,
            phase: Phase::Finished,
        });
        r.deliver(fin);
        assert_eq!(seen(&r), [(0, 0); 3]);
    }

    #[test]
    fn replicas_get_the_engines_load_once_per_interval() {
        let mut r = replicas(3);
        r.report_engines(0, |i| i as u32, None);
        assert!(r
            .views
            .iter()
            .all(|v| v.loads[2].engine.unwrap().running == 2));
        // Not due yet: the old report stays.
        r.report_engines(500, |_| 7, None);
        assert_eq!(r.views[1].loads[2].engine.unwrap().running, 2);
        r.report_engines(1000, |_| 7, None);
        assert_eq!(r.views[1].loads[2].engine.unwrap().running, 7);
        let picks: std::collections::BTreeSet<usize> = (0..100).map(|_| r.choose()).collect();
        assert_eq!(picks.len(), 3, "requests spread over every replica");
    }
}

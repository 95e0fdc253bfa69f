//! Previews of `kv_aware` (a pick under `Mode::Preview`): on random
//! histories, the preview is the decision a committed pick then makes with
//! the same rng, and previews change no later decision (a twin fed the same
//! picks without previews agrees); and a pick told which loads changed
//! (`Loads::changed`) decides exactly as one that compares them all.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::index::{MatchResult, WorkerMatch};
use crate::policy::test_util::*;
use crate::route::EngineLoad;
use crate::route::*;
use proptest::prelude::{any, prop_assert_eq, prop_oneof, proptest, Just, ProptestConfig};
use proptest::strategy::Strategy as Gen;
use rand::rngs::SmallRng;
use rand::SeedableRng;

/// One request of a random history: key (from a few, so prefixes return),
/// chain length, per-backend (blocks held, fresh), per-backend load.
#[derive(Clone, Debug)]
struct Step {
    key: u64,
    chain: u32,
    held: Vec<(u32, bool)>,
    loads: Vec<(bool, u32, u64)>,
    previews: u8,
    seed: u64,
}

fn step(n: usize) -> impl Gen<Value = Step> {
    (
        0u64..6,
        1u32..64,
        proptest::collection::vec((0u32..64, proptest::bool::weighted(0.8)), n),
        proptest::collection::vec(
            (
                proptest::bool::weighted(0.9),
                0u32..6,
                prop_oneof![Just(0u64), 0u64..200],
            ),
            n,
        ),
        0u8..4,
        any::<u64>(),
    )
        .prop_map(|(key, chain, held, loads, previews, seed)| Step {
            key: key.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            chain,
            held,
            loads,
            previews,
            seed,
        })
}

fn policy(n: usize, cfg: &PolicyConfig, capacity: Option<u64>) -> KvAware {
    let mut bs = backends(n);
    for b in &mut bs {
        b.capacity_blocks = capacity;
    }
    KvAware::with_window(cfg, &bs, 8.0)
}

fn input_of<'a>(s: &Step, m: &'a MatchResult) -> RouteInput<'a> {
    RouteInput {
        prefix_key: s.key,
        chain_blocks: s.chain,
        matches: Some(m),
        ..Default::default()
    }
}

fn match_of(s: &Step) -> MatchResult {
    MatchResult {
        workers: s
            .held
            .iter()
            .enumerate()
            .filter(|(_, (b, _))| *b > 0)
            .map(|(i, &(b, fresh))| WorkerMatch {
                slot: i as u16,
                blocks: b.min(s.chain),
                gpu_blocks: b.min(s.chain),
                fresh,
            })
            .collect(),
        chain_len: s.chain,
    }
}

fn loads_of(s: &Step) -> Vec<BackendLoad> {
    s.loads
        .iter()
        .map(|&(eligible, in_flight, pending)| BackendLoad {
            eligible,
            in_flight,
            pending_prefill_blocks: pending,
            engine: None,
        })
        .collect()
}

fn configs() -> impl Gen<Value = (PolicyConfig, Option<u64>)> {
    (
        prop_oneof![Just(None), Just(Some(0.1)), Just(Some(0.5))],
        prop_oneof![Just(None), Just(Some(96u64)), Just(Some(400u64))],
        1u32..8,
    )
        .prop_map(|(slack, capacity, threshold)| {
            let mut cfg = PolicyConfig {
                concurrency_threshold: threshold,
                ..Default::default()
            };
            cfg.kv.rebalance_slack = slack;
            (cfg, capacity)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn preview_is_the_next_pick_and_changes_nothing(
        n in 2usize..6,
        (cfg, capacity) in configs(),
        steps in proptest::collection::vec(step(6), 1..60),
    ) {
        let p = policy(n, &cfg, capacity);
        let twin = policy(n, &cfg, capacity);
        let mut last: Option<Step> = None;
        for s in &steps {
            let s = Step {
                held: s.held[..n].to_vec(),
                loads: s.loads[..n].to_vec(),
                ..s.clone()
            };
            let (m, all) = (match_of(&s), loads_of(&s));
            let (input, loads) = (input_of(&s, &m), Loads::new(&all));
            let rng = || SmallRng::seed_from_u64(s.seed);
            // A preview of another request (the last one's key, on its
            // loads, with this one's index view) changes nothing either.
            if let Some(o) = last.replace(s.clone()) {
                let other = RouteInput { prefix_key: o.key, ..input };
                let _ = p.pick(&previewing(&other), &Loads::new(&loads_of(&o)), &mut rng());
            }
            let mut previews = Vec::new();
            for _ in 0..=s.previews {
                previews.push(p.pick(&previewing(&input), &loads, &mut rng()));
            }
            let picked = p.pick(&input, &loads, &mut rng());
            let alone = twin.pick(&input, &loads, &mut rng());
            for pv in &previews {
                prop_assert_eq!(pv, &picked);
            }
            prop_assert_eq!(&picked, &alone, "previews changed a later decision");
            prop_assert_eq!(p.home_of(s.key), twin.home_of(s.key));
        }
    }
}

#[test]
fn preview_records_no_placement() {
    // A cold prefix previewed many times is placed by the first real pick
    // exactly where a policy that never previewed places it.
    let (p, twin) = (kv(3), kv(3));
    let loads = idle(3);
    for k in 0..40u64 {
        let input = RouteInput {
            prefix_key: k.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            chain_blocks: 100,
            matches: None,
            ..Default::default()
        };
        let first = p
            .pick(&previewing(&input), &Loads::new(&loads), &mut rng())
            .unwrap();
        for _ in 0..5 {
            assert_eq!(
                p.pick(&previewing(&input), &Loads::new(&loads), &mut rng())
                    .unwrap(),
                first
            );
        }
        let d = p.pick(&input, &Loads::new(&loads), &mut rng()).unwrap();
        assert_eq!(d, first);
        assert_eq!(
            d,
            twin.pick(&input, &Loads::new(&loads), &mut rng()).unwrap()
        );
    }
}

fn kv(n: usize) -> KvAware {
    KvAware::new(&PolicyConfig::default(), &backends(n))
}

/// One step of a history for `Loads::changed`: which positions keep their
/// load, the new loads (with a reported capacity) for the others, and
/// positions to report changed although they are not.
#[derive(Clone, Debug)]
struct Drift {
    step: Step,
    keep: Vec<bool>,
    capacity: Vec<Option<u64>>,
    extra: Vec<usize>,
}

fn drift(n: usize) -> impl Gen<Value = Drift> {
    (
        step(n),
        proptest::collection::vec(proptest::bool::weighted(0.7), n),
        proptest::collection::vec(
            prop_oneof![Just(None), Just(Some(96u64)), Just(Some(300))],
            n,
        ),
        proptest::collection::vec(0usize..n, 0..3),
    )
        .prop_map(|(step, keep, capacity, extra)| Drift {
            step,
            keep,
            capacity,
            extra,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Told which loads changed since its last decision (a superset), the
    /// policy decides exactly as one that compares every load; previews in
    /// between (which compare every load, capacities changing) agree with
    /// the pick and change neither it nor the change lists' meaning.
    #[test]
    fn pick_changed_is_pick(
        n in 2usize..6,
        (cfg, capacity) in configs(),
        steps in proptest::collection::vec(drift(6), 1..60),
    ) {
        let told = policy(n, &cfg, capacity);
        let scan = policy(n, &cfg, capacity);
        let mut loads: Vec<BackendLoad> = Vec::new();
        for d in &steps {
            let s = Step {
                held: d.step.held[..n].to_vec(),
                loads: d.step.loads[..n].to_vec(),
                ..d.step.clone()
            };
            let mut fresh = loads_of(&s);
            for (l, &cap) in fresh.iter_mut().zip(&d.capacity) {
                l.engine = cap.map(|c| EngineLoad {
                    capacity_blocks: Some(c),
                    ..EngineLoad::default()
                });
            }
            let mut changed: Vec<usize> = d.extra.iter().copied().filter(|&i| i < n).collect();
            if loads.is_empty() {
                loads = fresh.clone();
                changed.extend(0..n);
            } else {
                for i in 0..n {
                    if !d.keep[i] {
                        loads[i] = fresh[i];
                        changed.push(i);
                    }
                }
            }
            let m = match_of(&s);
            let input = input_of(&s, &m);
            let told_loads = Loads { all: &loads, changed: Some(&changed) };
            let previews: Vec<_> = (0..s.previews)
                .map(|_| told.pick(&previewing(&input), &Loads::new(&loads), &mut SmallRng::seed_from_u64(s.seed)))
                .collect();
            // A preview on other loads (every position changed) leaves the
            // next change list as true as before.
            let _ = told.pick(&previewing(&input), &Loads::new(&fresh), &mut SmallRng::seed_from_u64(s.seed));
            let a = told.pick(&input, &told_loads, &mut SmallRng::seed_from_u64(s.seed));
            let b = scan.pick(&input, &Loads::new(&loads), &mut SmallRng::seed_from_u64(s.seed));
            for pv in &previews {
                prop_assert_eq!(pv, &b);
            }
            prop_assert_eq!(a, b);
            prop_assert_eq!(told.home_of(s.key), scan.home_of(s.key));
        }
    }
}

#[test]
fn a_preview_puts_the_modelled_caches_back() {
    let mut bs = backends(2);
    for b in &mut bs {
        b.capacity_blocks = Some(100);
    }
    let p = KvAware::new(&PolicyConfig::default(), &bs);
    let loads = idle(2);
    let cold = RouteInput {
        prefix_key: 7,
        chain_blocks: 40,
        matches: None,
        ..Default::default()
    };
    let at = p
        .pick(&cold, &Loads::new(&loads), &mut rng())
        .unwrap()
        .backend;
    // The index says the holder has 10 blocks of it, and the other
    // backend's engine reports another capacity: a commit would take both.
    let m = MatchResult {
        workers: vec![WorkerMatch {
            slot: at as u16,
            blocks: 10,
            gpu_blocks: 10,
            fresh: true,
        }],
        chain_len: 40,
    };
    let mut other = loads.clone();
    other[1 - at].engine = Some(EngineLoad {
        capacity_blocks: Some(50),
        ..EngineLoad::default()
    });
    let seen = RouteInput {
        matches: Some(&m),
        ..cold
    };
    p.pick(&previewing(&seen), &Loads::new(&other), &mut rng())
        .unwrap();
    let s = p.placer.lock();
    assert_eq!(s.resident.of(at).unwrap().held(7), 40, "observation undone");
    assert_eq!(
        s.resident.of(1 - at).unwrap().capacity(),
        100,
        "new model undone"
    );
}

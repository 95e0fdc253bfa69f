//! Tests of `kv_aware` through membership changes (the `carry` module).

#![allow(clippy::unwrap_used)]

use super::*;
use crate::index::MatchResult;
use crate::policy::test_util::*;
use crate::route::*;
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use std::collections::HashMap;

const GOLDEN: u64 = 0x9e37_79b9_7f4a_7c15;

/// Backends `b0`, `b1`, ... of slots 0, 1, ..., of `capacity` blocks.
fn fleet(n: usize, capacity: Option<u64>) -> Vec<PolicyBackend> {
    backends(n)
        .into_iter()
        .map(|b| PolicyBackend {
            capacity_blocks: capacity,
            ..b
        })
        .collect()
}

/// `fleet` with backend `b{n}` (slot n) added.
fn added(b: &[PolicyBackend]) -> Vec<PolicyBackend> {
    let mut out = b.to_vec();
    let n = b.len();
    out.push(PolicyBackend {
        id: format!("b{n}"),
        slot: n as u16,
        capacity_blocks: b[0].capacity_blocks,
    });
    out
}

/// `b` without position `r` (the others keep their slots, as in the index).
fn removed(b: &[PolicyBackend], r: usize) -> Vec<PolicyBackend> {
    let mut out = b.to_vec();
    out.remove(r);
    out
}

/// The cache index as the tests play it: which slots hold how many blocks
/// of each prefix key.
#[derive(Clone, Debug, Default)]
struct Held(HashMap<u64, Vec<(u16, u32)>>);

impl Held {
    fn matches(&self, key: u64, chain: u32) -> Option<MatchResult> {
        let list: Vec<(u16, u32, bool)> = self
            .0
            .get(&key)?
            .iter()
            .map(|&(s, b)| (s, b, true))
            .collect();
        Some(matches(&list, chain))
    }

    fn store(&mut self, key: u64, slot: u16, blocks: u32) {
        let v = self.0.entry(key).or_default();
        v.retain(|h| h.0 != slot);
        v.push((slot, blocks));
    }

    fn evict(&mut self, key: u64, slot: u16) {
        if let Some(v) = self.0.get_mut(&key) {
            v.retain(|h| h.0 != slot);
        }
    }

    /// The index dropped worker `slot`.
    fn drop_worker(&mut self, slot: u16) {
        self.0.values_mut().for_each(|v| v.retain(|h| h.0 != slot));
    }
}

/// Loads of `n` backends from `seed`: in flight 0..4, sometimes a queued
/// prefill.
fn loads_of(n: usize, seed: u64) -> Vec<BackendLoad> {
    (0..n)
        .map(|i| {
            let x = seed.wrapping_mul(GOLDEN).rotate_left(7 * i as u32 + 3);
            BackendLoad {
                eligible: true,
                in_flight: (x % 4) as u32,
                pending_prefill_blocks: if x.is_multiple_of(7) { 60 } else { 0 },
                engine: None,
            }
        })
        .collect()
}

/// One request of a history: key, whether its backend publishes the
/// blocks (else the engine evicts a holder of it), load seed.
type Op = (u64, bool, u64);

/// Runs `ops` through `p` over `b`, playing the index in `held`.
fn run(p: &KvAware, b: &[PolicyBackend], held: &mut Held, ops: &[Op]) {
    for (n, &(k, publish, seed)) in ops.iter().enumerate() {
        let key = (k + 1).wrapping_mul(GOLDEN);
        let chain = 20 + (k as u32 % 5) * 10;
        let m = held.matches(key, chain);
        let input = RouteInput {
            prefix_key: key,
            chain_blocks: chain,
            matches: m.as_ref(),
            ..Default::default()
        };
        let mut rng = SmallRng::seed_from_u64(seed);
        let d = p
            .pick(&input, &Loads::new(&loads_of(b.len(), seed)), &mut rng)
            .unwrap();
        let slot = b[d.backend].slot;
        if publish {
            held.store(key, slot, chain);
        } else if n.is_multiple_of(3) {
            // The engine evicted it somewhere.
            let victim = b[(seed as usize) % b.len()].slot;
            held.evict(key, victim);
        }
    }
}

/// The change of a case: `None` adds a backend, `Some(r)` removes `r`
/// (modulo the fleet size).
fn changed(b: &[PolicyBackend], change: Option<usize>) -> (Vec<PolicyBackend>, Option<usize>) {
    match change {
        None => (added(b), None),
        Some(r) => {
            let r = r % b.len();
            (removed(b, r), Some(r))
        }
    }
}

fn id_of(b: &[PolicyBackend], at: usize) -> &str {
    &b[at].id
}

#[test]
fn a_prefix_still_prefilling_follows_its_home_across_an_add() {
    let b = fleet(3, None);
    let p = KvAware::new(&PolicyConfig::default(), &b);
    let cold = RouteInput {
        prefix_key: 77,
        chain_blocks: 500,
        matches: None,
        ..Default::default()
    };
    let first = p.pick(&cold, &Loads::new(&idle(3)), &mut rng()).unwrap();
    let at = id_of(&b, first.backend).to_owned();
    // Its first request is prefilling there when a backend is added.
    let b4 = added(&b);
    let next = p.carried(&b4, &PolicyConfig::default()).unwrap().policy;
    let mut loads = idle(4);
    let home = b4.iter().position(|x| x.id == at).unwrap();
    loads[home].pending_prefill_blocks = 2000;
    let again = next.pick(&cold, &Loads::new(&loads), &mut rng()).unwrap();
    assert_eq!(
        (id_of(&b4, again.backend), again.kind),
        (at.as_str(), DecisionKind::PrefixHash),
        "follows its first request"
    );
    // A policy that started afresh would place a second cold copy.
    let fresh = KvAware::new(&PolicyConfig::default(), &b4);
    assert_ne!(
        fresh
            .pick(&cold, &Loads::new(&loads), &mut rng())
            .unwrap()
            .backend,
        home
    );
}

#[test]
fn a_new_backend_takes_the_next_cold_prefixes() {
    let b = fleet(3, None);
    let cfg = PolicyConfig::default();
    let p = KvAware::new(&cfg, &b);
    let mut held = Held::default();
    // Six prefixes, each asked for ten times, warm where they went.
    let ops: Vec<Op> = (0..60u64).map(|i| (i % 6, true, 0)).collect();
    let idle_run = |p: &KvAware, held: &mut Held| {
        for &(k, _, _) in &ops {
            let key = (k + 1).wrapping_mul(GOLDEN);
            let m = held.matches(key, 40);
            let input = RouteInput {
                prefix_key: key,
                chain_blocks: 40,
                matches: m.as_ref(),
                ..Default::default()
            };
            let d = p.pick(&input, &Loads::new(&idle(3)), &mut rng()).unwrap();
            held.store(key, b[d.backend].slot, 40);
        }
    };
    idle_run(&p, &mut held);
    let b4 = added(&b);
    let next = p.carried(&b4, &cfg).unwrap().policy;
    let fresh = KvAware::new(&cfg, &b4);
    let mut on_new = (0, 0);
    for k in 100..102u64 {
        let input = RouteInput {
            prefix_key: k.wrapping_mul(GOLDEN),
            chain_blocks: 40,
            matches: None,
            ..Default::default()
        };
        let d = next
            .pick(&input, &Loads::new(&idle(4)), &mut rng())
            .unwrap();
        on_new.0 += usize::from(d.backend == 3);
        let f = fresh
            .pick(&input, &Loads::new(&idle(4)), &mut rng())
            .unwrap();
        on_new.1 += usize::from(f.backend == 3);
    }
    // The others carry six prefixes' load: both new prefixes go to the new
    // one. Afresh, every backend looks alike and the two are spread.
    assert_eq!(on_new, (2, 1));
}

#[test]
fn a_removed_workers_homes_and_copies_go_the_others_stay() {
    let b = fleet(3, None);
    let p = KvAware::with_window(&PolicyConfig::default(), &b, 1e5);
    {
        let mut s = p.placer.lock();
        for (key, at) in [(1u64, 0usize), (2, 1), (3, 2)] {
            s.rehome(key, Rehome::To(at));
            for _ in 0..10 {
                s.record(key, at, 5);
            }
        }
        // Key 2 also has a copy on b0; key 3 one on b1.
        s.rehome(2, Rehome::Copy(0));
        s.rehome(3, Rehome::Copy(1));
    }
    let next = p.carried_over(&PolicyConfig::default(), &removed(&b, 0));
    let s = next.placer.lock();
    assert!(s.home(1).is_none(), "homed on the removed b0: re-places");
    let k2 = s.home(2).unwrap();
    assert_eq!(
        (k2.backend, k2.count()),
        (0, 1),
        "b1 is position 0; copy gone"
    );
    let k3 = s.home(3).unwrap();
    assert_eq!(
        (k3.backend, s.homes.holders(&k3).collect::<Vec<_>>()),
        (1, vec![1, 0])
    );
    // b1 carries key 2 whole and half of key 3; b2 the other half.
    let l = s.homes.loads();
    // (Popularity decays a little over the 30 decisions.)
    assert!(
        (l[0] - 15.0).abs() < 0.01 && (l[1] - 5.0).abs() < 0.01,
        "{l:?}"
    );
    let was = p.placer.lock().pressures();
    assert_eq!(s.pressures(), was[1..].to_vec(), "pressure by worker id");
    assert_eq!(s.seq, p.placer.lock().seq);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// After adding or removing one backend, every prefix homed on a
    /// remaining worker keeps its home there (by worker id), with its
    /// popularity, its age, its flags and its copies on remaining workers;
    /// one homed on a removed worker is forgotten; each remaining worker's
    /// expected load is the popularity homed there.
    #[test]
    fn every_prefix_homed_on_a_remaining_worker_keeps_its_home(
        n in 2usize..6,
        change in proptest::option::of(0usize..6),
        ops in proptest::collection::vec((0u64..12, any::<bool>(), any::<u64>()), 50..300),
    ) {
        let b = fleet(n, None);
        let mut cfg = PolicyConfig::default();
        cfg.kv.rebalance_slack = Some(0.1);
        let p = KvAware::with_window(&cfg, &b, 50.0);
        let mut held = Held::default();
        run(&p, &b, &mut held, &ops);
        let (nb, gone) = changed(&b, change);
        let next = p.carried_over(&cfg, &nb);
        let (old, new) = (p.placer.lock(), next.placer.lock());
        let mut sums = vec![0.0; nb.len()];
        for k in 0..12u64 {
            let key = (k + 1).wrapping_mul(GOLDEN);
            let before = old.home(key);
            let after = new.home(key);
            let Some(h) = before else {
                prop_assert!(after.is_none());
                continue;
            };
            if Some(h.backend as usize) == gone {
                prop_assert!(after.is_none(), "homed on the removed worker");
                continue;
            }
            let a = after.unwrap();
            let ids = |t: &State, s: &[PolicyBackend], h: &Home| -> Vec<String> {
                t.homes.holders(h).map(|i| s[i].id.clone()).collect()
            };
            let mut want = ids(&old, &b, &h);
            want.retain(|id| nb.iter().any(|x| &x.id == id));
            prop_assert_eq!(ids(&new, &nb, &a), want);
            prop_assert_eq!(a.pop, h.pop);
            for i in new.homes.holders(&a) {
                sums[i] += a.pop / a.count() as f64;
            }
        }
        for (j, l) in new.homes.loads().iter().enumerate() {
            prop_assert!((l - sums[j]).abs() < 1e-6 * (1.0 + sums[j]), "{j}: {l} vs {}", sums[j]);
        }
        prop_assert_eq!(new.seq, old.seq);
    }
}

/// One case of the twin property: after `ops` on `n` backends and the
/// `change`, the prefixes (of 12) for which the rebuilt policy (or, with
/// `fresh`, one built afresh) decides otherwise than the old policy with
/// the changed worker unusable, under the loads of `after`. A prefix the
/// change moves across the admission threshold is left out: the threshold
/// counts every cache of known capacity, usable or not, so an added or
/// removed worker's cache changes it by design.
fn twin_disagreements(
    n: usize,
    change: Option<usize>,
    capacity: Option<u64>,
    ops: &[Op],
    after: &[u64],
    fresh: bool,
) -> Vec<String> {
    let b = fleet(n, capacity);
    let cfg = PolicyConfig::default();
    let p = KvAware::new(&cfg, &b);
    let mut held = Held::default();
    run(&p, &b, &mut held, ops);
    p.placer.lock().seq += 1000;
    let (nb, gone) = changed(&b, change);
    if let Some(r) = gone {
        held.drop_worker(b[r].slot);
    }
    let next = if fresh {
        KvAware::new(&cfg, &nb)
    } else {
        p.carried_over(&cfg, &nb)
    };
    let mut out = Vec::new();
    for (k, &seed) in after.iter().enumerate() {
        let key = (k as u64 + 1).wrapping_mul(GOLDEN);
        let home = p.placer.lock().home(key).map(|h| h.backend as usize);
        if gone.is_some() && home == gone {
            continue;
        }
        let chain = 20 + (k as u32 % 5) * 10;
        let tail = |s: &State| {
            let px = s.home(key).map_or(0.0, |h| h.pop) + s.unit;
            px < s.tail_threshold(chain)
        };
        if tail(&p.placer.lock()) != tail(&next.placer.lock()) {
            continue;
        }
        let m = held.matches(key, chain);
        let input = RouteInput {
            prefix_key: key,
            chain_blocks: chain,
            matches: m.as_ref(),
            ..Default::default()
        };
        // The same loads by worker id; the changed worker unusable.
        let mut loads_new = loads_of(nb.len(), seed);
        let loads_old: Vec<BackendLoad> = b
            .iter()
            .map(|x| match nb.iter().position(|y| y.id == x.id) {
                Some(j) => loads_new[j],
                None => BackendLoad::default(),
            })
            .collect();
        if gone.is_none() {
            loads_new[n].eligible = false;
        }
        let twin = p
            .pick(
                &previewing(&input),
                &Loads::new(&loads_old),
                &mut SmallRng::seed_from_u64(seed),
            )
            .unwrap();
        let got = next
            .pick(
                &previewing(&input),
                &Loads::new(&loads_new),
                &mut SmallRng::seed_from_u64(seed),
            )
            .unwrap();
        let got = (id_of(&nb, got.backend), got.kind, got.matched_blocks);
        let want = (id_of(&b, twin.backend), twin.kind, twin.matched_blocks);
        if got != want {
            out.push(format!("key {k}: {got:?}, the old policy {want:?}"));
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// For the remaining workers a change is the same as the changed worker
    /// becoming unusable: for every prefix not homed on a removed worker, the
    /// rebuilt policy decides what the old one decides with the removed
    /// worker ineligible (or the new one not yet eligible), by worker id,
    /// whatever the loads, modelled caches and stale copies. (The engines'
    /// capacities stay unknown here; the fixed histories below include
    /// them, leaving out the prefixes the change moves across the
    /// admission threshold.)
    #[test]
    fn a_change_is_the_changed_worker_becoming_unusable(
        n in 2usize..6,
        change in proptest::option::of(0usize..6),
        capacity in Just(None::<u64>),
        ops in proptest::collection::vec((0u64..12, any::<bool>(), any::<u64>()), 1..200),
        after in proptest::collection::vec(any::<u64>(), 12),
    ) {
        let wrong = twin_disagreements(n, change, capacity, &ops, &after, false);
        prop_assert!(wrong.is_empty(), "{:?}", wrong);
    }
}

#[test]
fn a_policy_built_afresh_fails_the_twin_property() {
    // The property has teeth: over a few fixed histories, a policy that
    // forgot the homes, loads and pressure decides otherwise for some
    // prefix, while the rebuilt one never does.
    let mut afresh = 0;
    for case in 0..8u64 {
        let ops: Vec<Op> = (0..150u64)
            .map(|i| {
                let x = (case * 1000 + i).wrapping_mul(GOLDEN);
                (x % 12, !x.is_multiple_of(3), x.rotate_left(17))
            })
            .collect();
        let after: Vec<u64> = (0..12u64).map(|k| (case + 1) * 7919 + k).collect();
        let change = (case % 2 == 0).then_some(case as usize);
        let capacity = (case % 4 < 2).then_some(150);
        let n = 3 + (case as usize % 3);
        let carried = twin_disagreements(n, change, capacity, &ops, &after, false);
        assert!(carried.is_empty(), "case {case}: {carried:?}");
        afresh += twin_disagreements(n, change, capacity, &ops, &after, true).len();
    }
    assert!(afresh > 0, "a fresh policy decided the same everywhere");
}

/// Of `keys` prefixes on `p` over `b` (held as `held.0` says), those `next`
/// over `nb` (held as `held.1` says) sends elsewhere, by worker id, at
/// idle: (moved, of which to `to`).
fn moved(
    p: &dyn Policy,
    b: &[PolicyBackend],
    next: &dyn Policy,
    nb: &[PolicyBackend],
    held: (&Held, &Held),
    keys: u64,
    to: &str,
) -> (usize, usize) {
    let (mut moved, mut onto) = (0, 0);
    for k in 0..keys {
        let key = (k + 1).wrapping_mul(GOLDEN);
        fn input(key: u64, m: &Option<MatchResult>) -> RouteInput<'_> {
            RouteInput {
                prefix_key: key,
                chain_blocks: 40,
                matches: m.as_ref(),
                ..Default::default()
            }
        }
        let (m0, m1) = (held.0.matches(key, 40), held.1.matches(key, 40));
        let before = p
            .pick(
                &previewing(&input(key, &m0)),
                &Loads::new(&idle(b.len())),
                &mut rng(),
            )
            .unwrap();
        let after = next
            .pick(
                &previewing(&input(key, &m1)),
                &Loads::new(&idle(nb.len())),
                &mut rng(),
            )
            .unwrap();
        if id_of(b, before.backend) != id_of(nb, after.backend) {
            moved += 1;
            onto += usize::from(id_of(nb, after.backend) == to);
        }
    }
    (moved, onto)
}

#[test]
fn a_change_moves_no_warm_prefix_and_the_ring_about_one_nth() {
    let keys = 400u64;
    let cfg = PolicyConfig::default();
    let b = fleet(4, None);
    let p = KvAware::new(&cfg, &b);
    let mut held = Held::default();
    for k in 0..keys {
        let key = (k + 1).wrapping_mul(GOLDEN);
        let input = RouteInput {
            prefix_key: key,
            chain_blocks: 40,
            matches: None,
            ..Default::default()
        };
        let d = p.pick(&input, &Loads::new(&idle(4)), &mut rng()).unwrap();
        held.store(key, b[d.backend].slot, 40);
    }
    // Warm prefixes: an add moves none; a removal only the removed one's.
    let grown = added(&b);
    let (warm_add, _) = moved(
        &p,
        &b,
        &*p.carried(&grown, &cfg).unwrap().policy,
        &grown,
        (&held, &held),
        keys,
        "b4",
    );
    let shrunk = removed(&b, 1);
    let mut rest = held.clone();
    rest.drop_worker(1);
    let on_b1 = held
        .0
        .values()
        .filter(|v| v.iter().any(|h| h.0 == 1))
        .count();
    let (warm_rm, _) = moved(
        &p,
        &b,
        &*p.carried(&shrunk, &cfg).unwrap().policy,
        &shrunk,
        (&held, &rest),
        keys,
        "",
    );
    assert_eq!((warm_add, warm_rm), (0, on_b1));
    println!(
        "NUMBER kv_aware, {keys} warm prefixes on 4 backends: add one -> {warm_add} moved; \
         remove b1 -> {warm_rm} moved (the {on_b1} it held, re-placed)"
    );
}

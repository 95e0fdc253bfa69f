//! The `choose` stage: the warm pick, the cheapest backend by the cost formula among those
//! holding the chain or not (docs/kv.md), read off the [`State`].

use super::candidates::{cheapest_scan, Held, Salted};
use super::home::Home;
use super::place::least_or;
use super::{step, KvAware, Rehome, State, Step};
use crate::error::PolicyError;
use crate::route::{BackendLoad, DecisionKind, RouteInput};
use rand::RngCore;

/// The warm step, and the home holding the best match when the pick is one of its holders
/// (what the `balance` stage may copy).
pub(super) fn warm(
    p: &KvAware,
    s: &State,
    input: &RouteInput<'_>,
    held: &Held,
    best_match: u32,
    loads: &[BackendLoad],
    rng: &mut dyn RngCore,
) -> Result<(Step, Option<Home>), PolicyError> {
    let key = input.prefix_key;
    let chain = input.chain_blocks.max(best_match);
    // A shallower match (or none) won on load, or the deeper holders were full: spill.
    let kind = |m| {
        if m == best_match {
            DecisionKind::KvMatch
        } else {
            DecisionKind::Spill
        }
    };
    let home: Option<Home> = s.home(key).filter(|h| s.cands.usable(h.backend as usize));
    let at = |h: &Home| h.backend as usize;
    let holds = |i: usize| held.get(i) >= best_match;
    let holding = home.filter(|h| holds(at(h)));
    // Its agent's view is stale: it may well hold it; re-home nothing.
    let of = |h: Home| input.matches.and_then(|m| m.of(p.slots[at(&h)]));
    let stale = home.and_then(of).is_some_and(|w| !w.fresh);
    // The home and its copies that pass `ok` and hold the deepest match, sorted.
    let holders_by = |ok: &dyn Fn(usize) -> bool| -> Vec<usize> {
        let mut v: Vec<usize> = s
            .home(key)
            .filter(|h| ok(at(h)) && holds(at(h)))
            .map_or_else(Vec::new, |h| {
                s.homes.holders(&h).filter(|&i| ok(i) && holds(i)).collect()
            });
        v.sort_unstable();
        v
    };
    let homes = holders_by(&|i| s.cands.usable(i));
    // A salted rng: the router seeds the caller's rng by the prefix key
    // (`route::pick`), so every tie would draw the same holder and a copy get no traffic.
    let cheapest = if homes.len() > 1 {
        let mut salted = Salted {
            inner: rng,
            salt: s.seq,
        };
        s.cands.cheapest(&p.kv, chain, held, &homes, &mut salted)
    } else {
        s.cands.cheapest(&p.kv, chain, held, &homes, rng)
    };
    let Some((m, backend)) = cheapest else {
        // Every backend is full: the same formula over the eligible ones; nothing is copied.
        let homes = holders_by(&|i| loads.get(i).is_some_and(|l| l.eligible));
        let (m, backend) = cheapest_full(p, chain, held, &homes, loads, rng)?;
        let kind = least_or(loads, backend, kind(m));
        return Ok((step(backend, m, kind, Rehome::Keep), None));
    };
    let copyable = holding.filter(|_| homes.contains(&backend) && m == best_match);
    // Its home lost it (or it had none): it lives where it went.
    let lost = holding.is_none() && !stale && home.is_none_or(|h| at(&h) != backend);
    let rehome = if lost {
        Rehome::To(backend)
    } else {
        Rehome::Keep
    };
    Ok((step(backend, m, kind(m), rehome), copyable))
}

/// The warm pick when every backend is full: the formula over the eligible holders, if any.
fn cheapest_full(
    p: &KvAware,
    chain: u32,
    held: &Held,
    homes: &[usize],
    loads: &[BackendLoad],
    rng: &mut dyn RngCore,
) -> Result<(u32, usize), PolicyError> {
    let matched: Vec<u32> = (0..loads.len()).map(|i| held.get(i)).collect();
    // A full fleet gains nothing from a cold prefill off the holders: capacity lost.
    let holders: Vec<BackendLoad> = loads
        .iter()
        .zip(&matched)
        .map(|(l, &m)| BackendLoad {
            eligible: l.eligible && m > 0,
            ..*l
        })
        .collect();
    let scope = if holders.iter().any(|l| l.eligible) {
        &holders[..]
    } else {
        loads
    };
    cheapest_scan(&p.kv, u32::MAX, chain, &matched, scope, homes, rng).ok_or(PolicyError::NoBackend)
}

//! Decisions of other router replicas (`Learns::observe_remote`): each is
//! recorded as this replica records its own (`record`, `cached`), and the
//! sender's home and copies for the prefix are taken (state, not the rule
//! that fired, so a lost fact is corrected by the next one for the key).
//! A replica blind to the others' picks would place new prefixes blind to
//! them and split warm ones (docs/replicas.md).

use super::home::Home;
use super::place::{Placer, State};

/// Where a prefix lives after a decision (kv_aware's home), by position in
/// the policy's snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HomeView {
    /// Its home.
    pub backend: usize,
    /// Its deliberate copies besides the home.
    pub copies: Vec<usize>,
}

/// A pick another replica made, by positions in this policy's snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemoteDecision {
    /// The request's prefix key.
    pub prefix_key: u64,
    /// Where it went.
    pub backend: usize,
    /// Full blocks in its chain.
    pub chain_blocks: u32,
    /// Blocks the backend must prefill (the sender's prediction).
    pub prefill_blocks: u32,
    /// The prefix's home after the decision, when the sender keeps homes.
    pub home: Option<HomeView>,
}

/// `key`'s home as `placer` holds it now.
pub(super) fn home_of(placer: &Placer, key: u64) -> Option<HomeView> {
    let s = placer.lock();
    s.home(key).map(|h| view(&s, &h))
}

fn view(s: &State, h: &Home) -> HomeView {
    HomeView {
        backend: h.backend as usize,
        copies: s.homes.holders(h).skip(1).collect(),
    }
}

/// Records `d` as the pick that made it would have been recorded.
pub(super) fn observe(placer: &Placer, d: &RemoteDecision) {
    let mut s = placer.lock();
    let n = s.homes.loads().len();
    if d.backend >= n {
        return;
    }
    if let Some(h) = d.home.as_ref().filter(|h| h.backend < n) {
        align(&mut s, d.prefix_key, h, n);
    }
    s.record(d.prefix_key, d.backend, d.prefill_blocks);
    s.cached(d.prefix_key, d.backend, d.chain_blocks);
}

/// Takes the sender's home (and copies) for `key`.
fn align(s: &mut State, key: u64, h: &HomeView, n: usize) {
    // Homes change below: the balance stage's fleet summary is retaken.
    s.fleet.set(None);
    if s.home(key)
        .is_none_or(|local| local.backend as usize != h.backend)
    {
        s.homes.set_home(key, h.backend, s.seq);
    }
    let want: Vec<usize> = h.copies.iter().copied().filter(|&c| c < n).collect();
    let have: Vec<usize> = s.home(key).map_or_else(Vec::new, |l| view(s, &l).copies);
    if have != want {
        while s.homes.drop_copy(key).is_some() {}
        for c in want {
            s.homes.add_copy(key, c);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::policy::test_util::*;
    use crate::policy::{
        build_policy, KvAware, KvConfig, Learns, Loads, Policy, PolicyConfig, RouteInput, Strategy,
    };

    fn kv(n: usize) -> KvAware {
        KvAware::new(&PolicyConfig::default(), &backends(n))
    }

    fn shared(p: &dyn Learns, key: u64, d: &crate::policy::Decision, chain: u32) -> RemoteDecision {
        RemoteDecision {
            prefix_key: key,
            backend: d.backend,
            chain_blocks: chain,
            prefill_blocks: chain - d.matched_blocks,
            home: p.home_of(key),
        }
    }

    #[test]
    fn a_replica_that_hears_every_pick_decides_as_the_one_that_made_them() {
        // Replica `a` places 12 cold prefixes; `b` hears of each; then both
        // place a 13th the same way, which a blind replica `c` does not.
        let (a, b, c) = (kv(4), kv(4), kv(4));
        let loads = idle(4);
        for k in 1..=12u64 {
            let key = k.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            let input = RouteInput {
                prefix_key: key,
                chain_blocks: 100,
                matches: None,
                ..Default::default()
            };
            // More requests of some keys: their popularities differ.
            for _ in 0..=(k % 5) {
                let d = a.pick(&input, &Loads::new(&loads), &mut rng()).unwrap();
                b.observe_remote(&shared(&a, key, &d, 100));
            }
        }
        let mut agree = 0;
        let mut blind = 0;
        let mut seen = Vec::new();
        for k in 100..140u64 {
            let key = k.wrapping_mul(0x2545_f491_4f6c_dd1d);
            let input = RouteInput {
                prefix_key: key,
                chain_blocks: 100,
                matches: None,
                ..Default::default()
            };
            let pa = a
                .pick(&previewing(&input), &Loads::new(&loads), &mut rng())
                .unwrap();
            let pb = b
                .pick(&previewing(&input), &Loads::new(&loads), &mut rng())
                .unwrap();
            let pc = c
                .pick(&previewing(&input), &Loads::new(&loads), &mut rng())
                .unwrap();
            agree += u32::from(pa.backend == pb.backend);
            blind += u32::from(pa.backend == pc.backend);
            seen.push((pa.backend, pc.backend));
        }
        assert_eq!(agree, 40);
        assert!(
            blind < 40,
            "a blind replica agrees by chance only ({blind}): {seen:?}"
        );
    }

    #[test]
    fn the_senders_home_and_copies_are_taken() {
        let p = kv(4);
        p.observe_remote(&RemoteDecision {
            prefix_key: 9,
            backend: 2,
            chain_blocks: 10,
            prefill_blocks: 10,
            home: Some(HomeView {
                backend: 2,
                copies: vec![],
            }),
        });
        assert_eq!(p.home_of(9).unwrap().backend, 2);
        let elsewhere = HomeView {
            backend: 1,
            copies: vec![3],
        };
        p.observe_remote(&RemoteDecision {
            prefix_key: 9,
            backend: 3,
            chain_blocks: 10,
            prefill_blocks: 10,
            home: Some(elsewhere.clone()),
        });
        assert_eq!(p.home_of(9), Some(elsewhere));
        // Out of range is ignored.
        p.observe_remote(&RemoteDecision {
            prefix_key: 10,
            backend: 7,
            ..Default::default()
        });
        assert_eq!(p.home_of(10), None);
    }

    #[test]
    fn stateless_policies_keep_nothing() {
        let cfg = PolicyConfig::default();
        let prefix = build_policy(Strategy::PrefixAware, &cfg, &backends(3), None).unwrap();
        assert!(prefix.learns.is_none());
    }
}

//! Other replicas' decisions, recorded through the same commit as this one's picks.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::policy::test_util::*;
use crate::route::*;
use crate::route::{Learns, Loads, Policy, PolicyConfig, RouteInput};

fn kv(n: usize) -> KvAware {
    KvAware::new(&PolicyConfig::default(), &backends(n))
}

fn shared(p: &dyn Learns, key: u64, d: &crate::route::Decision, chain: u32) -> RemoteDecision {
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

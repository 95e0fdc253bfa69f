//! Helpers the policies' unit tests share.
#![allow(clippy::unwrap_used)]

use crate::route::*;
use rand::rngs::SmallRng;
use rand::SeedableRng;
use warmpath_index::WorkerSlot;

pub(crate) fn rng() -> SmallRng {
    SmallRng::seed_from_u64(7)
}

pub(crate) fn backends(n: usize) -> Vec<PolicyBackend> {
    (0..n)
        .map(|i| PolicyBackend {
            id: format!("b{i}"),
            slot: i as WorkerSlot,
            capacity_blocks: None,
        })
        .collect()
}

/// A match of a `chain`-block request; `list` is (slot, blocks, fresh).
pub(crate) fn matches(list: &[(u16, u32, bool)], chain: u32) -> crate::index::MatchResult {
    crate::index::MatchResult {
        workers: list
            .iter()
            .map(|&(slot, blocks, fresh)| crate::index::WorkerMatch {
                slot,
                blocks,
                gpu_blocks: blocks,
                fresh,
            })
            .collect(),
        chain_len: chain,
    }
}

/// `input` as a preview (what `route::preview` asks).
pub(crate) fn previewing<'a>(input: &RouteInput<'a>) -> RouteInput<'a> {
    RouteInput {
        mode: Mode::Preview,
        ..*input
    }
}

pub(crate) fn idle(n: usize) -> Vec<BackendLoad> {
    vec![
        BackendLoad {
            eligible: true,
            ..Default::default()
        };
        n
    ]
}

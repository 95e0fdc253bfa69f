//! Whether the published block set is prefix-closed (the .proto's "Prefix
//! closure"): the router then probes a few blocks of a chain instead of every
//! one, so the claim must be exact. Kept by counting, O(1) per block: `kids[p]`
//! GPU blocks have parent `p`, `orphans` GPU blocks a parent not on the GPU,
//! `off_gpu` (block, tier) pairs are on another tier.

use crate::tracker::FastMap;
use warmpath_core::BlockHash;
use warmpath_proto::v1::Tier;

/// The counts (module docs).
#[derive(Debug, Default)]
pub(crate) struct Closure {
    kids: FastMap<BlockHash, u32>,
    orphans: u64,
    off_gpu: u64,
}

impl Closure {
    /// Whether the set is prefix-closed now.
    pub(crate) fn is_closed(&self) -> bool {
        self.orphans == 0 && self.off_gpu == 0
    }

    /// `hash` became held on `tier`; `on_gpu` says what is held now.
    pub(crate) fn added(
        &mut self,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tier: Tier,
        on_gpu: impl Fn(BlockHash) -> bool,
    ) {
        if tier != Tier::Gpu {
            self.off_gpu += 1;
            return;
        }
        if let Some(p) = parent {
            *self.kids.entry(p).or_insert(0) += 1;
            if !on_gpu(p) {
                self.orphans += 1;
            }
        }
        // Its children held already were orphans until now.
        let healed = self.kids.get(&hash).copied().unwrap_or(0);
        self.orphans = self.orphans.saturating_sub(u64::from(healed));
    }

    /// `hash` is no longer held on `tier`; `on_gpu` says what is held now.
    pub(crate) fn removed(
        &mut self,
        hash: BlockHash,
        parent: Option<BlockHash>,
        tier: Tier,
        on_gpu: impl Fn(BlockHash) -> bool,
    ) {
        if tier != Tier::Gpu {
            self.off_gpu = self.off_gpu.saturating_sub(1);
            return;
        }
        if let Some(p) = parent {
            if let Some(k) = self.kids.get_mut(&p) {
                *k -= 1;
                if *k == 0 {
                    self.kids.remove(&p);
                }
            }
            if !on_gpu(p) {
                self.orphans = self.orphans.saturating_sub(1);
            }
        }
        let orphaned = self.kids.get(&hash).copied().unwrap_or(0);
        self.orphans += u64::from(orphaned);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Random stores and removals over a small tree of blocks: the
        /// counted answer is the one read off the whole set.
        #[test]
        fn the_count_is_the_set_read_whole(
            ops in proptest::collection::vec((0u64..24, 0u8..3, proptest::bool::ANY), 1..120),
        ) {
            // Block b's parent is b / 2 (0 is a root): a binary tree.
            let parent = |b: u64| (b > 0).then_some(BlockHash(b / 2));
            let mut held: HashMap<(u64, u8), ()> = HashMap::new();
            let mut c = Closure::default();
            let tiers = [Tier::Gpu, Tier::Cpu, Tier::Disk];
            for (b, t, add) in ops {
                let key = (b, t);
                if add == held.contains_key(&key) {
                    continue;
                }
                if add {
                    held.insert(key, ());
                } else {
                    held.remove(&key);
                }
                let on_gpu = |x: BlockHash| held.contains_key(&(x.0, 0));
                if add {
                    c.added(BlockHash(b), parent(b), tiers[t as usize], on_gpu);
                } else {
                    c.removed(BlockHash(b), parent(b), tiers[t as usize], on_gpu);
                }
                let truth = held.keys().all(|&(x, t)| {
                    t == 0 && parent(x).is_none_or(|p| held.contains_key(&(p.0, 0)))
                });
                prop_assert_eq!(c.is_closed(), truth);
            }
        }
    }
}

//! The simulated instances of the scale run: a prefill queue, decode slots and
//! a prefix cache kept at the granularity of chain *segments*.
//!
//! A segment is a run of consecutive blocks inserted together: a document's
//! full blocks, or one request's own tail blocks (question). The cache is an
//! LRU over segments with a capacity in blocks; evicting a segment removes all
//! its blocks at once. vLLM evicts single leaf blocks, which trims a chain from
//! its end; whole-segment eviction is a simplification that keeps a
//! million-request run cheap and changes the hit rate only for documents that
//! are half evicted (rare with LRU). Every store and removal is applied to the
//! shared [`CacheIndex`] exactly as the agent would publish it.

use std::collections::{BTreeSet, HashMap, VecDeque};
use warmpath_core::{BlockHash, CacheIndex, IndexError, Tier, WorkerSlot};

struct Segment {
    /// Its block hashes when an index mirrors the cache (else empty).
    hashes: Vec<BlockHash>,
    blocks: usize,
    last_used: u64,
}

/// One simulated instance.
pub(crate) struct Instance {
    pub(crate) slot: WorkerSlot,
    segments: HashMap<u64, Segment>,
    lru: BTreeSet<(u64, u64)>,
    used_blocks: usize,
    capacity: usize,
    /// Requests waiting for prefill (indices into the run's request table).
    pub(crate) prefill_queue: VecDeque<usize>,
    /// The request in prefill, if any.
    pub(crate) prefilling: Option<usize>,
    /// Requests decoding.
    pub(crate) decoding: u32,
    /// Requests done with prefill, waiting for a decode slot.
    pub(crate) decode_wait: VecDeque<usize>,
    /// Requests routed here and not finished.
    pub(crate) in_flight: u32,
    /// Requests routed here in total.
    pub(crate) served: u64,
}

impl Instance {
    pub(crate) fn new(slot: WorkerSlot, capacity: usize) -> Self {
        Instance {
            slot,
            segments: HashMap::new(),
            lru: BTreeSet::new(),
            used_blocks: 0,
            capacity,
            prefill_queue: VecDeque::new(),
            prefilling: None,
            decoding: 0,
            decode_wait: VecDeque::new(),
            in_flight: 0,
            served: 0,
        }
    }

    /// Whether segment `key` is cached; marks it used at `tick` if so.
    pub(crate) fn touch(&mut self, key: u64, tick: u64) -> bool {
        let Some(seg) = self.segments.get_mut(&key) else {
            return false;
        };
        self.lru.remove(&(seg.last_used, key));
        seg.last_used = tick;
        self.lru.insert((tick, key));
        true
    }

    /// Caches segment `key` of `blocks` blocks (no-op when present or larger
    /// than the cache), evicting least recently used segments first. With an
    /// `index`, `hashes` are the segment's blocks and every change is
    /// mirrored into it; without one (strategies that never read the index)
    /// only the block count matters.
    pub(crate) fn insert(
        &mut self,
        key: u64,
        hashes: &[BlockHash],
        blocks: usize,
        tick: u64,
        index: Option<&CacheIndex>,
    ) -> Result<(), IndexError> {
        if blocks == 0 || blocks > self.capacity || self.touch(key, tick) {
            return Ok(());
        }
        while self.used_blocks + blocks > self.capacity {
            let Some((_, victim)) = self.lru.pop_first() else {
                break;
            };
            if let Some(seg) = self.segments.remove(&victim) {
                self.used_blocks -= seg.blocks;
                if let Some(index) = index {
                    index.remove(self.slot, Some(Tier::Gpu), &seg.hashes)?;
                }
            }
        }
        if let Some(index) = index {
            index.store(self.slot, Tier::Gpu, hashes)?;
        }
        self.used_blocks += blocks;
        self.segments.insert(
            key,
            Segment {
                hashes: if index.is_some() {
                    hashes.to_vec()
                } else {
                    Vec::new()
                },
                blocks,
                last_used: tick,
            },
        );
        self.lru.insert((tick, key));
        Ok(())
    }

    /// Blocks cached now.
    #[cfg(test)]
    pub(crate) fn used_blocks(&self) -> usize {
        self.used_blocks
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn hashes(base: u64, n: u64) -> Vec<BlockHash> {
        (0..n).map(|i| BlockHash(base + i)).collect()
    }

    #[test]
    fn lru_eviction_is_mirrored_in_the_index() {
        let index = CacheIndex::new();
        let slot = index.register_worker("w0").unwrap();
        let mut inst = Instance::new(slot, 10);
        inst.insert(1, &hashes(100, 4), 4, 1, Some(&index)).unwrap();
        inst.insert(2, &hashes(200, 4), 4, 2, Some(&index)).unwrap();
        assert_eq!(index.block_count(slot), 8);
        assert!(inst.touch(1, 3));
        // Needs room: segment 2 (least recently used) goes.
        inst.insert(3, &hashes(300, 4), 4, 4, Some(&index)).unwrap();
        assert!(!inst.touch(2, 5));
        assert!(inst.touch(1, 6));
        assert_eq!(inst.used_blocks(), 8);
        assert_eq!(index.block_count(slot), 8);
        assert!(index.holders_of(BlockHash(200)).is_empty());
        assert_eq!(index.holders_of(BlockHash(300)).len(), 1);
        // Too big for the cache: ignored.
        inst.insert(4, &hashes(400, 11), 11, 7, Some(&index))
            .unwrap();
        assert!(!inst.touch(4, 8));
    }

    #[test]
    fn without_an_index_only_block_counts_matter() {
        let mut inst = Instance::new(WorkerSlot::default(), 10);
        inst.insert(1, &[], 6, 1, None).unwrap();
        inst.insert(2, &[], 6, 2, None).unwrap();
        assert_eq!(inst.used_blocks(), 6);
        assert!(!inst.touch(1, 3));
        assert!(inst.touch(2, 4));
    }
}

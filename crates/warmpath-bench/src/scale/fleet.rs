//! The simulated instances of the scale run: a prefill queue, decode slots and
//! a prefix cache kept at the granularity of chain *segments*.
//!
//! A segment is a run of consecutive blocks inserted together: a document's
//! full blocks, or one request's own tail blocks (question). The cache is an
//! LRU over segments with a capacity in blocks. Like vLLM, which evicts the
//! least recently used *leaf* block first, eviction trims the least recently
//! used segment from its end, only as many blocks as the new ones need: a
//! document that lost its last blocks still hits on the blocks it kept, and
//! its next request writes the missing ones back. (vLLM would first evict
//! the document's cached question tails, which hang off its last block; here
//! a tail younger than its document can outlive the document's last blocks —
//! 3 blocks of 500, a negligible difference.) Every store and removal is
//! applied to the shared [`CacheIndex`] exactly as the agent would publish it.

use std::collections::{BTreeSet, HashMap, VecDeque};
use warmpath_core::{BlockHash, CacheIndex, IndexError, Tier, WorkerSlot};

struct Segment {
    /// Its block hashes when an index mirrors the cache (else empty).
    hashes: Vec<BlockHash>,
    /// Leading blocks cached now.
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

    /// Leading blocks of segment `key` cached (0 when none); marks it used
    /// at `tick` if any.
    pub(crate) fn touch(&mut self, key: u64, tick: u64) -> usize {
        let Some(seg) = self.segments.get_mut(&key) else {
            return 0;
        };
        self.lru.remove(&(seg.last_used, key));
        seg.last_used = tick;
        self.lru.insert((tick, key));
        seg.blocks
    }

    /// Whether any block of segment `key` is cached (without marking it used).
    pub(crate) fn holds(&self, key: u64) -> bool {
        self.segments.contains_key(&key)
    }

    /// Caches segment `key` of `blocks` blocks (only the missing end when
    /// part of it is cached; no-op when larger than the cache), trimming
    /// least recently used segments first. With an `index`, `hashes` are
    /// the segment's blocks and every change is mirrored into it; without
    /// one (strategies that never read the index) only counts matter.
    pub(crate) fn insert(
        &mut self,
        key: u64,
        hashes: &[BlockHash],
        blocks: usize,
        tick: u64,
        index: Option<&CacheIndex>,
    ) -> Result<(), IndexError> {
        let have = self.touch(key, tick);
        if blocks == 0 || blocks > self.capacity || have >= blocks {
            return Ok(());
        }
        let need = blocks - have;
        while self.used_blocks + need > self.capacity {
            let Some(&(at, victim)) = self.lru.iter().find(|(_, k)| *k != key) else {
                break;
            };
            let Some(seg) = self.segments.get_mut(&victim) else {
                self.lru.remove(&(at, victim));
                continue;
            };
            let trim = (self.used_blocks + need - self.capacity).min(seg.blocks);
            let keep = seg.blocks - trim;
            if let Some(index) = index {
                let gone = seg.hashes.get(keep..seg.blocks).unwrap_or(&[]);
                index.remove(self.slot, Some(Tier::Gpu), gone)?;
            }
            seg.blocks = keep;
            self.used_blocks -= trim;
            if keep == 0 {
                self.segments.remove(&victim);
                self.lru.remove(&(at, victim));
            }
        }
        if let Some(index) = index {
            index.store(
                self.slot,
                Tier::Gpu,
                hashes.get(have..blocks).unwrap_or(&[]),
            )?;
        }
        self.used_blocks += need;
        match self.segments.get_mut(&key) {
            Some(seg) => seg.blocks = blocks,
            None => {
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
            }
        }
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
        assert_eq!(inst.touch(1, 3), 4);
        // Needs 2 more blocks: segment 2 (least recently used) loses its
        // last 2, keeps its first 2.
        inst.insert(3, &hashes(300, 4), 4, 4, Some(&index)).unwrap();
        assert_eq!(inst.used_blocks(), 10);
        assert_eq!(index.block_count(slot), 10);
        assert!(index.holders_of(BlockHash(203)).is_empty());
        assert_eq!(index.holders_of(BlockHash(201)).len(), 1);
        assert_eq!(inst.touch(2, 5), 2);
        // Its next request writes the missing end back, trimming segment 1
        // (now the least recently used).
        inst.insert(2, &hashes(200, 4), 4, 6, Some(&index)).unwrap();
        assert_eq!(inst.touch(2, 7), 4);
        assert_eq!(inst.touch(1, 8), 2);
        assert_eq!(index.block_count(slot), 10);
        assert_eq!(index.holders_of(BlockHash(203)).len(), 1);
        assert!(index.holders_of(BlockHash(102)).is_empty());
        // Too big for the cache: ignored.
        inst.insert(4, &hashes(400, 11), 11, 9, Some(&index))
            .unwrap();
        assert_eq!(inst.touch(4, 10), 0);
    }

    #[test]
    fn without_an_index_only_block_counts_matter() {
        let mut inst = Instance::new(WorkerSlot::default(), 10);
        inst.insert(1, &[], 6, 1, None).unwrap();
        inst.insert(2, &[], 6, 2, None).unwrap();
        assert_eq!(inst.used_blocks(), 10);
        assert_eq!(inst.touch(1, 3), 4);
        assert_eq!(inst.touch(2, 4), 6);
        inst.insert(3, &[], 10, 5, None).unwrap();
        assert_eq!((inst.touch(1, 6), inst.touch(2, 7)), (0, 0));
    }
}

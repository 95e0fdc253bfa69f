//! The simulated instances of the scale run: a prefill queue, decode slots
//! and an LRU prefix cache kept per chain segment, mirrored into the index
//! (docs/bench.md, "The `scale` model").

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use warmpath_core::{BlockHash, CacheIndex, IndexError, Tier, WorkerSlot};

struct Segment {
    /// Its block hashes when an index mirrors the cache (else empty).
    hashes: Vec<BlockHash>,
    /// Leading blocks cached now.
    blocks: usize,
    last_used: u64,
    /// The segment it hangs off (a tail's document).
    parent: Option<u64>,
    /// The segments hanging off its last block (a document's tails).
    children: HashSet<u64>,
}

#[derive(Default)]
pub(crate) struct Instance {
    pub(crate) slot: WorkerSlot,
    segments: HashMap<u64, Segment>,
    lru: BTreeSet<(u64, u64)>,
    used_blocks: usize,
    capacity: usize,
    /// Requests waiting for prefill (indices into the run's request table).
    pub(crate) prefill_queue: VecDeque<usize>,
    pub(crate) prefilling: Option<usize>,
    pub(crate) decoding: u32,
    /// Requests done with prefill, waiting for a decode slot.
    pub(crate) decode_wait: VecDeque<usize>,
    pub(crate) in_flight: u32,
    pub(crate) served: u64,
    /// Requests routed here in the run's second half.
    pub(crate) served_late: u64,
}

impl Instance {
    pub(crate) fn new(slot: WorkerSlot, capacity: usize) -> Self {
        Instance {
            slot,
            capacity,
            ..Instance::default()
        }
    }

    /// Leading blocks of segment `key` cached; marks it used at `tick`.
    pub(crate) fn touch(&mut self, key: u64, tick: u64) -> usize {
        let Some(seg) = self.segments.get_mut(&key) else {
            return 0;
        };
        self.lru.remove(&(seg.last_used, key));
        seg.last_used = tick;
        self.lru.insert((tick, key));
        seg.blocks
    }

    /// Empties the cache, as an engine restart or vLLM's `/reset_prefix_cache`
    /// does; its agent publishes `AllBlocksCleared`, so the index forgets it all.
    pub(crate) fn clear(&mut self, index: Option<&CacheIndex>) -> Result<(), IndexError> {
        self.segments.clear();
        self.lru.clear();
        self.used_blocks = 0;
        index.map_or(Ok(()), |ix| ix.clear_worker(self.slot))
    }

    /// Whether any block of segment `key` is cached (without marking it used).
    pub(crate) fn holds(&self, key: u64) -> bool {
        self.segments.contains_key(&key)
    }

    /// Caches segment `key` of `blocks` blocks (only the missing end),
    /// trimming least recently used segments first; under `parent` (segment,
    /// length) only when all of it is cached. With an `index`, every change
    /// is mirrored into it.
    pub(crate) fn insert(
        &mut self,
        key: u64,
        hashes: &[BlockHash],
        blocks: usize,
        tick: u64,
        parent: Option<(u64, usize)>,
        index: Option<&CacheIndex>,
    ) -> Result<(), IndexError> {
        let have = self.touch(key, tick);
        if blocks == 0 || blocks > self.capacity || have >= blocks {
            return Ok(());
        }
        if let Some((p, len)) = parent {
            if self.segments.get(&p).is_none_or(|s| s.blocks < len) {
                return Ok(());
            }
        }
        let up = parent.map(|(p, _)| p);
        let need = blocks - have;
        while self.used_blocks + need > self.capacity {
            let Some(&(at, victim)) = self.lru.iter().find(|(_, k)| *k != key && Some(*k) != up)
            else {
                break;
            };
            let Some(seg) = self.segments.get(&victim) else {
                self.lru.remove(&(at, victim));
                continue;
            };
            // Its tails are leaves below its last block: they go first.
            let children: Vec<u64> = seg.children.iter().copied().collect();
            if !children.is_empty() {
                for c in children {
                    self.trim(c, usize::MAX, index)?;
                }
                continue;
            }
            let trim = self.used_blocks + need - self.capacity;
            self.trim(victim, trim, index)?;
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
                        parent: up,
                        children: HashSet::new(),
                    },
                );
                self.lru.insert((tick, key));
                if let Some(p) = up.and_then(|p| self.segments.get_mut(&p)) {
                    p.children.insert(key);
                }
            }
        }
        Ok(())
    }

    /// Trims up to `trim` blocks from the end of segment `key`.
    fn trim(
        &mut self,
        key: u64,
        trim: usize,
        index: Option<&CacheIndex>,
    ) -> Result<(), IndexError> {
        let Some(seg) = self.segments.get_mut(&key) else {
            return Ok(());
        };
        let trim = trim.min(seg.blocks);
        let keep = seg.blocks - trim;
        if let Some(index) = index {
            let gone = seg.hashes.get(keep..seg.blocks).unwrap_or(&[]);
            index.remove(self.slot, Some(Tier::Gpu), gone)?;
        }
        seg.blocks = keep;
        self.used_blocks -= trim;
        if keep == 0 {
            let (at, up) = (seg.last_used, seg.parent);
            self.segments.remove(&key);
            self.lru.remove(&(at, key));
            if let Some(p) = up.and_then(|p| self.segments.get_mut(&p)) {
                p.children.remove(&key);
            }
        }
        Ok(())
    }

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
        inst.insert(1, &hashes(100, 4), 4, 1, None, Some(&index))
            .unwrap();
        inst.insert(2, &hashes(200, 4), 4, 2, None, Some(&index))
            .unwrap();
        assert_eq!(index.block_count(slot), 8);
        assert_eq!(inst.touch(1, 3), 4);
        // Needs 2 more blocks: segment 2 (least recently used) loses its
        // last 2, keeps its first 2.
        inst.insert(3, &hashes(300, 4), 4, 4, None, Some(&index))
            .unwrap();
        assert_eq!(inst.used_blocks(), 10);
        assert_eq!(index.block_count(slot), 10);
        assert!(index.holders_of(BlockHash(203)).is_empty());
        assert_eq!(index.holders_of(BlockHash(201)).len(), 1);
        assert_eq!(inst.touch(2, 5), 2);
        // Its next request writes the missing end back, trimming segment 1
        // (now the least recently used).
        inst.insert(2, &hashes(200, 4), 4, 6, None, Some(&index))
            .unwrap();
        assert_eq!(inst.touch(2, 7), 4);
        assert_eq!(inst.touch(1, 8), 2);
        assert_eq!(index.block_count(slot), 10);
        assert_eq!(index.holders_of(BlockHash(203)).len(), 1);
        assert!(index.holders_of(BlockHash(102)).is_empty());
        // Too big for the cache: ignored.
        inst.insert(4, &hashes(400, 11), 11, 9, None, Some(&index))
            .unwrap();
        assert_eq!(inst.touch(4, 10), 0);
    }

    proptest::proptest! {
        /// Documents and their tails inserted in any order into a small
        /// cache: every tail cached hangs off its whole document, and the
        /// index holds exactly each segment's cached leading blocks.
        #[test]
        fn what_an_instance_holds_stays_prefix_closed(
            ops in proptest::collection::vec((0u64..6, proptest::bool::ANY, 1usize..6), 1..80),
        ) {
            const DOC: usize = 4;
            let index = CacheIndex::new();
            let slot = index.register_worker("w0").unwrap();
            let mut inst = Instance::new(slot, 14);
            let doc = |d: u64| hashes(1000 * d, DOC as u64);
            let tail = |d: u64, t: u64| hashes(1000 * d + 100 * t, 2);
            for (tick, (d, is_tail, t)) in ops.into_iter().enumerate() {
                let tick = tick as u64 + 1;
                if is_tail {
                    let key = 100 + 10 * d + t as u64;
                    inst.insert(key, &tail(d, t as u64), 2, tick, Some((d, DOC)), Some(&index)).unwrap();
                } else {
                    inst.insert(d, &doc(d), DOC, tick, None, Some(&index)).unwrap();
                }
                proptest::prop_assert!(inst.used_blocks() <= 14);
                let mut held = 0;
                for (key, seg) in &inst.segments {
                    if let Some(p) = seg.parent {
                        let up = inst.segments.get(&p).map(|s| s.blocks);
                        proptest::prop_assert_eq!(up, Some(DOC), "tail {} under a partial document", key);
                    }
                    for (i, h) in seg.hashes.iter().enumerate() {
                        let indexed = !index.holders_of(*h).is_empty();
                        proptest::prop_assert_eq!(indexed, i < seg.blocks);
                    }
                    held += seg.blocks;
                }
                proptest::prop_assert_eq!(held, inst.used_blocks());
                proptest::prop_assert_eq!(index.block_count(slot), held as u64);
            }
        }
    }

    #[test]
    fn without_an_index_only_block_counts_matter() {
        let mut inst = Instance::new(WorkerSlot::default(), 10);
        inst.insert(1, &[], 6, 1, None, None).unwrap();
        inst.insert(2, &[], 6, 2, None, None).unwrap();
        assert_eq!(inst.used_blocks(), 10);
        assert_eq!(inst.touch(1, 3), 4);
        assert_eq!(inst.touch(2, 4), 6);
        inst.insert(3, &[], 10, 5, None, None).unwrap();
        assert_eq!((inst.touch(1, 6), inst.touch(2, 7)), (0, 0));
    }
}

//! The warmest prefix chains of a pool: a bounded top-K ("space saving") keyed
//! by root hash, holding every chain hit more than `total / capacity` times.

use parking_lot::Mutex;
use std::collections::HashMap;
use warmpath_core::BlockHash;

/// Chains tracked per pool.
pub(crate) const DEFAULT_CAPACITY: usize = 256;
/// Longest chain kept per root, in blocks.
pub(crate) const MAX_DEPTH: usize = 4096;

#[derive(Debug, Default, Clone)]
struct Chain {
    hashes: Vec<BlockHash>,
    hits: u64,
    routed: HashMap<String, u64>,
    preview: Option<String>,
}

/// One tracked chain, as reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct HotChain {
    /// The longest chain seen under this root (block 0 first).
    pub hashes: Vec<BlockHash>,
    /// Requests routed with this root (may over-estimate, see module docs).
    pub hits: u64,
    /// Requests routed to each worker.
    pub routed: Vec<(String, u64)>,
    /// The prompt's first characters (`show_prompts` only).
    pub preview: Option<String>,
}

#[derive(Debug)]
pub(crate) struct HotChains {
    capacity: usize,
    table: Mutex<HashMap<u64, Chain>>,
}

impl Default for HotChains {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY)
    }
}

impl HotChains {
    /// A tracker of at most `capacity` chains (at least 1).
    pub(crate) fn new(capacity: usize) -> Self {
        HotChains {
            capacity: capacity.max(1),
            table: Mutex::new(HashMap::with_capacity(capacity.max(1))),
        }
    }

    /// Records a request with block chain `chain` routed to `worker`.
    pub(crate) fn record(&self, chain: &[BlockHash], worker: &str, preview: Option<&str>) {
        let Some(root) = chain.first() else { return };
        let chain = &chain[..chain.len().min(MAX_DEPTH)];
        let mut table = self.table.lock();
        if !table.contains_key(&root.0) && table.len() >= self.capacity {
            let victim = table
                .iter()
                .min_by_key(|(_, c)| c.hits)
                .map(|(k, c)| (*k, c.hits));
            if let Some((k, hits)) = victim {
                table.remove(&k);
                table.insert(
                    root.0,
                    Chain {
                        hits,
                        ..Chain::default()
                    },
                );
            }
        }
        let entry = table.entry(root.0).or_default();
        entry.hits += 1;
        if chain.len() > entry.hashes.len() {
            entry.hashes.clear();
            entry.hashes.extend_from_slice(chain);
            entry.preview = preview.map(str::to_owned);
        } else if entry.preview.is_none() {
            entry.preview = preview.map(str::to_owned);
        }
        match entry.routed.get_mut(worker) {
            Some(n) => *n += 1,
            None => {
                entry.routed.insert(worker.to_owned(), 1);
            }
        }
    }

    /// The `k` most hit chains, most hit first.
    pub(crate) fn top(&self, k: usize) -> Vec<HotChain> {
        let table = self.table.lock();
        let mut all: Vec<&Chain> = table.values().collect();
        all.sort_unstable_by(|a, b| b.hits.cmp(&a.hits).then(a.hashes.cmp(&b.hashes)));
        all.into_iter()
            .take(k)
            .map(|c| {
                let mut routed: Vec<(String, u64)> =
                    c.routed.iter().map(|(w, n)| (w.clone(), *n)).collect();
                routed.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                HotChain {
                    hashes: c.hashes.clone(),
                    hits: c.hits,
                    routed,
                    preview: c.preview.clone(),
                }
            })
            .collect()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn chain(root: u64, len: u64) -> Vec<BlockHash> {
        (0..len).map(|i| BlockHash(root * 1000 + i)).collect()
    }

    #[test]
    fn counts_hits_per_root_and_worker_and_keeps_the_longest_chain() {
        let h = HotChains::new(4);
        h.record(&chain(1, 2), "a", None);
        h.record(&chain(1, 5), "b", None);
        h.record(&chain(1, 3), "b", None);
        h.record(&chain(2, 1), "a", None);
        h.record(&[], "a", None);
        let top = h.top(10);
        assert_eq!(top.len(), 2);
        assert_eq!(top[0].hits, 3);
        assert_eq!(top[0].hashes, chain(1, 5));
        assert_eq!(
            top[0].routed,
            vec![("b".to_owned(), 2), ("a".to_owned(), 1)]
        );
        assert_eq!(top[1].hits, 1);
    }

    #[test]
    fn a_heavy_hitter_survives_a_flood_of_one_off_roots() {
        let h = HotChains::new(8);
        for i in 0..1000u64 {
            h.record(&chain(1, 1), "a", None);
            h.record(&chain(10 + i, 1), "b", None);
        }
        let top = h.top(1);
        assert_eq!(top[0].hashes, chain(1, 1));
        assert!(top[0].hits >= 1000);
        assert_eq!(h.top(100).len(), 8, "bounded");
    }
}

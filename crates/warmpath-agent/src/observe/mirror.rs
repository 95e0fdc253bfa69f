//! An LRU mirror of the engine's prefix cache, for engines that report nothing.
//!
//! The mirror is the project's one model of vLLM's prefix cache
//! ([`warmpath_core::prefix_cache::PrefixCache`], which the simulator and the
//! candle engine run too), keyed by warmpath block hashes. Touching a request's
//! block chain makes all of it recent; blocks not held yet become
//! [`Change::Stored`] segments (chain order, with their parent), and the least
//! recently used blocks pushed out to make room become one [`Change::Removed`].
//! As in vLLM only full blocks are cached (the caller hashes with
//! [`warmpath_core::hash_tokens`], which drops a partial tail), a chain
//! shrinks from its end (only a block no cached block extends is evicted), a
//! request never evicts its own blocks, and a request longer than the whole
//! cache keeps its first `capacity` blocks.
//!
//! Pure data structure: no I/O, no clock, no locks (one owner).

use crate::tracker::Change;
use warmpath_core::prefix_cache::{EngineBlockHash, PrefixCache};
use warmpath_core::BlockHash;
use warmpath_proto::v1::Tier;

/// The mirror. See the module docs.
#[derive(Debug)]
pub struct LruMirror {
    cache: PrefixCache<()>,
}

impl LruMirror {
    /// An empty mirror of `capacity` blocks (at least 1).
    pub fn new(capacity: usize) -> Self {
        // Block size 1: the chain's hashes are given, so it never hashes tokens.
        let cache = match PrefixCache::new(1, capacity.max(1)) {
            Ok(c) => c,
            Err(e) => unreachable!("a block size of 1 is valid: {e}"),
        };
        LruMirror { cache }
    }

    /// How many blocks it can hold.
    pub fn capacity(&self) -> usize {
        self.cache.capacity()
    }

    /// How many blocks it holds.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }

    /// Whether `h` is held (does not change recency).
    pub fn contains(&self, h: BlockHash) -> bool {
        self.cache.contains(EngineBlockHash(h.0))
    }

    /// Records that the engine just computed or reused `chain` (one request's
    /// full blocks, chain order). Returns the changes to publish: the evicted
    /// blocks first (one `Removed`), then the newly held blocks as one
    /// `Stored` segment after its parent.
    pub fn touch(&mut self, chain: &[BlockHash]) -> Vec<Change> {
        let keys: Vec<EngineBlockHash> = chain.iter().map(|h| EngineBlockHash(h.0)).collect();
        let out = self.cache.insert_chain(&keys, |_| ());
        let mut changes = Vec::new();
        if !out.removed.is_empty() {
            changes.push(Change::Removed {
                hashes: out.removed.iter().map(|h| BlockHash(h.0)).collect(),
                tier: Tier::Gpu,
            });
        }
        if let Some(first) = out.first_new {
            changes.push(Change::Stored {
                parent: first.checked_sub(1).map(|p| chain[p]),
                hashes: chain[first..out.cached_blocks].to_vec(),
                tier: Tier::Gpu,
            });
        }
        changes
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use warmpath_core::{hash_tokens, HashSeed};

    fn chain(tenant: &str, toks: &[u32]) -> Vec<BlockHash> {
        hash_tokens(HashSeed::new("m", "", tenant), 4, toks)
    }

    fn stored(c: &Change) -> (Option<BlockHash>, Vec<BlockHash>) {
        match c {
            Change::Stored { parent, hashes, .. } => (*parent, hashes.clone()),
            Change::Removed { .. } => panic!("expected Stored, got {c:?}"),
        }
    }

    fn removed(c: &Change) -> Vec<BlockHash> {
        match c {
            Change::Removed { hashes, .. } => hashes.clone(),
            Change::Stored { .. } => panic!("expected Removed, got {c:?}"),
        }
    }

    #[test]
    fn a_new_chain_is_one_stored_segment_without_parent() {
        let mut m = LruMirror::new(10);
        let c = chain("", &(0..12).collect::<Vec<_>>());
        let ch = m.touch(&c);
        assert_eq!(ch.len(), 1);
        assert_eq!(stored(&ch[0]), (None, c.clone()));
        assert_eq!(m.len(), 3);
        assert!(m.touch(&c).is_empty(), "a second touch stores nothing");
    }

    #[test]
    fn an_extension_is_stored_after_its_parent() {
        let mut m = LruMirror::new(10);
        let long = chain("", &(0..20).collect::<Vec<_>>());
        m.touch(&long[..2]);
        let ch = m.touch(&long);
        assert_eq!(ch.len(), 1);
        assert_eq!(stored(&ch[0]), (Some(long[1]), long[2..].to_vec()));
    }

    #[test]
    fn least_recently_used_goes_first_and_tails_before_heads() {
        let mut m = LruMirror::new(4);
        let a = chain("", &(0..8).collect::<Vec<_>>()); // 2 blocks
        let b = chain("", &(100..108).collect::<Vec<_>>()); // 2 blocks
        let c = chain("", &(200..204).collect::<Vec<_>>()); // 1 block
        m.touch(&a);
        m.touch(&b);
        m.touch(&a); // a is now more recent than b
        let ch = m.touch(&c);
        assert_eq!(removed(&ch[0]), vec![b[1]], "b's tail goes, b's head stays");
        assert_eq!(stored(&ch[1]), (None, c.clone()));
        assert!(m.contains(b[0]) && !m.contains(b[1]));
        assert!(a.iter().all(|h| m.contains(*h)));
        assert_eq!(m.len(), 4);
    }

    #[test]
    fn a_request_never_evicts_its_own_blocks() {
        let mut m = LruMirror::new(3);
        let a = chain("", &(0..12).collect::<Vec<_>>()); // 3 blocks, fills it
        m.touch(&a);
        let other = chain("", &(50..54).collect::<Vec<_>>());
        m.touch(&other); // evicts a[2]
        assert!(!m.contains(a[2]));
        // a[0] and a[1] are older than `other`, but a needs them: `other` goes.
        let ch = m.touch(&a);
        assert_eq!(removed(&ch[0]), vec![other[0]]);
        assert_eq!(stored(&ch[1]), (Some(a[1]), vec![a[2]]));
        assert!(a.iter().all(|h| m.contains(*h)));
    }

    #[test]
    fn a_head_outlives_its_tail_though_used_less_recently() {
        let mut m = LruMirror::new(3);
        let a = chain("", &(0..8).collect::<Vec<_>>()); // 2 blocks
        let d = chain("", &(50..54).collect::<Vec<_>>());
        m.touch(&a);
        m.touch(&d);
        // a[0] is the least recently used, but a[1] extends it: a[1] goes.
        let c = chain("", &(100..104).collect::<Vec<_>>());
        let ch = m.touch(&c);
        assert_eq!(removed(&ch[0]), vec![a[1]]);
        assert!(m.contains(a[0]) && m.contains(d[0]) && m.contains(c[0]));
    }

    #[test]
    fn a_chain_longer_than_the_cache_keeps_its_head() {
        let mut m = LruMirror::new(2);
        let a = chain("", &(0..16).collect::<Vec<_>>());
        let ch = m.touch(&a);
        assert_eq!(stored(&ch[0]), (None, a[..2].to_vec()));
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn tenants_do_not_share_blocks() {
        let mut m = LruMirror::new(10);
        let toks: Vec<u32> = (0..8).collect();
        let (x, y, none) = (
            chain("acme", &toks),
            chain("globex", &toks),
            chain("", &toks),
        );
        m.touch(&x);
        let ch = m.touch(&y);
        assert_eq!(
            stored(&ch[0]),
            (None, y.clone()),
            "same tokens, other tenant"
        );
        let ch = m.touch(&none);
        assert_eq!(stored(&ch[0]).1, none);
        assert_eq!(m.len(), 6);
    }

    #[test]
    fn empty_chains_and_zero_capacity_are_harmless() {
        let mut m = LruMirror::new(0);
        assert_eq!(m.capacity(), 1);
        assert!(m.touch(&[]).is_empty());
        assert!(m.is_empty());
    }
}

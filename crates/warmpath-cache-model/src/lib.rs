//! A block-level prefix cache with vLLM's semantics, generic over what a block
//! holds (`V`): the engine stores each layer's K and V there, the simulator `()`.
//! Keys are an *engine-local* chained hash ([`EngineBlockHash`]), deliberately
//! not warmpath's, so event consumers must map engine hashes as they must for
//! vLLM; the rest of the semantics is in docs/design-notes.md.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::fmt;
use thiserror::Error;
use xxhash_rust::xxh3::xxh3_64;

/// An engine-local block hash: `xxh3_64("engine/1", parent, tokens, salt)`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EngineBlockHash(pub u64);

impl fmt::Debug for EngineBlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EngineBlockHash({:016x})", self.0)
    }
}

/// Hashes one block chained on `parent` (`None` for block 0). The salt only
/// counts for block 0; later blocks inherit it through the chain.
pub fn engine_block_hash(
    parent: Option<EngineBlockHash>,
    tokens: &[u32],
    salt: Option<&str>,
) -> EngineBlockHash {
    let mut buf = Vec::with_capacity(8 + 9 + 4 + tokens.len() * 4 + 1 + salt.map_or(0, str::len));
    buf.extend_from_slice(b"engine/1");
    match parent {
        Some(p) => {
            buf.push(1);
            buf.extend_from_slice(&p.0.to_le_bytes());
        }
        None => buf.push(0),
    }
    let n = u32::try_from(tokens.len()).unwrap_or(u32::MAX);
    buf.extend_from_slice(&n.to_le_bytes());
    for t in tokens {
        buf.extend_from_slice(&t.to_le_bytes());
    }
    match (parent, salt) {
        (None, Some(s)) => {
            buf.push(1);
            buf.extend_from_slice(s.as_bytes());
        }
        _ => buf.push(0),
    }
    EngineBlockHash(xxh3_64(&buf))
}

/// A change to the cache's contents, in the terms of vLLM's KV events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheEvent {
    /// Consecutive newly cached blocks of one prompt.
    BlockStored {
        /// The new blocks' hashes, in prompt order.
        block_hashes: Vec<EngineBlockHash>,
        /// The block before the first new one; `None` when they start at block 0.
        parent_block_hash: Option<EngineBlockHash>,
        /// All the new blocks' tokens (`block_hashes.len() * block_size`).
        token_ids: Vec<u32>,
        block_size: usize,
        /// The request's salt, only when the first new block is block 0
        /// (it belongs in that block's `extra_keys`).
        cache_salt: Option<String>,
    },
    /// Blocks evicted from the cache.
    BlockRemoved { block_hashes: Vec<EngineBlockHash> },
    /// Everything was dropped (`clear`).
    AllBlocksCleared,
}

impl CacheEvent {
    /// vLLM's per-block `extra_keys` for a `BlockStored`: the salt as a
    /// one-element tuple on block 0, nothing on the others. `None` when no
    /// block carries extra keys (or for other events).
    pub fn extra_keys(&self) -> Option<Vec<Option<Vec<String>>>> {
        match self {
            CacheEvent::BlockStored {
                block_hashes,
                cache_salt: Some(salt),
                ..
            } => {
                let mut keys = vec![None; block_hashes.len()];
                if let Some(first) = keys.first_mut() {
                    *first = Some(vec![salt.clone()]);
                }
                Some(keys)
            }
            _ => None,
        }
    }
}

/// Why the cache refused an operation. None of these is worth retrying as is.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PrefixCacheError {
    #[error("prefix cache: block size must be at least 1 token")]
    ZeroBlockSize,
    /// `clear` while blocks are pinned by running requests (vLLM refuses too).
    #[error("prefix cache: cannot clear while {0} blocks are in use; retry when requests finish")]
    InUse(usize),
}

/// The result of [`PrefixCache::lookup`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrefixMatch {
    /// The hashes of every full block of the prompt.
    pub hashes: Vec<EngineBlockHash>,
    /// How many leading blocks are cached (and usable).
    pub cached_blocks: usize,
    /// `cached_blocks * block_size`; always <= prompt length - 1.
    pub cached_tokens: usize,
}

/// The result of [`PrefixCache::insert`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InsertOutcome {
    pub stored: usize,
    /// Full blocks of the prompt now cached (the rest did not fit).
    pub cached_blocks: usize,
    /// What changed, in order: at most one BlockRemoved, then at most one BlockStored.
    pub events: Vec<CacheEvent>,
}

/// The result of [`PrefixCache::insert_chain`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainOutcome {
    /// Blocks evicted to make room, in eviction order.
    pub removed: Vec<EngineBlockHash>,
    /// The chain position of the first newly cached block: every block from
    /// there up to `cached_blocks` is new (a cached block's parent is cached).
    pub first_new: Option<usize>,
    /// Leading blocks of the chain now cached (the rest did not fit).
    pub cached_blocks: usize,
}

/// Query/hit counters in tokens, as vLLM's `prefix_cache_queries/hits`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Prompt tokens looked up.
    pub queried_tokens: u64,
    /// Of those, tokens found cached.
    pub hit_tokens: u64,
}

#[derive(Clone, Debug)]
struct Entry<V> {
    parent: Option<EngineBlockHash>,
    children: u32,
    pins: u32,
    last_used: u64,
    value: V,
}

impl<V> Entry<V> {
    fn evictable(&self) -> bool {
        self.children == 0 && self.pins == 0
    }
}

/// The cache itself. Not thread-safe by design: the engine owns it from one
/// worker thread; wrap it in a lock to share it.
#[derive(Clone, Debug)]
pub struct PrefixCache<V> {
    block_size: usize,
    capacity: usize,
    entries: HashMap<EngineBlockHash, Entry<V>>,
    /// Unpinned leaves by (last use, hash): the eviction order.
    evictable: BTreeSet<(u64, EngineBlockHash)>,
    clock: u64,
    stats: CacheStats,
}

impl<V> PrefixCache<V> {
    /// An empty cache of `capacity` blocks of `block_size` tokens.
    pub fn new(block_size: usize, capacity: usize) -> Result<Self, PrefixCacheError> {
        if block_size == 0 {
            return Err(PrefixCacheError::ZeroBlockSize);
        }
        Ok(PrefixCache {
            block_size,
            capacity,
            entries: HashMap::new(),
            evictable: BTreeSet::new(),
            clock: 0,
            stats: CacheStats::default(),
        })
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Fraction of the capacity in use, 0.0..=1.0 (0 for a zero capacity).
    pub fn usage(&self) -> f64 {
        // A zero-capacity cache never holds a block: 0 / 1.
        self.entries.len() as f64 / self.capacity.max(1) as f64
    }

    /// Query/hit counters since creation.
    pub fn stats(&self) -> CacheStats {
        self.stats
    }

    pub fn contains(&self, hash: EngineBlockHash) -> bool {
        self.entries.contains_key(&hash)
    }

    pub fn get(&self, hash: EngineBlockHash) -> Option<&V> {
        self.entries.get(&hash).map(|e| &e.value)
    }

    /// A cached block's value, to change it (recency unchanged).
    pub fn get_mut(&mut self, hash: EngineBlockHash) -> Option<&mut V> {
        self.entries.get_mut(&hash).map(|e| &mut e.value)
    }

    /// A cached block's parent (`Some(None)` for a block 0).
    pub fn parent_of(&self, hash: EngineBlockHash) -> Option<Option<EngineBlockHash>> {
        self.entries.get(&hash).map(|e| e.parent)
    }

    /// Every cached block's hash, in no particular order.
    pub fn hashes(&self) -> impl Iterator<Item = EngineBlockHash> + '_ {
        self.entries.keys().copied()
    }

    /// The hashes of every full block of `tokens` under `salt`.
    pub fn block_hashes(&self, tokens: &[u32], salt: Option<&str>) -> Vec<EngineBlockHash> {
        let mut out = Vec::with_capacity(tokens.len() / self.block_size);
        let mut parent = None;
        for block in tokens.chunks_exact(self.block_size) {
            let h = engine_block_hash(parent, block, salt);
            out.push(h);
            parent = Some(h);
        }
        out
    }

    /// Finds the longest cached prefix of a prompt, marks it recently used and
    /// counts the query. The match is capped so that at least one prompt token
    /// is left to compute.
    pub fn lookup(&mut self, tokens: &[u32], salt: Option<&str>) -> PrefixMatch {
        let hashes = self.block_hashes(tokens, salt);
        let cap = tokens.len().saturating_sub(1) / self.block_size;
        let mut cached_blocks = 0;
        for &h in hashes.iter().take(cap) {
            if !self.entries.contains_key(&h) {
                break;
            }
            self.touch(h);
            cached_blocks += 1;
        }
        let cached_tokens = cached_blocks * self.block_size;
        self.stats.queried_tokens += tokens.len() as u64;
        self.stats.hit_tokens += cached_tokens as u64;
        PrefixMatch {
            hashes,
            cached_blocks,
            cached_tokens,
        }
    }

    /// Caches every full block of a computed prompt: blocks already cached are
    /// marked recently used, missing ones get `make(block_index)`. Evicts
    /// least recently used leaves to make room, never a block of this prompt;
    /// stops early when nothing can be evicted.
    pub fn insert(
        &mut self,
        tokens: &[u32],
        salt: Option<&str>,
        mut make: impl FnMut(usize) -> V,
    ) -> InsertOutcome {
        let Ok(out) = self.try_insert(tokens, salt, |i| Ok::<V, Infallible>(make(i)));
        out
    }

    /// [`Self::insert`] with a fallible `make`. Every value that may be needed
    /// is made before anything changes, so an error leaves the cache (and the
    /// event stream) untouched.
    pub fn try_insert<E>(
        &mut self,
        tokens: &[u32],
        salt: Option<&str>,
        make: impl FnMut(usize) -> Result<V, E>,
    ) -> Result<InsertOutcome, E> {
        let hashes = self.block_hashes(tokens, salt);
        let chain = self.try_insert_chain(&hashes, make)?;
        let cached_blocks = chain.cached_blocks;
        let mut events = Vec::new();
        if !chain.removed.is_empty() {
            events.push(CacheEvent::BlockRemoved {
                block_hashes: chain.removed,
            });
        }
        let stored = chain.first_new.map_or(0, |f| cached_blocks - f);
        if let Some(f) = chain.first_new {
            events.push(CacheEvent::BlockStored {
                block_hashes: hashes[f..cached_blocks].to_vec(),
                parent_block_hash: f.checked_sub(1).map(|p| hashes[p]),
                token_ids: tokens[f * self.block_size..cached_blocks * self.block_size].to_vec(),
                block_size: self.block_size,
                cache_salt: if f == 0 {
                    salt.map(str::to_owned)
                } else {
                    None
                },
            });
        }
        Ok(InsertOutcome {
            stored,
            cached_blocks,
            events,
        })
    }

    /// Caches a chain of block hashes given as they are (each the child of
    /// the one before), as [`Self::insert`] caches a prompt's: for a model of
    /// a cache whose keys are computed elsewhere (the agent's mirror of an
    /// engine that reports nothing).
    pub fn insert_chain(
        &mut self,
        hashes: &[EngineBlockHash],
        mut make: impl FnMut(usize) -> V,
    ) -> ChainOutcome {
        let Ok(out) = self.try_insert_chain(hashes, |i| Ok::<V, Infallible>(make(i)));
        out
    }

    fn try_insert_chain<E>(
        &mut self,
        hashes: &[EngineBlockHash],
        mut make: impl FnMut(usize) -> Result<V, E>,
    ) -> Result<ChainOutcome, E> {
        // This chain's blocks stay pinned while it is inserted, so at most
        // `capacity` of them can ever be cached.
        let reachable = hashes.len().min(self.capacity);
        let mut values = Vec::with_capacity(reachable);
        for (i, h) in hashes.iter().take(reachable).enumerate() {
            values.push(if self.entries.contains_key(h) {
                None
            } else {
                Some(make(i)?)
            });
        }
        let mut removed = Vec::new();
        let mut first_new: Option<usize> = None;
        let mut parent = None;
        let mut cached_blocks = 0;
        for (i, (&h, value)) in hashes.iter().zip(values).enumerate() {
            match value {
                Some(v) if !self.entries.contains_key(&h) => {
                    if self.entries.len() >= self.capacity {
                        match self.evict_one() {
                            Some(gone) => removed.push(gone),
                            None => break,
                        }
                    }
                    self.add(h, parent, v);
                    first_new.get_or_insert(i);
                }
                _ => self.touch(h),
            }
            self.pin(h);
            parent = Some(h);
            cached_blocks += 1;
        }
        for &h in &hashes[..cached_blocks] {
            self.unpin(h);
        }
        Ok(ChainOutcome {
            removed,
            first_new,
            cached_blocks,
        })
    }

    /// Protects a block from eviction (e.g. while a running request uses it).
    /// Returns false if it is not cached. Pins nest; undo each with [`Self::unpin`].
    pub fn pin(&mut self, hash: EngineBlockHash) -> bool {
        self.update(hash, |e| e.pins += 1)
    }

    /// Undoes one [`Self::pin`]. Returns false if the block is not cached or not pinned.
    pub fn unpin(&mut self, hash: EngineBlockHash) -> bool {
        let pinned = self.entries.get(&hash).is_some_and(|e| e.pins > 0);
        pinned && self.update(hash, |e| e.pins -= 1)
    }

    /// Drops every block (vLLM's reset_prefix_cache). Refused while any block
    /// is pinned.
    pub fn clear(&mut self) -> Result<Vec<CacheEvent>, PrefixCacheError> {
        let in_use = self.entries.values().filter(|e| e.pins > 0).count();
        if in_use > 0 {
            return Err(PrefixCacheError::InUse(in_use));
        }
        self.entries.clear();
        self.evictable.clear();
        Ok(vec![CacheEvent::AllBlocksCleared])
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn touch(&mut self, hash: EngineBlockHash) {
        let now = self.tick();
        self.update(hash, |e| e.last_used = now);
    }

    /// Applies `f` to an entry while keeping the eviction set in step.
    fn update(&mut self, hash: EngineBlockHash, f: impl FnOnce(&mut Entry<V>)) -> bool {
        let Some(e) = self.entries.get_mut(&hash) else {
            return false;
        };
        if e.evictable() {
            self.evictable.remove(&(e.last_used, hash));
        }
        f(e);
        if e.evictable() {
            self.evictable.insert((e.last_used, hash));
        }
        true
    }

    fn add(&mut self, hash: EngineBlockHash, parent: Option<EngineBlockHash>, value: V) {
        if let Some(p) = parent {
            self.update(p, |e| e.children += 1);
        }
        let now = self.tick();
        self.entries.insert(
            hash,
            Entry {
                parent,
                children: 0,
                pins: 0,
                last_used: now,
                value,
            },
        );
        self.evictable.insert((now, hash));
    }

    fn evict_one(&mut self) -> Option<EngineBlockHash> {
        let (_, victim) = self.evictable.pop_first()?;
        let entry = self.entries.remove(&victim)?;
        if let Some(p) = entry.parent {
            self.update(p, |e| e.children = e.children.saturating_sub(1));
        }
        Some(victim)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn toks(n: usize, base: u32) -> Vec<u32> {
        (0..n as u32).map(|i| base + i).collect()
    }

    #[test]
    fn hash_depends_on_parent_tokens_and_block0_salt() {
        let t = [1, 2, 3, 4];
        let a = engine_block_hash(None, &t, None);
        assert_eq!(a, engine_block_hash(None, &t, None));
        assert_ne!(a, engine_block_hash(None, &t, Some("x")));
        assert_ne!(a, engine_block_hash(None, &[1, 2, 3, 5], None));
        assert_ne!(a, engine_block_hash(Some(a), &t, None));
        // The salt only matters for block 0.
        assert_eq!(
            engine_block_hash(Some(a), &t, Some("x")),
            engine_block_hash(Some(a), &t, None)
        );
        // Not the warmpath hash of the same tokens.
        let seed = warmpath_hash::HashSeed::new("m", "", "");
        assert_ne!(a.0, warmpath_hash::hash_block(seed.0, &t).0);
    }

    #[test]
    fn zero_block_size_is_an_error() {
        assert_eq!(
            PrefixCache::<()>::new(0, 4).unwrap_err(),
            PrefixCacheError::ZeroBlockSize
        );
    }

    #[test]
    fn full_hit_recomputes_the_last_block() {
        let mut c = PrefixCache::new(4, 16).unwrap();
        let p = toks(8, 0);
        assert_eq!(c.lookup(&p, None).cached_blocks, 0);
        assert_eq!(c.insert(&p, None, |_| ()).stored, 2);
        let m = c.lookup(&p, None);
        assert_eq!((m.cached_blocks, m.cached_tokens), (1, 4));
        let longer = toks(9, 0);
        assert_eq!(c.lookup(&longer, None).cached_tokens, 8);
        assert_eq!(c.lookup(&[], None).cached_blocks, 0);
        let s = c.stats();
        assert_eq!((s.queried_tokens, s.hit_tokens), (8 + 8 + 9, 4 + 8));
    }

    #[test]
    fn salts_never_share_blocks() {
        let mut c = PrefixCache::new(4, 16).unwrap();
        let p = toks(13, 100);
        c.insert(&p, Some("a"), |_| ());
        assert_eq!(c.lookup(&p, Some("b")).cached_blocks, 0);
        assert_eq!(c.lookup(&p, None).cached_blocks, 0);
        assert_eq!(c.lookup(&p, Some("a")).cached_blocks, 3);
    }

    #[test]
    fn events_describe_new_blocks_with_parent_and_salt() {
        let mut c = PrefixCache::new(2, 16).unwrap();
        let out = c.insert(&[1, 2, 3], Some("s"), |i| i);
        let h = c.block_hashes(&[1, 2, 3, 4, 5, 6], Some("s"));
        assert_eq!(
            out.events,
            vec![CacheEvent::BlockStored {
                block_hashes: vec![h[0]],
                parent_block_hash: None,
                token_ids: vec![1, 2],
                block_size: 2,
                cache_salt: Some("s".into()),
            }]
        );
        assert_eq!(
            out.events[0].extra_keys(),
            Some(vec![Some(vec!["s".to_string()])])
        );
        let out = c.insert(&[1, 2, 3, 4, 5, 6], Some("s"), |i| i);
        assert_eq!(out.stored, 2);
        assert_eq!(
            out.events,
            vec![CacheEvent::BlockStored {
                block_hashes: vec![h[1], h[2]],
                parent_block_hash: Some(h[0]),
                token_ids: vec![3, 4, 5, 6],
                block_size: 2,
                cache_salt: None,
            }]
        );
        assert_eq!(out.events[0].extra_keys(), None);
        assert_eq!(c.get(h[2]), Some(&2));
        // Nothing new: no events.
        assert!(c.insert(&[1, 2, 3, 4], Some("s"), |i| i).events.is_empty());
    }

    #[test]
    fn evicts_least_recently_used_leaves_first() {
        let mut c = PrefixCache::new(2, 4).unwrap();
        let a = [1, 1, 2, 2];
        let b = [3, 3, 4, 4];
        let ha = c.block_hashes(&a, None);
        let hb = c.block_hashes(&b, None);
        c.insert(&a, None, |_| ());
        c.insert(&b, None, |_| ());
        c.lookup(&[1, 1, 2, 2, 9], None); // a is now more recent than b
        let out = c.insert(&[5, 5], None, |_| ());
        // b's leaf goes first, never b's root before its child.
        assert_eq!(
            out.events[0],
            CacheEvent::BlockRemoved {
                block_hashes: vec![hb[1]]
            }
        );
        let out = c.insert(&[6, 6], None, |_| ());
        assert_eq!(
            out.events[0],
            CacheEvent::BlockRemoved {
                block_hashes: vec![hb[0]]
            }
        );
        assert!(c.contains(ha[0]) && c.contains(ha[1]));
    }

    #[test]
    fn insert_never_evicts_its_own_chain_and_stops_when_full() {
        let mut c = PrefixCache::new(1, 3).unwrap();
        let out = c.insert(&[1, 2, 3, 4, 5], None, |_| ());
        assert_eq!((out.stored, out.cached_blocks), (3, 3));
        assert_eq!(c.len(), 3);
        // A pinned chain leaves no room for anyone else.
        let h = c.block_hashes(&[1, 2, 3], None);
        for &x in &h {
            assert!(c.pin(x));
        }
        let out = c.insert(&[9], None, |_| ());
        assert_eq!((out.stored, out.cached_blocks), (0, 0));
        assert!(out.events.is_empty());
        assert_eq!(c.clear(), Err(PrefixCacheError::InUse(3)));
        for &x in &h {
            assert!(c.unpin(x));
        }
        assert!(!c.unpin(h[0]));
        assert_eq!(c.clear(), Ok(vec![CacheEvent::AllBlocksCleared]));
        assert!(c.is_empty());
    }

    #[test]
    fn failed_try_insert_changes_nothing() {
        let mut c = PrefixCache::new(2, 8).unwrap();
        c.insert(&[1, 2], None, |_| 0);
        let r = c.try_insert(&[1, 2, 3, 4, 5, 6], None, |i| {
            if i == 2 {
                Err("boom")
            } else {
                Ok(i)
            }
        });
        assert_eq!(r, Err("boom"));
        assert_eq!(c.len(), 1);
        // Values are made only for missing blocks.
        let mut made = Vec::new();
        c.try_insert(&[1, 2, 3, 4], None, |i| {
            made.push(i);
            Ok::<_, ()>(i)
        })
        .unwrap();
        assert_eq!(made, vec![1]);
    }

    #[test]
    fn zero_capacity_caches_nothing() {
        let mut c = PrefixCache::new(2, 0).unwrap();
        let out = c.insert(&[1, 2, 3, 4], None, |_| ());
        assert_eq!(out.stored, 0);
        assert!(out.events.is_empty());
        assert_eq!(c.usage(), 0.0);
    }
}

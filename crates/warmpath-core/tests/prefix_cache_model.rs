//! Model-based test of `warmpath_core::prefix_cache` against a naive reference,
//! and a check that the events it emits mirror its contents exactly.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;
use std::collections::HashMap;
use warmpath_core::prefix_cache::{engine_block_hash, CacheEvent, EngineBlockHash, PrefixCache};

/// A naive reference: linear scans, recomputed children, same LRU rule.
struct Naive {
    bs: usize,
    cap: usize,
    clock: u64,
    blocks: Vec<(EngineBlockHash, Option<EngineBlockHash>, u64)>,
}

impl Naive {
    fn hashes(&self, t: &[u32], salt: Option<&str>) -> Vec<EngineBlockHash> {
        let mut p = None;
        t.chunks_exact(self.bs)
            .map(|b| {
                let h = engine_block_hash(p, b, salt);
                p = Some(h);
                h
            })
            .collect()
    }

    fn pos(&self, h: EngineBlockHash) -> Option<usize> {
        self.blocks.iter().position(|b| b.0 == h)
    }

    fn touch(&mut self, i: usize) {
        self.clock += 1;
        self.blocks[i].2 = self.clock;
    }

    fn lookup(&mut self, t: &[u32], salt: Option<&str>) -> usize {
        let cap = t.len().saturating_sub(1) / self.bs;
        let mut n = 0;
        for h in self.hashes(t, salt).into_iter().take(cap) {
            match self.pos(h) {
                Some(i) => self.touch(i),
                None => break,
            }
            n += 1;
        }
        n
    }

    fn insert(&mut self, t: &[u32], salt: Option<&str>) -> usize {
        let hs = self.hashes(t, salt);
        for (k, &h) in hs.iter().enumerate() {
            if let Some(i) = self.pos(h) {
                self.touch(i);
                continue;
            }
            if self.blocks.len() >= self.cap {
                let victim = self
                    .blocks
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| !hs[..k].contains(&b.0))
                    .filter(|(_, b)| !self.blocks.iter().any(|c| c.1 == Some(b.0)))
                    .min_by_key(|(_, b)| b.2)
                    .map(|(i, _)| i);
                match victim {
                    Some(i) => {
                        self.blocks.remove(i);
                    }
                    None => return k,
                }
            }
            self.clock += 1;
            let parent = k.checked_sub(1).map(|p| hs[p]);
            self.blocks.push((h, parent, self.clock));
        }
        hs.len()
    }
}

#[derive(Clone, Debug)]
enum Op {
    Lookup(Vec<u32>, Option<&'static str>),
    Insert(Vec<u32>, Option<&'static str>),
    Clear,
}

fn prompt() -> impl Strategy<Value = (Vec<u32>, Option<&'static str>)> {
    (
        0u32..3,
        0usize..40,
        0usize..40,
        prop::sample::select(vec![None, Some("a"), Some("b")]),
    )
        .prop_map(|(base, len, diverge, salt)| {
            let t = (0..len as u32)
                .map(|i| {
                    if (i as usize) < diverge {
                        base * 100 + i
                    } else {
                        7
                    }
                })
                .collect();
            (t, salt)
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prompt().prop_map(|(t, s)| Op::Lookup(t, s)),
        4 => prompt().prop_map(|(t, s)| Op::Insert(t, s)),
        1 => Just(Op::Clear),
    ]
}

/// Applies events to what a consumer believes is cached (hash -> parent),
/// re-deriving every stored hash from the reported tokens and salt.
fn apply(
    mirror: &mut HashMap<EngineBlockHash, Option<EngineBlockHash>>,
    bs: usize,
    events: Vec<CacheEvent>,
) -> Result<(), TestCaseError> {
    for e in events {
        match e {
            CacheEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                cache_salt,
            } => {
                prop_assert_eq!(block_size, bs);
                prop_assert_eq!(token_ids.len(), block_hashes.len() * bs);
                let mut p = parent_block_hash;
                if let Some(p) = p {
                    prop_assert!(mirror.contains_key(&p));
                }
                for (h, b) in block_hashes.iter().zip(token_ids.chunks_exact(bs)) {
                    let salt = if p.is_none() {
                        cache_salt.as_deref()
                    } else {
                        None
                    };
                    prop_assert_eq!(*h, engine_block_hash(p, b, salt));
                    prop_assert!(mirror.insert(*h, p).is_none());
                    p = Some(*h);
                }
            }
            CacheEvent::BlockRemoved { block_hashes } => {
                for h in block_hashes {
                    prop_assert!(mirror.remove(&h).is_some());
                }
            }
            CacheEvent::AllBlocksCleared => mirror.clear(),
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn matches_naive_model_and_events_mirror_contents(
        bs in 1usize..5,
        cap in 0usize..14,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        let mut c = PrefixCache::new(bs, cap).unwrap();
        let mut n = Naive { bs, cap, clock: 0, blocks: Vec::new() };
        let mut mirror = HashMap::new();
        for op in ops {
            let events = match op {
                Op::Lookup(t, s) => {
                    let m = c.lookup(&t, s);
                    prop_assert_eq!(m.cached_blocks, n.lookup(&t, s));
                    prop_assert!(m.cached_tokens < t.len().max(1));
                    Vec::new()
                }
                Op::Insert(t, s) => {
                    let out = c.insert(&t, s, |_| ());
                    prop_assert_eq!(out.cached_blocks, n.insert(&t, s));
                    out.events
                }
                Op::Clear => {
                    n.blocks.clear();
                    c.clear().unwrap()
                }
            };
            apply(&mut mirror, bs, events)?;
            prop_assert!(c.len() <= cap);
            let mut got: Vec<_> = c.hashes().collect();
            let mut want: Vec<_> = mirror.keys().copied().collect();
            let mut naive: Vec<_> = n.blocks.iter().map(|b| b.0).collect();
            got.sort();
            want.sort();
            naive.sort();
            prop_assert_eq!(&got, &want);
            prop_assert_eq!(&got, &naive);
            // Whole prefixes only.
            for h in got {
                if let Some(Some(p)) = c.parent_of(h) {
                    prop_assert!(c.contains(p));
                }
            }
        }
    }
}

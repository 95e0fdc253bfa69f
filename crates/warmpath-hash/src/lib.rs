//! The shared block hash (docs/cache-index.md, "The block hash"): the single
//! definition used by the router (hashing requests), the agent (re-hashing what
//! an engine reports) and the engines; and tenant ids ([`tenant`]), which seed it.

pub mod tenant;

use serde::{Deserialize, Serialize};
use std::fmt;
use std::hash::Hasher;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// The hash of one block, chained over every block before it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BlockHash(pub u64);

impl BlockHash {
    /// 16-digit lowercase hex, the form every user-facing surface prints.
    pub fn to_hex(self) -> String {
        format!("{:016x}", self.0)
    }

    /// Parses the 16-digit hex form (case-insensitive).
    pub fn from_hex(s: &str) -> Option<Self> {
        if s.len() != 16 {
            return None;
        }
        u64::from_str_radix(s, 16).ok().map(BlockHash)
    }
}

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash({:016x})", self.0)
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// What seeds a chain: the model, the LoRA adapter (if any) and the tenant (if any).
/// Two requests share cache entries only when all three are equal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HashSeed(pub u64);

impl HashSeed {
    /// `xxh3_64(b"warmpath/1" 0x00 model 0x00 lora 0x00 tenant)`; pass `""` for no
    /// LoRA adapter or no tenant.
    pub fn new(model: &str, lora: &str, tenant: &str) -> Self {
        let mut buf =
            Vec::with_capacity(b"warmpath/1".len() + 3 + model.len() + lora.len() + tenant.len());
        buf.extend_from_slice(b"warmpath/1");
        buf.push(0);
        buf.extend_from_slice(model.as_bytes());
        buf.push(0);
        buf.extend_from_slice(lora.as_bytes());
        buf.push(0);
        buf.extend_from_slice(tenant.as_bytes());
        HashSeed(xxh3_64(&buf))
    }
}

/// Hashes one full block chained onto `prev` (the seed's value for block 0, the
/// previous block's hash otherwise). This is the one block-hash function.
#[inline]
pub fn hash_block(prev: u64, tokens: &[u32]) -> BlockHash {
    // Blocks are small (16 tokens by default): a stack buffer avoids
    // allocating, and one sized for the default block avoids clearing 256
    // bytes per block for 64.
    fn on_stack<const N: usize>(prev: u64, tokens: &[u32]) -> BlockHash {
        let mut buf = [0u8; N];
        for (chunk, t) in buf.chunks_exact_mut(4).zip(tokens) {
            chunk.copy_from_slice(&t.to_le_bytes());
        }
        BlockHash(xxh3_64_with_seed(&buf[..tokens.len() * 4], prev))
    }
    match tokens.len() {
        0..=16 => on_stack::<64>(prev, tokens),
        17..=64 => on_stack::<256>(prev, tokens),
        _ => {
            let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
            BlockHash(xxh3_64_with_seed(&bytes, prev))
        }
    }
}

/// An incremental hasher for one chain, fed full blocks.
#[derive(Clone, Copy, Debug)]
pub struct ChainHasher {
    prev: u64,
    block_size: usize,
}

impl ChainHasher {
    /// A chain that starts at block 0 under `seed`.
    pub fn new(seed: HashSeed, block_size: usize) -> Self {
        ChainHasher {
            prev: seed.0,
            block_size,
        }
    }

    /// Hashes every full block of `tokens` (a trailing partial block is ignored)
    /// and appends them to `out`.
    pub fn extend(&mut self, tokens: &[u32], out: &mut Vec<BlockHash>) {
        if self.block_size == 0 {
            return;
        }
        out.reserve(tokens.len() / self.block_size);
        for block in tokens.chunks_exact(self.block_size) {
            let h = hash_block(self.prev, block);
            self.prev = h.0;
            out.push(h);
        }
    }
}

/// The hashes of every full block of `tokens` under `seed`.
pub fn hash_tokens(seed: HashSeed, block_size: usize, tokens: &[u32]) -> Vec<BlockHash> {
    let mut out = Vec::new();
    ChainHasher::new(seed, block_size).extend(tokens, &mut out);
    out
}

/// A `Hasher` that passes a `u64` key through: block hashes are xxh3 outputs.
#[derive(Default, Clone, Copy, Debug)]
pub struct IdentityHasher(u64);

impl Hasher for IdentityHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        // Only used for non-u64 keys (never here); fold bytes in anyway.
        for b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn hex(hs: &[BlockHash]) -> Vec<String> {
        hs.iter().map(|h| h.to_hex()).collect()
    }

    fn tokens_0_31() -> Vec<u32> {
        (0..32).collect()
    }

    #[test]
    fn golden_plain() {
        let hs = hash_tokens(HashSeed::new("m", "", ""), 16, &tokens_0_31());
        assert_eq!(hex(&hs), ["d3034b7f684156db", "ab6763183c4579bf"]);
    }

    #[test]
    fn golden_tenant() {
        let hs = hash_tokens(HashSeed::new("m", "", "acme"), 16, &tokens_0_31());
        assert_eq!(hex(&hs), ["846f32e51cf9b9c8", "ca65ce98c2b0770a"]);
    }

    #[test]
    fn golden_lora() {
        let hs = hash_tokens(HashSeed::new("m", "sql-adapter", ""), 16, &tokens_0_31());
        assert_eq!(hex(&hs), ["50e81dc032d5d4fc", "3f6abe1708ac1b88"]);
    }

    #[test]
    fn trailing_partial_block_is_not_hashed() {
        let mut toks = tokens_0_31();
        toks.extend(32..47); // 15 more tokens: one short of a third block
        let hs = hash_tokens(HashSeed::new("m", "", ""), 16, &toks);
        assert_eq!(hex(&hs), ["d3034b7f684156db", "ab6763183c4579bf"]);
    }

    #[test]
    fn long_blocks_use_the_heap_path_consistently() {
        let toks: Vec<u32> = (0..300).collect();
        let a = hash_tokens(HashSeed::new("m", "", ""), 100, &toks);
        let bytes: Vec<u8> = toks[..100].iter().flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(
            a[0].0,
            xxh3_64_with_seed(&bytes, HashSeed::new("m", "", "").0)
        );
    }

    #[test]
    fn hex_round_trip() {
        let h = BlockHash(0x00ab_cdef_0123_4567);
        assert_eq!(h.to_hex(), "00abcdef01234567");
        assert_eq!(BlockHash::from_hex("00ABCDEF01234567"), Some(h));
        assert_eq!(BlockHash::from_hex("abc"), None);
    }

    proptest! {
        /// The hashes of a prefix are a prefix of the hashes.
        #[test]
        fn prefix_property(toks in proptest::collection::vec(any::<u32>(), 0..200), cut in 0usize..200, bs in 1usize..20) {
            let seed = HashSeed::new("m", "", "");
            let cut = cut.min(toks.len());
            let whole = hash_tokens(seed, bs, &toks);
            let part = hash_tokens(seed, bs, &toks[..cut]);
            prop_assert_eq!(&whole[..part.len()], &part[..]);
            prop_assert_eq!(part.len(), cut / bs);
        }

        /// Incremental hashing equals one-shot hashing, however the input is split.
        #[test]
        fn incremental_equals_oneshot(toks in proptest::collection::vec(any::<u32>(), 0..128), split in 0usize..8) {
            let seed = HashSeed::new("m", "lora", "t");
            let bs = 8;
            let whole = hash_tokens(seed, bs, &toks);
            let split = (split * bs).min(toks.len() / bs * bs);
            let mut c = ChainHasher::new(seed, bs);
            let mut out = Vec::new();
            c.extend(&toks[..split], &mut out);
            c.extend(&toks[split..], &mut out);
            prop_assert_eq!(whole, out);
        }

        /// Every block size hashes the tokens' little-endian bytes with the
        /// previous hash as the seed (the stack buffers change nothing).
        #[test]
        fn any_block_size_hashes_the_le_bytes(toks in proptest::collection::vec(any::<u32>(), 0..100), prev in any::<u64>()) {
            let bytes: Vec<u8> = toks.iter().flat_map(|t| t.to_le_bytes()).collect();
            prop_assert_eq!(hash_block(prev, &toks).0, xxh3_64_with_seed(&bytes, prev));
        }

        /// Different tenants never share a block hash for the same tokens.
        #[test]
        fn tenants_are_isolated(toks in proptest::collection::vec(any::<u32>(), 16..64)) {
            let a = hash_tokens(HashSeed::new("m", "", "a"), 16, &toks);
            let b = hash_tokens(HashSeed::new("m", "", "b"), 16, &toks);
            for (x, y) in a.iter().zip(&b) {
                prop_assert_ne!(x, y);
            }
        }
    }
}

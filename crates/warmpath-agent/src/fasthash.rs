//! A fast, per-map seeded hasher for the agent's block maps: their keys are
//! already hashes, so a multiply-rotate mix (as in FxHash) spreads them; the
//! random per-map seed keeps an engine's crafted hashes from aiming at one
//! bucket chain.

use std::hash::{BuildHasher, Hasher};

const K: u64 = 0xf135_7aea_2e62_a9c5;

/// Builds [`FastHasher`]s seeded randomly per map.
#[derive(Clone, Debug)]
pub struct FastState(u64);

impl Default for FastState {
    fn default() -> Self {
        FastState(rand::random())
    }
}

impl BuildHasher for FastState {
    type Hasher = FastHasher;
    fn build_hasher(&self) -> FastHasher {
        FastHasher(self.0)
    }
}

/// The hasher: `state = (state.rotl(26) ^ word) * K` per word, folded on
/// finish.
#[derive(Clone, Debug)]
pub struct FastHasher(u64);

impl FastHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(26) ^ w).wrapping_mul(K);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn finish(&self) -> u64 {
        // Fold the well-mixed high bits into the low ones hashbrown uses.
        self.0 ^ (self.0 >> 29)
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }
    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
}

/// A `HashMap` with [`FastState`].
pub type FastMap<K, V> = std::collections::HashMap<K, V, FastState>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn sequential_keys_spread_over_low_bits() {
        let s = FastState::default();
        let buckets: HashSet<u64> = (0u64..4096).map(|k| s.hash_one(k) & 4095).collect();
        assert!(
            buckets.len() > 2000,
            "{} of 4096 buckets used",
            buckets.len()
        );
    }

    #[test]
    fn byte_keys_differ_by_length_and_content() {
        let s = FastState::default();
        assert_ne!(s.hash_one(b"ab".as_slice()), s.hash_one(b"ab\0".as_slice()));
        assert_ne!(s.hash_one(vec![1u8; 32]), s.hash_one(vec![2u8; 32]));
        assert_eq!(s.hash_one((7u64, 1i32)), s.hash_one((7u64, 1i32)));
    }

    #[test]
    fn maps_are_seeded_apart() {
        let (a, b) = (FastState::default(), FastState::default());
        assert_ne!(a.hash_one(42u64), b.hash_one(42u64));
    }
}

//! A deterministic word generator: the text of every workload, drawn with
//! the caller's seeded RNG from a fixed vocabulary built from a fixed seed,
//! so a workload is byte-for-byte reproducible.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Tokens per word with the tiny tokenizer (`sim`'s `tokens_per_word_is_calibrated`).
pub const TOKENS_PER_WORD: f64 = 4.75;

const ONSETS: [&str; 20] = [
    "b", "c", "d", "f", "g", "h", "l", "m", "n", "p", "r", "s", "t", "v", "w", "br", "st", "tr",
    "pl", "gr",
];
const VOWELS: [&str; 8] = ["a", "e", "i", "o", "u", "ea", "ou", "ai"];
const CODAS: [&str; 10] = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st"];

/// A fixed vocabulary and sampling from it.
#[derive(Debug, Clone)]
pub struct WordGen {
    vocab: Vec<String>,
}

/// Distinct words of the vocabulary.
const VOCABULARY: usize = 2048;

impl Default for WordGen {
    /// The vocabulary, always the same.
    fn default() -> Self {
        let mut rng = SmallRng::seed_from_u64(0x005e_ed0f_706b_656e);
        let mut vocab = Vec::with_capacity(VOCABULARY);
        let mut seen = std::collections::HashSet::with_capacity(VOCABULARY);
        while vocab.len() < VOCABULARY {
            let syllables = rng.random_range(1..=3);
            let mut w = String::new();
            for _ in 0..syllables {
                w.push_str(ONSETS[rng.random_range(0..ONSETS.len())]);
                w.push_str(VOWELS[rng.random_range(0..VOWELS.len())]);
                w.push_str(CODAS[rng.random_range(0..CODAS.len())]);
            }
            if seen.insert(w.clone()) {
                vocab.push(w);
            }
        }
        WordGen { vocab }
    }
}

impl WordGen {
    pub fn word<R: Rng + ?Sized>(&self, rng: &mut R) -> &str {
        &self.vocab[rng.random_range(0..self.vocab.len())]
    }

    /// `words` words as sentences (capitalised, ending in a period every
    /// 8–16 words).
    pub fn text<R: Rng + ?Sized>(&self, rng: &mut R, words: usize) -> String {
        let mut out = String::with_capacity(words * 7);
        let mut left_in_sentence = 0usize;
        for i in 0..words {
            if left_in_sentence == 0 {
                left_in_sentence = rng.random_range(8..=16);
                if i > 0 {
                    out.push_str(". ");
                }
                let w = self.word(rng);
                let mut chars = w.chars();
                if let Some(c) = chars.next() {
                    out.extend(c.to_uppercase());
                    out.push_str(chars.as_str());
                }
            } else {
                out.push(' ');
                out.push_str(self.word(rng));
            }
            left_in_sentence -= 1;
        }
        if words > 0 {
            out.push('.');
        }
        out
    }

    /// About `tokens` tokens of text (see [`TOKENS_PER_WORD`]).
    pub fn text_tokens<R: Rng + ?Sized>(&self, rng: &mut R, tokens: usize) -> String {
        let words = ((tokens as f64) / TOKENS_PER_WORD).round() as usize;
        self.text(rng, words.max(1))
    }

    /// A line of pseudo source code (for the `code` workload).
    pub fn code_line<R: Rng + ?Sized>(&self, rng: &mut R) -> String {
        let a = self.word(rng);
        let b = self.word(rng);
        let c = self.word(rng);
        match rng.random_range(0..4) {
            0 => format!("    let {a}_{b} = {c}({a}, {});", rng.random_range(0..100)),
            1 => format!("    if {a} > {b} {{ return {c}; }}"),
            2 => format!("fn {a}_{b}({c}: u32) -> u32 {{"),
            _ => format!("    // {a} {b} {c}"),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn vocabulary_is_fixed_and_distinct() {
        let a = WordGen::default();
        let b = WordGen::default();
        assert_eq!(a.vocab, b.vocab);
        let set: std::collections::HashSet<_> = a.vocab.iter().collect();
        assert_eq!(set.len(), VOCABULARY);
        assert!(a
            .vocab
            .iter()
            .all(|w| w.chars().all(|c| c.is_ascii_lowercase())));
    }

    #[test]
    fn text_is_reproducible_and_sized() {
        let g = WordGen::default();
        let t1 = g.text(&mut SmallRng::seed_from_u64(3), 100);
        let t2 = g.text(&mut SmallRng::seed_from_u64(3), 100);
        let t3 = g.text(&mut SmallRng::seed_from_u64(4), 100);
        assert_eq!(t1, t2);
        assert_ne!(t1, t3);
        assert_eq!(t1.split_whitespace().count(), 100);
        assert!(t1.ends_with('.'));
        assert!(t1.chars().next().unwrap().is_ascii_uppercase());
    }
}

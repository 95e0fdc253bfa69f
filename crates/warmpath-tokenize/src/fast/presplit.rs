//! The Llama 3 / GPT-4 / Qwen split regex on the `regex` crate, with `\s+(?!\S)`
//! applied after the match (why that is exact: docs/tokenization.md), then GPT-2's
//! byte alphabet and the [`WordCache`] or the model. Only [`KNOWN_PATTERNS`] are taken.

use super::word_cache::WordCache;
use crate::error::TokenizeError;
use crate::weighted_lru::CacheStats;
use regex::Regex;
use serde_json::Value;
use tokenizers::{Model, ModelWrapper, Tokenizer};

/// Most words the word cache holds; past that, words are not added (the
/// library's own BPE cache behaves the same way).
const WORD_CACHE_CAPACITY: usize = 100_000;

/// Split patterns whose last alternatives are `\s+(?!\S)|\s+` and whose
/// earlier alternatives never match white space alone (see the module docs).
/// Each with the most digits its `\p{N}` alternative takes.
pub(crate) const KNOWN_PATTERNS: [(&str, usize); 2] = [
    // Llama 3, GPT-4 (cl100k).
    (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        3,
    ),
    // Qwen 2 / 2.5 (single digits).
    (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        1,
    ),
];

/// GPT-2's reversible map from bytes to printable characters (the byte-level
/// alphabet).
pub(crate) fn byte_alphabet() -> [char; 256] {
    let mut out = ['\0'; 256];
    let mut extra = 0u32;
    for b in 0u32..256 {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let c = if printable {
            b
        } else {
            extra += 1;
            255 + extra
        };
        out[b as usize] = char::from_u32(c).unwrap_or('\0');
    }
    out
}

#[derive(Debug)]
pub(crate) struct FastPieces {
    regex: Regex,
    /// The pattern's `\p{N}{1,max_digits}`, for the digit prewarm.
    max_digits: usize,
    alphabet: [char; 256],
    /// Split text -> ids; `None` when the model is not deterministic per word.
    words: Option<WordCache>,
}

impl FastPieces {
    /// `Some` only for the configuration described in the module docs.
    pub(crate) fn new(tokenizer: &Tokenizer) -> Option<Self> {
        if tokenizer.get_normalizer().is_some() {
            return None;
        }
        let pre = serde_json::to_value(tokenizer.get_pre_tokenizer()?).ok()?;
        let (pattern, max_digits) = Self::recognise(&pre)?;
        let regex = Regex::new(&pattern.replacen(r"|\s+(?!\S)", "", 1)).ok()?;
        let deterministic = matches!(tokenizer.get_model(),
            ModelWrapper::BPE(bpe) if bpe.dropout.is_none_or(|d| d == 0.0));
        let fast = FastPieces {
            regex,
            max_digits,
            alphabet: byte_alphabet(),
            words: deterministic.then(|| WordCache::new(WORD_CACHE_CAPACITY)),
        };
        fast.prewarm_digits(tokenizer);
        Some(fast)
    }

    /// Puts every ASCII digit group the pattern can split off (`0`–`999` with
    /// leading zeros for `\p{N}{1,3}`) in the word cache, as a miss would: a
    /// question's numbers are often new and would otherwise hit the BPE.
    fn prewarm_digits(&self, tokenizer: &Tokenizer) {
        let Some(words) = &self.words else {
            return;
        };
        let model = tokenizer.get_model();
        let mut groups: Vec<(String, Vec<u32>)> = Vec::new();
        for len in 1..=self.max_digits.min(3) {
            for n in 0..10usize.pow(len as u32) {
                let group = format!("{n:0len$}", len = len);
                // Digits are printable ASCII: the byte alphabet keeps them.
                let Ok(tokens) = model.tokenize(&group) else {
                    continue;
                };
                groups.push((group, tokens.iter().map(|t| t.id).collect()));
            }
        }
        words.insert(groups.iter().map(|(g, ids)| (g.as_str(), ids.as_slice())));
    }

    /// The split pattern when `pre` is `Sequence[Split(known, Isolated),
    /// ByteLevel(add_prefix_space: false, use_regex: false)]`.
    fn recognise(pre: &Value) -> Option<(&'static str, usize)> {
        if pre.get("type")?.as_str()? != "Sequence" {
            return None;
        }
        let [split, bytes] = pre.get("pretokenizers")?.as_array()?.as_slice() else {
            return None;
        };
        let is = |v: &Value, k: &str, want: &Value| v.get(k) == Some(want);
        let split_ok = is(split, "type", &"Split".into())
            && is(split, "behavior", &"Isolated".into())
            && is(split, "invert", &false.into());
        let bytes_ok = is(bytes, "type", &"ByteLevel".into())
            && is(bytes, "add_prefix_space", &false.into())
            && is(bytes, "use_regex", &false.into());
        if !(split_ok && bytes_ok) {
            return None;
        }
        let pattern = split.get("pattern")?.get("Regex")?.as_str()?;
        KNOWN_PATTERNS.into_iter().find(|&(k, _)| k == pattern)
    }

    /// Whether the words of this tokenizer always give the same ids (BPE
    /// without dropout): then ids may be remembered.
    pub(crate) fn deterministic(&self) -> bool {
        self.words.is_some()
    }

    /// The word cache's counters (splits, not pieces).
    pub(crate) fn word_stats(&self) -> Option<CacheStats> {
        self.words.as_ref().map(WordCache::stats)
    }

    /// The splits of `text`, as the library's Split pre-tokenizer makes them.
    pub(crate) fn splits<'t>(&'t self, text: &'t str) -> impl Iterator<Item = &'t str> + 't {
        let mut at = 0;
        std::iter::from_fn(move || {
            if at >= text.len() {
                return None;
            }
            let Some(m) = self.regex.find_at(text, at) else {
                // Not reachable with the known patterns (they match every
                // character), but Isolated keeps an unmatched tail as a split.
                let rest = &text[at..];
                at = text.len();
                return Some(rest);
            };
            if m.start() > at {
                // Likewise: an unmatched gap is a split of its own.
                let gap = &text[at..m.start()];
                at = m.start();
                return Some(gap);
            }
            let mut end = m.end();
            let s = m.as_str();
            let whitespace_run = s.chars().all(char::is_whitespace) && !s.contains(['\r', '\n']);
            if whitespace_run && end < text.len() {
                // A non-space follows (the run is maximal): give the last
                // character back when more than one is left.
                if let Some(last) = s.chars().next_back() {
                    if s.len() > last.len_utf8() {
                        end -= last.len_utf8();
                    }
                }
            }
            if end <= at {
                // Never empty (the known patterns have no empty match): always
                // move on by at least one character.
                end = at + text[at..].chars().next().map_or(1, char::len_utf8);
            }
            let piece = &text[at..end];
            at = end;
            Some(piece)
        })
    }

    /// Appends the ids of `text` (which holds no added token) to `ids`,
    /// tokenizing each split with `tokenizer`'s model.
    pub(crate) fn encode(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
        ids: &mut Vec<u32>,
    ) -> Result<(), TokenizeError> {
        let model = tokenizer.get_model();
        let mut mapped = String::new();
        // Splits encoded here, to add to the word cache after the reads.
        let mut fresh: Vec<(&str, std::ops::Range<usize>)> = Vec::new();
        let (mut hits, mut misses) = (0, 0);
        {
            let reader = self.words.as_ref().map(WordCache::reader);
            for split in self.splits(text) {
                if let Some(hit) = reader.as_ref().and_then(|r| r.get(split)) {
                    ids.extend_from_slice(hit);
                    hits += 1;
                    continue;
                }
                misses += 1;
                mapped.clear();
                mapped.extend(split.bytes().map(|b| self.alphabet[usize::from(b)]));
                let tokens = model.tokenize(&mapped).map_err(TokenizeError::Encode)?;
                let start = ids.len();
                ids.extend(tokens.iter().map(|t| t.id));
                if reader.is_some() && WordCache::fits(split, &ids[start..]) {
                    fresh.push((split, start..ids.len()));
                }
            }
        }
        if let Some(words) = &self.words {
            words.count(hits, misses);
            if !fresh.is_empty() {
                words.insert(fresh.into_iter().map(|(s, r)| (s, &ids[r])));
            }
        }
        Ok(())
    }
}

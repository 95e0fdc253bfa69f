//! Cutting a text at added tokens, as the `tokenizers` library does, without
//! its per-byte alignment bookkeeping.
//!
//! The library's `AddedVocabulary::extract_and_normalize` builds a
//! `NormalizedString` (16 bytes of offsets per input byte) and slices it per
//! piece: for a 27 KB system prompt that is most of the time of a warm,
//! segment-cached encode. The cut itself is two leftmost-longest
//! Aho-Corasick passes: tokens with `normalized: false` over the text, then
//! tokens with `normalized: true` over the pieces left between them. This
//! module repeats exactly those passes, and only for the configurations where
//! nothing else changes the cut: no normalizer under normalized tokens, no
//! `lstrip`/`rstrip`/`single_word` tokens, and `encode_special_tokens` off.
//! Anything else gets `None` from [`AddedSplitter::new`] and the caller keeps
//! using the library.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use std::collections::HashMap;
use tokenizers::Tokenizer;

/// One piece of a cut text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Piece<'a> {
    /// Text between added tokens (never empty).
    Text(&'a str),
    /// An added token, by id.
    Added(u32),
}

/// One matching pass: an automaton and the id of each of its patterns.
struct Pass {
    trie: AhoCorasick,
    ids: Vec<u32>,
}

impl Pass {
    fn build(tokens: Vec<(String, u32)>) -> Option<Self> {
        let (patterns, ids): (Vec<String>, Vec<u32>) = tokens.into_iter().unzip();
        let trie = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .ok()?;
        Some(Pass { trie, ids })
    }

    /// Cuts `text`: text pieces go to `text_piece`, added tokens to `out`.
    fn cut<'a, E, O>(
        &self,
        text: &'a str,
        out: &mut O,
        mut text_piece: impl FnMut(&'a str, &mut O) -> Result<(), E>,
    ) -> Result<(), E>
    where
        O: FnMut(Piece<'a>) -> Result<(), E> + ?Sized,
    {
        let mut at = 0;
        for m in self.trie.find_iter(text) {
            if at < m.start() {
                text_piece(&text[at..m.start()], out)?;
            }
            out(Piece::Added(self.ids[m.pattern().as_usize()]))?;
            at = m.end();
        }
        if at < text.len() {
            text_piece(&text[at..], out)?;
        }
        Ok(())
    }
}

/// The raw pass for token sets like Llama 3's, where every added token is
/// `<|inner|>` (at least 4 bytes) with no `|>` inside `inner`: then at most
/// one token can match at a `<|` — the text up to the first `|>` after it —
/// so the pass is a `memchr` for `<` and one map lookup per candidate, with
/// the same leftmost-longest result as the automaton (whose transition
/// tables a cold core must fetch byte by byte).
struct Bracketed {
    ids: HashMap<Box<str>, u32>,
}

impl Bracketed {
    fn build(tokens: &[(String, u32)]) -> Option<Self> {
        let shaped = |t: &str| {
            t.len() >= 4
                && t.starts_with("<|")
                && t.ends_with("|>")
                && !t[2..t.len() - 2].contains("|>")
        };
        tokens.iter().all(|(t, _)| shaped(t)).then(|| Bracketed {
            ids: tokens
                .iter()
                .map(|(t, id)| (t.as_str().into(), *id))
                .collect(),
        })
    }

    fn cut<'a, E>(
        &self,
        text: &'a str,
        out: &mut impl FnMut(Piece<'a>) -> Result<(), E>,
    ) -> Result<(), E> {
        let bytes = text.as_bytes();
        let (mut at, mut from) = (0, 0);
        while let Some(k) = memchr::memchr(b'<', &bytes[from..]) {
            let start = from + k;
            from = start + 1;
            if bytes.get(start + 1) != Some(&b'|') {
                continue;
            }
            let Some(e) = find_close(&bytes[start + 2..]) else {
                break; // no token can end anywhere after this
            };
            let end = start + 2 + e + 2;
            if let Some(&id) = self.ids.get(&text[start..end]) {
                if at < start {
                    out(Piece::Text(&text[at..start]))?;
                }
                out(Piece::Added(id))?;
                at = end;
                from = end;
            }
        }
        if at < text.len() {
            out(Piece::Text(&text[at..]))?;
        }
        Ok(())
    }
}

/// Where the first `|>` in `bytes` starts. (`memmem::find` would build a
/// searcher for the two-byte needle on every call.)
fn find_close(bytes: &[u8]) -> Option<usize> {
    let mut from = 0;
    while let Some(k) = memchr::memchr(b'|', &bytes[from..]) {
        let at = from + k;
        if bytes.get(at + 1) == Some(&b'>') {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// The exact added-token cut of one tokenizer (see module docs).
pub(crate) struct AddedSplitter {
    raw: Pass,
    /// `None` when no token is matched in the normalized pass: skip it.
    normalized: Option<Pass>,
    /// The raw pass without the automaton, when the tokens allow it and
    /// there is no normalized pass.
    bracketed: Option<Bracketed>,
}

impl std::fmt::Debug for AddedSplitter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddedSplitter")
            .field("raw_tokens", &self.raw.ids.len())
            .field(
                "normalized_tokens",
                &self.normalized.as_ref().map_or(0, |p| p.ids.len()),
            )
            .finish()
    }
}

impl AddedSplitter {
    /// The splitter for `tokenizer`, or `None` when its configuration needs
    /// the library's own cut (see module docs).
    pub(crate) fn new(tokenizer: &Tokenizer) -> Option<Self> {
        if tokenizer.get_encode_special_tokens() {
            return None;
        }
        let has_normalizer = tokenizer.get_normalizer().is_some();
        let mut raw = Vec::new();
        let mut normalized = Vec::new();
        for token in tokenizer.get_added_tokens_decoder().into_values() {
            if token.content.is_empty() {
                continue; // the library never adds these
            }
            if token.lstrip || token.rstrip || token.single_word {
                return None;
            }
            if token.normalized && has_normalizer {
                return None;
            }
            // The library maps content to id through its own lookup; do the same.
            let id = tokenizer.token_to_id(&token.content)?;
            if token.normalized {
                normalized.push((token.content, id));
            } else {
                raw.push((token.content, id));
            }
        }
        // The library builds each automaton in its own token order; with
        // leftmost-longest matching only equal contents could tie, and equal
        // contents share one id. Sort for a deterministic build.
        raw.sort_unstable();
        raw.dedup();
        normalized.sort_unstable();
        normalized.dedup();
        Some(AddedSplitter {
            bracketed: if normalized.is_empty() {
                Bracketed::build(&raw)
            } else {
                None
            },
            raw: Pass::build(raw)?,
            normalized: if normalized.is_empty() {
                None
            } else {
                Some(Pass::build(normalized)?)
            },
        })
    }

    /// Cuts `text` into pieces, in order, calling `out` for each; stops at
    /// the first error `out` returns.
    pub(crate) fn split<'a, E>(
        &self,
        text: &'a str,
        mut out: impl FnMut(Piece<'a>) -> Result<(), E>,
    ) -> Result<(), E> {
        if let Some(b) = &self.bracketed {
            return b.cut(text, &mut out);
        }
        // The second pass runs on each text piece the first one leaves.
        match &self.normalized {
            Some(normalized) => self.raw.cut(text, &mut out, |piece, out| {
                normalized.cut(piece, out, |t, out| out(Piece::Text(t)))
            }),
            None => self.raw.cut(text, &mut out, |t, out| out(Piece::Text(t))),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::tokenize::tiny;
    use proptest::prelude::*;
    use serde_json::{json, Value};
    use std::str::FromStr;
    use tokenizers::{NormalizerWrapper, OffsetReferential, OffsetType};

    /// The tiny tokenizer plus added tokens that overlap each other and the
    /// special ones, half of them matched in the second (normalized) pass.
    fn overlapping() -> Tokenizer {
        let mut doc: Value = serde_json::from_str(&tiny::tokenizer_json()).unwrap();
        let added = doc["added_tokens"].as_array_mut().unwrap();
        for (i, (content, normalized)) in [
            ("ab", true),
            ("bc", false),
            ("abc", true),
            ("<|eot", true),
            ("id|>x", false),
            ("é", true),
        ]
        .into_iter()
        .enumerate()
        {
            added.push(json!({"id": tiny::VOCAB_SIZE + i, "content": content,
                "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": normalized, "special": i % 2 == 0}));
        }
        Tokenizer::from_str(&doc.to_string()).unwrap()
    }

    fn ours(s: &AddedSplitter, text: &str) -> Vec<(String, Option<u32>)> {
        let mut v = Vec::new();
        s.split(text, |p| {
            v.push(match p {
                Piece::Text(t) => (t.to_owned(), None),
                Piece::Added(id) => (String::new(), Some(id)),
            });
            Ok::<(), ()>(())
        })
        .unwrap();
        v
    }

    fn library(t: &Tokenizer, text: &str) -> Vec<(String, Option<u32>)> {
        t.get_added_vocabulary()
            .extract_and_normalize(None::<&NormalizerWrapper>, text)
            .get_splits(OffsetReferential::Original, OffsetType::None)
            .into_iter()
            .filter(|(piece, _, _)| !piece.is_empty())
            .map(|(piece, _, added)| match added {
                Some(tokens) => (String::new(), Some(tokens[0].id)),
                None => (piece.to_owned(), None),
            })
            .collect()
    }

    #[test]
    fn two_passes_like_the_library() {
        let t = overlapping();
        let s = AddedSplitter::new(&t).unwrap();
        // "bc" (raw pass) wins over "abc"/"ab" (normalized pass) although
        // those start earlier: the raw pass runs first over the whole text.
        let text = "xabcy<|eot_id|>x<|eotz";
        assert_eq!(ours(&s, text), library(&t, text));
        let got = ours(&s, text);
        assert_eq!(got[0], ("xa".to_owned(), None));
        assert_eq!(got[1].1, t.token_to_id("bc"));
        assert!(ours(&s, "").is_empty());
    }

    #[test]
    fn configurations_the_cut_cannot_mirror_are_refused() {
        for flag in ["lstrip", "rstrip", "single_word"] {
            let mut doc: Value = serde_json::from_str(&tiny::tokenizer_json()).unwrap();
            doc["added_tokens"][0][flag] = json!(true);
            let t = Tokenizer::from_str(&doc.to_string()).unwrap();
            assert!(AddedSplitter::new(&t).is_none(), "{flag}");
        }
        let mut t = overlapping();
        t.set_encode_special_tokens(true);
        assert!(AddedSplitter::new(&t).is_none());
        assert!(AddedSplitter::new(&overlapping()).is_some());
    }

    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(tiny::BEGIN_OF_TEXT.to_string()),
            Just(tiny::EOT_ID.to_string()),
            Just("<|start_header_id|>user<|end_header_id|>\n\n".to_string()),
            Just("<|eot".to_string()),
            Just("id|>x".to_string()),
            "[abcé<|>xyz]{0,12}",
            "\\PC{0,20}",
        ]
    }

    proptest! {
        #[test]
        fn find_close_equals_memmem(bytes in proptest::collection::vec(
            prop_oneof![Just(b'|'), Just(b'>'), Just(b'<'), any::<u8>()], 0..64)) {
            prop_assert_eq!(find_close(&bytes), memchr::memmem::find(&bytes, b"|>"));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// The cut equals the library's on any mix of overlapping tokens.
        #[test]
        fn cut_equals_library(pieces in proptest::collection::vec(piece(), 0..10)) {
            let t = overlapping();
            let s = AddedSplitter::new(&t).unwrap();
            let text: String = pieces.concat();
            prop_assert_eq!(ours(&s, &text), library(&t, &text));
        }

        /// Llama-3-shaped tokens take the automaton-free pass; same cut.
        #[test]
        fn bracketed_cut_equals_library(pieces in proptest::collection::vec(bracket_piece(), 0..12)) {
            let t = Tokenizer::from_str(&tiny::tokenizer_json()).unwrap();
            let s = AddedSplitter::new(&t).unwrap();
            prop_assert!(s.bracketed.is_some());
            let text: String = pieces.concat();
            prop_assert_eq!(ours(&s, &text), library(&t, &text));
        }
    }

    fn bracket_piece() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(tiny::BEGIN_OF_TEXT.to_string()),
            Just(tiny::EOT_ID.to_string()),
            Just("<|start_header_id|>".to_string()),
            Just("<|end_header_id|>".to_string()),
            Just("<|".to_string()),
            Just("|>".to_string()),
            Just("<||>".to_string()),
            Just("<|eot_id".to_string()),
            Just("<".to_string()),
            "[<|>a-z_é ]{0,10}",
        ]
    }

    #[test]
    fn only_bracket_shaped_raw_tokens_skip_the_automaton() {
        let t = Tokenizer::from_str(&tiny::tokenizer_json()).unwrap();
        assert!(AddedSplitter::new(&t).unwrap().bracketed.is_some());
        assert!(AddedSplitter::new(&overlapping())
            .unwrap()
            .bracketed
            .is_none());
        for odd in ["<|a|>b", "<|a|>b|>", "<|>", "[INST]"] {
            let tokens = vec![("<|eot_id|>".to_owned(), 1), (odd.to_owned(), 2)];
            assert!(Bracketed::build(&tokens).is_none(), "{odd}");
        }
        let tokens = vec![("<|a||>".to_owned(), 1), ("<||>".to_owned(), 2)];
        let b = Bracketed::build(&tokens).unwrap();
        let mut got = Vec::new();
        b.cut("x<|a||><|<||>|>", &mut |p| {
            got.push(p);
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(
            got,
            vec![
                Piece::Text("x"),
                Piece::Added(1),
                Piece::Text("<|"),
                Piece::Added(2),
                Piece::Text("|>")
            ]
        );
    }
}

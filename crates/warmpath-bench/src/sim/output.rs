//! What a simulated engine "generates": real token ids whose streamed text,
//! sent back by a chat client as the assistant message, re-tokenizes to the
//! same ids, so a conversation's next turn hits the blocks decode filled.
//! That holds for a first token of ASCII letters (the template trims a
//! leading space), then tokens of one space + letters and now and then a lone
//! `.`, each encoding back to itself alone: a byte-level BPE pre-tokenizer
//! splits such text exactly there.

use crate::error::{ensure, BenchError};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use warmpath_core::tokenize::ChatTokenizer;

/// A sentence ends (with a `.` token) after this many words on average.
const WORDS_PER_SENTENCE: u32 = 12;

/// The tokens a simulated engine emits.
#[derive(Clone, Debug)]
pub struct OutputVocab {
    /// `(id, text)` of tokens that are letters only (start of an answer).
    first: Vec<(u32, String)>,
    /// `(id, text)` of tokens that are a space + letters.
    inner: Vec<(u32, String)>,
    /// The `.` token, when the vocabulary has one that round-trips.
    period: Option<(u32, String)>,
}

/// Generated output: the token ids and each one's text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Output {
    /// Token ids, in order.
    pub ids: Vec<u32>,
    /// The text of each token (`pieces.concat()` is the whole answer).
    pub pieces: Vec<String>,
}

impl Output {
    pub fn text(&self) -> String {
        self.pieces.concat()
    }
}

fn letters(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphabetic())
}

impl OutputVocab {
    /// Scans the vocabulary for tokens that round-trip (see the module docs).
    pub fn new(tok: &ChatTokenizer) -> Result<Self, BenchError> {
        let inner_tok = tok.tokenizer();
        let size = u32::try_from(inner_tok.get_vocab_size(true)).unwrap_or(u32::MAX);
        let (mut first, mut inner, mut period) = (Vec::new(), Vec::new(), Vec::new());
        for id in 0..size {
            let Ok(text) = inner_tok.decode(&[id], false) else {
                continue;
            };
            let list = if letters(&text) {
                &mut first
            } else if text.strip_prefix(' ').is_some_and(letters) {
                &mut inner
            } else if text == "." {
                &mut period
            } else {
                continue;
            };
            // Only a token that encodes back to itself alone is usable.
            if tok.encode_text_uncached(&text, false)? == [id] {
                list.push((id, text));
            }
        }
        let why = "no single-token words to generate output from (need tokens that \
                   decode to letters and to a space + letters)";
        ensure(!first.is_empty() && !inner.is_empty(), "tokenizer", why)?;
        let period = period.pop();
        Ok(OutputVocab {
            first,
            inner,
            period,
        })
    }

    /// `n` tokens of output, the same for the same `seed`.
    pub fn generate(&self, seed: u64, n: usize) -> Output {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut out = Output {
            ids: Vec::with_capacity(n),
            pieces: Vec::with_capacity(n),
        };
        let mut after_period = false;
        for i in 0..n {
            let (id, text) = if i == 0 {
                &self.first[rng.random_range(0..self.first.len())]
            } else {
                match &self.period {
                    Some(p) if !after_period && rng.random_ratio(1, WORDS_PER_SENTENCE) => {
                        after_period = true;
                        p
                    }
                    _ => {
                        after_period = false;
                        &self.inner[rng.random_range(0..self.inner.len())]
                    }
                }
            };
            out.ids.push(*id);
            out.pieces.push(text.clone());
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::sim::tiny_tokenizer;
    use warmpath_core::request::{Expect, Request};
    use warmpath_core::tokenize::tiny::EOT_ID_ID;

    fn encode_chat(tok: &ChatTokenizer, messages: &serde_json::Value) -> Vec<u32> {
        let body = serde_json::json!({"model": "m", "messages": messages});
        let req = Request::from_value(&body, Expect::Chat).unwrap();
        tok.encode_request(&req).unwrap()
    }

    #[test]
    fn tiny_vocabulary_has_words_of_both_kinds() {
        let v = OutputVocab::new(&tiny_tokenizer().unwrap()).unwrap();
        let (first, inner) = (v.first.len(), v.inner.len());
        assert!(first >= 20 && inner >= 20, "{first} / {inner}");
        assert!(v.period.is_some());
        let a = v.generate(7, 50);
        assert_eq!(a, v.generate(7, 50));
        assert_ne!(a, v.generate(8, 50));
        assert_eq!(a.ids.len(), 50);
        assert!(!a.text().starts_with(' ') && !a.text().ends_with(' '));
    }

    /// The next turn of a chat (history + the streamed answer as the
    /// assistant message + a new user message), rendered by the real template
    /// and encoded by the real tokenizer, starts with the previous prompt
    /// followed by exactly the generated ids, then the template's `<|eot_id|>`.
    #[test]
    fn the_answer_round_trips_through_the_chat_template() {
        let tok = tiny_tokenizer().unwrap();
        let v = OutputVocab::new(&tok).unwrap();
        for (seed, n) in [(1u64, 1usize), (2, 2), (3, 37), (4, 300), (5, 1000)] {
            let mut messages = serde_json::json!([
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Tell me a story about the sea."}
            ]);
            let prompt = encode_chat(&tok, &messages);
            let out = v.generate(seed, n);
            let arr = messages.as_array_mut().unwrap();
            arr.push(serde_json::json!({"role": "assistant", "content": out.text()}));
            arr.push(serde_json::json!({"role": "user", "content": "And then?"}));
            let next = encode_chat(&tok, &messages);
            assert_eq!(&next[..prompt.len()], &prompt[..], "seed {seed}");
            let answer = &next[prompt.len()..prompt.len() + n];
            assert_eq!(answer, &out.ids[..], "seed {seed}: {:?}", out.text());
            assert_eq!(next[prompt.len() + n], EOT_ID_ID);
        }
    }
}

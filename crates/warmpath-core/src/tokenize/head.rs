//! Chat heads: the block hashes of a chat's first messages, remembered.
//!
//! Most chat requests repeat a long beginning (a system prompt, a document,
//! the earlier turns of a conversation) and add a short new end. The segment
//! cache already spares re-tokenizing the long part, but every request still
//! renders it into a fresh string, cuts that string at added tokens, hashes
//! the long segment to find it in the cache, copies its ids out and hashes
//! every block of them: ~100 KB of memory touched per request, which a core
//! that just woke up pays several times over.
//!
//! [`HeadChains`] remembers, per *head* (the rendering of `messages[..k]`),
//! the block hashes of its full blocks and the ids of its last partial block.
//! A request whose head was seen renders and tokenizes only the messages
//! after it and continues the chain from the remembered hashes.
//!
//! **Exactness.** A head is keyed by the xxh3-128 and length of its rendered
//! text, salted with the hash seed and block size, computed in one streaming
//! pass by the native renderer ([`Native::head_keys`]) without building the
//! text. The ids of `head ++ rest` equal `ids(head) ++ ids(rest)` because every
//! message's rendering after the first starts with an added token, where the
//! tokenizer cuts the text, and the tokenizer is only used this way when no
//! added token could match across that cut
//! ([`head_split_is_exact`]). On top of that, a head is remembered
//! only after checking that cut on the request that brought it: its full ids
//! must equal the head's ids followed by the rest's. Chats the native
//! renderer does not take (other templates, `chat_template_kwargs`) and
//! `continue_final_message` go the whole way every time.

use super::native::{HeadKey, Native};
use crate::hash::{BlockHash, ChainHasher, HashSeed};
use crate::weighted_lru::{Size, WeightedLru};
use std::sync::Arc;

/// Longest heads probed per request (the last messages of a conversation
/// change from turn to turn; the head of the previous turn is usually two
/// messages back).
pub const MAX_PROBES: usize = 4;

/// Shortest rendered head worth remembering, in bytes.
pub const MIN_HEAD_BYTES: usize = 2048;

/// The remembered chain of one head.
#[derive(Debug)]
pub struct HeadChain {
    hashes: Box<[BlockHash]>,
    tail: Box<[u32]>,
}

impl Size for HeadChain {
    fn size(&self) -> usize {
        self.hashes.len() + 1
    }
}

/// Counters of a [`HeadChains`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeadStats {
    /// Probes that found a head.
    pub hits: u64,
    /// Probes that found none (a request may probe up to [`MAX_PROBES`]).
    pub misses: u64,
    /// Heads dropped for room.
    pub evictions: u64,
    /// Heads held.
    pub entries: usize,
    /// Block hashes held (plus one per head).
    pub blocks: usize,
}

/// A bounded LRU of head chains (see module docs), weighted by blocks.
pub struct HeadChains {
    lru: WeightedLru<HeadChain>,
}

impl std::fmt::Debug for HeadChains {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeadChains")
            .field("capacity_blocks", &self.lru.capacity())
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for HeadChains {
    /// Room for 1M block hashes (~8 MiB): 2000 heads of 8000 tokens at 16
    /// tokens a block.
    fn default() -> Self {
        Self::new(1 << 20)
    }
}

impl HeadChains {
    /// A memo of at most `capacity_blocks` block hashes; 0 turns it off.
    pub fn new(capacity_blocks: usize) -> Self {
        HeadChains {
            lru: WeightedLru::new(capacity_blocks),
        }
    }

    /// Its counters.
    pub fn stats(&self) -> HeadStats {
        let c = self.lru.counts();
        HeadStats {
            hits: c.hits,
            misses: c.misses,
            evictions: c.evictions,
            entries: c.entries,
            blocks: c.size,
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.lru.capacity() > 0
    }

    pub(crate) fn get(&self, key: &HeadKey) -> Option<Arc<HeadChain>> {
        self.lru.get((key.hash, key.len))
    }
}

/// The salt of head keys: hashes differ per seed and block size.
pub(crate) fn salt(seed: HashSeed, block_size: usize) -> [u8; 16] {
    let mut s = [0u8; 16];
    s[..8].copy_from_slice(&seed.0.to_le_bytes());
    s[8..].copy_from_slice(&(block_size as u64).to_le_bytes());
    s
}

/// Whether the tokenizer cuts a chat's rendering exactly where each message
/// after the first starts: `start` (the native template's
/// [`Native::message_start`]) must be an added token, and no added token may
/// match across the cut — no proper suffix of one may be a prefix of `start`
/// or begin with it.
pub(crate) fn head_split_is_exact<'t>(
    native: &Native,
    mut added: impl Iterator<Item = &'t str>,
) -> bool {
    let start = native.message_start();
    let mut found = false;
    let crossing = added.any(|token| {
        found |= token == start;
        token.char_indices().skip(1).any(|(p, _)| {
            let b = &token[p..];
            start.starts_with(b) || b.starts_with(start)
        })
    });
    found && !crossing
}

/// A request's token ids, ready to hash: either all of them, or those after
/// a remembered head.
#[derive(Debug)]
pub struct ChatIds {
    seed: HashSeed,
    block_size: usize,
    head: Option<Arc<HeadChain>>,
    ids: Vec<u32>,
    remember: Option<(HeadKey, usize)>,
}

impl ChatIds {
    /// All of a request's ids, nothing remembered.
    pub(crate) fn whole(seed: HashSeed, block_size: usize, ids: Vec<u32>) -> Self {
        ChatIds {
            seed,
            block_size,
            head: None,
            ids,
            remember: None,
        }
    }

    /// The ids after a remembered head.
    pub(crate) fn after(
        seed: HashSeed,
        block_size: usize,
        head: Arc<HeadChain>,
        ids: Vec<u32>,
    ) -> Self {
        ChatIds {
            seed,
            block_size,
            head: Some(head),
            ids,
            remember: None,
        }
    }

    /// All of a request's ids, and a verified head of `head_tokens` of them
    /// to remember under `key` once hashed.
    pub(crate) fn remembering(
        seed: HashSeed,
        block_size: usize,
        ids: Vec<u32>,
        key: HeadKey,
        head_tokens: usize,
    ) -> Self {
        ChatIds {
            remember: (head_tokens <= ids.len()).then_some((key, head_tokens)),
            ..Self::whole(seed, block_size, ids)
        }
    }

    /// Whether a remembered head was used.
    pub fn used_head(&self) -> bool {
        self.head.is_some()
    }

    /// The hashes of every full block of the request's ids (what
    /// [`crate::hash_tokens`] gives for all of them), remembering the head
    /// in `heads` when this request brought a new one.
    pub fn block_hashes(self, heads: &HeadChains) -> Vec<BlockHash> {
        let bs = self.block_size;
        match self.head {
            Some(head) => {
                let mut out =
                    Vec::with_capacity(head.hashes.len() + self.ids.len() / bs.max(1) + 1);
                out.extend_from_slice(&head.hashes);
                let mut hasher = match head.hashes.last() {
                    Some(&parent) => ChainHasher::after(parent, bs),
                    None => ChainHasher::new(self.seed, bs),
                };
                if head.tail.is_empty() {
                    hasher.extend(&self.ids, &mut out);
                } else {
                    let mut ids = Vec::with_capacity(head.tail.len() + self.ids.len());
                    ids.extend_from_slice(&head.tail);
                    ids.extend_from_slice(&self.ids);
                    hasher.extend(&ids, &mut out);
                }
                out
            }
            None => {
                let mut out = Vec::new();
                ChainHasher::new(self.seed, bs).extend(&self.ids, &mut out);
                if let (Some((key, head_tokens)), true) = (self.remember, bs > 0) {
                    let full = head_tokens / bs;
                    let chain = HeadChain {
                        hashes: out[..full].into(),
                        tail: self.ids[full * bs..head_tokens].into(),
                    };
                    heads.lru.insert((key.hash, key.len), Arc::new(chain));
                }
                out
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::hash_tokens;
    use crate::request::{Content, ContentCache, Expect, Request, RequestBody};
    use crate::tokenize::native::CHATML;
    use crate::tokenize::{tiny, CacheConfig, ChatTokenizer, TokenizerFiles};
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn llama3() -> ChatTokenizer {
        ChatTokenizer::new(&tiny::files().unwrap(), CacheConfig::default()).unwrap()
    }

    /// The tiny tokenizer with ChatML's two added tokens and template.
    fn chatml() -> ChatTokenizer {
        let mut doc: Value = serde_json::from_str(&tiny::tokenizer_json()).unwrap();
        let added = doc["added_tokens"].as_array_mut().unwrap();
        for (i, content) in ["<|im_start|>", "<|im_end|>"].into_iter().enumerate() {
            added.push(json!({"id": tiny::VOCAB_SIZE + i, "content": content,
                "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": true}));
        }
        let files = TokenizerFiles::from_strings(doc.to_string(), None)
            .unwrap()
            .with_chat_template(CHATML);
        ChatTokenizer::new(&files, CacheConfig::default()).unwrap()
    }

    /// Hashes through `heads` and checks them against plain hashing.
    /// Long contents with escapes come from the router's content cache (as
    /// `Content::Shared`, keyed by their literal), the rest from the body.
    fn check(
        tok: &ChatTokenizer,
        heads: &HeadChains,
        body: &Value,
        seed: HashSeed,
        bs: usize,
    ) -> bool {
        thread_local! {
            static CONTENTS: ContentCache = ContentCache::default();
        }
        let text = body.to_string();
        let req = CONTENTS
            .with(|c| Request::parse_with(text.as_bytes(), Expect::Chat, Some(c)))
            .unwrap();
        let ids = tok
            .encode_request_remembering(&req, seed, bs, heads)
            .unwrap();
        let used = ids.used_head();
        let want = hash_tokens(seed, bs, &tok.encode_request(&req).unwrap());
        assert_eq!(ids.block_hashes(heads), want, "{body}");
        used
    }

    #[test]
    fn a_repeated_head_is_used_and_hashes_stay_exact() {
        for tok in [llama3(), chatml()] {
            assert!(tok.remembers_heads(), "the cut is exact for both templates");
            let heads = HeadChains::default();
            let seed = HashSeed::new("m", "", "acme");
            let system = tiny::corpus_slice(100, 6000);
            let ask = |q: &str| {
                json!({"model": "m", "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": q}]})
            };
            let first = ask("first question?").to_string();
            let cache = ContentCache::default();
            let parsed = Request::parse_with(first.as_bytes(), Expect::Chat, Some(&cache)).unwrap();
            let RequestBody::Chat(c) = &parsed.body else {
                unreachable!()
            };
            let shared = matches!(c.messages[0].content, Content::Shared(..));
            assert!(shared, "the system prompt is shared");
            assert!(!check(&tok, &heads, &ask("first question?"), seed, 16));
            assert!(check(&tok, &heads, &ask("second question?"), seed, 16));
            assert!(check(&tok, &heads, &ask(" <|eot_id|> third\n"), seed, 16));
            // Another tenant (seed) or block size has heads of its own.
            let other = HashSeed::new("m", "", "globex");
            assert!(!check(&tok, &heads, &ask("q"), other, 16));
            assert!(!check(&tok, &heads, &ask("q"), seed, 4));
            // A later turn finds the head of the turn before.
            let turns = json!({"model": "m", "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": "first question?"},
                {"role": "assistant", "content": "an answer"},
                {"role": "user", "content": "and then?"}]});
            assert!(check(&tok, &heads, &turns, seed, 16));
            // continue_final_message and kwargs go the whole way.
            let mut cont = ask("an answer in progress");
            cont["messages"][1]["role"] = json!("assistant");
            cont["continue_final_message"] = json!(true);
            cont["add_generation_prompt"] = json!(false);
            assert!(!check(&tok, &heads, &cont, seed, 16));
            let mut kw = ask("q");
            kw["chat_template_kwargs"] = json!({"x": 1});
            assert!(!check(&tok, &heads, &kw, seed, 16));
            let s = heads.stats();
            assert!(s.hits >= 3 && s.entries >= 3, "{s:?}");
        }
        // Off: never used, still exact.
        let off = HeadChains::new(0);
        let tok = llama3();
        let body = json!({"model": "m", "messages": [
            {"role": "system", "content": tiny::corpus_slice(0, 5000)},
            {"role": "user", "content": "q"}]});
        assert!(!check(&tok, &off, &body, HashSeed::new("m", "", ""), 16));
        assert!(!check(&tok, &off, &body, HashSeed::new("m", "", ""), 16));
    }

    fn content() -> impl Strategy<Value = Value> {
        prop_oneof![
            3 => "[ a-z\n\t\u{a0}\u{e9}\u{1F600}<|>_]{0,24}".prop_map(Value::from),
            2 => (0usize..3, 1500usize..3000)
                .prop_map(|(d, n)| Value::from(tiny::corpus_slice(d * 7919, n))),
            1 => Just(json!(" <|eot_id|><|start_header_id|>\n ")),
            1 => Just(Value::Null),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]
        #[test]
        fn hashes_through_heads_equal_plain_hashing(
            system in 0usize..3,
            turns in proptest::collection::vec(
                (prop_oneof![Just("user"), Just("assistant"), Just("tool")], content()), 0..5),
            asks in proptest::collection::vec(content(), 1..4),
            tenant in prop_oneof![Just(""), Just("acme")],
            bs in prop_oneof![Just(1usize), Just(4), Just(16)],
            use_chatml in any::<bool>(),
        ) {
            let tok = if use_chatml { chatml() } else { llama3() };
            let heads = HeadChains::default();
            let seed = HashSeed::new("m", "", tenant);
            let mut messages = vec![json!({"role": "system",
                "content": tiny::corpus_slice(system * 4001, 4000)})];
            messages.extend(turns.iter().map(|(r, c)| json!({"role": r, "content": c})));
            let mut used = 0;
            // The same head with each ask, then the conversation going on.
            for round in 0..2 {
                for ask in &asks {
                    let mut m = messages.clone();
                    m.push(json!({"role": "user", "content": ask}));
                    let body = json!({"model": "m", "messages": m});
                    used += usize::from(check(&tok, &heads, &body, seed, bs));
                }
                messages.push(json!({"role": "user", "content": asks[0]}));
                messages.push(json!({"role": "assistant", "content": format!("reply {round}")}));
            }
            // Every request after the first finds a head (the system prompt
            // alone is over the minimum).
            prop_assert!(used + 1 >= 2 * asks.len(), "{} of {}", used, 2 * asks.len());
        }
    }

    #[test]
    fn the_cut_is_exact_only_without_crossing_tokens() {
        let llama = Native::Llama3Instruct { bos: "<s>".into() };
        let ok = ["<|start_header_id|>", "<|eot_id|>", "<|end_header_id|>"];
        assert!(head_split_is_exact(&llama, ok.into_iter()));
        // The start must itself be an added token.
        assert!(!head_split_is_exact(&llama, ["<|eot_id|>"].into_iter()));
        // A token whose end is the start's beginning could match across.
        for bad in ["x<|start", "ab<|start_header_id|>cd", "<|eot_id|><|"] {
            let tokens = ok.into_iter().chain([bad]);
            assert!(!head_split_is_exact(&llama, tokens), "{bad}");
        }
        assert!(head_split_is_exact(
            &Native::ChatMl,
            ["<|im_start|>", "<|im_end|>", "<|endoftext|>"].into_iter()
        ));
    }
}

//! [`ChatTokenizer`]: request -> token ids, the way vLLM computes them.

use super::cache::{CacheConfig, CacheStats, SegmentCache};
use super::files::TokenizerFiles;
use super::head::{self, ChatIds, HeadChains};
use super::presplit::FastPieces;
use super::split::{AddedSplitter, Piece};
use super::template::ChatTemplate;
use super::TokenizeError;
use crate::request::{ChatBody, FirstPrompt, Request, RequestBody};
use std::path::Path;
use std::str::FromStr;
use tokenizers::{Encoding, NormalizerWrapper, OffsetReferential, OffsetType, Token, Tokenizer};

/// A tokenizer with its chat template and a cache for long shared segments.
/// Share it behind an `Arc`: every method takes `&self`.
pub struct ChatTokenizer {
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    cache: SegmentCache,
    /// The short pieces' cache (see [`CacheConfig::short_capacity_tokens`]).
    short: SegmentCache,
    /// `Some` when cutting the text at added tokens ourselves is exactly what
    /// the library does (see [`ChatTokenizer::segment_cache_active`]); it holds
    /// the ids post-processing puts before and after a sequence when special
    /// tokens are added.
    segmenting: Option<SpecialWrap>,
    /// The fast exact cut at added tokens, when the configuration allows it;
    /// otherwise the library's own cut is used.
    splitter: Option<AddedSplitter>,
    /// The fast pre-tokenizer for pieces, when the configuration is one it
    /// reproduces exactly (see [`FastPieces`]).
    fast: Option<FastPieces>,
    /// Heads may be remembered ([`super::head`]): the cut at each message
    /// after the first is exact.
    head_split: bool,
}

/// The ids the post-processor adds around one sequence with special tokens on.
#[derive(Debug)]
struct SpecialWrap {
    before: Vec<u32>,
    after: Vec<u32>,
}

impl SpecialWrap {
    /// Finds the wrap by post-processing a one-id sequence. `None` when the
    /// post-processor changes a sequence without special tokens, or does more
    /// than put ids around it.
    fn probe(tokenizer: &Tokenizer) -> Option<Self> {
        const SENTINEL: u32 = u32::MAX;
        let probe = |add_special_tokens| {
            let one = Encoding::from_tokens(vec![Token::new(SENTINEL, String::new(), (0, 0))], 0);
            let out = tokenizer.post_process(one, None, add_special_tokens).ok()?;
            Some(out.get_ids().to_vec())
        };
        if probe(false)? != [SENTINEL] {
            return None;
        }
        let ids = probe(true)?;
        let at = ids.iter().position(|&i| i == SENTINEL)?;
        if ids[at + 1..].contains(&SENTINEL) {
            return None;
        }
        Some(SpecialWrap {
            before: ids[..at].to_vec(),
            after: ids[at + 1..].to_vec(),
        })
    }
}

impl std::fmt::Debug for ChatTokenizer {
    /// Short: the vocabulary itself is not printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTokenizer")
            .field("vocab_size", &self.tokenizer.get_vocab_size(true))
            .field("chat_template", &self.template.is_some())
            .field("segment_cache_active", &self.segment_cache_active())
            .field("cache", &self.cache)
            .finish()
    }
}

impl ChatTokenizer {
    /// Builds from loaded files; compiles the chat template if there is one.
    pub fn new(files: &TokenizerFiles, cache: CacheConfig) -> Result<Self, TokenizeError> {
        let tokenizer = Tokenizer::from_str(&files.tokenizer_json).map_err(TokenizeError::Load)?;
        let template = files
            .chat_template
            .as_deref()
            .map(|t| ChatTemplate::new(t, files.special_tokens.clone()))
            .transpose()?;
        let added = tokenizer.get_added_tokens_decoder();
        let has_normalizer = tokenizer.get_normalizer().is_some();
        let splitting_is_exact = tokenizer.get_truncation().is_none()
            && tokenizer.get_padding().is_none()
            && added
                .values()
                .all(|t| !(t.single_word || has_normalizer && t.normalized));
        let segmenting = if splitting_is_exact {
            SpecialWrap::probe(&tokenizer)
        } else {
            None
        };
        let splitter = segmenting
            .as_ref()
            .and_then(|_| AddedSplitter::new(&tokenizer));
        let fast = segmenting
            .as_ref()
            .and_then(|_| FastPieces::new(&tokenizer));
        let head_split = splitter.is_some()
            && template
                .as_ref()
                .and_then(ChatTemplate::native)
                .is_some_and(|n| {
                    head::head_split_is_exact(n, added.values().map(|t| t.content.as_str()))
                });
        Ok(ChatTokenizer {
            head_split,
            tokenizer,
            template,
            cache: SegmentCache::new(cache),
            short: SegmentCache::short_pieces(cache),
            segmenting,
            splitter,
            fast,
        })
    }

    /// Loads a tokenizer.json or a model folder (see [`TokenizerFiles::load`])
    /// with the default cache sizing. Reads files: start-up only.
    pub fn load(path: &Path) -> Result<Self, TokenizeError> {
        Self::new(&TokenizerFiles::load(path)?, CacheConfig::default())
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Whether chat requests can be rendered.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// Whether long segments are served from the cache. False when the cache is
    /// sized 0, when tokenizer.json sets truncation or padding, or when it has
    /// added tokens whose matching depends on context (`single_word`, or
    /// `normalized` with a normalizer): then every text is tokenized whole,
    /// which is always exact.
    pub fn segment_cache_active(&self) -> bool {
        self.segmenting.is_some() && self.cache.config().capacity_tokens > 0
    }

    /// Segment cache counters (the long segments).
    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// The short pieces' cache counters.
    pub fn short_cache_stats(&self) -> CacheStats {
        self.short.stats()
    }

    /// Renders a chat with the model's template.
    pub fn render_chat(&self, chat: &ChatBody<'_>) -> Result<String, TokenizeError> {
        self.template
            .as_ref()
            .ok_or(TokenizeError::NoChatTemplate)?
            .render(chat)
    }

    /// The token ids vLLM would compute for the request: chat -> rendered text
    /// without added special tokens; completion text -> with special tokens;
    /// token ids -> as given. For a batch prompt, the first prompt.
    pub fn encode_request(&self, req: &Request<'_>) -> Result<Vec<u32>, TokenizeError> {
        match &req.body {
            RequestBody::Chat(chat) => self.encode_text(&self.render_chat(chat)?, false),
            RequestBody::Completion(p) => match p.first() {
                FirstPrompt::Text(t) => self.encode_text(t, true),
                FirstPrompt::Ids(ids) => Ok(ids.to_vec()),
            },
        }
    }

    /// Whether chat heads can be remembered with this tokenizer: a native
    /// chat template whose per-message cut the tokenizer keeps (see
    /// [`super::head`]).
    pub fn remembers_heads(&self) -> bool {
        self.head_split
    }

    /// The ids of `req`, ready for [`ChatIds::block_hashes`] under `seed`
    /// and `block_size`: a chat whose head `heads` remembers is rendered
    /// and tokenized only after that head (see [`super::head`]); any other
    /// request is encoded whole by [`encode_request`](Self::encode_request).
    /// The hashes equal those of the whole request's ids either way.
    pub fn encode_request_remembering(
        &self,
        req: &Request<'_>,
        seed: crate::HashSeed,
        block_size: usize,
        heads: &HeadChains,
    ) -> Result<ChatIds, TokenizeError> {
        let whole = |ids| Ok(ChatIds::whole(seed, block_size, ids));
        let (RequestBody::Chat(chat), true, Some(native)) = (
            &req.body,
            self.head_split && heads.enabled() && block_size > 0,
            self.template.as_ref().and_then(ChatTemplate::native),
        ) else {
            return whole(self.encode_request(req)?);
        };
        let keys = match native.head_keys(chat, &head::salt(seed, block_size)) {
            Some(keys) if !chat.continue_final_message => keys,
            _ => return whole(self.encode_request(req)?),
        };
        let worth = |k: &&super::native::HeadKey| k.len >= head::MIN_HEAD_BYTES;
        for key in keys.iter().rev().take(head::MAX_PROBES).take_while(worth) {
            if let Some(chain) = heads.get(key) {
                let Some(rest) = native.render_from(chat, key.messages) else {
                    break;
                };
                let ids = self.encode_text(&rest, false)?;
                return Ok(ChatIds::after(seed, block_size, chain, ids));
            }
        }
        let text = self.render_chat(chat)?;
        let ids = self.encode_text(&text, false)?;
        // Remember the longest head, once its cut is seen to hold here.
        let Some(key) = keys.last().filter(worth) else {
            return whole(ids);
        };
        let (Some(head), Some(rest)) = (text.get(..key.len), text.get(key.len..)) else {
            return whole(ids);
        };
        let head_ids = self.encode_text(head, false)?;
        let exact =
            ids.starts_with(&head_ids) && self.encode_text(rest, false)? == ids[head_ids.len()..];
        if exact {
            let n = head_ids.len();
            Ok(ChatIds::remembering(seed, block_size, ids, *key, n))
        } else {
            whole(ids)
        }
    }

    /// Encodes `text`, serving long segments from the cache. Always equal to
    /// [`encode_text_uncached`](Self::encode_text_uncached).
    pub fn encode_text(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizeError> {
        // Cut and encode piece by piece when the cut is exact and either the
        // text is long enough to be worth caching or the pieces have the fast
        // pre-tokenizer (which beats one library call even uncached).
        let wrap = match &self.segmenting {
            Some(wrap) if self.fast.is_some() || self.cache.is_cacheable(text.len()) => wrap,
            _ => return self.encode_text_uncached(text, add_special_tokens),
        };
        // The library cuts the input at added tokens before anything else
        // (normalizer, pre-tokenizer, model) runs; each piece between them is
        // tokenized on its own. Do the same cut, and cache the long pieces.
        let mut ids = Vec::with_capacity(text.len() / 3);
        if add_special_tokens {
            ids.extend_from_slice(&wrap.before);
        }
        let text_piece = |ids: &mut Vec<u32>, piece: &str| -> Result<(), TokenizeError> {
            let cache = if self.cache.is_cacheable(piece.len()) {
                Some(&self.cache)
            } else if self.short.is_cacheable(piece.len()) {
                Some(&self.short)
            } else {
                None
            };
            if let Some(cache) = cache {
                let cached = cache.get_or_encode(piece, |p| self.encode_piece(p))?;
                ids.extend_from_slice(&cached);
            } else {
                ids.extend(self.encode_piece(piece)?);
            }
            Ok(())
        };
        match &self.splitter {
            Some(splitter) => splitter.split(text, |piece| match piece {
                Piece::Added(id) => {
                    ids.push(id);
                    Ok(())
                }
                Piece::Text(t) => text_piece(&mut ids, t),
            })?,
            None => {
                let pieces = self
                    .tokenizer
                    .get_added_vocabulary()
                    .extract_and_normalize(None::<&NormalizerWrapper>, text);
                for (piece, _, added) in
                    pieces.get_splits(OffsetReferential::Original, OffsetType::None)
                {
                    match added {
                        Some(tokens) => ids.extend(tokens.iter().map(|t| t.id)),
                        None => text_piece(&mut ids, piece)?,
                    }
                }
            }
        }
        // Without truncation or padding, post-processing only puts the probed
        // ids around the sequence.
        if add_special_tokens {
            ids.extend_from_slice(&wrap.after);
        }
        Ok(ids)
    }

    /// Encodes `text` with the library in one go, no cache.
    pub fn encode_text_uncached(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizeError> {
        let enc = self
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(TokenizeError::Encode)?;
        Ok(enc.get_ids().to_vec())
    }

    /// One piece that holds no added token, without special tokens.
    fn encode_piece(&self, piece: &str) -> Result<Vec<u32>, TokenizeError> {
        match &self.fast {
            Some(fast) => {
                let mut ids = Vec::with_capacity(piece.len() / 3 + 1);
                fast.encode(&self.tokenizer, piece, &mut ids)?;
                Ok(ids)
            }
            None => self.encode_text_uncached(piece, false),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::request::Expect;
    use crate::tokenize::tiny;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn tiny_tok(cache: CacheConfig) -> ChatTokenizer {
        ChatTokenizer::new(&tiny::files().unwrap(), cache).unwrap()
    }

    fn small_segments() -> CacheConfig {
        CacheConfig {
            min_segment_bytes: 8,
            capacity_tokens: 1 << 16,
            short_capacity_tokens: 64,
        }
    }

    fn req(v: &Value) -> Request<'_> {
        Request::from_value(v, Expect::Any).unwrap()
    }

    const RENDERED: &str = "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is the capital of France?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";

    #[test]
    fn chat_with_system_prompt_renders_like_llama3() {
        let t = tiny_tok(CacheConfig::default());
        let v = json!({"model": "tiny", "messages": [
            {"role": "system", "content": "You are a helpful assistant.  "},
            {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}]});
        let r = req(&v);
        let RequestBody::Chat(chat) = &r.body else {
            panic!("chat")
        };
        assert_eq!(t.render_chat(chat).unwrap(), RENDERED);
        let ids = t.encode_request(&r).unwrap();
        let plain = t
            .tokenizer()
            .encode(RENDERED, false)
            .unwrap()
            .get_ids()
            .to_vec();
        assert_eq!(ids, plain);
        assert_eq!(ids[0], tiny::BOS_ID);
        assert_eq!(
            ids.iter().filter(|&&i| i == tiny::BOS_ID).count(),
            1,
            "BOS only once"
        );
        assert_eq!(ids.iter().filter(|&&i| i == tiny::EOT_ID_ID).count(), 2);
        assert_eq!(
            &ids[ids.len() - 2..],
            &t.encode_text_uncached("<|end_header_id|>\n\n", false)
                .unwrap()[..]
        );
    }

    #[test]
    fn completions_and_id_prompts() {
        let t = tiny_tok(CacheConfig::default());
        assert!(
            format!("{t:?}").len() < 400,
            "Debug does not print the vocabulary"
        );
        let v = json!({"model": "tiny", "prompt": ["Once upon a time", "x"]});
        let ids = t.encode_request(&req(&v)).unwrap();
        assert_eq!(ids[0], tiny::BOS_ID);
        assert_eq!(
            ids,
            t.tokenizer()
                .encode("Once upon a time", true)
                .unwrap()
                .get_ids()
        );
        let v = json!({"model": "tiny", "prompt": [5, 6, 7]});
        assert_eq!(t.encode_request(&req(&v)).unwrap(), vec![5, 6, 7]);
    }

    #[test]
    fn no_template_means_no_chat() {
        let files = TokenizerFiles::from_strings(tiny::tokenizer_json(), None).unwrap();
        let t = ChatTokenizer::new(&files, CacheConfig::default()).unwrap();
        assert!(!t.has_chat_template());
        let v = json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}]});
        assert!(matches!(
            t.encode_request(&req(&v)),
            Err(TokenizeError::NoChatTemplate)
        ));
        let v = json!({"model": "tiny", "prompt": "hi"});
        assert!(t.encode_request(&req(&v)).is_ok());
        let bad = TokenizerFiles::from_strings("{}".into(), None).unwrap();
        assert!(matches!(
            ChatTokenizer::new(&bad, CacheConfig::default()),
            Err(TokenizeError::Load(_))
        ));
    }

    #[test]
    fn repeated_long_system_prompt_hits_the_cache() {
        let t = tiny_tok(CacheConfig {
            min_segment_bytes: 256,
            capacity_tokens: 1 << 20,
            ..CacheConfig::default()
        });
        assert!(t.segment_cache_active());
        let system = "Please read the document below and answer the questions. ".repeat(40);
        for q in ["first question?", "second question?", "third?"] {
            let v = json!({"model": "tiny", "messages": [
                {"role": "system", "content": system}, {"role": "user", "content": q}]});
            let r = req(&v);
            let RequestBody::Chat(chat) = &r.body else {
                panic!("chat")
            };
            let rendered = t.render_chat(chat).unwrap();
            assert_eq!(
                t.encode_request(&r).unwrap(),
                t.encode_text_uncached(&rendered, false).unwrap()
            );
        }
        let s = t.cache_stats();
        assert_eq!((s.misses, s.hits, s.entries), (1, 2, 1), "{s:?}");
        assert!(s.tokens > 400);
        // Role headers and the text between special tokens repeat: the
        // short-piece cache serves them from the second request on.
        let short = t.short_cache_stats();
        assert!(short.hits >= 4 && short.tokens > 0, "{short:?}");
    }

    #[test]
    fn context_dependent_added_tokens_disable_the_cache_but_stay_exact() {
        let mut doc: Value = serde_json::from_str(&tiny::tokenizer_json()).unwrap();
        doc["added_tokens"].as_array_mut().unwrap().push(json!({
            "id": tiny::VOCAB_SIZE, "content": "cat", "single_word": true, "lstrip": false,
            "rstrip": false, "normalized": false, "special": false}));
        let files = TokenizerFiles::from_strings(doc.to_string(), None).unwrap();
        let t = ChatTokenizer::new(&files, small_segments()).unwrap();
        assert!(!t.segment_cache_active());
        let text = "<|eot_id|>cat concatenate the cat<|eot_id|>";
        assert_eq!(
            t.encode_text(text, true).unwrap(),
            t.encode_text_uncached(text, true).unwrap()
        );
        assert_eq!(t.cache_stats().misses, 0);
    }

    #[test]
    fn special_wrap_is_probed_from_the_post_processor() {
        let t = tiny_tok(small_segments());
        let wrap = t.segmenting.as_ref().unwrap();
        assert_eq!(
            (&wrap.before[..], &wrap.after[..]),
            (&[tiny::BOS_ID][..], &[][..])
        );
        // A processor that closes the sequence too ("BOS $A EOT").
        let mut doc: Value = serde_json::from_str(&tiny::tokenizer_json()).unwrap();
        let eot = json!({"SpecialToken": {"id": tiny::EOT_ID, "type_id": 0}});
        doc["post_processor"]["single"]
            .as_array_mut()
            .unwrap()
            .push(eot);
        doc["post_processor"]["special_tokens"][tiny::EOT_ID] =
            json!({"id": tiny::EOT_ID, "ids": [tiny::EOT_ID_ID], "tokens": [tiny::EOT_ID]});
        let files = TokenizerFiles::from_strings(doc.to_string(), None).unwrap();
        let t = ChatTokenizer::new(&files, small_segments()).unwrap();
        assert!(t.segment_cache_active());
        let text = format!("{}<|eot_id|>tail", tiny::corpus_slice(0, 300));
        let ids = t.encode_text(&text, true).unwrap();
        assert_eq!(ids, t.encode_text_uncached(&text, true).unwrap());
        assert_eq!(
            (ids[0], ids[ids.len() - 1]),
            (tiny::BOS_ID, tiny::EOT_ID_ID)
        );
        assert!(t.cache_stats().misses > 0, "the cached path was taken");
    }

    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(tiny::BEGIN_OF_TEXT.to_string()),
            Just(tiny::EOT_ID.to_string()),
            Just("<|start_header_id|>user<|end_header_id|>\n\n".to_string()),
            Just("<|eot".to_string()),
            Just("|>".to_string()),
            "[a-zA-Z .,!?\n]{0,80}",
            "\\PC{0,40}",
            (0usize..5000, 1usize..600).prop_map(|(at, len)| { tiny::corpus_slice(at, len) }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Segment-cached tokenization equals plain tokenization, cold and warm,
        /// with and without special tokens.
        #[test]
        fn cached_equals_plain(pieces in proptest::collection::vec(piece(), 0..8), special in any::<bool>()) {
            let t = tiny_tok(small_segments());
            let text: String = pieces.concat();
            let plain = t.encode_text_uncached(&text, special).unwrap();
            prop_assert_eq!(&t.encode_text(&text, special).unwrap(), &plain, "cold");
            prop_assert_eq!(&t.encode_text(&text, special).unwrap(), &plain, "warm");
            // Caches off: still cut at added tokens, every piece through the
            // fast pre-tokenizer.
            let off = tiny_tok(CacheConfig { capacity_tokens: 0, short_capacity_tokens: 0, ..small_segments() });
            prop_assert_eq!(&off.encode_text(&text, special).unwrap(), &plain, "caches off");
        }
    }
}

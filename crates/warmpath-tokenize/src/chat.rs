//! [`ChatTokenizer`]: request -> token ids, the way vLLM computes them.

use super::error::TokenizeError;
use super::fast::{CacheConfig, FastPath};
use super::files::TokenizerFiles;
use super::template::ChatTemplate;
use super::weighted_lru::CacheStats;
use std::path::Path;
use std::str::FromStr;
use tokenizers::Tokenizer;
use warmpath_request::{ChatBody, FirstPrompt, Request, RequestBody};

/// A tokenizer with its chat template and the fast path's memo.
/// Share it behind an `Arc`: every method takes `&self`.
pub struct ChatTokenizer {
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    /// `Some` when the fast path is exact for this tokenizer (`super::fast`).
    fast: Option<FastPath>,
}

impl std::fmt::Debug for ChatTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTokenizer")
            .field("vocab_size", &self.tokenizer.get_vocab_size(true))
            .field("chat_template", &self.template.is_some())
            .field("fast_path", &self.fast.is_some())
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
        Ok(ChatTokenizer {
            fast: FastPath::new(&tokenizer, cache),
            tokenizer,
            template,
        })
    }

    /// Loads a tokenizer.json or a model folder (see [`TokenizerFiles::load`])
    /// with the default memo sizing. Reads files: start-up only.
    pub fn load(path: &Path) -> Result<Self, TokenizeError> {
        Self::new(&TokenizerFiles::load(path)?, CacheConfig::default())
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Whether chat requests can be rendered.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// The chunk memo's counters (zero without the fast path).
    pub fn chunk_stats(&self) -> CacheStats {
        self.fast
            .as_ref()
            .map(FastPath::chunk_stats)
            .unwrap_or_default()
    }

    /// The pre-split's word cache counters, when there is one.
    pub fn word_stats(&self) -> Option<CacheStats> {
        self.fast.as_ref().and_then(FastPath::word_stats)
    }

    /// Renders a chat with the model's template.
    pub fn render_chat(&self, chat: &ChatBody<'_>) -> Result<String, TokenizeError> {
        self.template
            .as_ref()
            .ok_or(TokenizeError::NoChatTemplate)?
            .render(chat)
    }

    /// The token ids vLLM would compute for the request (for a batch, its first
    /// prompt); see docs/tokenization.md.
    pub fn encode_request(&self, req: &Request<'_>) -> Result<Vec<u32>, TokenizeError> {
        self.encode_request_capped(req, None)
    }

    /// [`encode_request`](Self::encode_request), refusing more than `cap` tokens
    /// ([`TokenizeError::PromptTooLong`]); the fast path stops soon after the
    /// cap, so the work is bounded by the cap, not by the prompt's length.
    pub fn encode_request_capped(
        &self,
        req: &Request<'_>,
        cap: Option<usize>,
    ) -> Result<Vec<u32>, TokenizeError> {
        let ids = match &req.body {
            RequestBody::Chat(chat) => {
                self.encode_text_capped(&self.render_chat(chat)?, false, cap)
            }
            RequestBody::Completion(p) => match p.first() {
                FirstPrompt::Text(t) => self.encode_text_capped(t, true, cap),
                FirstPrompt::Ids(ids) => Ok(ids.to_vec()),
            },
        }?;
        match cap {
            Some(cap) if ids.len() > cap => Err(TokenizeError::PromptTooLong {
                cap,
                seen: ids.len(),
                complete: true,
            }),
            _ => Ok(ids),
        }
    }

    /// Equal to [`encode_text_uncached`](Self::encode_text_uncached), by the fast path if any.
    pub fn encode_text(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizeError> {
        self.encode_text_capped(text, add_special_tokens, None)
    }

    fn encode_text_capped(
        &self,
        text: &str,
        add_special_tokens: bool,
        cap: Option<usize>,
    ) -> Result<Vec<u32>, TokenizeError> {
        match &self.fast {
            Some(fast) => fast.encode(&self.tokenizer, text, add_special_tokens, cap),
            None => self.encode_text_uncached(text, add_special_tokens),
        }
    }

    /// Encodes `text` with the library in one go, no memo.
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
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::tiny;
    use serde_json::{json, Value};
    use warmpath_request::Expect;

    fn tiny_tok(cache: CacheConfig) -> ChatTokenizer {
        ChatTokenizer::new(&tiny::files().unwrap(), cache).unwrap()
    }

    fn small_segments() -> CacheConfig {
        CacheConfig {
            min_segment_bytes: 8,
            capacity_tokens: 1 << 16,
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
    fn repeated_long_system_prompt_hits_the_memo() {
        let t = tiny_tok(CacheConfig {
            min_segment_bytes: 256,
            capacity_tokens: 1 << 20,
        });
        assert!(t.fast.as_ref().is_some_and(FastPath::chunks_pieces));
        let system = tiny::corpus_slice(0, 3000);
        let mut misses = Vec::new();
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
            misses.push(t.chunk_stats().misses);
        }
        let s = t.chunk_stats();
        assert!(misses[0] > 1, "the system prompt is cut into chunks");
        assert_eq!(misses[2], misses[0], "{s:?}: nothing new after the first");
        assert_eq!(s.hits, 2 * misses[0]);
        assert!(s.tokens > 400);
        let words = t.word_stats().unwrap();
        assert!(words.hits > 0 && words.entries > 0, "{words:?}");
    }

    #[test]
    fn context_dependent_added_tokens_disable_the_cache_but_stay_exact() {
        let mut doc: Value = serde_json::from_str(&tiny::tokenizer_json()).unwrap();
        doc["added_tokens"].as_array_mut().unwrap().push(json!({
            "id": tiny::VOCAB_SIZE, "content": "cat", "single_word": true, "lstrip": false,
            "rstrip": false, "normalized": false, "special": false}));
        let files = TokenizerFiles::from_strings(doc.to_string(), None).unwrap();
        let t = ChatTokenizer::new(&files, small_segments()).unwrap();
        assert!(t.fast.is_none());
        let text = "<|eot_id|>cat concatenate the cat<|eot_id|>";
        assert_eq!(
            t.encode_text(text, true).unwrap(),
            t.encode_text_uncached(text, true).unwrap()
        );
        assert_eq!(t.chunk_stats().misses, 0);
    }

    #[test]
    fn special_wrap_is_probed_from_the_post_processor() {
        let t = tiny_tok(small_segments());
        assert_eq!(
            t.encode_text("x", true).unwrap(),
            t.encode_text_uncached("x", true).unwrap()
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
        assert!(t.fast.is_some());
        let text = format!("{}<|eot_id|>tail", tiny::corpus_slice(0, 300));
        let ids = t.encode_text(&text, true).unwrap();
        assert_eq!(ids, t.encode_text_uncached(&text, true).unwrap());
        assert_eq!(
            (ids[0], ids[ids.len() - 1]),
            (tiny::BOS_ID, tiny::EOT_ID_ID)
        );
        assert!(t.chunk_stats().misses > 0, "the fast path was taken");
    }
}

//! OpenAI response bodies (chat and text completions, whole and streamed) and
//! incremental detokenization for streaming.

use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use warmpath_core::tokenize::ChatTokenizer;

/// Which API a request came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

impl Kind {
    /// A short label for metrics.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Chat => "chat",
            Kind::Completion => "completion",
        }
    }
}

/// Seconds since the Unix epoch.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The fields every body of one response repeats.
#[derive(Clone, Debug)]
pub struct Meta {
    /// Chat or completion.
    pub kind: Kind,
    id: String,
    model: String,
    created: u64,
    prompt_tokens: usize,
}

impl Meta {
    /// A fresh response id for `model`.
    pub fn new(kind: Kind, model: &str, prompt_tokens: usize) -> Self {
        let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        let id = match kind {
            Kind::Chat => format!("chatcmpl-{n:016x}"),
            Kind::Completion => format!("cmpl-{n:016x}"),
        };
        Meta {
            kind,
            id,
            model: model.to_owned(),
            created: now(),
            prompt_tokens,
        }
    }

    /// The `usage` object, with vLLM's `prompt_tokens_details.cached_tokens`.
    pub fn usage(&self, completion_tokens: usize, cached_tokens: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens},
        })
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
            (Kind::Completion, _) => "text_completion",
        }
    }

    fn envelope(&self, chunk: bool, choices: Value) -> Value {
        json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }

    /// A whole (non-streamed) response.
    pub fn full(&self, text: &str, finish: Option<&str>, usage: Value) -> Value {
        let choice = match self.kind {
            Kind::Chat => json!({"index": 0, "message": {"role": "assistant", "content": text},
                                 "logprobs": null, "finish_reason": finish}),
            Kind::Completion => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
            }
        };
        let mut v = self.envelope(false, json!([choice]));
        v["usage"] = usage;
        v
    }

    /// The first chat chunk, announcing the assistant role.
    pub fn chunk_role(&self) -> Value {
        self.envelope(
            true,
            json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
        )
    }

    /// A chunk carrying `text` (and, on the last one, the finish reason).
    pub fn chunk(&self, text: &str, finish: Option<&str>) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let delta = if text.is_empty() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
            Kind::Completion => {
                json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
            }
        };
        self.envelope(true, json!([choice]))
    }

    /// The final usage-only chunk (`stream_options.include_usage`).
    pub fn usage_chunk(&self, usage: Value) -> Value {
        let mut v = self.envelope(true, json!([]));
        v["usage"] = usage;
        v
    }
}

/// Turns a growing list of ids into text pieces without splitting a UTF-8
/// character that spans several byte-level tokens.
#[derive(Debug, Default)]
pub struct IncrementalText {
    sent: String,
}

impl IncrementalText {
    /// The new text since the last call. Unless `last`, text ending in an
    /// incomplete character (U+FFFD) is held back.
    pub fn advance(&mut self, tok: &ChatTokenizer, ids: &[u32], last: bool) -> String {
        let Ok(text) = tok.tokenizer().decode(ids, true) else {
            return String::new();
        };
        if !last && text.ends_with('\u{FFFD}') {
            return String::new();
        }
        match text.strip_prefix(self.sent.as_str()) {
            Some(rest) => {
                let piece = rest.to_owned();
                self.sent = text;
                piece
            }
            // Decoding changed earlier text (rare); send nothing until it settles.
            None => String::new(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use warmpath_core::tokenize::{tiny, CacheConfig};

    #[test]
    fn bodies_have_openai_shape() {
        let m = Meta::new(Kind::Chat, "tiny", 10);
        let v = m.full("hi", Some("length"), m.usage(2, 8));
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["choices"][0]["message"]["content"], "hi");
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
        assert_eq!(v["usage"]["total_tokens"], 12);
        assert_eq!(m.chunk("", Some("stop"))["choices"][0]["delta"], json!({}));
        let c = Meta::new(Kind::Completion, "tiny", 3);
        assert_eq!(c.chunk("x", None)["choices"][0]["text"], "x");
        assert_ne!(m.id, c.id);
    }

    #[test]
    fn incremental_text_reassembles_multibyte_characters() {
        let tok = ChatTokenizer::new(&tiny::files().unwrap(), CacheConfig::default()).unwrap();
        let text = "naïve café – ok";
        let ids = tok.encode_text(text, false).unwrap();
        let mut inc = IncrementalText::default();
        let mut out = String::new();
        for i in 1..=ids.len() {
            let piece = inc.advance(&tok, &ids[..i], i == ids.len());
            assert!(!piece.contains('\u{FFFD}'));
            out.push_str(&piece);
        }
        assert_eq!(out, text);
    }
}

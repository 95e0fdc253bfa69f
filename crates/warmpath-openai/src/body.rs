//! OpenAI response bodies as vLLM writes them: whole and streamed, chat and
//! text completions.

use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};

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
                                 "logprobs": null, "finish_reason": finish, "stop_reason": null}),
            Kind::Completion => json!({"index": 0, "text": text, "logprobs": null,
                                       "finish_reason": finish, "stop_reason": null}),
        };
        let mut v = self.envelope(false, json!([choice]));
        v["usage"] = usage;
        v
    }

    /// One streamed chunk carrying `text`; the `first` chat chunk also carries
    /// the assistant role, and the last one (with `finish`) an empty delta.
    pub fn chunk(&self, text: &str, first: bool, finish: Option<&str>) -> Value {
        let choice = match self.kind {
            Kind::Chat => {
                let delta = match (first, finish) {
                    (_, Some(_)) => json!({}),
                    (true, None) => json!({"role": "assistant", "content": text}),
                    (false, None) => json!({"content": text}),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_have_vllm_shapes() {
        let m = Meta::new(Kind::Chat, "m", 10);
        let full = m.full("hi", Some("length"), m.usage(2, 8));
        assert_eq!(full["object"], "chat.completion");
        assert_eq!(full["choices"][0]["message"]["content"], "hi");
        assert_eq!(full["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
        assert_eq!(full["usage"]["total_tokens"], 12);
        let first = m.chunk("a", true, None);
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(first["object"], "chat.completion.chunk");
        let last = m.chunk("", false, Some("length"));
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert_eq!(last["choices"][0]["delta"], json!({}));
        assert_eq!(m.usage_chunk(m.usage(1, 0))["choices"], json!([]));
        let c = Meta::new(Kind::Completion, "m", 3);
        assert_eq!(c.full("x", None, Value::Null)["choices"][0]["text"], "x");
        assert_eq!(c.chunk("y", true, None)["object"], "text_completion");
        assert_ne!(m.id, c.id);
    }
}

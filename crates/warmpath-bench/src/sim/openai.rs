//! OpenAI-shaped bodies as vLLM writes them (whole and streamed), and errors.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The fields every body of one response repeats.
#[derive(Clone, Debug)]
pub(crate) struct Meta {
    pub(crate) chat: bool,
    id: String,
    model: String,
    created: u64,
}

impl Meta {
    pub(crate) fn new(chat: bool, model: &str) -> Self {
        let n = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Meta {
            chat,
            id: if chat {
                format!("chatcmpl-sim{n:012x}")
            } else {
                format!("cmpl-sim{n:012x}")
            },
            model: model.to_owned(),
            created: unix_now(),
        }
    }

    /// `usage` with `prompt_tokens_details.cached_tokens`.
    pub(crate) fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
        json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }

    /// A whole (non-streamed) response.
    pub(crate) fn full(&self, text: &str, usage: Value) -> Value {
        let choice = if self.chat {
            json!({"index": 0, "message": {"role": "assistant", "content": text},
                   "logprobs": null, "finish_reason": "length", "stop_reason": null})
        } else {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": "length",
                   "stop_reason": null})
        };
        json!({
            "id": self.id, "object": if self.chat { "chat.completion" } else { "text_completion" },
            "created": self.created, "model": self.model, "choices": [choice], "usage": usage,
        })
    }

    /// One streamed chunk: the first carries the assistant role (chat).
    pub(crate) fn chunk(&self, text: &str, first: bool, finish: Option<&str>) -> Value {
        let choice = if self.chat {
            let delta = match (first, finish) {
                (_, Some(_)) => json!({}),
                (true, None) => json!({"role": "assistant", "content": text}),
                (false, None) => json!({"content": text}),
            };
            json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
        } else {
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish})
        };
        self.wrap(json!([choice]), None)
    }

    /// The final usage chunk (`stream_options.include_usage`).
    pub(crate) fn usage_chunk(&self, usage: Value) -> Value {
        self.wrap(json!([]), Some(usage))
    }

    fn wrap(&self, choices: Value, usage: Option<Value>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": if self.chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created, "model": self.model, "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }
}

/// An error answer in OpenAI's shape.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = match self.status {
            StatusCode::NOT_FOUND => "NotFoundError",
            s if s.is_client_error() => "BadRequestError",
            _ => "InternalServerError",
        };
        metrics::counter!("warmpath_sim_http_errors_total", "status" => self.status.as_u16().to_string())
            .increment(1);
        let body = json!({"error": {"message": self.message, "type": kind, "param": null,
                                    "code": self.status.as_u16()}});
        (self.status, axum::Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_have_vllm_shapes() {
        let m = Meta::new(true, "m");
        let full = m.full("hi", Meta::usage(10, 2, 8));
        assert_eq!(full["object"], "chat.completion");
        assert_eq!(full["choices"][0]["message"]["content"], "hi");
        assert_eq!(full["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
        let first = m.chunk("a", true, None);
        assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(
            m.chunk("", false, Some("length"))["choices"][0]["finish_reason"],
            "length"
        );
        assert_eq!(m.usage_chunk(Meta::usage(1, 1, 0))["choices"], json!([]));
        let c = Meta::new(false, "m");
        assert_eq!(c.full("x", Value::Null)["choices"][0]["text"], "x");
        assert_eq!(c.chunk("y", true, None)["object"], "text_completion");
    }
}

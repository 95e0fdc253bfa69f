//! A workload's spec and the record of one request (generated or read from a trace).

use crate::error::{ensure, BenchError};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.to_owned(),
            content: content.into(),
        }
    }
}

/// A request whose `group` starts with this prefix is a turn of a
/// conversation, replayed closed loop like a chat client ([`crate::compare::driver`]);
/// its `max_tokens` is the length of the answer it asks for.
pub const CONVERSATION_PREFIX: &str = "conversation:";

/// How a request carries its tenant id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TenantVia {
    /// The body field `prompt_cache_key`.
    #[default]
    Body,
    /// The header `X-Prefix-Aware-Id`.
    Header,
}

/// One request of a trace (one JSONL line).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceRequest {
    /// Seconds from the start of the run.
    pub arrival: f64,
    pub model: String,
    /// Chat messages (chat completions API); exclusive with `prompt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<ChatMessage>>,
    /// A prompt (completions API); exclusive with `messages`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// Output tokens to generate.
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// Tenant id, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// How the tenant id is sent (body by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_via: Option<TenantVia>,
    /// The shared prefix this request belongs to (document, conversation,
    /// file), for reports; see also [`CONVERSATION_PREFIX`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

fn default_max_tokens() -> u32 {
    32
}

impl TraceRequest {
    pub fn path(&self) -> &'static str {
        if self.messages.is_some() {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        }
    }

    /// The conversation this request is a turn of, if any.
    pub fn conversation(&self) -> Option<&str> {
        self.messages.as_ref()?;
        self.group
            .as_deref()
            .filter(|g| g.starts_with(CONVERSATION_PREFIX))
    }

    pub fn header_tenant(&self) -> Option<&str> {
        match self.tenant_via {
            Some(TenantVia::Header) => self.tenant.as_deref(),
            _ => None,
        }
    }

    pub fn body(&self, stream: bool) -> serde_json::Value {
        let mut body = serde_json::json!({
            "model": self.model,
            "max_tokens": self.max_tokens,
            "stream": stream,
        });
        if stream {
            body["stream_options"] = serde_json::json!({"include_usage": true});
        }
        if let Some(m) = &self.messages {
            body["messages"] = serde_json::json!(m);
        } else {
            body["prompt"] = serde_json::json!(self.prompt.as_deref().unwrap_or(""));
        }
        if let (Some(t), None | Some(TenantVia::Body)) = (&self.tenant, self.tenant_via) {
            body["prompt_cache_key"] = serde_json::json!(t);
        }
        body
    }

    /// Checks the record: a finite arrival >= 0, exactly one of messages / prompt, a model.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.arrival.is_finite() && self.arrival >= 0.0) {
            return Err(format!("arrival {} must be a number >= 0", self.arrival));
        }
        if self.model.is_empty() {
            return Err("model must not be empty".into());
        }
        match (&self.messages, &self.prompt) {
            (Some(m), None) if m.is_empty() => Err("messages must not be empty".into()),
            (Some(_), None) | (None, Some(_)) => Ok(()),
            (Some(_), Some(_)) => Err("give either messages or prompt, not both".into()),
            (None, None) => Err("one of messages or prompt is required".into()),
        }
    }
}

/// The built-in workloads (`--workload long`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadKind {
    /// Shared ~8000-token documents + distinct questions.
    Long,
    /// Growing multi-turn chats.
    Short,
    /// System prompt + retrieved chunks + question.
    Rag,
    /// A source file + a short instruction (completions API).
    Code,
    /// One shared system prompt, several tenants.
    Tenants,
}

/// Everything that determines a generated trace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkloadSpec {
    pub kind: WorkloadKind,
    /// RNG seed: same seed, same requests.
    pub seed: u64,
    /// Mean arrivals per second (> 0).
    pub rate: f64,
    pub requests: usize,
    pub model: String,
    pub max_tokens: u32,
    /// Shared prefixes (documents, files, conversations in parallel).
    pub docs: usize,
    /// Zipf exponent of prefix popularity.
    pub zipf: f64,
    /// Tokens of a shared prefix.
    pub prefix_tokens: usize,
}

impl WorkloadSpec {
    pub fn new(kind: WorkloadKind) -> Self {
        WorkloadSpec {
            kind,
            seed: 42,
            rate: 10.0,
            requests: 1000,
            model: "warmpath-tiny".into(),
            max_tokens: 32,
            docs: match kind {
                WorkloadKind::Short => 64,
                WorkloadKind::Rag => 200,
                _ => 48,
            },
            zipf: 0.8,
            prefix_tokens: match kind {
                WorkloadKind::Long => 8000,
                WorkloadKind::Code => 3000,
                WorkloadKind::Tenants => 2000,
                WorkloadKind::Rag => 300,
                WorkloadKind::Short => 200,
            },
        }
    }

    pub fn validate(&self) -> Result<(), BenchError> {
        ensure(
            self.rate.is_finite() && self.rate > 0.0,
            "rate",
            "must be a number > 0",
        )?;
        ensure(self.docs > 0, "docs", "must be at least 1")?;
        ensure(self.max_tokens > 0, "max_tokens", "must be at least 1")?;
        ensure(
            self.zipf.is_finite() && self.zipf >= 0.0,
            "zipf",
            "must be a number >= 0",
        )?;
        ensure(!self.model.is_empty(), "model", "must not be empty")?;
        Ok(())
    }
}

/// Stretches a trace to a new mean rate (arrivals scaled by old / new).
pub fn rescale(trace: &[TraceRequest], old_rate: f64, new_rate: f64) -> Vec<TraceRequest> {
    let f = if new_rate > 0.0 {
        old_rate / new_rate
    } else {
        1.0
    };
    trace
        .iter()
        .map(|r| TraceRequest {
            arrival: r.arrival * f,
            ..r.clone()
        })
        .collect()
}

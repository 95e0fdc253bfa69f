//! An OpenAI chat or completion request, reduced to what routing, prefix hashing
//! and tokenization read. [`Request`] borrows from the body's bytes
//! ([`Request::parse`], one serde walk, see `walk.rs`), from a parsed
//! [`serde_json::Value`] ([`Request::from_value`], the same walk), or owns its
//! data. The shapes accepted (vLLM's) are listed in docs/tokenization.md; the
//! other endpoints' bodies are read by [`surface`].

use serde_json::{Map, Value};
use std::borrow::Cow;
use thiserror::Error;
use warmpath_hash::tenant::{TenantError, TenantId, TenantSource};

/// Why a request body was refused. Never retryable: the client must fix the body
/// (the router answers HTTP 400 with this message).
#[derive(Debug, Error)]
pub enum RequestError {
    /// The body is not JSON at all.
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(#[source] serde_json::Error),
    /// The body is JSON but not an object.
    #[error("request body must be a JSON object")]
    NotAnObject,
    /// A required field is absent (or null).
    #[error("request is missing the required field `{0}`")]
    Missing(&'static str),
    /// A field has the wrong JSON type or shape; `field` is a path such as
    /// `messages[2].content[0].text`.
    #[error("field `{field}` must be {expected}")]
    WrongType {
        field: String,
        expected: &'static str,
    },
    /// An array that must have at least one element is empty.
    #[error("field `{0}` must not be an empty array")]
    Empty(String),
    /// The endpoint accepts both kinds and the body has neither `messages` nor `prompt`.
    #[error("request has neither `messages` (chat) nor `prompt` (completion)")]
    UnknownKind,
}

/// Which kind of body the endpoint takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// `/v1/chat/completions`: `messages` is required.
    Chat,
    /// `/v1/completions`: `prompt` is required.
    Completion,
    /// Either (e.g. `/cache-index/query`): `messages` wins when both are present.
    Any,
}

/// A parsed request; `'a` borrows from the JSON value it was read from.
#[derive(Clone, Debug, PartialEq)]
pub struct Request<'a> {
    pub model: Cow<'a, str>,
    /// The `stream` field (false when absent or null).
    pub stream: bool,
    pub body: RequestBody<'a>,
    /// The `prompt_cache_key` field (a tenant id candidate, not yet validated).
    pub prompt_cache_key: Option<Cow<'a, str>>,
    /// The `cache_salt` field (a tenant id candidate, not yet validated).
    pub cache_salt: Option<Cow<'a, str>>,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_tokens: Option<u32>,
}

/// What the request asks the model to continue.
#[derive(Clone, Debug, PartialEq)]
pub enum RequestBody<'a> {
    Chat(ChatBody<'a>),
    Completion(Prompt<'a>),
}

/// The chat-specific part of a request.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatBody<'a> {
    /// The messages, in order; never empty.
    pub messages: Vec<Message<'a>>,
    /// `add_generation_prompt` (default true, as in vLLM).
    pub add_generation_prompt: bool,
    /// `continue_final_message` (default false, as in vLLM).
    pub continue_final_message: bool,
    /// `tools`, passed to the chat template as-is.
    pub tools: Option<Cow<'a, Value>>,
    /// `chat_template_kwargs`, extra template variables.
    pub chat_template_kwargs: Option<Cow<'a, Map<String, Value>>>,
}

/// One chat message.
#[derive(Clone, Debug, PartialEq)]
pub struct Message<'a> {
    pub role: Cow<'a, str>,
    /// `content`, reduced to its text.
    pub content: Content<'a>,
    /// The message's other fields as sent (`name`, `tool_calls`,
    /// `tool_call_id`, ...), for templates that read them; never `role` or
    /// `content`. Usually empty.
    pub extra: Map<String, Value>,
}

/// The text of a message's `content`.
#[derive(Clone, Debug, PartialEq)]
pub enum Content<'a> {
    /// `content` absent or null (e.g. an assistant message with tool calls).
    Empty,
    /// `content` as a string.
    Text(Cow<'a, str>),
    /// The `text` of every `{"type":"text"}` part, in order.
    Parts(Vec<Cow<'a, str>>),
}

impl Content<'_> {
    /// The content as one string: text parts are joined with `"\n"`, as vLLM
    /// does for text-only models.
    pub fn text(&self) -> Cow<'_, str> {
        match self {
            Content::Empty => Cow::Borrowed(""),
            Content::Text(t) => Cow::Borrowed(t.as_ref()),
            Content::Parts(ps) if ps.len() == 1 => Cow::Borrowed(ps[0].as_ref()),
            Content::Parts(ps) => Cow::Owned(ps.join("\n")),
        }
    }

    fn into_owned(self) -> Content<'static> {
        match self {
            Content::Empty => Content::Empty,
            Content::Text(t) => Content::Text(Cow::Owned(t.into_owned())),
            Content::Parts(ps) => {
                Content::Parts(ps.into_iter().map(|p| Cow::Owned(p.into_owned())).collect())
            }
        }
    }
}

/// A completion prompt.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt<'a> {
    Text(Cow<'a, str>),
    /// A batch of strings (never empty).
    Texts(Vec<Cow<'a, str>>),
    /// One prompt given as token ids (never empty).
    Ids(Vec<u32>),
    /// A batch of token-id prompts (never empty, none empty).
    IdBatches(Vec<Vec<u32>>),
}

/// The first prompt of a completion request: what routing looks at for a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstPrompt<'p> {
    Text(&'p str),
    Ids(&'p [u32]),
}

impl Prompt<'_> {
    /// The first prompt. A batch goes to one backend, so routing uses its first
    /// element; parsing guarantees there is one.
    pub fn first(&self) -> FirstPrompt<'_> {
        match self {
            Prompt::Text(t) => FirstPrompt::Text(t),
            Prompt::Texts(ts) => FirstPrompt::Text(ts.first().map_or("", |t| t.as_ref())),
            Prompt::Ids(ids) => FirstPrompt::Ids(ids),
            Prompt::IdBatches(bs) => FirstPrompt::Ids(bs.first().map_or(&[][..], |b| b.as_slice())),
        }
    }

    fn into_owned(self) -> Prompt<'static> {
        match self {
            Prompt::Text(t) => Prompt::Text(Cow::Owned(t.into_owned())),
            Prompt::Texts(ts) => {
                Prompt::Texts(ts.into_iter().map(|t| Cow::Owned(t.into_owned())).collect())
            }
            Prompt::Ids(ids) => Prompt::Ids(ids),
            Prompt::IdBatches(bs) => Prompt::IdBatches(bs),
        }
    }
}

impl<'a> Request<'a> {
    /// Detaches the request from the JSON value it borrows.
    pub fn into_owned(self) -> Request<'static> {
        let body = match self.body {
            RequestBody::Chat(c) => RequestBody::Chat(ChatBody {
                messages: c
                    .messages
                    .into_iter()
                    .map(|m| Message {
                        role: Cow::Owned(m.role.into_owned()),
                        content: m.content.into_owned(),
                        extra: m.extra,
                    })
                    .collect(),
                add_generation_prompt: c.add_generation_prompt,
                continue_final_message: c.continue_final_message,
                tools: c.tools.map(|t| Cow::Owned(t.into_owned())),
                chat_template_kwargs: c.chat_template_kwargs.map(|k| Cow::Owned(k.into_owned())),
            }),
            RequestBody::Completion(p) => RequestBody::Completion(p.into_owned()),
        };
        Request {
            model: Cow::Owned(self.model.into_owned()),
            stream: self.stream,
            body,
            prompt_cache_key: self.prompt_cache_key.map(|s| Cow::Owned(s.into_owned())),
            cache_salt: self.cache_salt.map(|s| Cow::Owned(s.into_owned())),
            max_tokens: self.max_tokens,
        }
    }

    /// The tenant by precedence: the `X-Prefix-Aware-Id` header, then
    /// `prompt_cache_key`, then `cache_salt`; the first present one is validated.
    pub fn tenant(&self, header: Option<&str>) -> Result<Option<TenantId>, TenantError> {
        let (key, salt) = (self.prompt_cache_key.as_deref(), self.cache_salt.as_deref());
        let found = header
            .map(|v| (v, TenantSource::Header))
            .or(key.map(|v| (v, TenantSource::PromptCacheKey)))
            .or(salt.map(|v| (v, TenantSource::CacheSalt)));
        found.map(|(v, src)| TenantId::parse(v, src)).transpose()
    }
}

impl Request<'static> {
    /// Parses a JSON body into an owned request.
    pub fn from_slice(body: &[u8], expect: Expect) -> Result<Self, RequestError> {
        Request::parse(body, expect).map(Request::into_owned)
    }
}

mod parse;
pub mod surface;
mod walk;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;

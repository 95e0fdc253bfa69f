//! An OpenAI chat or completion request, reduced to what routing needs.
//!
//! [`Request`] borrows from a parsed [`serde_json::Value`] ([`Request::from_value`])
//! or owns its data ([`Request::from_slice`], [`Request::into_owned`]). Only the
//! fields that routing, prefix hashing and tokenization read are kept; the
//! router forwards the original body untouched (apart from `cache_salt`).
//!
//! Accepted shapes (the ones vLLM accepts):
//! - `model`: string, required.
//! - `stream`: boolean or null (absent = false).
//! - chat: `messages`, a non-empty array of objects with a string `role` and a
//!   `content` that is a string, null/absent, or an array of parts where only
//!   `{"type":"text","text":...}` parts count (other part types are skipped).
//!   `add_generation_prompt` (default true), `continue_final_message` (default
//!   false), `tools` and `chat_template_kwargs` are kept for template rendering.
//! - completion: `prompt`, a string, a non-empty array of strings, a non-empty
//!   array of token ids, or a non-empty array of non-empty arrays of token ids.
//! - `prompt_cache_key`, `cache_salt`: string or null.
//! - `max_completion_tokens`, else `max_tokens`: non-negative integer or null.

use crate::tenant::{TenantError, TenantId, TenantSource};
use serde_json::{Map, Value};
use std::borrow::Cow;
use thiserror::Error;

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
        /// Where in the body.
        field: String,
        /// What was expected, in words.
        expected: &'static str,
    },
    /// An array that must have at least one element is empty.
    #[error("field `{0}` must not be an empty array")]
    Empty(String),
    /// The endpoint accepts both kinds and the body has neither `messages` nor `prompt`.
    #[error("request has neither `messages` (chat) nor `prompt` (completion)")]
    UnknownKind,
}

impl RequestError {
    /// Whether sending the same body again could succeed: never.
    pub fn is_retryable(&self) -> bool {
        false
    }
}

fn wrong(field: impl Into<String>, expected: &'static str) -> RequestError {
    RequestError::WrongType {
        field: field.into(),
        expected,
    }
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
    /// The `model` field.
    pub model: Cow<'a, str>,
    /// The `stream` field (false when absent or null).
    pub stream: bool,
    /// Chat messages or a completion prompt.
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
    /// A chat request.
    Chat(ChatBody<'a>),
    /// A completion request.
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
    /// `role`.
    pub role: Cow<'a, str>,
    /// `content`, reduced to its text.
    pub content: Content<'a>,
    /// The whole message object as sent, for templates that read other keys
    /// (`name`, `tool_calls`, `tool_call_id`).
    pub raw: Cow<'a, Value>,
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
    /// One string.
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
    /// A text prompt.
    Text(&'p str),
    /// A token-id prompt.
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
    /// Reads a request from a parsed JSON body.
    pub fn from_value(v: &'a Value, expect: Expect) -> Result<Self, RequestError> {
        let obj = v.as_object().ok_or(RequestError::NotAnObject)?;
        let model = match obj.get("model") {
            None | Some(Value::Null) => return Err(RequestError::Missing("model")),
            Some(Value::String(s)) => Cow::Borrowed(s.as_str()),
            Some(_) => return Err(wrong("model", "a string")),
        };
        let stream = opt_bool(obj, "stream")?.unwrap_or(false);
        let has = |k: &str| obj.get(k).is_some_and(|v| !v.is_null());
        let chat = match expect {
            Expect::Chat => true,
            Expect::Completion => false,
            Expect::Any if has("messages") => true,
            Expect::Any if has("prompt") => false,
            Expect::Any => return Err(RequestError::UnknownKind),
        };
        let body = if chat {
            RequestBody::Chat(parse_chat(obj)?)
        } else {
            RequestBody::Completion(parse_prompt(obj.get("prompt"))?)
        };
        let max_tokens = match opt_u32(obj, "max_completion_tokens")? {
            Some(n) => Some(n),
            None => opt_u32(obj, "max_tokens")?,
        };
        Ok(Request {
            model,
            stream,
            body,
            prompt_cache_key: opt_str(obj, "prompt_cache_key")?,
            cache_salt: opt_str(obj, "cache_salt")?,
            max_tokens,
        })
    }

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
                        raw: Cow::Owned(m.raw.into_owned()),
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
        let candidates = [
            (header, TenantSource::Header),
            (
                self.prompt_cache_key.as_deref(),
                TenantSource::PromptCacheKey,
            ),
            (self.cache_salt.as_deref(), TenantSource::CacheSalt),
        ];
        match candidates
            .into_iter()
            .find_map(|(v, src)| v.map(|v| (v, src)))
        {
            Some((v, src)) => TenantId::parse(v, src).map(Some),
            None => Ok(None),
        }
    }

    /// Whether this is a chat request.
    pub fn is_chat(&self) -> bool {
        matches!(self.body, RequestBody::Chat(_))
    }
}

impl Request<'static> {
    /// Parses a JSON body into an owned request.
    pub fn from_slice(body: &[u8], expect: Expect) -> Result<Self, RequestError> {
        let v: Value = serde_json::from_slice(body).map_err(RequestError::InvalidJson)?;
        Request::from_value(&v, expect).map(Request::into_owned)
    }
}

fn opt_bool(obj: &Map<String, Value>, key: &'static str) -> Result<Option<bool>, RequestError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(wrong(key, "a boolean")),
    }
}

fn opt_str<'a>(
    obj: &'a Map<String, Value>,
    key: &'static str,
) -> Result<Option<Cow<'a, str>>, RequestError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(Cow::Borrowed(s))),
        Some(_) => Err(wrong(key, "a string")),
    }
}

fn opt_u32(obj: &Map<String, Value>, key: &'static str) -> Result<Option<u32>, RequestError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| wrong(key, "a non-negative integer below 2^32")),
    }
}

fn parse_chat(obj: &Map<String, Value>) -> Result<ChatBody<'_>, RequestError> {
    let msgs = match obj.get("messages") {
        None | Some(Value::Null) => return Err(RequestError::Missing("messages")),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(wrong("messages", "an array of message objects")),
    };
    if msgs.is_empty() {
        return Err(RequestError::Empty("messages".into()));
    }
    let messages = msgs
        .iter()
        .enumerate()
        .map(|(i, m)| parse_message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let tools = match obj.get("tools") {
        None | Some(Value::Null) => None,
        Some(t @ Value::Array(_)) => Some(Cow::Borrowed(t)),
        Some(_) => return Err(wrong("tools", "an array")),
    };
    let chat_template_kwargs = match obj.get("chat_template_kwargs") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(Cow::Borrowed(m)),
        Some(_) => return Err(wrong("chat_template_kwargs", "an object")),
    };
    Ok(ChatBody {
        messages,
        add_generation_prompt: opt_bool(obj, "add_generation_prompt")?.unwrap_or(true),
        continue_final_message: opt_bool(obj, "continue_final_message")?.unwrap_or(false),
        tools,
        chat_template_kwargs,
    })
}

fn parse_message(i: usize, m: &Value) -> Result<Message<'_>, RequestError> {
    let obj = m
        .as_object()
        .ok_or_else(|| wrong(format!("messages[{i}]"), "an object"))?;
    let role = match obj.get("role") {
        Some(Value::String(r)) => Cow::Borrowed(r.as_str()),
        _ => return Err(wrong(format!("messages[{i}].role"), "a string")),
    };
    let content = match obj.get("content") {
        None | Some(Value::Null) => Content::Empty,
        Some(Value::String(s)) => Content::Text(Cow::Borrowed(s)),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                let kind = p.get("type").and_then(Value::as_str).ok_or_else(|| {
                    wrong(
                        format!("messages[{i}].content[{j}]"),
                        "an object with a string `type`",
                    )
                })?;
                if kind == "text" {
                    match p.get("text") {
                        Some(Value::String(t)) => texts.push(Cow::Borrowed(t.as_str())),
                        _ => {
                            return Err(wrong(
                                format!("messages[{i}].content[{j}].text"),
                                "a string",
                            ))
                        }
                    }
                }
            }
            Content::Parts(texts)
        }
        Some(_) => {
            return Err(wrong(
                format!("messages[{i}].content"),
                "a string, null or an array of content parts",
            ))
        }
    };
    Ok(Message {
        role,
        content,
        raw: Cow::Borrowed(m),
    })
}

fn parse_prompt(v: Option<&Value>) -> Result<Prompt<'_>, RequestError> {
    const SHAPES: &str =
        "a string, an array of strings, an array of token ids or an array of arrays of token ids";
    let arr = match v {
        None | Some(Value::Null) => return Err(RequestError::Missing("prompt")),
        Some(Value::String(s)) => return Ok(Prompt::Text(Cow::Borrowed(s))),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(wrong("prompt", SHAPES)),
    };
    match arr.first() {
        None => Err(RequestError::Empty("prompt".into())),
        Some(Value::String(_)) => arr
            .iter()
            .enumerate()
            .map(|(i, s)| {
                s.as_str()
                    .map(Cow::Borrowed)
                    .ok_or_else(|| wrong(format!("prompt[{i}]"), "a string like prompt[0]"))
            })
            .collect::<Result<_, _>>()
            .map(Prompt::Texts),
        Some(Value::Number(_)) => ids(arr, "prompt").map(Prompt::Ids),
        Some(Value::Array(_)) => arr
            .iter()
            .enumerate()
            .map(|(i, b)| match b {
                Value::Array(b) if b.is_empty() => Err(RequestError::Empty(format!("prompt[{i}]"))),
                Value::Array(b) => ids(b, &format!("prompt[{i}]")),
                _ => Err(wrong(
                    format!("prompt[{i}]"),
                    "an array of token ids like prompt[0]",
                )),
            })
            .collect::<Result<_, _>>()
            .map(Prompt::IdBatches),
        Some(_) => Err(wrong("prompt", SHAPES)),
    }
}

fn ids(arr: &[Value], field: &str) -> Result<Vec<u32>, RequestError> {
    arr.iter()
        .enumerate()
        .map(|(i, x)| {
            x.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| wrong(format!("{field}[{i}]"), "a token id (integer 0..2^32)"))
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn chat(v: &Value) -> ChatBody<'_> {
        match Request::from_value(v, Expect::Chat).unwrap().body {
            RequestBody::Chat(c) => c,
            other => panic!("not chat: {other:?}"),
        }
    }

    fn prompt(v: Value) -> Result<Prompt<'static>, RequestError> {
        let body = json!({"model": "m", "prompt": v});
        Request::from_value(&body, Expect::Completion).map(|r| match r.into_owned().body {
            RequestBody::Completion(p) => p,
            other => panic!("not completion: {other:?}"),
        })
    }

    fn err_field(e: RequestError) -> String {
        match e {
            RequestError::WrongType { field, .. } => field,
            other => panic!("not WrongType: {other:?}"),
        }
    }

    #[test]
    fn chat_fields_are_read() {
        let v = json!({
            "model": "llama", "stream": true, "max_tokens": 7, "prompt_cache_key": "acme",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [
                    {"type": "text", "text": "a"},
                    {"type": "image_url", "image_url": {"url": "x"}},
                    {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": null, "tool_calls": []}
            ]
        });
        let r = Request::from_value(&v, Expect::Chat).unwrap();
        assert_eq!(r.model, "llama");
        assert!(r.stream && r.is_chat());
        assert_eq!(r.max_tokens, Some(7));
        assert_eq!(r.prompt_cache_key.as_deref(), Some("acme"));
        let c = chat(&v);
        assert_eq!(c.messages.len(), 3);
        assert_eq!(c.messages[0].content.text(), "be brief");
        assert_eq!(c.messages[1].content.text(), "a\nb");
        assert_eq!(c.messages[2].content, Content::Empty);
        assert!(c.messages[2].raw.get("tool_calls").is_some());
        assert!(c.add_generation_prompt && !c.continue_final_message);
    }

    #[test]
    fn max_completion_tokens_wins_and_defaults_hold() {
        let v = json!({"model": "m", "max_tokens": 5, "max_completion_tokens": 9,
                       "messages": [{"role": "user", "content": "hi"}],
                       "add_generation_prompt": false});
        let r = Request::from_value(&v, Expect::Any).unwrap();
        assert_eq!(r.max_tokens, Some(9));
        assert!(!r.stream);
        assert!(!chat(&v).add_generation_prompt);
    }

    #[test]
    fn prompt_shapes() {
        assert_eq!(prompt(json!("hi")).unwrap(), Prompt::Text("hi".into()));
        assert_eq!(
            prompt(json!(["a", "b"])).unwrap(),
            Prompt::Texts(vec!["a".into(), "b".into()])
        );
        assert_eq!(
            prompt(json!([1, 2, 3])).unwrap(),
            Prompt::Ids(vec![1, 2, 3])
        );
        let batch = prompt(json!([[1, 2], [3]])).unwrap();
        assert_eq!(batch, Prompt::IdBatches(vec![vec![1, 2], vec![3]]));
        assert_eq!(batch.first(), FirstPrompt::Ids(&[1, 2]));
        assert_eq!(
            prompt(json!(["x", "y"])).unwrap().first(),
            FirstPrompt::Text("x")
        );
    }

    #[test]
    fn bad_prompts_are_refused_with_their_path() {
        assert!(matches!(prompt(json!([])), Err(RequestError::Empty(_))));
        assert!(
            matches!(prompt(json!([[1], []])), Err(RequestError::Empty(f)) if f == "prompt[1]")
        );
        assert_eq!(err_field(prompt(json!(["a", 1])).unwrap_err()), "prompt[1]");
        assert_eq!(err_field(prompt(json!([1, -1])).unwrap_err()), "prompt[1]");
        assert_eq!(
            err_field(prompt(json!([1, 4294967296u64])).unwrap_err()),
            "prompt[1]"
        );
        assert_eq!(err_field(prompt(json!([1.5])).unwrap_err()), "prompt[0]");
        assert_eq!(
            err_field(prompt(json!([[1], "a"])).unwrap_err()),
            "prompt[1]"
        );
        assert_eq!(err_field(prompt(json!(5)).unwrap_err()), "prompt");
        assert_eq!(err_field(prompt(json!([true])).unwrap_err()), "prompt");
        let v = json!({"model": "m"});
        assert!(matches!(
            Request::from_value(&v, Expect::Completion),
            Err(RequestError::Missing("prompt"))
        ));
    }

    #[test]
    fn bad_chats_are_refused_with_their_path() {
        let cases = [
            (
                json!({"model": "m", "messages": [{"content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"model": "m", "messages": [{"role": 1}]}),
                "messages[0].role",
            ),
            (json!({"model": "m", "messages": ["x"]}), "messages[0]"),
            (
                json!({"model": "m", "messages": [{"role": "u", "content": 3}]}),
                "messages[0].content",
            ),
            (
                json!({"model": "m", "messages": [{"role": "u", "content": [{"text": "x"}]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"model": "m", "messages": [{"role": "u", "content": [{"type": "text"}]}]}),
                "messages[0].content[0].text",
            ),
            (json!({"model": "m", "messages": {}}), "messages"),
            (json!({"model": 3, "messages": []}), "model"),
            (
                json!({"model": "m", "stream": "yes", "messages": []}),
                "stream",
            ),
            (
                json!({"model": "m", "prompt_cache_key": 5, "prompt": "x"}),
                "prompt_cache_key",
            ),
            (
                json!({"model": "m", "max_tokens": -1, "prompt": "x"}),
                "max_tokens",
            ),
            (
                json!({"model": "m", "tools": {}, "messages": [{"role": "u"}]}),
                "tools",
            ),
        ];
        for (body, field) in cases {
            let e = Request::from_value(&body, Expect::Any).unwrap_err();
            assert!(e.to_string().contains(field), "{e} for {body}");
            assert!(!e.is_retryable());
            assert_eq!(err_field(e), field, "{body}");
        }
        let empty = json!({"model": "m", "messages": []});
        assert!(matches!(
            Request::from_value(&empty, Expect::Chat),
            Err(RequestError::Empty(_))
        ));
    }

    #[test]
    fn body_level_errors() {
        assert!(matches!(
            Request::from_slice(b"{", Expect::Any),
            Err(RequestError::InvalidJson(_))
        ));
        assert!(matches!(
            Request::from_slice(b"[]", Expect::Any),
            Err(RequestError::NotAnObject)
        ));
        assert!(matches!(
            Request::from_slice(br#"{"prompt":"x"}"#, Expect::Any),
            Err(RequestError::Missing("model"))
        ));
        assert!(matches!(
            Request::from_slice(br#"{"model":"m"}"#, Expect::Any),
            Err(RequestError::UnknownKind)
        ));
        let r = Request::from_slice(
            br#"{"model":"m","prompt":"p","messages":null}"#,
            Expect::Any,
        );
        assert!(!r.unwrap().is_chat(), "null messages do not make a chat");
    }

    #[test]
    fn tenant_precedence() {
        let v =
            json!({"model": "m", "prompt": "x", "prompt_cache_key": "key", "cache_salt": "salt"});
        let r = Request::from_value(&v, Expect::Completion).unwrap();
        assert_eq!(r.tenant(Some("hdr")).unwrap().unwrap().as_str(), "hdr");
        assert_eq!(r.tenant(None).unwrap().unwrap().as_str(), "key");
        let v = json!({"model": "m", "prompt": "x", "cache_salt": "salt"});
        let r = Request::from_value(&v, Expect::Completion).unwrap();
        assert_eq!(r.tenant(None).unwrap().unwrap().as_str(), "salt");
        let v = json!({"model": "m", "prompt": "x", "prompt_cache_key": ""});
        let r = Request::from_value(&v, Expect::Completion).unwrap();
        assert_eq!(
            r.tenant(None),
            Err(TenantError::Empty(TenantSource::PromptCacheKey))
        );
    }

    #[test]
    fn owned_equals_borrowed() {
        let v = json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "t"}]}],
                       "tools": [{"type": "function"}], "chat_template_kwargs": {"x": 1}});
        let borrowed = Request::from_value(&v, Expect::Chat).unwrap();
        let owned = Request::from_slice(v.to_string().as_bytes(), Expect::Chat).unwrap();
        assert_eq!(borrowed, owned);
    }
}

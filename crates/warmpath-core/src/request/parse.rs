//! Reading a [`Request`] out of a JSON value: shapes, defaults and error paths.

use super::{ChatBody, Content, Expect, Message, Prompt, Request, RequestBody, RequestError};
use serde_json::{Map, Value};
use std::borrow::Cow;

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
}

fn wrong(field: impl Into<String>, expected: &'static str) -> RequestError {
    RequestError::WrongType {
        field: field.into(),
        expected,
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
    u32_field(obj.get(key), key)
}

/// A token count field's value: absent or null, else a non-negative integer
/// below 2^32.
pub(super) fn u32_field(v: Option<&Value>, key: &'static str) -> Result<Option<u32>, RequestError> {
    match v {
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
    let extra = obj
        .iter()
        .filter(|(k, _)| k.as_str() != "role" && k.as_str() != "content")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(Message {
        role,
        content,
        extra,
    })
}

pub(super) fn parse_prompt(v: Option<&Value>) -> Result<Prompt<'_>, RequestError> {
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

//! Reading a [`Request`] from the JSON walk (`super::walk`): shapes,
//! defaults and errors, checked in one fixed order.

use super::walk::{Msg, Node, Part, PartNode, Top};
use super::{ChatBody, Content, Expect, Message, Prompt, Request, RequestBody, RequestError};
use serde::Deserialize;
use serde_json::Value;
use std::borrow::Cow;

impl<'a> Request<'a> {
    /// Parses a JSON body, borrowing every string without escapes from it:
    /// one walk, no [`Value`] tree (see `walk.rs`).
    pub fn parse(body: &'a [u8], expect: Expect) -> Result<Self, RequestError> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let walked =
            Node::<(), Top<'a>>::deserialize(&mut de).and_then(|top| de.end().map(|()| top));
        match walked {
            Ok(top) => read(top, expect),
            // The walk reads strings borrowed, and on some invalid bodies
            // serde_json then places the error a column away from where its
            // `Value` reader does: a body that fails takes the slow reader
            // once, so the message is always the same.
            Err(e) => Err(RequestError::InvalidJson(
                serde_json::from_slice::<Value>(body).err().unwrap_or(e),
            )),
        }
    }

    /// Reads a request from a parsed JSON body, by the same walk.
    pub fn from_value(v: &'a Value, expect: Expect) -> Result<Self, RequestError> {
        let top = Node::<(), Top<'a>>::deserialize(v).map_err(RequestError::InvalidJson)?;
        read(top, expect)
    }
}

/// The request in `top`, or the first error in the order: body, `model`,
/// `stream`, kind, the chat or prompt, the token limits, the tenant fields.
fn read<'a>(top: Node<'a, (), Top<'a>>, expect: Expect) -> Result<Request<'a>, RequestError> {
    let Node::Map(mut top) = top else {
        return Err(RequestError::NotAnObject);
    };
    let model = match std::mem::take(&mut top.model) {
        Node::Null => return Err(RequestError::Missing("model")),
        Node::Str(s) => s,
        _ => return Err(wrong("model", "a string")),
    };
    let stream = opt_bool(&top.stream, "stream")?.unwrap_or(false);
    let chat = match expect {
        Expect::Chat => true,
        Expect::Completion => false,
        Expect::Any if !top.messages.is_null() => true,
        Expect::Any if !top.prompt.is_null() => false,
        Expect::Any => return Err(RequestError::UnknownKind),
    };
    let body = if chat {
        RequestBody::Chat(read_chat(&mut top)?)
    } else {
        RequestBody::Completion(parse_prompt(Some(&top.prompt), "prompt")?.into_owned())
    };
    let max_tokens = match u32_field(Some(&top.max_completion_tokens), "max_completion_tokens")? {
        Some(n) => Some(n),
        None => u32_field(Some(&top.max_tokens), "max_tokens")?,
    };
    Ok(Request {
        model,
        stream,
        body,
        prompt_cache_key: opt_str(top.prompt_cache_key, "prompt_cache_key")?,
        cache_salt: opt_str(top.cache_salt, "cache_salt")?,
        max_tokens,
    })
}

pub(super) fn wrong(field: impl Into<String>, expected: &'static str) -> RequestError {
    RequestError::WrongType {
        field: field.into(),
        expected,
    }
}

fn opt_bool(v: &Node<'_>, key: &'static str) -> Result<Option<bool>, RequestError> {
    match v {
        Node::Null => Ok(None),
        Node::Bool(b) => Ok(Some(*b)),
        _ => Err(wrong(key, "a boolean")),
    }
}

fn opt_str<'a>(v: Node<'a>, key: &'static str) -> Result<Option<Cow<'a, str>>, RequestError> {
    match v {
        Node::Null => Ok(None),
        Node::Str(s) => Ok(Some(s)),
        _ => Err(wrong(key, "a string")),
    }
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

fn read_chat<'a>(top: &mut Top<'a>) -> Result<ChatBody<'a>, RequestError> {
    let msgs = match std::mem::take(&mut top.messages) {
        Node::Null => return Err(RequestError::Missing("messages")),
        Node::Seq(a) => a,
        _ => return Err(wrong("messages", "an array of message objects")),
    };
    if msgs.is_empty() {
        return Err(RequestError::Empty("messages".into()));
    }
    let messages = msgs
        .into_iter()
        .enumerate()
        .map(|(i, m)| read_message(i, m))
        .collect::<Result<Vec<_>, _>>()?;
    let tools = match std::mem::take(&mut top.tools) {
        Value::Null => None,
        t @ Value::Array(_) => Some(Cow::Owned(t)),
        _ => return Err(wrong("tools", "an array")),
    };
    let chat_template_kwargs = match std::mem::take(&mut top.chat_template_kwargs) {
        Value::Null => None,
        Value::Object(m) => Some(Cow::Owned(m)),
        _ => return Err(wrong("chat_template_kwargs", "an object")),
    };
    Ok(ChatBody {
        messages,
        add_generation_prompt: opt_bool(&top.add_generation_prompt, "add_generation_prompt")?
            .unwrap_or(true),
        continue_final_message: opt_bool(&top.continue_final_message, "continue_final_message")?
            .unwrap_or(false),
        tools,
        chat_template_kwargs,
    })
}

fn read_message<'a>(i: usize, m: Node<'a, (), Msg<'a>>) -> Result<Message<'a>, RequestError> {
    let Node::Map(m) = m else {
        return Err(wrong(format!("messages[{i}]"), "an object"));
    };
    let role = match m.role {
        Node::Str(r) => r,
        _ => return Err(wrong(format!("messages[{i}].role"), "a string")),
    };
    let content = match m.content {
        Node::Null => Content::Empty,
        Node::Str(s) => Content::Text(s),
        Node::Seq(parts) => Content::Parts(read_parts(i, parts)?),
        _ => {
            return Err(wrong(
                format!("messages[{i}].content"),
                "a string, null or an array of content parts",
            ))
        }
    };
    Ok(Message {
        role,
        content,
        extra: m.extra,
    })
}

/// The texts of the `{"type":"text"}` parts; other types are skipped.
fn read_parts<'a>(i: usize, parts: Vec<PartNode<'a>>) -> Result<Vec<Cow<'a, str>>, RequestError> {
    let mut texts = Vec::with_capacity(parts.len());
    for (j, p) in parts.into_iter().enumerate() {
        let Node::Map(Part {
            kind: Node::Str(kind),
            text,
        }) = p
        else {
            let field = format!("messages[{i}].content[{j}]");
            return Err(wrong(field, "an object with a string `type`"));
        };
        if kind == "text" {
            let Node::Str(t) = text else {
                return Err(wrong(
                    format!("messages[{i}].content[{j}].text"),
                    "a string",
                ));
            };
            texts.push(t);
        }
    }
    Ok(texts)
}

/// A completion prompt at `field` (`prompt`; `input` for embeddings).
pub(super) fn parse_prompt<'v>(
    v: Option<&'v Value>,
    field: &'static str,
) -> Result<Prompt<'v>, RequestError> {
    const SHAPES: &str =
        "a string, an array of strings, an array of token ids or an array of arrays of token ids";
    // `expected` is static text: one pair of wordings per field name.
    let (like_text, like_ids) = match field {
        "input" => (
            "a string like input[0]",
            "an array of token ids like input[0]",
        ),
        _ => (
            "a string like prompt[0]",
            "an array of token ids like prompt[0]",
        ),
    };
    let arr = match v {
        None | Some(Value::Null) => return Err(RequestError::Missing(field)),
        Some(Value::String(s)) => return Ok(Prompt::Text(Cow::Borrowed(s))),
        Some(Value::Array(a)) => a,
        Some(_) => return Err(wrong(field, SHAPES)),
    };
    match arr.first() {
        None => Err(RequestError::Empty(field.into())),
        Some(Value::String(_)) => arr
            .iter()
            .enumerate()
            .map(|(i, s)| {
                s.as_str()
                    .map(Cow::Borrowed)
                    .ok_or_else(|| wrong(format!("{field}[{i}]"), like_text))
            })
            .collect::<Result<_, _>>()
            .map(Prompt::Texts),
        Some(Value::Number(_)) => ids(arr, field).map(Prompt::Ids),
        Some(Value::Array(_)) => arr
            .iter()
            .enumerate()
            .map(|(i, b)| match b {
                Value::Array(b) if b.is_empty() => {
                    Err(RequestError::Empty(format!("{field}[{i}]")))
                }
                Value::Array(b) => ids(b, &format!("{field}[{i}]")),
                _ => Err(wrong(format!("{field}[{i}]"), like_ids)),
            })
            .collect::<Result<_, _>>()
            .map(Prompt::IdBatches),
        Some(_) => Err(wrong(field, SHAPES)),
    }
}

pub(super) fn ids(arr: &[Value], field: &str) -> Result<Vec<u32>, RequestError> {
    arr.iter()
        .enumerate()
        .map(|(i, x)| {
            x.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| wrong(format!("{field}[{i}]"), "a token id (integer 0..2^32)"))
        })
        .collect()
}

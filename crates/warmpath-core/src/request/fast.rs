//! Reading a [`Request`] straight from the body's bytes: the router's hot path.
//!
//! [`Request::parse`] walks the JSON once with serde and keeps only the
//! fields routing reads. Strings are borrowed from the body unless they hold
//! escapes (a long system prompt with `\n` in it is unescaped once), and every
//! other value is skipped without being built — where a [`Value`] tree costs
//! an allocation per string, array and object.
//!
//! It accepts exactly the bodies [`Request::from_value`] accepts and returns
//! the same request: whenever anything is unusual (a field of another type
//! than expected, a missing field, a body that is not an object, invalid
//! JSON) the fast walk gives up and the body is parsed into a [`Value`] and
//! read by [`Request::from_value`], so every error is the same error too.
//! `parse_matches_from_value` (a proptest in `tests.rs`) checks both.

use super::parse::{parse_prompt, u32_field};
use super::{ChatBody, Content, Expect, Message, Request, RequestBody, RequestError};
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt;

impl<'a> Request<'a> {
    /// Parses a JSON body, borrowing from it where it can (module docs).
    /// Same result and same errors as parsing a [`Value`] and calling
    /// [`Request::from_value`].
    pub fn parse(body: &'a [u8], expect: Expect) -> Result<Self, RequestError> {
        if let Some(r) = fast(body, expect) {
            return Ok(r);
        }
        let v: Value = serde_json::from_slice(body).map_err(RequestError::InvalidJson)?;
        Request::from_value(&v, expect).map(Request::into_owned)
    }
}

/// The fast walk; `None` sends the body to the general path.
fn fast(body: &[u8], expect: Expect) -> Option<Request<'_>> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let top = Top::deserialize(&mut de).ok()?;
    de.end().ok()?;
    let chat = match expect {
        Expect::Chat => true,
        Expect::Completion => false,
        Expect::Any if top.messages.is_some() => true,
        Expect::Any if top.prompt.is_some() => false,
        Expect::Any => return None,
    };
    let body = if chat {
        let messages: Vec<Message<'_>> = top.messages?.into_iter().map(|m| m.0).collect();
        if messages.is_empty() {
            return None;
        }
        let tools = match top.tools {
            None => None,
            Some(t @ Value::Array(_)) => Some(Cow::Owned(t)),
            Some(_) => return None,
        };
        let chat_template_kwargs = match top.chat_template_kwargs {
            None => None,
            Some(Value::Object(m)) => Some(Cow::Owned(m)),
            Some(_) => return None,
        };
        RequestBody::Chat(ChatBody {
            messages,
            add_generation_prompt: top.add_generation_prompt.unwrap_or(true),
            continue_final_message: top.continue_final_message.unwrap_or(false),
            tools,
            chat_template_kwargs,
        })
    } else {
        RequestBody::Completion(parse_prompt(top.prompt.as_ref()).ok()?.into_owned())
    };
    let max_tokens =
        match u32_field(top.max_completion_tokens.as_ref(), "max_completion_tokens").ok()? {
            Some(n) => Some(n),
            None => u32_field(top.max_tokens.as_ref(), "max_tokens").ok()?,
        };
    Some(Request {
        model: top.model?.0,
        stream: top.stream.unwrap_or(false),
        body,
        prompt_cache_key: top.prompt_cache_key.map(|s| s.0),
        cache_salt: top.cache_salt.map(|s| s.0),
        max_tokens,
    })
}

/// Gives up on the fast walk (the general path reports the real error).
fn give_up<E: de::Error>() -> E {
    E::custom("not on the fast path")
}

/// A string borrowed from the body when it has no escapes.
struct Str<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Str<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Str<'de>, E> {
                Ok(Str(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// The top-level fields routing reads; a repeated key keeps its last value,
/// as in a [`Value`]. `None` is absent or null.
#[derive(Default)]
struct Top<'a> {
    model: Option<Str<'a>>,
    stream: Option<bool>,
    messages: Option<Vec<Msg<'a>>>,
    prompt: Option<Value>,
    prompt_cache_key: Option<Str<'a>>,
    cache_salt: Option<Str<'a>>,
    max_tokens: Option<Value>,
    max_completion_tokens: Option<Value>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
    tools: Option<Value>,
    chat_template_kwargs: Option<Value>,
}

impl<'de> Deserialize<'de> for Top<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Top<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a request object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Top<'de>, A::Error> {
                let mut t = Top::default();
                while let Some(key) = map.next_key::<Str<'de>>()? {
                    match key.0.as_ref() {
                        "model" => t.model = map.next_value()?,
                        "stream" => t.stream = map.next_value()?,
                        "messages" => t.messages = map.next_value()?,
                        "prompt" => t.prompt = non_null(map.next_value()?),
                        "prompt_cache_key" => t.prompt_cache_key = map.next_value()?,
                        "cache_salt" => t.cache_salt = map.next_value()?,
                        "max_tokens" => t.max_tokens = non_null(map.next_value()?),
                        "max_completion_tokens" => {
                            t.max_completion_tokens = non_null(map.next_value()?);
                        }
                        "add_generation_prompt" => t.add_generation_prompt = map.next_value()?,
                        "continue_final_message" => t.continue_final_message = map.next_value()?,
                        "tools" => t.tools = non_null(map.next_value()?),
                        "chat_template_kwargs" => {
                            t.chat_template_kwargs = non_null(map.next_value()?);
                        }
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(t)
            }
        }
        d.deserialize_map(V)
    }
}

fn non_null(v: Value) -> Option<Value> {
    (!v.is_null()).then_some(v)
}

/// One chat message.
struct Msg<'a>(Message<'a>);

impl<'de> Deserialize<'de> for Msg<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Msg<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a message object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Msg<'de>, A::Error> {
                let (mut role, mut content, mut extra) = (None, Content::Empty, Map::new());
                while let Some(key) = map.next_key::<Str<'de>>()? {
                    match key.0.as_ref() {
                        "role" => role = Some(map.next_value::<Str<'de>>()?.0),
                        "content" => content = map.next_value::<ContentDe<'de>>()?.0,
                        _ => {
                            let v: Value = map.next_value()?;
                            extra.insert(key.0.into_owned(), v);
                        }
                    }
                }
                Ok(Msg(Message {
                    role: role.ok_or_else(give_up)?,
                    content,
                    extra,
                }))
            }
        }
        d.deserialize_map(V)
    }
}

/// A message's `content`: null, a string, or content parts.
struct ContentDe<'a>(Content<'a>);

impl<'de> Deserialize<'de> for ContentDe<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ContentDe<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, null or content parts")
            }
            fn visit_unit<E: de::Error>(self) -> Result<ContentDe<'de>, E> {
                Ok(ContentDe(Content::Empty))
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<ContentDe<'de>, E> {
                Ok(ContentDe(Content::Text(Cow::Borrowed(v))))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ContentDe<'de>, E> {
                Ok(ContentDe(Content::Text(Cow::Owned(v.to_owned()))))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<ContentDe<'de>, E> {
                Ok(ContentDe(Content::Text(Cow::Owned(v))))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ContentDe<'de>, A::Error> {
                let mut texts = Vec::new();
                while let Some(part) = seq.next_element::<Part<'de>>()? {
                    if part.kind.as_deref() == Some("text") {
                        texts.push(part.text.ok_or_else(give_up)?);
                    } else if part.kind.is_none() {
                        return Err(give_up());
                    }
                }
                Ok(ContentDe(Content::Parts(texts)))
            }
        }
        d.deserialize_any(V)
    }
}

/// One content part: its `type`, and its `text` when that is a string.
struct Part<'a> {
    kind: Option<Cow<'a, str>>,
    text: Option<Cow<'a, str>>,
}

impl<'de> Deserialize<'de> for Part<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Part<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a content part object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Part<'de>, A::Error> {
                let mut p = Part {
                    kind: None,
                    text: None,
                };
                while let Some(key) = map.next_key::<Str<'de>>()? {
                    match key.0.as_ref() {
                        "type" => p.kind = Some(map.next_value::<Str<'de>>()?.0),
                        "text" => p.text = map.next_value::<Option<Str<'de>>>()?.map(|s| s.0),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(p)
            }
        }
        d.deserialize_map(V)
    }
}

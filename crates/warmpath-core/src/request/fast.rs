//! Reading a [`Request`] straight from the body's bytes: the router's hot path.
//!
//! [`Request::parse`] first tries the skimming walk of `skim.rs` (the common
//! chat shape, a known long content skipped unread); when that gives up, it
//! walks the JSON once with serde here and keeps only the fields routing
//! reads. Strings are borrowed from the body unless they hold
//! escapes (a long system prompt with `\n` in it is unescaped once), and every
//! other value is skipped without being built — where a [`Value`] tree costs
//! an allocation per string, array and object.
//!
//! It accepts exactly the bodies [`Request::from_value`] accepts and returns
//! the same request: whenever anything is unusual (a field of another type
//! than expected, a missing field, a body that is not an object, invalid
//! JSON) the fast walk gives up and the body is parsed into a [`Value`] and
//! read by [`Request::from_value`], so every error is the same error too.
//! `parse_matches_from_value` and `skimmed_chats_match_from_value`
//! (proptests in `tests.rs`) check all three walks.

use super::parse::{parse_prompt, u32_field};
use super::{ChatBody, Content, ContentCache, Expect, Message, Request, RequestBody, RequestError};
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt;

impl<'a> Request<'a> {
    /// Parses a JSON body, borrowing from it where it can (module docs).
    /// Same result and same errors as parsing a [`Value`] and calling
    /// [`Request::from_value`].
    pub fn parse(body: &'a [u8], expect: Expect) -> Result<Self, RequestError> {
        Self::parse_with(body, expect, None)
    }

    /// [`Request::parse`], taking long message contents that hold escapes
    /// from `cache` (and keeping them there): a repeated system prompt is
    /// unescaped once. Same result and same errors as [`Request::parse`].
    pub fn parse_with(
        body: &'a [u8],
        expect: Expect,
        cache: Option<&ContentCache>,
    ) -> Result<Self, RequestError> {
        if let Some(r) = super::skim::skim(body, expect, cache) {
            return Ok(r);
        }
        if let Some(r) = fast(body, expect, cache) {
            return Ok(r);
        }
        let v: Value = serde_json::from_slice(body).map_err(RequestError::InvalidJson)?;
        Request::from_value(&v, expect).map(Request::into_owned)
    }
}

/// The fast walk; `None` sends the body to the general path.
fn fast<'a>(body: &'a [u8], expect: Expect, cache: Option<&ContentCache>) -> Option<Request<'a>> {
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
        let messages = top
            .messages?
            .into_iter()
            .map(|m| m.resolve(cache))
            .collect::<Option<Vec<Message<'_>>>>()?;
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

/// One chat message, its content not yet unescaped.
struct Msg<'a> {
    role: Cow<'a, str>,
    content: ContentDe<'a>,
    extra: Map<String, Value>,
}

impl<'a> Msg<'a> {
    /// The message, its content unescaped (or taken from `cache`); `None`
    /// when serde_json refuses the literal.
    fn resolve(self, cache: Option<&ContentCache>) -> Option<Message<'a>> {
        let content = match self.content {
            ContentDe::Ready(c) => c,
            ContentDe::Literal(lit) => match cache {
                Some(cache) if cache.is_cacheable(lit.len()) => {
                    let (text, key) = cache.get_or_unescape(lit)?;
                    Content::Shared(text, key)
                }
                _ => Content::Text(Cow::Owned(serde_json::from_str::<String>(lit).ok()?)),
            },
        };
        Some(Message {
            role: self.role,
            content,
            extra: self.extra,
        })
    }
}

impl<'de> Deserialize<'de> for Msg<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Msg<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a message object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Msg<'de>, A::Error> {
                let (mut role, mut content, mut extra) =
                    (None, ContentDe::Ready(Content::Empty), Map::new());
                while let Some(key) = map.next_key::<Str<'de>>()? {
                    match key.0.as_ref() {
                        "role" => role = Some(map.next_value::<Str<'de>>()?.0),
                        "content" => content = map.next_value::<ContentDe<'de>>()?,
                        _ => {
                            let v: Value = map.next_value()?;
                            extra.insert(key.0.into_owned(), v);
                        }
                    }
                }
                Ok(Msg {
                    role: role.ok_or_else(give_up)?,
                    content,
                    extra,
                })
            }
        }
        d.deserialize_map(V)
    }
}

/// A message's `content`: null, a string, or content parts; a string with
/// escapes is kept as its JSON literal until [`Msg::resolve`].
enum ContentDe<'a> {
    Ready(Content<'a>),
    /// The string's JSON literal, quotes included.
    Literal(&'a str),
}

impl<'de> Deserialize<'de> for ContentDe<'de> {
    /// Through serde_json's `RawValue`, which checks the value and borrows
    /// its text: a string without escapes is that text, one with escapes
    /// waits for [`Msg::resolve`]; `null` and content parts are read from
    /// the text by the visitor below.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <&'de RawValue>::deserialize(d)?.get();
        if raw.starts_with('"') {
            let inner = raw
                .get(1..raw.len().saturating_sub(1))
                .ok_or_else(give_up)?;
            return Ok(if memchr::memchr(b'\\', inner.as_bytes()).is_some() {
                ContentDe::Literal(raw)
            } else {
                ContentDe::Ready(Content::Text(Cow::Borrowed(inner)))
            });
        }
        serde_json::Deserializer::from_str(raw)
            .deserialize_any(ContentVisitor)
            .map_err(|_| give_up())
    }
}

/// `null` or content parts (strings are handled above).
struct ContentVisitor;

impl<'de> Visitor<'de> for ContentVisitor {
    type Value = ContentDe<'de>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string, null or content parts")
    }
    fn visit_unit<E: de::Error>(self) -> Result<ContentDe<'de>, E> {
        Ok(ContentDe::Ready(Content::Empty))
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
        Ok(ContentDe::Ready(Content::Parts(texts)))
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

//! The one walk over a request's JSON: serde, borrowing, never failing on shape.
//! Every field routing reads is a [`Node`] (null, bool, string borrowed unless it
//! holds escapes, number, or an array/object read by its [`FromSeq`] / [`FromMap`]
//! shape); a value of an unexpected kind is recorded, never an error, so
//! `super::parse` reports shape errors in a fixed order whatever the key order.
//! Other values are skipped ([`IgnoredAny`]); a repeated key keeps its last value.

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};
use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

/// One JSON value, with arrays read as `S` and objects as `M`.
#[derive(Default)]
pub(super) enum Node<'de, S = (), M = ()> {
    /// `null`, or the field is absent.
    #[default]
    Null,
    Bool(bool),
    Str(Cow<'de, str>),
    Number,
    Seq(S),
    Map(M),
}

impl<'de, S, M> Node<'de, S, M> {
    pub(super) fn is_null(&self) -> bool {
        matches!(self, Node::Null)
    }
}

/// How an array in a given place is read.
pub(super) trait FromSeq<'de>: Sized {
    fn from_seq<A: SeqAccess<'de>>(seq: A) -> Result<Self, A::Error>;
}

/// How an object in a given place is read.
pub(super) trait FromMap<'de>: Sized {
    fn from_map<A: MapAccess<'de>>(map: A) -> Result<Self, A::Error>;
}

/// Skipped.
impl<'de> FromSeq<'de> for () {
    fn from_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }
}

/// Skipped.
impl<'de> FromMap<'de> for () {
    fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(())
    }
}

impl<'de, T: Deserialize<'de>> FromSeq<'de> for Vec<T> {
    fn from_seq<A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(x) = seq.next_element()? {
            out.push(x);
        }
        Ok(out)
    }
}

impl<'de, S: FromSeq<'de>, M: FromMap<'de>> Deserialize<'de> for Node<'de, S, M> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'de, S, M>(PhantomData<(&'de (), S, M)>);
        impl<'de, S: FromSeq<'de>, M: FromMap<'de>> Visitor<'de> for V<'de, S, M> {
            type Value = Node<'de, S, M>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(Node::Null)
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
                Ok(Node::Bool(v))
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
                Ok(Node::Number)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
                Ok(Node::Number)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
                Ok(Node::Number)
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Node::Str(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Node::Str(Cow::Owned(v.to_owned())))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                S::from_seq(seq).map(Node::Seq)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                M::from_map(map).map(Node::Map)
            }
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// The next key (JSON keys are strings; borrowed unless escaped).
fn next_key<'de, A: MapAccess<'de>>(map: &mut A) -> Result<Option<Cow<'de, str>>, A::Error> {
    Ok(map.next_key::<Node<'de>>()?.map(|k| match k {
        Node::Str(s) => s,
        _ => Cow::Borrowed(""),
    }))
}

/// The top-level fields routing reads.
#[derive(Default)]
pub(super) struct Top<'de> {
    pub model: Node<'de>,
    pub stream: Node<'de>,
    pub messages: Node<'de, Vec<Node<'de, (), Msg<'de>>>>,
    pub prompt: Value,
    pub prompt_cache_key: Node<'de>,
    pub cache_salt: Node<'de>,
    pub max_tokens: Value,
    pub max_completion_tokens: Value,
    pub add_generation_prompt: Node<'de>,
    pub continue_final_message: Node<'de>,
    pub tools: Value,
    pub chat_template_kwargs: Value,
}

impl<'de> FromMap<'de> for Top<'de> {
    fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut t = Top::default();
        while let Some(key) = next_key(&mut map)? {
            let m = &mut map;
            match key.as_ref() {
                "model" => t.model = m.next_value()?,
                "stream" => t.stream = m.next_value()?,
                "messages" => t.messages = m.next_value()?,
                "prompt" => t.prompt = m.next_value()?,
                "prompt_cache_key" => t.prompt_cache_key = m.next_value()?,
                "cache_salt" => t.cache_salt = m.next_value()?,
                "max_tokens" => t.max_tokens = m.next_value()?,
                "max_completion_tokens" => t.max_completion_tokens = m.next_value()?,
                "add_generation_prompt" => t.add_generation_prompt = m.next_value()?,
                "continue_final_message" => t.continue_final_message = m.next_value()?,
                "tools" => t.tools = m.next_value()?,
                "chat_template_kwargs" => t.chat_template_kwargs = m.next_value()?,
                _ => {
                    m.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(t)
    }
}

/// A content part: an array of any value, objects read as [`Part`].
pub(super) type PartNode<'de> = Node<'de, (), Part<'de>>;

/// One message object.
#[derive(Default)]
pub(super) struct Msg<'de> {
    pub role: Node<'de>,
    pub content: Node<'de, Vec<PartNode<'de>>>,
    /// The other fields, as sent.
    pub extra: Map<String, Value>,
}

impl<'de> FromMap<'de> for Msg<'de> {
    fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut msg = Msg::default();
        while let Some(key) = next_key(&mut map)? {
            match key.as_ref() {
                "role" => msg.role = map.next_value()?,
                "content" => msg.content = map.next_value()?,
                _ => {
                    let v = map.next_value()?;
                    msg.extra.insert(key.into_owned(), v);
                }
            }
        }
        Ok(msg)
    }
}

/// One content part object: its `type` and `text`.
#[derive(Default)]
pub(super) struct Part<'de> {
    pub kind: Node<'de>,
    pub text: Node<'de>,
}

impl<'de> FromMap<'de> for Part<'de> {
    fn from_map<A: MapAccess<'de>>(mut map: A) -> Result<Self, A::Error> {
        let mut p = Part::default();
        while let Some(key) = next_key(&mut map)? {
            match key.as_ref() {
                "type" => p.kind = map.next_value()?,
                "text" => p.text = map.next_value()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(p)
    }
}

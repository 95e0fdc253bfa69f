//! The rest of vLLM's OpenAI surface (embeddings, responses, tokenize,
//! detokenize and the pooling endpoints), reduced to what routing needs: the
//! optional `model` and, where the body carries a prompt, a [`Request`] to route
//! it by (the shapes: docs/tokenization.md). Not the hot path, so these bodies
//! are read through a [`Value`] tree.

use super::parse::{ids, parse_prompt, u32_field, wrong};
use super::{ChatBody, Content, Expect, Message, Request, RequestBody, RequestError};
use serde_json::{Map, Value};
use std::borrow::Cow;

/// Which endpoint a body was sent to ([`Endpoint::path`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Embeddings,
    Responses,
    Tokenize,
    Detokenize,
    Pooling,
    Classify,
    Score,
    ScoreV1,
    Rerank,
    RerankV1,
    RerankV2,
}

impl Endpoint {
    /// Every endpoint, in the order the docs list them.
    pub const ALL: [Endpoint; 11] = [
        Endpoint::Embeddings,
        Endpoint::Responses,
        Endpoint::Tokenize,
        Endpoint::Detokenize,
        Endpoint::Pooling,
        Endpoint::Classify,
        Endpoint::Score,
        Endpoint::ScoreV1,
        Endpoint::Rerank,
        Endpoint::RerankV1,
        Endpoint::RerankV2,
    ];

    /// The path, the same on the router and on vLLM.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Tokenize => "/tokenize",
            Endpoint::Detokenize => "/detokenize",
            Endpoint::Pooling => "/pooling",
            Endpoint::Classify => "/classify",
            Endpoint::Score => "/score",
            Endpoint::ScoreV1 => "/v1/score",
            Endpoint::Rerank => "/rerank",
            Endpoint::RerankV1 => "/v1/rerank",
            Endpoint::RerankV2 => "/v2/rerank",
        }
    }

    /// The endpoint at exactly `path`.
    pub fn of_path(path: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.path() == path)
    }
}

/// What routing reads from one of these bodies.
#[derive(Clone, Debug, PartialEq)]
pub struct Surface {
    pub model: Option<String>,
    /// The prompt as a chat or completion request (its `model` is the
    /// body's, or empty until the caller sets the pool's), or `None` when
    /// the body has no prompt (detokenize).
    pub prompt: Option<Request<'static>>,
    /// `/v1/responses`: the stored response this one continues. The engine
    /// that stored it holds it in memory, so the follow-up must go there.
    pub previous_response_id: Option<String>,
}

impl Surface {
    /// Reads a body sent to `endpoint`.
    pub fn parse(body: &[u8], endpoint: Endpoint) -> Result<Self, RequestError> {
        let v: Value = serde_json::from_slice(body).map_err(RequestError::InvalidJson)?;
        let Value::Object(top) = &v else {
            return Err(RequestError::NotAnObject);
        };
        let model = opt_str(top, "model")?.map(Cow::into_owned);
        let named = model.as_deref().unwrap_or("");
        let prompt = match endpoint {
            Endpoint::Embeddings | Endpoint::Tokenize
                if top.get("messages").is_some_and(|m| !m.is_null()) =>
            {
                Some(chat_like(top, named)?)
            }
            Endpoint::Embeddings => Some(completion_like(top, named, "input")?),
            Endpoint::Tokenize => Some(completion_like(top, named, "prompt")?),
            Endpoint::Responses => Some(responses(top, named)?),
            Endpoint::Detokenize => {
                match top.get("tokens") {
                    None | Some(Value::Null) => return Err(RequestError::Missing("tokens")),
                    Some(Value::Array(a)) => ids(a, "tokens")?,
                    Some(_) => return Err(wrong("tokens", "an array of token ids")),
                };
                None
            }
            // The pooling, classify, score and rerank bodies: no prompt.
            _ => None,
        };
        let previous_response_id = match endpoint {
            Endpoint::Responses => opt_str(top, "previous_response_id")?
                .map(|id| response_id(&id, "previous_response_id"))
                .transpose()?,
            _ => None,
        };
        Ok(Surface {
            model,
            prompt,
            previous_response_id,
        })
    }
}

/// The longest response id accepted (vLLM's are `resp_` and 32 hex digits).
pub const MAX_RESPONSE_ID: usize = 256;

/// Whether `b` may be part of a response id: ASCII letters, digits, `-`,
/// `_`, `.` and `:` (ids go into a URL path when the router asks engines
/// for one).
pub fn is_response_id_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':')
}

/// A response id as given in a body's `field` or a path: at most
/// [`MAX_RESPONSE_ID`] bytes for which [`is_response_id_byte`] holds.
pub fn response_id(id: &str, field: &'static str) -> Result<String, RequestError> {
    let ok = !id.is_empty() && id.len() <= MAX_RESPONSE_ID && id.bytes().all(is_response_id_byte);
    if ok {
        Ok(id.to_owned())
    } else {
        Err(wrong(
            field,
            "a response id (1 to 256 ASCII letters, digits, `-`, `_`, `.` or `:`)",
        ))
    }
}

/// A chat-shaped body (`messages`, the chat template fields): read by the
/// chat endpoint's own parser, with `model` filled in when absent.
fn chat_like(top: &Map<String, Value>, model: &str) -> Result<Request<'static>, RequestError> {
    let mut body = top.clone();
    body.insert("model".into(), Value::String(model.to_owned()));
    body.remove("prompt");
    let body = Value::Object(body);
    Request::from_value(&body, Expect::Chat).map(Request::into_owned)
}

/// A completion-shaped prompt at `field`.
fn completion_like(
    top: &Map<String, Value>,
    model: &str,
    field: &'static str,
) -> Result<Request<'static>, RequestError> {
    let prompt = parse_prompt(top.get(field), field)?.into_owned();
    Ok(Request {
        model: Cow::Owned(model.to_owned()),
        stream: false,
        body: RequestBody::Completion(prompt),
        prompt_cache_key: opt_str(top, "prompt_cache_key")?,
        cache_salt: opt_str(top, "cache_salt")?,
        max_tokens: None,
    })
}

fn opt_str(
    top: &Map<String, Value>,
    key: &'static str,
) -> Result<Option<Cow<'static, str>>, RequestError> {
    match top.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(Cow::Owned(s.clone()))),
        Some(_) => Err(wrong(key, "a string")),
    }
}

/// `/v1/responses`: `instructions`, then the `input` messages.
fn responses(top: &Map<String, Value>, model: &str) -> Result<Request<'static>, RequestError> {
    let mut messages = Vec::new();
    if let Some(s) = opt_str(top, "instructions")? {
        messages.push(message("system", Content::Text(s)));
    }
    match top.get("input") {
        None | Some(Value::Null) => return Err(RequestError::Missing("input")),
        Some(Value::String(s)) => messages.push(message("user", Content::Text(s.clone().into()))),
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(RequestError::Empty("input".into()))
        }
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                if let Some(m) = input_item(i, item)? {
                    messages.push(m);
                }
            }
        }
        Some(_) => return Err(wrong("input", "a string or an array of input items")),
    }
    let stream = match top.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(wrong("stream", "a boolean")),
    };
    Ok(Request {
        model: Cow::Owned(model.to_owned()),
        stream,
        body: RequestBody::Chat(ChatBody {
            messages,
            add_generation_prompt: true,
            continue_final_message: false,
            tools: None,
            chat_template_kwargs: None,
        }),
        prompt_cache_key: opt_str(top, "prompt_cache_key")?,
        cache_salt: opt_str(top, "cache_salt")?,
        max_tokens: u32_field(top.get("max_output_tokens"), "max_output_tokens")?,
    })
}

fn message(role: &str, content: Content<'static>) -> Message<'static> {
    Message {
        role: Cow::Owned(role.to_owned()),
        content,
        extra: Map::new(),
    }
}

/// One `input` item: a message when it has a `role`, else skipped.
fn input_item(i: usize, item: &Value) -> Result<Option<Message<'static>>, RequestError> {
    let Value::Object(item) = item else {
        return Err(wrong(format!("input[{i}]"), "an object"));
    };
    let role = match item.get("role") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(r)) => r,
        Some(_) => return Err(wrong(format!("input[{i}].role"), "a string")),
    };
    let content = match item.get("content") {
        None | Some(Value::Null) => Content::Empty,
        Some(Value::String(s)) => Content::Text(s.clone().into()),
        Some(Value::Array(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for (j, p) in parts.iter().enumerate() {
                let field = || format!("input[{i}].content[{j}]");
                let Some(Value::String(_)) = p.get("type") else {
                    return Err(wrong(field(), "an object with a string `type`"));
                };
                match p.get("text") {
                    // input_text, output_text, text: the text counts;
                    // images and files have none.
                    Some(Value::String(t)) => texts.push(Cow::Owned(t.clone())),
                    None | Some(Value::Null) => {}
                    Some(_) => return Err(wrong(format!("{}.text", field()), "a string")),
                }
            }
            Content::Parts(texts)
        }
        Some(_) => {
            return Err(wrong(
                format!("input[{i}].content"),
                "a string or an array of content parts",
            ))
        }
    };
    Ok(Some(message(role, content)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::Prompt;
    use serde_json::json;

    fn parse(v: Value, e: Endpoint) -> Result<Surface, RequestError> {
        Surface::parse(v.to_string().as_bytes(), e)
    }

    fn texts(r: &Request<'_>) -> Vec<(String, String)> {
        match &r.body {
            RequestBody::Chat(c) => c
                .messages
                .iter()
                .map(|m| (m.role.to_string(), m.content.text().into_owned()))
                .collect(),
            RequestBody::Completion(_) => panic!("not chat"),
        }
    }

    #[test]
    fn paths_round_trip() {
        for e in Endpoint::ALL {
            assert_eq!(Endpoint::of_path(e.path()), Some(e));
        }
        assert_eq!(Endpoint::of_path("/v1/embeddings/"), None);
    }

    #[test]
    fn pooling_bodies_name_a_model_and_route_without_a_prompt() {
        for e in [Endpoint::Pooling, Endpoint::Score, Endpoint::RerankV2] {
            let body = json!({"model": "r", "query": "q", "documents": ["a", "b"]});
            let s = parse(body, e).unwrap();
            assert_eq!((s.model.as_deref(), s.prompt), (Some("r"), None), "{e:?}");
            let e2 = parse(json!([1]), e).unwrap_err();
            assert!(matches!(e2, RequestError::NotAnObject), "{e:?}");
            let e3 = parse(json!({"model": 1}), e).unwrap_err();
            assert!(matches!(e3, RequestError::WrongType { ref field, .. } if field == "model"));
        }
    }

    #[test]
    fn embeddings_input_takes_every_prompt_shape() {
        let s = parse(json!({"model": "m", "input": "hi"}), Endpoint::Embeddings).unwrap();
        assert_eq!(s.model.as_deref(), Some("m"));
        let p = s.prompt.unwrap();
        assert_eq!(p.model, "m");
        assert_eq!(p.body, RequestBody::Completion(Prompt::Text("hi".into())));
        let s = parse(json!({"input": [[1, 2], [3]]}), Endpoint::Embeddings).unwrap();
        assert_eq!(s.model, None);
        assert_eq!(
            s.prompt.unwrap().body,
            RequestBody::Completion(Prompt::IdBatches(vec![vec![1, 2], vec![3]]))
        );
        let s = parse(
            json!({"model": "m", "messages": [{"role": "user", "content": "x"}]}),
            Endpoint::Embeddings,
        )
        .unwrap();
        assert!(matches!(s.prompt.unwrap().body, RequestBody::Chat(_)));
    }

    #[test]
    fn embeddings_errors_name_input() {
        let e = parse(json!({"model": "m"}), Endpoint::Embeddings).unwrap_err();
        assert!(matches!(e, RequestError::Missing("input")), "{e}");
        let e = parse(json!({"input": ["a", 1]}), Endpoint::Embeddings).unwrap_err();
        assert_eq!(
            e.to_string(),
            "field `input[1]` must be a string like input[0]"
        );
        let e = parse(json!({"input": []}), Endpoint::Embeddings).unwrap_err();
        assert!(
            matches!(e, RequestError::Empty(ref f) if f == "input"),
            "{e}"
        );
        let e = parse(json!({"model": 3, "input": "x"}), Endpoint::Embeddings).unwrap_err();
        assert!(matches!(e, RequestError::WrongType { ref field, .. } if field == "model"));
    }

    #[test]
    fn responses_put_instructions_first_and_skip_non_messages() {
        let s = parse(
            json!({"model": "m", "instructions": "be brief", "stream": true,
            "input": [
                {"role": "user", "content": "hi"},
                {"type": "function_call_output", "call_id": "c", "output": "42"},
                {"type": "message", "role": "assistant",
                 "content": [{"type": "output_text", "text": "a"},
                             {"type": "input_image", "image_url": "u"},
                             {"type": "output_text", "text": "b"}]},
            ]}),
            Endpoint::Responses,
        )
        .unwrap();
        let p = s.prompt.unwrap();
        assert!(p.stream);
        assert_eq!(
            texts(&p),
            [
                ("system".into(), "be brief".into()),
                ("user".into(), "hi".into()),
                ("assistant".into(), "a\nb".into()),
            ]
        );
        let s = parse(json!({"model": "m", "input": "q"}), Endpoint::Responses).unwrap();
        assert_eq!(texts(&s.prompt.unwrap()), [("user".into(), "q".into())]);
    }

    #[test]
    fn responses_name_the_response_they_continue() {
        let s = parse(json!({"input": "q"}), Endpoint::Responses).unwrap();
        assert_eq!(s.previous_response_id, None);
        let body = json!({"input": "q", "previous_response_id": "resp_0a9f"});
        let s = parse(body.clone(), Endpoint::Responses).unwrap();
        assert_eq!(s.previous_response_id.as_deref(), Some("resp_0a9f"));
        // Only the responses endpoint reads it.
        let s = parse(body, Endpoint::Tokenize);
        assert!(s.is_err_and(|e| e.to_string().contains("`prompt`")));
        let long = "r".repeat(MAX_RESPONSE_ID + 1);
        for bad in [
            json!(5),
            json!(""),
            json!("a b"),
            json!("a/b"),
            json!("a?b"),
            json!(long),
        ] {
            let body = json!({"input": "q", "previous_response_id": bad});
            let e = parse(body.clone(), Endpoint::Responses).unwrap_err();
            assert!(
                e.to_string()
                    .starts_with("field `previous_response_id` must be"),
                "{body}: {e}"
            );
        }
        let null = json!({"input": "q", "previous_response_id": null});
        assert_eq!(
            parse(null, Endpoint::Responses)
                .unwrap()
                .previous_response_id,
            None
        );
    }

    #[test]
    fn responses_errors_say_where() {
        let cases = [
            (
                json!({"model": "m"}),
                "request is missing the required field `input`",
            ),
            (
                json!({"model": "m", "input": 5}),
                "field `input` must be a string or an array of input items",
            ),
            (
                json!({"model": "m", "input": [7]}),
                "field `input[0]` must be an object",
            ),
            (
                json!({"model": "m", "input": [{"role": "user", "content": [{"text": "x"}]}]}),
                "field `input[0].content[0]` must be an object with a string `type`",
            ),
            (
                json!({"model": "m", "input": "x", "instructions": []}),
                "field `instructions` must be a string",
            ),
            (
                json!({"model": "m", "input": "x", "max_output_tokens": -1}),
                "field `max_output_tokens` must be a non-negative integer below 2^32",
            ),
        ];
        for (body, want) in cases {
            let e = parse(body.clone(), Endpoint::Responses).unwrap_err();
            assert_eq!(e.to_string(), want, "{body}");
        }
    }

    #[test]
    fn tokenize_takes_a_prompt_or_messages() {
        let s = parse(json!({"model": "m", "prompt": "abc"}), Endpoint::Tokenize).unwrap();
        assert!(matches!(s.prompt.unwrap().body, RequestBody::Completion(_)));
        let s = parse(
            json!({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": false}),
            Endpoint::Tokenize,
        )
        .unwrap();
        match s.prompt.unwrap().body {
            RequestBody::Chat(c) => assert!(!c.add_generation_prompt),
            RequestBody::Completion(_) => panic!("chat expected"),
        }
        let e = parse(json!({"model": "m"}), Endpoint::Tokenize).unwrap_err();
        assert!(matches!(e, RequestError::Missing("prompt")), "{e}");
        let e = parse(json!({"messages": []}), Endpoint::Tokenize).unwrap_err();
        assert!(
            matches!(e, RequestError::Empty(ref f) if f == "messages"),
            "{e}"
        );
    }

    #[test]
    fn detokenize_has_no_prompt_but_checks_tokens() {
        let s = parse(
            json!({"model": "m", "tokens": [1, 2]}),
            Endpoint::Detokenize,
        )
        .unwrap();
        assert_eq!(s.prompt, None);
        let e = parse(json!({"model": "m"}), Endpoint::Detokenize).unwrap_err();
        assert!(matches!(e, RequestError::Missing("tokens")), "{e}");
        let e = parse(json!({"tokens": [1, "x"]}), Endpoint::Detokenize).unwrap_err();
        assert_eq!(
            e.to_string(),
            "field `tokens[1]` must be a token id (integer 0..2^32)"
        );
        assert!(matches!(
            Surface::parse(b"[1]", Endpoint::Detokenize),
            Err(RequestError::NotAnObject)
        ));
        assert!(matches!(
            Surface::parse(b"{", Endpoint::Tokenize),
            Err(RequestError::InvalidJson(_))
        ));
    }
}

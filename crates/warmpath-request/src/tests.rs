//! Tests of request parsing.

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
    assert!(r.stream && matches!(r.body, RequestBody::Chat(_)));
    assert_eq!(r.max_tokens, Some(7));
    assert_eq!(r.prompt_cache_key.as_deref(), Some("acme"));
    let c = chat(&v);
    assert_eq!(c.messages.len(), 3);
    assert_eq!(c.messages[0].content.text(), "be brief");
    assert_eq!(c.messages[1].content.text(), "a\nb");
    assert_eq!(c.messages[2].content, Content::Empty);
    assert!(c.messages[2].extra.get("tool_calls").is_some());
    assert!(!c.messages[2].extra.contains_key("role"));
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
    assert!(matches!(prompt(json!([[1], []])), Err(RequestError::Empty(f)) if f == "prompt[1]"));
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
    let chat = matches!(r.unwrap().body, RequestBody::Chat(_));
    assert!(!chat, "null messages do not make a chat");
}

#[test]
fn tenant_precedence() {
    let v = json!({"model": "m", "prompt": "x", "prompt_cache_key": "key", "cache_salt": "salt"});
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

/// `parse` and `from_value` against the oracle on the same body: the same
/// request, or the same error.
fn same_as_from_value(body: &[u8]) {
    let v: Result<Value, _> = serde_json::from_slice(body);
    for expect in [Expect::Chat, Expect::Completion, Expect::Any] {
        let fast = Request::parse(body, expect).map_err(|e| e.to_string());
        let slow = match &v {
            Ok(v) => oracle::oracle(v, expect).map_err(|e| e.to_string()),
            Err(e) => Err(format!("request body is not valid JSON: {e}")),
        };
        assert_eq!(fast, slow, "{expect:?}: {}", String::from_utf8_lossy(body));
        if let Ok(v) = &v {
            let walked = Request::from_value(v, expect).map_err(|e| e.to_string());
            assert_eq!(walked, slow, "from_value {expect:?}: {v}");
        }
    }
}

#[test]
fn parse_borrows_plain_strings_and_unescapes_others() {
    let body = br#"{"model":"m","cache_salt":"s","messages":[{"role":"system","content":"plain"},{"role":"user","content":"two\nlines","name":"x"}]}"#;
    let r = Request::parse(body, Expect::Chat).unwrap();
    assert!(matches!(r.model, Cow::Borrowed("m")));
    let RequestBody::Chat(c) = &r.body else {
        panic!("not chat")
    };
    assert!(matches!(
        c.messages[0].content,
        Content::Text(Cow::Borrowed("plain"))
    ));
    assert!(matches!(&c.messages[1].content, Content::Text(Cow::Owned(t)) if t == "two\nlines"));
    assert_eq!(c.messages[1].extra.get("name"), Some(&json!("x")));
    assert_eq!(c.messages[1].extra.len(), 1);
    same_as_from_value(body);
}

#[test]
fn parse_keeps_the_last_of_repeated_keys_like_a_value() {
    for body in [
        &br#"{"model":1,"model":"m","prompt":"p"}"#[..],
        br#"{"model":"m","model":null,"prompt":"p"}"#,
        br#"{"model":"m","messages":[{"role":"user","content":"a","content":null,"role":"tool"}]}"#,
        br#"{"model":"m","messages":[{"role":"u","content":[{"type":"text","text":"a","text":"b"}]}]}"#,
        br#"{"model":"m","messages":[{"role":"u","content":[{"type":"text","text":"a","text":null}]}]}"#,
        br#"{"model":"m","messages":[{"role":"u","content":"x"}],"messages":null,"prompt":[1,2]}"#,
        br#"{"model":"m","prompt":"p","max_tokens":3,"max_tokens":-1}"#,
        br#"{"model":"m","prompt":"p","max_completion_tokens":3,"max_tokens":-1}"#,
        br#"{"model":"m","prompt":"p","stream":true,"stream":null}"#,
    ] {
        same_as_from_value(body);
    }
}

#[test]
fn parse_gives_the_same_errors() {
    for body in [
        &b""[..],
        b"[]",
        b"{\"model\":\"m\"} x",
        b"{\"model\":\"m\",\"prompt\":\"p\"",
        br#"{"model":"m","messages":[]}"#,
        br#"{"model":"m","messages":[1]}"#,
        br#"{"model":"m","messages":[{"content":"x"}]}"#,
        br#"{"model":"m","messages":[{"role":"u","content":[{"text":"x"}]}]}"#,
        br#"{"model":"m","messages":[{"role":"u","content":[3]}]}"#,
        br#"{"model":"m","messages":[{"role":"u","content":3}]}"#,
        br#"{"model":"m","messages":[{"role":"u"}],"tools":{}}"#,
        br#"{"model":"m","messages":[{"role":"u"}],"chat_template_kwargs":[]}"#,
        br#"{"model":"m","messages":[{"role":"u"}],"add_generation_prompt":"yes"}"#,
        br#"{"model":"m","prompt":[]}"#,
        br#"{"model":"m","prompt":[[]]}"#,
        br#"{"model":"m","prompt":[1,"a"]}"#,
        br#"{"model":"m","prompt":"p","max_tokens":1.5}"#,
        br#"{"model":"m","prompt":"p","cache_salt":7}"#,
    ] {
        same_as_from_value(body);
    }
}

mod prop {
    use super::*;
    use proptest::prelude::*;

    /// A field value: absent, null, one of the valid shapes, or a wrong type.
    fn field(valid: Vec<Value>) -> impl Strategy<Value = Option<Value>> {
        let mut choices = vec![
            Value::Null,
            json!(7),
            json!("s\"\\\n\u{e9}"),
            json!(true),
            json!([]),
            json!({}),
        ];
        choices.extend(valid);
        prop_oneof![
            1 => Just(None),
            4 => proptest::sample::select(choices).prop_map(Some),
        ]
    }

    fn text() -> impl Strategy<Value = String> {
        "[a-z \\n\\t\"\\\\\u{e9}\u{1F600}]{0,12}"
    }

    fn part() -> impl Strategy<Value = Value> {
        (
            field(vec![json!("text"), json!("image_url")]),
            proptest::option::of(text()),
            any::<bool>(),
        )
            .prop_map(|(kind, t, odd)| {
                if odd {
                    return json!(["not", "an", "object"]);
                }
                let mut m = Map::new();
                if let Some(k) = kind {
                    m.insert("type".into(), k);
                }
                if let Some(t) = t {
                    m.insert("text".into(), Value::String(t));
                }
                Value::Object(m)
            })
    }

    fn message() -> impl Strategy<Value = Value> {
        (
            field(vec![json!("user"), json!("system")]),
            prop_oneof![
                1 => Just(None),
                1 => Just(Some(Value::Null)),
                3 => text().prop_map(|t| Some(Value::String(t))),
                1 => "[a-z \\n\"]{64,90}".prop_map(|t| Some(Value::String(t))),
                2 => proptest::collection::vec(part(), 0..3).prop_map(|p| Some(Value::Array(p))),
                1 => Just(Some(json!(5))),
            ],
            proptest::option::of(text()),
        )
            .prop_map(|(role, content, name)| {
                let mut m = Map::new();
                if let Some(r) = role {
                    m.insert("role".into(), r);
                }
                if let Some(c) = content {
                    m.insert("content".into(), c);
                }
                if let Some(n) = name {
                    m.insert("name".into(), Value::String(n));
                }
                Value::Object(m)
            })
    }

    fn body() -> impl Strategy<Value = Value> {
        let messages = prop_oneof![
            1 => Just(None),
            1 => Just(Some(Value::Null)),
            4 => proptest::collection::vec(message(), 0..4).prop_map(|m| Some(Value::Array(m))),
        ];
        let prompt = field(vec![
            json!("a prompt"),
            json!(["a", "b"]),
            json!([1, 2, 3]),
            json!([[1], [2, 3]]),
            json!([[1], []]),
            json!([1, "x"]),
        ]);
        let numbers = vec![
            json!(0),
            json!(4096),
            json!(-1),
            json!(1.5),
            json!(5_000_000_000u64),
        ];
        (
            (
                field(vec![json!("m")]),
                field(vec![json!(false)]),
                messages,
                prompt,
            ),
            (
                field(vec![json!("tenant-a")]),
                field(vec![json!("salt")]),
                field(numbers.clone()),
                field(numbers),
            ),
            (
                field(vec![json!(false)]),
                field(vec![json!(true)]),
                field(vec![json!([{"type": "function"}])]),
                field(vec![json!({"enable_thinking": false})]),
                field(vec![json!({"deep": [1, {"x": null}]})]),
            ),
        )
            .prop_map(
                |(
                    (model, stream, messages, prompt),
                    (pck, salt, mt, mct),
                    (agp, cfm, tools, kw, other),
                )| {
                    let mut m = Map::new();
                    for (k, v) in [
                        ("model", model),
                        ("stream", stream),
                        ("messages", messages),
                        ("prompt", prompt),
                        ("prompt_cache_key", pck),
                        ("cache_salt", salt),
                        ("max_tokens", mt),
                        ("max_completion_tokens", mct),
                        ("add_generation_prompt", agp),
                        ("continue_final_message", cfm),
                        ("tools", tools),
                        ("chat_template_kwargs", kw),
                        ("temperature", other),
                    ] {
                        insert_some(&mut m, k, v);
                    }
                    Value::Object(m)
                },
            )
    }

    fn insert_some(m: &mut Map<String, Value>, key: &str, v: Option<Value>) {
        if let Some(v) = v {
            m.insert(key.into(), v);
        }
    }

    /// The common chat shape: simple messages (long contents among them),
    /// other fields of every kind.
    fn simple_chat() -> impl Strategy<Value = Value> {
        let content = prop_oneof![
            1 => Just(Value::Null),
            2 => text().prop_map(Value::String),
            3 => "[a-z \\n\"\u{e9}]{64,200}".prop_map(Value::String),
            1 => "[a-z ]{64,100}".prop_map(Value::String),
        ];
        let message = (
            proptest::sample::select(vec!["system", "user", "assistant"]),
            proptest::option::of(content),
        )
            .prop_map(|(role, content)| {
                let mut m = Map::new();
                m.insert("role".into(), json!(role));
                if let Some(c) = content {
                    m.insert("content".into(), c);
                }
                Value::Object(m)
            });
        let other = proptest::sample::select(vec![
            json!(0.7),
            json!(-1e-3),
            json!("s\"}]"),
            json!({"include_usage": true, "x": ["]", {}]}),
            json!([null, false]),
            json!(null),
        ]);
        (
            proptest::collection::vec(message, 1..4),
            proptest::option::of(other),
            proptest::option::of(proptest::sample::select(vec![
                json!(5),
                json!(null),
                json!(-2),
            ])),
            proptest::option::of(proptest::sample::select(vec![json!("t-1"), json!(null)])),
            any::<bool>(),
        )
            .prop_map(|(messages, other, max_tokens, pck, stream)| {
                let mut m = Map::new();
                m.insert("model".into(), json!("m"));
                m.insert("stream".into(), json!(stream));
                m.insert("messages".into(), Value::Array(messages));
                for (k, v) in [
                    ("temperature", other),
                    ("max_tokens", max_tokens),
                    ("prompt_cache_key", pck),
                ] {
                    insert_some(&mut m, k, v);
                }
                Value::Object(m)
            })
    }

    fn json_bytes(v: &Value, pretty: bool) -> Vec<u8> {
        if pretty {
            serde_json::to_vec_pretty(v).unwrap()
        } else {
            serde_json::to_vec(v).unwrap()
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1024))]
        #[test]
        fn simple_chats_match_from_value(v in simple_chat(), pretty in any::<bool>()) {
            let bytes = json_bytes(&v, pretty);
            same_as_from_value(&bytes);
        }

        #[test]
        fn parse_matches_from_value(v in body(), pretty in any::<bool>()) {
            let bytes = json_bytes(&v, pretty);
            same_as_from_value(&bytes);
        }

        #[test]
        fn parse_never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            same_as_from_value(&bytes);
        }
    }
}

/// An independent reading of a [`Value`] (the parser before the walk),
/// kept as the oracle the walk is checked against.
mod oracle {
    use super::super::*;
    use serde_json::{Map, Value};
    use std::borrow::Cow;

    /// The request in `v`, read straight from the tree.
    pub(super) fn oracle(v: &Value, expect: Expect) -> Result<Request<'_>, RequestError> {
        {
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
    pub(super) fn u32_field(
        v: Option<&Value>,
        key: &'static str,
    ) -> Result<Option<u32>, RequestError> {
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
                    Value::Array(b) if b.is_empty() => {
                        Err(RequestError::Empty(format!("prompt[{i}]")))
                    }
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
}

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
    assert!(r.stream && r.is_chat());
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

/// `parse` against `from_value` on the same body: the same request, or the
/// same error.
fn same_as_from_value(body: &[u8]) {
    let v: Result<Value, _> = serde_json::from_slice(body);
    for expect in [Expect::Chat, Expect::Completion, Expect::Any] {
        let fast = Request::parse(body, expect).map_err(|e| e.to_string());
        let slow = match &v {
            Ok(v) => Request::from_value(v, expect).map_err(|e| e.to_string()),
            Err(e) => Err(format!("request body is not valid JSON: {e}")),
        };
        assert_eq!(fast, slow, "{expect:?}: {}", String::from_utf8_lossy(body));
        // Through a content cache that keeps every literal: a miss, then a hit.
        let cache = ContentCache::new(1 << 20).keeping_from(1);
        for _ in 0..2 {
            let cached = Request::parse_with(body, expect, Some(&cache)).map_err(|e| e.to_string());
            assert_eq!(
                cached,
                slow,
                "cached {expect:?}: {}",
                String::from_utf8_lossy(body)
            );
        }
    }
}

#[test]
fn a_long_escaped_content_is_shared_from_the_cache() {
    // JSON text: escaped line breaks, a \u escape and an escaped backslash.
    let system = r"line one\nline \u00e9\\ two\n".repeat(100);
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"system","content":"{system}"}},{{"role":"user","content":"short\nq"}}]}}"#
    );
    let cache = ContentCache::default();
    let plain = Request::parse(body.as_bytes(), Expect::Chat).unwrap();
    for round in 0..2 {
        let r = Request::parse_with(body.as_bytes(), Expect::Chat, Some(&cache)).unwrap();
        assert_eq!(r, plain);
        let RequestBody::Chat(c) = &r.body else {
            panic!("not chat")
        };
        assert!(
            matches!(c.messages[0].content, Content::Shared(..)),
            "long: shared"
        );
        assert!(
            matches!(c.messages[1].content, Content::Text(Cow::Owned(_))),
            "short: not kept"
        );
        assert_eq!(
            c.messages[0].content.text(),
            "line one\nline \u{e9}\\ two\n".repeat(100)
        );
        let s = cache.stats();
        assert_eq!((s.hits, s.misses, s.entries), (round, 1, 1));
    }
    // An owned copy keeps sharing the text.
    let owned = Request::parse_with(body.as_bytes(), Expect::Chat, Some(&cache))
        .unwrap()
        .into_owned();
    assert_eq!(owned, plain);
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
                // Long enough to be found by its start in a content cache.
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

    /// The shape the skimming walk (`skim.rs`) reads to the end: simple
    /// messages (long contents among them), other fields of every kind.
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
        fn skimmed_chats_match_from_value(v in simple_chat(), pretty in any::<bool>()) {
            let bytes = json_bytes(&v, pretty);
            same_as_from_value(&bytes);
            // ... and the skimming walk read them itself, hits included.
            let cache = ContentCache::new(1 << 20).keeping_from(1);
            for _ in 0..2 {
                let skimmed = super::super::skim::skim(&bytes, Expect::Chat, Some(&cache));
                prop_assert!(skimmed.is_some() || v["max_tokens"] == json!(-2));
            }
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

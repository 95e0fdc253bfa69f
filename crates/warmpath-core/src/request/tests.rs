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

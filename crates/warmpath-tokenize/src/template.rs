//! Chat-template rendering with minijinja, configured like Hugging Face's
//! `apply_chat_template` as vLLM calls it.

use super::error::TokenizeError;
use super::files::SpecialTokens;
use super::pyfuncs;
use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::{Environment, Value};
use std::collections::BTreeMap;
use std::fmt;
use warmpath_request::{ChatBody, Message};

const NAME: &str = "chat";

/// A compiled chat template plus the special tokens it may print.
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    special: SpecialTokens,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("special", &self.special)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`. The environment has `trim_blocks` and `lstrip_blocks`
    /// on (as Hugging Face), Python string/dict/list methods (minijinja-contrib's
    /// pycompat), `raise_exception`, `strftime_now` and a Python-style `tojson`.
    pub(crate) fn new(source: &str, special: SpecialTokens) -> Result<Self, TokenizeError> {
        let mut env = Environment::new();
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(TokenizeError::TemplateSyntax)?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", pyfuncs::raise_exception);
        env.add_function("strftime_now", pyfuncs::strftime_now);
        env.add_filter("tojson", pyfuncs::tojson);
        env.add_template_owned(NAME, source.to_owned())
            .map_err(TokenizeError::TemplateSyntax)?;
        Ok(ChatTemplate { env, special })
    }

    /// Renders a chat as vLLM does: each message's content reduced to a string
    /// (text parts joined with `"\n"`), `tool_calls[].function.arguments` given
    /// as JSON strings parsed into objects, the template variables `messages`,
    /// `tools`, `add_generation_prompt`, `bos_token`, `eos_token`, `unk_token`,
    /// `pad_token`, then `chat_template_kwargs` (which cannot replace `messages`).
    /// With `continue_final_message` the text is cut right after the last
    /// message's content, as `transformers` does.
    pub(crate) fn render(&self, chat: &ChatBody<'_>) -> Result<String, TokenizeError> {
        if chat.continue_final_message && chat.add_generation_prompt {
            return Err(TokenizeError::ContinueFinalMessage(
                "cannot be combined with add_generation_prompt=true",
            ));
        }
        let rendered = self.render_jinja(chat)?;
        if chat.continue_final_message {
            let last = chat
                .messages
                .last()
                .map(|m| m.content.text())
                .unwrap_or_default();
            return cut_after_final_message(rendered, &last);
        }
        Ok(rendered)
    }

    fn render_jinja(&self, chat: &ChatBody<'_>) -> Result<String, TokenizeError> {
        let messages: Vec<Value> = chat.messages.iter().map(template_message).collect();
        let mut ctx: BTreeMap<String, Value> = BTreeMap::new();
        if let Some(kw) = &chat.chat_template_kwargs {
            for (k, v) in kw.iter() {
                ctx.insert(k.clone(), Value::from(Serde(v)));
            }
        }
        ctx.insert("messages".into(), Value::from(messages));
        let tools = chat
            .tools
            .as_deref()
            .map_or(Value::from(()), |t| Value::from(Serde(t)));
        ctx.insert("tools".into(), tools);
        ctx.entry("add_generation_prompt".into())
            .or_insert(Value::from(chat.add_generation_prompt));
        let s = &self.special;
        for (k, v) in [
            ("bos_token", &s.bos),
            ("eos_token", &s.eos),
            ("unk_token", &s.unk),
            ("pad_token", &s.pad),
        ] {
            if let Some(v) = v {
                ctx.entry(k.into()).or_insert(Value::from(v.as_str()));
            }
        }
        let tmpl = self.env.get_template(NAME).map_err(TokenizeError::Render)?;
        tmpl.render(&ctx).map_err(TokenizeError::Render)
    }
}

/// The message as the template sees it.
fn template_message(m: &Message<'_>) -> Value {
    // Built straight into template values: the message's other fields are
    // converted one by one, and the content (often the long system prompt)
    // is copied once instead of being cloned with the raw object first.
    let mut obj: BTreeMap<String, Value> = BTreeMap::new();
    for (k, v) in &m.extra {
        let value = match k.as_str() {
            "role" | "content" => continue,
            "tool_calls" => Value::from(Serde(tool_calls_with_parsed_arguments(v))),
            _ => Value::from(Serde(v)),
        };
        obj.insert(k.clone(), value);
    }
    obj.insert("role".into(), Value::from(m.role.as_ref()));
    obj.insert("content".into(), Value::from(m.content.text().as_ref()));
    Value::from(obj)
}

/// `tool_calls` with each `function.arguments` JSON string parsed, as
/// Hugging Face's templates expect.
fn tool_calls_with_parsed_arguments(v: &serde_json::Value) -> serde_json::Value {
    let mut v = v.clone();
    if let serde_json::Value::Array(calls) = &mut v {
        for call in calls {
            if let Some(args) = call.pointer_mut("/function/arguments") {
                if let Some(parsed) = args.as_str().and_then(|s| serde_json::from_str(s).ok()) {
                    *args = parsed;
                }
            }
        }
    }
    v
}

/// `transformers`' continue_final_message: cut after the final message's text.
fn cut_after_final_message(mut rendered: String, last: &str) -> Result<String, TokenizeError> {
    let stripped = last.trim();
    let Some(loc) = rendered.rfind(stripped) else {
        return Err(TokenizeError::ContinueFinalMessage(
            "the final message does not appear in the rendered template",
        ));
    };
    let lstripped = last.trim_start();
    let keep = if rendered[loc..].starts_with(lstripped) {
        lstripped.len()
    } else {
        stripped.len()
    };
    rendered.truncate(loc + keep);
    Ok(rendered)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;
    use warmpath_request::{Expect, Request, RequestBody};

    fn chat_of(v: &serde_json::Value) -> ChatBody<'_> {
        match Request::from_value(v, Expect::Chat).unwrap().body {
            RequestBody::Chat(c) => c,
            RequestBody::Completion(_) => unreachable!(),
        }
    }

    fn special() -> SpecialTokens {
        SpecialTokens {
            bos: Some("<s>".into()),
            eos: Some("</s>".into()),
            ..Default::default()
        }
    }

    #[test]
    fn pycompat_trim_blocks_and_globals() {
        let src = "{{ bos_token }}{% for m in messages %}\n  {% if m.role == 'user' %}\n[{{ m.content.strip().upper() }}]\n  {% endif %}\n{% endfor %}\n{% if add_generation_prompt %}>{% endif %}";
        let t = ChatTemplate::new(src, special()).unwrap();
        let v = json!({"model": "m", "messages": [
            {"role": "user", "content": [{"type": "text", "text": " hi"}, {"type": "text", "text": "yo "}]},
            {"role": "assistant", "content": "ok"}]});
        assert_eq!(t.render(&chat_of(&v)).unwrap(), "<s>[HI\nYO]\n>");
    }

    #[test]
    fn raise_exception_is_a_client_error() {
        let src = "{% if messages[0].role != 'system' %}{{ raise_exception('system first') }}{% endif %}ok";
        let t = ChatTemplate::new(src, special()).unwrap();
        let v = json!({"model": "m", "messages": [{"role": "user", "content": "x"}]});
        let e = t.render(&chat_of(&v)).unwrap_err();
        assert!(e.is_client_error());
        assert!(e.to_string().contains("system first"), "{e}");
        assert!(matches!(
            ChatTemplate::new("{% if %}", special()),
            Err(TokenizeError::TemplateSyntax(_))
        ));
    }

    #[test]
    fn tools_kwargs_and_tool_call_arguments() {
        let src = "{{ tools | tojson }}|{{ flavour }}|{{ messages[0].tool_calls[0].function.arguments.city }}|{% if not add_generation_prompt %}no-gen{% endif %}";
        let t = ChatTemplate::new(src, special()).unwrap();
        let v = json!({"model": "m", "tools": [{"name": "f<x>", "type": "function"}],
            "chat_template_kwargs": {"flavour": "mint", "messages": []},
            "add_generation_prompt": false,
            "messages": [{"role": "assistant", "content": null, "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "w", "arguments": "{\"city\": \"Oslo\"}"}}]}]});
        assert_eq!(
            t.render(&chat_of(&v)).unwrap(),
            "[{\"name\": \"f<x>\", \"type\": \"function\"}]|mint|Oslo|no-gen"
        );
    }

    #[test]
    fn continue_final_message_cuts_after_the_last_content() {
        let src = "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>{% endfor %}";
        let t = ChatTemplate::new(src, special()).unwrap();
        let v = json!({"model": "m", "add_generation_prompt": false, "continue_final_message": true,
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The answer is "}]});
        assert_eq!(
            t.render(&chat_of(&v)).unwrap(),
            "<user>q</user><assistant>The answer is"
        );
        let both = json!({"model": "m", "continue_final_message": true, "messages": [{"role": "user", "content": "q"}]});
        assert!(t.render(&chat_of(&both)).unwrap_err().is_client_error());
    }
}

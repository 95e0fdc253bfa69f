//! Native renderers for well-known chat templates.
//!
//! Rendering through minijinja costs little back to back (~20 µs for an
//! 8000-token chat) but ~100 µs on a core that sat idle for a few
//! milliseconds, which is how a router core usually finds a request: the
//! template VM, its value type and the string concatenations of the long
//! system prompt (each `+` copies it) all come in cold. A template whose
//! source is **byte for byte** one of the sources below is rendered by plain
//! Rust that writes each piece once into a buffer of the right size.
//!
//! The native output equals minijinja's for every input it is used for (the
//! proptest in this module compares them on random chats with whitespace,
//! Unicode and special-token text in the contents). It is used only when the
//! request cannot steer the template through anything the native code does
//! not model: no `chat_template_kwargs`, and a BOS token the template can
//! print. Anything else, and every other template, goes through minijinja.

use super::files::SpecialTokens;
use crate::request::ChatBody;

/// Meta Llama 3 Instruct's template (`meta-llama/Meta-Llama-3-8B-Instruct`,
/// `-70B-Instruct`), also the tiny test model's.
pub const LLAMA3_INSTRUCT: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/// The ChatML template many fine-tunes ship (`<|im_start|>` / `<|im_end|>`,
/// contents printed as they are).
pub const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A template rendered natively.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Native {
    /// [`LLAMA3_INSTRUCT`], with the BOS token it prints first.
    Llama3Instruct {
        /// `bos_token`.
        bos: String,
    },
    /// [`CHATML`].
    ChatMl,
}

impl Native {
    /// The native renderer for `source`, if it is one of the known sources
    /// and the special tokens it reads are defined.
    pub fn recognize(source: &str, special: &SpecialTokens) -> Option<Self> {
        match source {
            LLAMA3_INSTRUCT => special
                .bos
                .as_ref()
                .map(|bos| Native::Llama3Instruct { bos: bos.clone() }),
            CHATML => Some(Native::ChatMl),
            _ => None,
        }
    }

    /// Renders `chat`, or `None` when the request carries something the
    /// native renderer does not model (then minijinja renders it).
    /// `continue_final_message` is applied by the caller, as for minijinja.
    pub fn render(&self, chat: &ChatBody<'_>) -> Option<String> {
        if chat
            .chat_template_kwargs
            .as_ref()
            .is_some_and(|k| !k.is_empty())
        {
            return None;
        }
        let texts: Vec<_> = chat.messages.iter().map(|m| m.content.text()).collect();
        let size: usize = chat
            .messages
            .iter()
            .zip(&texts)
            .map(|(m, t)| m.role.len() + t.len() + 48)
            .sum::<usize>()
            + 64;
        let mut out = String::with_capacity(size);
        match self {
            Native::Llama3Instruct { bos } => {
                out.push_str(bos);
                for (m, text) in chat.messages.iter().zip(&texts) {
                    out.push_str("<|start_header_id|>");
                    out.push_str(&m.role);
                    out.push_str("<|end_header_id|>\n\n");
                    // minijinja's `trim`: Rust's `str::trim` (Unicode White_Space).
                    out.push_str(text.trim());
                    out.push_str("<|eot_id|>");
                }
                if chat.add_generation_prompt {
                    out.push_str("<|start_header_id|>assistant<|end_header_id|>\n\n");
                }
            }
            Native::ChatMl => {
                for (m, text) in chat.messages.iter().zip(&texts) {
                    out.push_str("<|im_start|>");
                    out.push_str(&m.role);
                    out.push('\n');
                    out.push_str(text);
                    out.push_str("<|im_end|>\n");
                }
                if chat.add_generation_prompt {
                    out.push_str("<|im_start|>assistant\n");
                }
            }
        }
        Some(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::request::{Expect, Request, RequestBody};
    use crate::tokenize::ChatTemplate;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    fn special(bos: Option<&str>) -> SpecialTokens {
        SpecialTokens {
            bos: bos.map(str::to_owned),
            eos: Some("<|eot_id|>".into()),
            ..Default::default()
        }
    }

    fn chat(v: &Value) -> ChatBody<'_> {
        match Request::from_value(v, Expect::Chat).unwrap().body {
            RequestBody::Chat(c) => c,
            RequestBody::Completion(_) => unreachable!(),
        }
    }

    #[test]
    fn recognized_only_byte_for_byte_and_with_the_tokens_it_prints() {
        let s = special(Some("<|begin_of_text|>"));
        assert!(Native::recognize(LLAMA3_INSTRUCT, &s).is_some());
        assert!(Native::recognize(CHATML, &special(None)).is_some());
        // No BOS token: the template would fail on `bos_token + content`.
        assert_eq!(Native::recognize(LLAMA3_INSTRUCT, &special(None)), None);
        let spaced = LLAMA3_INSTRUCT.replace("{{ content }}", "{{content}}");
        assert_eq!(Native::recognize(&spaced, &s), None);
        assert_eq!(Native::recognize(&format!("{CHATML}\n"), &s), None);
        // The tiny test model ships Llama 3's template.
        assert_eq!(crate::tokenize::tiny::CHAT_TEMPLATE, LLAMA3_INSTRUCT);
    }

    #[test]
    fn kwargs_fall_back_to_the_template_engine() {
        let n = Native::recognize(LLAMA3_INSTRUCT, &special(Some("<s>"))).unwrap();
        let v = json!({"model": "m", "chat_template_kwargs": {"bos_token": "[B]"},
            "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(n.render(&chat(&v)), None);
        let t = ChatTemplate::new(LLAMA3_INSTRUCT, special(Some("<s>"))).unwrap();
        assert!(t
            .render(&chat(&v))
            .unwrap()
            .starts_with("[B]<|start_header_id|>user"));
    }

    fn content() -> impl Strategy<Value = Value> {
        let text = "[ a-z\\n\\t\u{a0}\u{3000}\u{e9}\u{1F600}<|>_]{0,24}";
        prop_oneof![
            4 => text.prop_map(Value::from),
            1 => Just(Value::Null),
            1 => proptest::collection::vec(text, 0..3).prop_map(|ps| {
                Value::from(ps.into_iter().map(|p| json!({"type": "text", "text": p})).collect::<Vec<_>>())
            }),
            1 => Just(json!(" <|eot_id|>\n ")),
        ]
    }

    fn message() -> impl Strategy<Value = Value> {
        let role = prop_oneof![
            Just("system"),
            Just("user"),
            Just("assistant"),
            Just("tool"),
            Just(" odd role\n")
        ];
        (role, content(), any::<bool>()).prop_map(|(role, content, named)| {
            let mut m = json!({"role": role, "content": content});
            if named {
                m["name"] = json!("n");
            }
            m
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]
        #[test]
        fn native_equals_minijinja(
            messages in proptest::collection::vec(message(), 1..5),
            generation in proptest::option::of(any::<bool>()),
            continue_final in any::<bool>(),
            empty_kwargs in any::<bool>(),
            chatml in any::<bool>(),
            bos in prop_oneof![Just("<|begin_of_text|>"), Just(""), Just(" <s>\n")],
        ) {
            let mut v = json!({"model": "m", "messages": messages});
            if let Some(g) = generation {
                v["add_generation_prompt"] = json!(g);
            }
            if continue_final {
                v["continue_final_message"] = json!(true);
            }
            if empty_kwargs {
                v["chat_template_kwargs"] = json!({});
            }
            let source = if chatml { CHATML } else { LLAMA3_INSTRUCT };
            let native = ChatTemplate::new(source, special(Some(bos))).unwrap();
            prop_assert!(native.is_native());
            let jinja = ChatTemplate::new(source, special(Some(bos))).unwrap().without_native();
            prop_assert!(!jinja.is_native());
            let c = chat(&v);
            let (a, b) = (native.render(&c), jinja.render(&c));
            match (a, b) {
                (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
                (Err(a), Err(b)) => prop_assert_eq!(a.to_string(), b.to_string()),
                (a, b) => prop_assert!(false, "native {:?} vs minijinja {:?}", a, b),
            }
        }
    }
}

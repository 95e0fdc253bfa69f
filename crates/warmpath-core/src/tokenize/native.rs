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
use crate::request::{ChatBody, Content};
use xxhash_rust::xxh3::Xxh3;

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
    /// Renders `chat` as the template would; `None` when the request carries
    /// `chat_template_kwargs` (the template engine must see them).
    pub fn render(&self, chat: &ChatBody<'_>) -> Option<String> {
        self.render_from(chat, 0)
    }

    /// The rendering of `messages[from..]` and the generation prompt: the
    /// text [`render`](Self::render) writes after the first `from` messages
    /// (so `head ++ render_from(chat, k) == render(chat)` where `head` is
    /// what [`head_keys`](Self::head_keys) hashed for `k`).
    pub fn render_from(&self, chat: &ChatBody<'_>, from: usize) -> Option<String> {
        if !Self::usable(chat) {
            return None;
        }
        let messages = chat.messages.get(from..)?;
        let texts: Vec<_> = messages.iter().map(|m| m.content.text()).collect();
        let size: usize = messages
            .iter()
            .zip(&texts)
            .map(|(m, t)| m.role.len() + t.len() + 48)
            .sum::<usize>()
            + 64;
        let mut out = String::with_capacity(size);
        for (i, (m, text)) in messages.iter().zip(&texts).enumerate() {
            self.emit_message(from + i, &m.role, text, &mut |p| out.push_str(p.text()));
        }
        if chat.add_generation_prompt {
            out.push_str(self.generation_prompt());
        }
        Some(out)
    }

    /// Keys of the chat's *heads*: for each `k` in `1..messages.len()`, the
    /// 128-bit xxh3 of `salt` followed by the rendering of `messages[..k]`,
    /// and that rendering's byte length, computed in one streaming pass
    /// without building the text. A shared content
    /// ([`Content::Shared`]) stands in the stream as the byte 0xFF and its
    /// literal's key instead of its text, so its text is not read (only its
    /// ends, to trim it); 0xFF never occurs in UTF-8, so the stream still
    /// names one rendering. Shortest head first. `None` when the chat is not
    /// rendered natively (see [`render`](Self::render)).
    pub fn head_keys(&self, chat: &ChatBody<'_>, salt: &[u8]) -> Option<Vec<HeadKey>> {
        if !Self::usable(chat) {
            return None;
        }
        let heads = chat.messages.len().saturating_sub(1);
        let mut keys = Vec::with_capacity(heads);
        let mut hasher = Xxh3::new();
        hasher.update(salt);
        let mut len = 0usize;
        for (i, m) in chat.messages[..heads].iter().enumerate() {
            let text = m.content.text();
            let shared = match &m.content {
                Content::Shared(_, key) => Some(key),
                _ => None,
            };
            self.emit_message(i, &m.role, &text, &mut |p| {
                match (p, shared) {
                    (Part::Content(_), Some(key)) => {
                        hasher.update(&[0xFF]);
                        hasher.update(&key.hash.to_le_bytes());
                        hasher.update(&(key.len as u64).to_le_bytes());
                    }
                    (p, _) => hasher.update(p.text().as_bytes()),
                }
                len += p.text().len();
            });
            keys.push(HeadKey {
                messages: i + 1,
                hash: hasher.digest128(),
                len,
            });
        }
        Some(keys)
    }

    /// What every message's rendering but the first starts with: an added
    /// token, where the tokenizer cuts the text (see
    /// `ChatTokenizer::head_split_is_exact`).
    pub fn message_start(&self) -> &'static str {
        match self {
            Native::Llama3Instruct { .. } => "<|start_header_id|>",
            Native::ChatMl => "<|im_start|>",
        }
    }

    fn usable(chat: &ChatBody<'_>) -> bool {
        chat.chat_template_kwargs
            .as_ref()
            .is_none_or(|k| k.is_empty())
    }

    fn generation_prompt(&self) -> &'static str {
        match self {
            Native::Llama3Instruct { .. } => "<|start_header_id|>assistant<|end_header_id|>\n\n",
            Native::ChatMl => "<|im_start|>assistant\n",
        }
    }

    /// Writes message `index`'s rendering piece by piece.
    fn emit_message<'t>(
        &'t self,
        index: usize,
        role: &'t str,
        text: &'t str,
        out: &mut impl FnMut(Part<'t>),
    ) {
        use Part::{Content, Template};
        match self {
            Native::Llama3Instruct { bos } => {
                if index == 0 {
                    out(Template(bos));
                }
                out(Template("<|start_header_id|>"));
                out(Template(role));
                out(Template("<|end_header_id|>\n\n"));
                // minijinja's `trim`: Rust's `str::trim` (Unicode White_Space).
                out(Content(text.trim()));
                out(Template("<|eot_id|>"));
            }
            Native::ChatMl => {
                out(Template("<|im_start|>"));
                out(Template(role));
                out(Template("\n"));
                out(Content(text));
                out(Template("<|im_end|>\n"));
            }
        }
    }
}

/// A piece of a message's rendering.
#[derive(Clone, Copy)]
enum Part<'t> {
    /// Template text (or the role).
    Template(&'t str),
    /// The message's content, as rendered.
    Content(&'t str),
}

impl<'t> Part<'t> {
    fn text(self) -> &'t str {
        match self {
            Part::Template(t) | Part::Content(t) => t,
        }
    }
}

/// The key of a chat's head (its first `messages` messages, rendered).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeadKey {
    /// How many messages the head holds.
    pub messages: usize,
    /// xxh3-128 of the salt and the rendered head (shared contents by their
    /// literal's key, see [`Native::head_keys`]).
    pub hash: u128,
    /// Bytes of the rendered head (without the salt).
    pub len: usize,
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

        #[test]
        fn heads_and_rests_make_the_whole_rendering(
            messages in proptest::collection::vec(message(), 1..6),
            generation in any::<bool>(),
            chatml in any::<bool>(),
            salt in proptest::collection::vec(any::<u8>(), 0..9),
        ) {
            let v = json!({"model": "m", "messages": messages, "add_generation_prompt": generation});
            let c = chat(&v);
            let n = if chatml {
                Native::ChatMl
            } else {
                Native::Llama3Instruct { bos: "<|begin_of_text|>".into() }
            };
            let whole = n.render(&c).unwrap();
            let keys = n.head_keys(&c, &salt).unwrap();
            prop_assert_eq!(keys.len(), c.messages.len() - 1);
            for (i, key) in keys.iter().enumerate() {
                prop_assert_eq!(key.messages, i + 1);
                let head = &whole[..key.len];
                let mut salted = salt.clone();
                salted.extend_from_slice(head.as_bytes());
                prop_assert_eq!(key.hash, xxhash_rust::xxh3::xxh3_128(&salted));
                let rest = n.render_from(&c, key.messages).unwrap();
                prop_assert_eq!(format!("{head}{rest}"), whole.clone());
                prop_assert!(rest.starts_with(n.message_start()));
            }
            prop_assert_eq!(n.render_from(&c, c.messages.len() + 1), None);
        }
    }
}

//! The hot path's walk over the common chat body, skipping a known long
//! content without reading it.
//!
//! [`Request::parse`](super::Request::parse) first tries this walk, then
//! serde's ([`super::fast`]), then a [`serde_json::Value`]. Serde reads a
//! string byte by byte (escapes, control characters); for a chat with a 28 KB
//! system prompt that scan is most of what parsing costs, every request,
//! although the router saw the same literal on the previous one. Here a
//! message's `content` string is first looked up in the [`ContentCache`] by
//! its first bytes ([`ContentCache::find_literal`]): a hit is confirmed by the
//! 128-bit xxh3 of the literal's bytes and skipped whole.
//!
//! Why a skip is exact: the walk only looks up a literal where a JSON value
//! starts, and a cached literal is a complete JSON string that serde_json
//! accepted (it ends at its one unescaped quote). So when the bytes from that
//! start equal a cached literal, that literal *is* the token, and its text is
//! the cached text (up to a 128-bit hash collision, the key used for the
//! content cache throughout).
//!
//! The walk knows only this shape: a top-level object whose `messages` are
//! objects with just a string `role` and a string or null `content`, plus
//! `model`, `stream`, `prompt_cache_key`, `cache_salt`, `max_tokens`,
//! `max_completion_tokens`, `add_generation_prompt` and
//! `continue_final_message`. Any other field's value is located here and
//! checked by serde_json (so the body is valid JSON exactly when serde says
//! so). Anything else — `prompt`, `tools`, `chat_template_kwargs`, content
//! parts, message fields beyond `role` and `content`, a field of an
//! unexpected type, invalid JSON — gives up (`None`), and the next walk
//! decides, errors included. `parse_matches_from_value` (a proptest in
//! `tests.rs`) checks all three walks against [`Request::from_value`](super::Request::from_value).

use super::parse::u32_field;
use super::{ChatBody, Content, ContentCache, Expect, Message, Request, RequestBody};
use serde_json::{Map, Value};
use std::borrow::Cow;

/// The walk; `None` hands the body to the next one.
pub(super) fn skim<'a>(
    body: &'a [u8],
    expect: Expect,
    cache: Option<&ContentCache>,
) -> Option<Request<'a>> {
    if expect == Expect::Completion {
        return None;
    }
    let mut c = Cursor { b: body, at: 0 };
    let top = c.top(cache)?;
    c.ws();
    if c.at != body.len() {
        return None;
    }
    let messages = top.messages.filter(|m| !m.is_empty())?;
    let max_tokens =
        match u32_field(top.max_completion_tokens.as_ref(), "max_completion_tokens").ok()? {
            Some(n) => Some(n),
            None => u32_field(top.max_tokens.as_ref(), "max_tokens").ok()?,
        };
    Some(Request {
        model: top.model?,
        stream: top.stream.unwrap_or(false),
        body: RequestBody::Chat(ChatBody {
            messages,
            add_generation_prompt: top.add_generation_prompt.unwrap_or(true),
            continue_final_message: top.continue_final_message.unwrap_or(false),
            tools: None,
            chat_template_kwargs: None,
        }),
        prompt_cache_key: top.prompt_cache_key,
        cache_salt: top.cache_salt,
        max_tokens,
    })
}

/// The fields read; a repeated key keeps its last value, as in a [`Value`].
#[derive(Default)]
struct Top<'a> {
    model: Option<Cow<'a, str>>,
    stream: Option<bool>,
    messages: Option<Vec<Message<'a>>>,
    prompt_cache_key: Option<Cow<'a, str>>,
    cache_salt: Option<Cow<'a, str>>,
    max_tokens: Option<Value>,
    max_completion_tokens: Option<Value>,
    add_generation_prompt: Option<bool>,
    continue_final_message: Option<bool>,
}

/// A position in the body. Every method returns `None` to give up.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    /// Skips JSON whitespace.
    fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.b.get(self.at) {
            self.at += 1;
        }
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.at).copied()
    }

    /// Consumes `byte` (after whitespace).
    fn eat(&mut self, byte: u8) -> Option<()> {
        self.eat_if(byte).then_some(())
    }

    /// Consumes `byte` (after whitespace) when it is next.
    fn eat_if(&mut self, byte: u8) -> bool {
        self.ws();
        let is = self.peek() == Some(byte);
        if is {
            self.at += 1;
        }
        is
    }

    /// After an element of a list closed by `close`: whether another follows
    /// (a comma was consumed) or the list ended (`close` was); `None` for
    /// anything else.
    fn more(&mut self, close: u8) -> Option<bool> {
        if self.eat_if(b',') {
            return Some(true);
        }
        self.eat(close)?;
        Some(false)
    }

    /// Walks `{ "key": value, ... }`, calling `field` at each value (the
    /// cursor after the colon and whitespace); it must consume the value.
    fn object(&mut self, mut field: impl FnMut(&mut Self, &str) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.eat_if(b'}') {
            return Some(());
        }
        loop {
            self.ws();
            let key = self.string()?;
            self.eat(b':')?;
            self.ws();
            field(self, &key)?;
            if !self.more(b'}')? {
                return Some(());
            }
        }
    }

    fn top(&mut self, cache: Option<&ContentCache>) -> Option<Top<'a>> {
        let mut t = Top::default();
        self.object(|c, key| {
            match key {
                "model" => t.model = c.opt_string()?,
                "stream" => t.stream = c.opt_bool()?,
                "messages" => t.messages = c.messages(cache)?,
                "prompt_cache_key" => t.prompt_cache_key = c.opt_string()?,
                "cache_salt" => t.cache_salt = c.opt_string()?,
                "max_tokens" => t.max_tokens = Some(c.checked_value()?),
                "max_completion_tokens" => t.max_completion_tokens = Some(c.checked_value()?),
                "add_generation_prompt" => t.add_generation_prompt = c.opt_bool()?,
                "continue_final_message" => t.continue_final_message = c.opt_bool()?,
                // Read by the template: serde's walk keeps them.
                "prompt" | "tools" | "chat_template_kwargs" => return None,
                _ => {
                    c.checked_value()?;
                }
            }
            Some(())
        })?;
        Some(t)
    }

    /// `null` (`Some(None)`) or an array of simple messages.
    fn messages(&mut self, cache: Option<&ContentCache>) -> Option<Option<Vec<Message<'a>>>> {
        if self.null() {
            return Some(None);
        }
        self.eat(b'[')?;
        let mut out = Vec::new();
        if self.eat_if(b']') {
            return Some(Some(out));
        }
        loop {
            let (mut role, mut content) = (None, Content::Empty);
            self.ws();
            self.object(|c, key| {
                match key {
                    "role" => role = Some(c.string()?),
                    "content" => content = c.content(cache)?,
                    _ => return None,
                }
                Some(())
            })?;
            out.push(Message {
                role: role?,
                content,
                extra: Map::new(),
            });
            if !self.more(b']')? {
                return Some(Some(out));
            }
        }
    }

    /// A message's `content`: null or a string, a long one from `cache`.
    fn content(&mut self, cache: Option<&ContentCache>) -> Option<Content<'a>> {
        if self.null() {
            return Some(Content::Empty);
        }
        if let (Some(cache), Some(b'"')) = (cache, self.peek()) {
            if let Some((text, key)) = cache.find_literal(&self.b[self.at..]) {
                self.at += key.len;
                return Some(Content::Shared(text, key));
            }
        }
        let lit = self.literal()?;
        let inner = &lit[1..lit.len() - 1];
        if let Some(text) = plain(inner) {
            return Some(Content::Text(Cow::Borrowed(text)));
        }
        let lit = std::str::from_utf8(lit).ok()?;
        match cache {
            Some(cache) if cache.is_cacheable(lit.len()) => {
                let (text, key) = cache.get_or_unescape(lit)?;
                Some(Content::Shared(text, key))
            }
            _ => Some(Content::Text(Cow::Owned(
                serde_json::from_str::<String>(lit).ok()?,
            ))),
        }
    }

    /// Consumes `null` when it is next.
    fn null(&mut self) -> bool {
        let is = self.b[self.at..].starts_with(b"null");
        if is {
            self.at += 4;
        }
        is
    }

    fn opt_bool(&mut self) -> Option<Option<bool>> {
        for (word, v) in [
            (&b"true"[..], Some(true)),
            (b"false", Some(false)),
            (b"null", None),
        ] {
            if self.b[self.at..].starts_with(word) {
                self.at += word.len();
                return Some(v);
            }
        }
        None
    }

    fn opt_string(&mut self) -> Option<Option<Cow<'a, str>>> {
        if self.null() {
            return Some(None);
        }
        self.string().map(Some)
    }

    /// A string, borrowed when it has no escapes.
    fn string(&mut self) -> Option<Cow<'a, str>> {
        let lit = self.literal()?;
        match plain(&lit[1..lit.len() - 1]) {
            Some(text) => Some(Cow::Borrowed(text)),
            None => serde_json::from_slice::<String>(lit).ok().map(Cow::Owned),
        }
    }

    /// The next string literal, quotes included (escapes not checked).
    fn literal(&mut self) -> Option<&'a [u8]> {
        let start = self.at;
        if self.peek()? != b'"' {
            return None;
        }
        let mut i = start + 1;
        loop {
            i += memchr::memchr2(b'"', b'\\', self.b.get(i..)?)?;
            if self.b[i] == b'"' {
                self.at = i + 1;
                return Some(&self.b[start..self.at]);
            }
            i += 2;
        }
    }

    /// The next value of any kind, as serde_json reads it.
    fn checked_value(&mut self) -> Option<Value> {
        let start = self.at;
        match self.peek()? {
            b'"' => {
                self.literal()?;
            }
            b'{' | b'[' => {
                let mut depth = 0usize;
                loop {
                    match self.peek()? {
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                self.at += 1;
                                break;
                            }
                        }
                        b'"' => {
                            self.literal()?;
                            continue;
                        }
                        _ => {}
                    }
                    self.at += 1;
                }
            }
            _ => {
                while let Some(b) = self.peek() {
                    if matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r') {
                        break;
                    }
                    self.at += 1;
                }
            }
        }
        serde_json::from_slice(&self.b[start..self.at]).ok()
    }
}

/// The text of a string literal's inside when it needs no unescaping: no
/// backslash, no control character (JSON forbids them raw), valid UTF-8.
fn plain(inner: &[u8]) -> Option<&str> {
    // No early exit: this form vectorizes.
    let special = inner
        .iter()
        .fold(false, |acc, &b| acc | (b < 0x20) | (b == b'\\'));
    if special {
        return None;
    }
    std::str::from_utf8(inner).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn chat(system_lit: &str) -> String {
        format!(
            r#"{{"model":"m","temperature":0.5,"messages":[{{"role":"system","content":{system_lit}}},{{"role":"user","content":"hi"}}],"max_tokens":3}}"#
        )
    }

    fn first_content<'r>(r: &'r Request<'_>) -> &'r Content<'r> {
        let RequestBody::Chat(c) = &r.body else {
            panic!("not chat")
        };
        &c.messages[0].content
    }

    #[test]
    fn a_known_literal_is_skipped_and_shared() {
        let text = "rule one\nrule \u{e9} two \"quoted\"\n".repeat(80);
        let lit = serde_json::to_string(&text).unwrap();
        let body = chat(&lit);
        let cache = ContentCache::default();
        let miss = skim(body.as_bytes(), Expect::Chat, Some(&cache)).unwrap();
        let hit = skim(body.as_bytes(), Expect::Chat, Some(&cache)).unwrap();
        assert_eq!(miss, hit);
        assert_eq!(first_content(&hit).text(), text);
        assert!(matches!(first_content(&hit), Content::Shared(..)));
        assert_eq!(hit.max_tokens, Some(3));
        let s = cache.stats();
        assert_eq!((s.hits, s.misses), (1, 1));
        // Found by its start; a literal that only begins alike is not.
        assert!(cache.find_literal(lit.as_bytes()).is_some());
        let mut near = lit.clone().into_bytes();
        near[lit.len() / 2] ^= 1;
        assert!(cache.find_literal(&near).is_none());
        assert_eq!(
            Request::from_value(&serde_json::from_str(&body).unwrap(), Expect::Chat).unwrap(),
            hit
        );
    }

    #[test]
    fn a_literal_sharing_only_the_start_is_read_in_full() {
        let cache = ContentCache::default();
        let base = "same start, long enough to fill the probe\n".repeat(40);
        let lit = serde_json::to_string(&base).unwrap();
        skim(chat(&lit).as_bytes(), Expect::Chat, Some(&cache)).unwrap();
        // Same first bytes; the cached literal's length lands on an escaped
        // quote, then on a plain one inside a longer string, then past it.
        let mut longer = base.clone();
        longer.insert(base.len() - 2, '"');
        let shorter = &base[..base.len() - 5];
        let other = format!("{}\"x", &base[..base.len() - 1]);
        for text in [longer.as_str(), shorter, other.as_str()] {
            let body = chat(&serde_json::to_string(text).unwrap());
            let r = skim(body.as_bytes(), Expect::Chat, Some(&cache)).unwrap();
            assert_eq!(first_content(&r).text(), text);
        }
    }

    #[test]
    fn gives_up_on_what_it_does_not_know() {
        let control = "{\"model\":\"m\",\"messages\":[{\"role\":\"u\",\"content\":\"a\u{1}\"}]}";
        for body in [
            control,
            r#"{"model":"m","prompt":"p"}"#,
            r#"{"model":"m","messages":[{"role":"u","content":"c","name":"n"}]}"#,
            r#"{"model":"m","messages":[{"role":"u","content":[{"type":"text","text":"t"}]}]}"#,
            r#"{"model":"m","messages":[{"role":"u"}],"tools":[]}"#,
            r#"{"model":"m","messages":[]}"#,
            r#"{"model":"m","messages":[{"content":"c"}]}"#,
            r#"{"model":"m","messages":[{"role":"u"}],"x":[1,}"#,
            r#"{"model":"m","messages":[{"role":"u"}],"x":01}"#,
            r#"{"model":"m","messages":[{"role":"u"}]} x"#,
            r#"{"model":7,"messages":[{"role":"u"}]}"#,
        ] {
            assert!(skim(body.as_bytes(), Expect::Any, None).is_none(), "{body}");
        }
        let ok = r#" { "model" : "m" , "x" : {"y":[1,"]"]}, "messages" : [ { "role" : "u" } ] } "#;
        assert!(skim(ok.as_bytes(), Expect::Chat, None).is_some());
        assert!(skim(ok.as_bytes(), Expect::Completion, None).is_none());
    }
}

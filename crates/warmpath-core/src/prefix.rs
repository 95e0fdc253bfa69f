//! PREFIX_AWARE keys: a 64-bit hash of the first `prefix_length` units (bytes,
//! characters or token ids) of a request; what is hashed, exactly, is in
//! docs/cache-index.md, "The prefix key".

use std::fmt;
use thiserror::Error;
use warmpath_hash::tenant::TenantId;
use warmpath_request::{Content, FirstPrompt, Request, RequestBody};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

/// A refused PREFIX_AWARE setting: a configuration error, never retryable.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum PrefixError {
    /// `prefix_length` outside `1024..=65536`.
    #[error("prefix_length {0} is outside the accepted range 1024..=65536")]
    LengthOutOfRange(usize),
}

/// The PREFIX_AWARE key of a request; place it on the hash ring.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PrefixKey(pub u64);

impl fmt::Debug for PrefixKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrefixKey({:016x})", self.0)
    }
}

impl fmt::Display for PrefixKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The part of a request that a key is computed from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Extracted<'r> {
    /// Characters of chat text or a text prompt (at most `prefix_length`).
    Text(String),
    /// Token ids of an id prompt (at most `prefix_length`).
    Ids(&'r [u32]),
}

/// Computes PREFIX_AWARE keys for one validated `prefix_length`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PrefixExtractor {
    prefix_length: usize,
}

impl PrefixExtractor {
    /// Validates `prefix_length` (1024..=65536).
    pub fn new(prefix_length: usize) -> Result<Self, PrefixError> {
        if (1024..=65536).contains(&prefix_length) {
            Ok(PrefixExtractor { prefix_length })
        } else {
            Err(PrefixError::LengthOutOfRange(prefix_length))
        }
    }

    /// The key of a raw `/invocations` body: its first `prefix_length` bytes.
    pub fn key_for_body(&self, model: &str, tenant: Option<&TenantId>, body: &[u8]) -> PrefixKey {
        let end = body.len().min(self.prefix_length);
        PrefixKey(xxh3_64_with_seed(&body[..end], seed(model, tenant, b'b')))
    }

    /// The key of a chat or completion request.
    pub fn key_for_request(
        &self,
        model: &str,
        tenant: Option<&TenantId>,
        req: &Request<'_>,
    ) -> PrefixKey {
        match self.extract(req) {
            Extracted::Text(t) => {
                PrefixKey(xxh3_64_with_seed(t.as_bytes(), seed(model, tenant, b't')))
            }
            Extracted::Ids(ids) => {
                let bytes: Vec<u8> = ids.iter().flat_map(|t| t.to_le_bytes()).collect();
                PrefixKey(xxh3_64_with_seed(&bytes, seed(model, tenant, b'i')))
            }
        }
    }

    /// What [`key_for_request`](Self::key_for_request) hashes (docs/cache-index.md).
    /// Never reads or copies more than `prefix_length` characters of text.
    pub fn extract<'r>(&self, req: &'r Request<'_>) -> Extracted<'r> {
        let mut out = Budget {
            text: String::new(),
            left: self.prefix_length,
        };
        match &req.body {
            RequestBody::Chat(chat) => {
                for m in &chat.messages {
                    let full = out.push(&m.role)
                        || out.push("\n")
                        || match &m.content {
                            Content::Empty => false,
                            Content::Text(t) => out.push(t),
                            Content::Parts(ps) => ps
                                .iter()
                                .enumerate()
                                .any(|(i, p)| (i > 0 && out.push("\n")) || out.push(p)),
                        }
                        || out.push("\n");
                    if full {
                        break;
                    }
                }
            }
            RequestBody::Completion(p) => match p.first() {
                FirstPrompt::Text(t) => {
                    out.push(t);
                }
                FirstPrompt::Ids(ids) => {
                    return Extracted::Ids(&ids[..ids.len().min(self.prefix_length)]);
                }
            },
        }
        Extracted::Text(out.text)
    }
}

fn seed(model: &str, tenant: Option<&TenantId>, kind: u8) -> u64 {
    let (tenant, kind) = (tenant.map_or("", TenantId::as_str), char::from(kind));
    xxh3_64(format!("warmpath/prefix/1\0{model}\0{tenant}\0{kind}").as_bytes())
}

/// Text accumulated up to a character budget.
struct Budget {
    text: String,
    left: usize,
}

impl Budget {
    /// Appends as much of `s` as the budget allows; true once the budget is spent.
    fn push(&mut self, s: &str) -> bool {
        // The byte offset of the first character over the budget, if any. A
        // character is at least one byte, so a text no longer (in bytes) than
        // the budget fits whole; when the budget's worth of bytes is ASCII,
        // the cut is at that many bytes (no walk over the characters).
        let cut = if s.len() <= self.left {
            None
        } else if s.as_bytes()[..self.left].is_ascii() {
            Some(self.left)
        } else {
            s.char_indices().nth(self.left).map(|(i, _)| i)
        };
        match cut {
            Some(i) => {
                self.text.push_str(&s[..i]);
                self.left = 0;
                true
            }
            None => {
                self.left -= s.chars().count();
                self.text.push_str(s);
                self.left == 0
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Value};
    use warmpath_hash::tenant::TenantSource;
    use warmpath_request::Expect;

    fn req(v: &Value) -> Request<'_> {
        Request::from_value(v, Expect::Any).unwrap()
    }

    fn text(e: Extracted<'_>) -> String {
        match e {
            Extracted::Text(t) => t,
            Extracted::Ids(_) => panic!("ids"),
        }
    }

    fn px() -> PrefixExtractor {
        PrefixExtractor::new(1024).unwrap()
    }

    #[test]
    fn length_is_validated() {
        assert_eq!(
            PrefixExtractor::new(1023),
            Err(PrefixError::LengthOutOfRange(1023))
        );
        assert_eq!(
            PrefixExtractor::new(65537),
            Err(PrefixError::LengthOutOfRange(65537))
        );
        assert!(PrefixExtractor::new(1024).is_ok());
        assert!(PrefixExtractor::new(65536).is_ok());
        assert!(PrefixExtractor::new(0)
            .unwrap_err()
            .to_string()
            .contains("1024..=65536"));
    }

    #[test]
    fn chat_text_layout_is_role_newline_content_newline() {
        let v = json!({"model": "m", "messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null}]});
        assert_eq!(
            text(px().extract(&req(&v))),
            "system\nS\nuser\na\nb\nassistant\n\n"
        );
    }

    #[test]
    fn text_is_cut_at_characters_not_bytes() {
        let v = json!({"model": "m", "prompt": "é".repeat(2000)});
        let t = text(px().extract(&req(&v)));
        assert_eq!(t.chars().count(), 1024);
        assert_eq!(t.len(), 2048);
        let v = json!({"model": "m", "messages": [{"role": "user", "content": "ü".repeat(3000)}]});
        let t = text(px().extract(&req(&v)));
        assert_eq!(t.chars().count(), 1024);
        assert!(t.starts_with("user\nü"));
    }

    #[test]
    fn id_prompts_use_the_first_ids_of_the_first_prompt() {
        let ids: Vec<u32> = (0..5000).collect();
        let v = json!({"model": "m", "prompt": [ids.clone(), [1]]});
        let r = req(&v);
        assert_eq!(px().extract(&r), Extracted::Ids(&ids[..1024]));
        let mut ids2 = ids.clone();
        ids2[2000] = 7;
        let v2 = json!({"model": "m", "prompt": ids2});
        assert_eq!(
            px().key_for_request("m", None, &r),
            px().key_for_request("m", None, &req(&v2))
        );
    }

    #[test]
    fn model_tenant_and_kind_separate_keys() {
        let v = json!({"model": "m", "prompt": "hello"});
        let r = req(&v);
        let t = TenantId::parse("acme", TenantSource::Header).unwrap();
        let p = px();
        let base = p.key_for_request("m", None, &r);
        assert_ne!(base, p.key_for_request("m2", None, &r));
        assert_ne!(base, p.key_for_request("m", Some(&t), &r));
        assert_ne!(base, p.key_for_body("m", None, b"hello"));
        assert_eq!(
            base,
            p.key_for_request(
                "m",
                None,
                &req(&json!({"model": "x", "prompt": ["hello", "z"]}))
            )
        );
    }

    /// Keys travel between router replicas (shared decisions): their layout is pinned.
    #[test]
    fn keys_are_golden() {
        let t = TenantId::parse("acme", TenantSource::Header).unwrap();
        let (text, ids) = (
            json!({"model": "m", "prompt": "hello"}),
            json!({"model": "m", "prompt": [1, 2, 3]}),
        );
        let p = px();
        let key = |k: PrefixKey| format!("{k}");
        assert_eq!(
            key(p.key_for_request("m", None, &req(&text))),
            "4a72577affd1b743"
        );
        assert_eq!(
            key(p.key_for_request("llama", Some(&t), &req(&text))),
            "d457bfe1077c7cac"
        );
        assert_eq!(
            key(p.key_for_body("m", Some(&t), b"abc")),
            "8b8a1c1ccabdd2be"
        );
        assert_eq!(
            key(p.key_for_request("m", None, &req(&ids))),
            "1747bce38e5d0058"
        );
    }

    #[test]
    fn body_keys_use_bytes() {
        let p = px();
        let mut a = vec![b'x'; 1024];
        let k = p.key_for_body("m", None, &a);
        a.extend_from_slice(b"tail");
        assert_eq!(k, p.key_for_body("m", None, &a));
        a[1023] = b'y';
        assert_ne!(k, p.key_for_body("m", None, &a));
        assert_ne!(
            p.key_for_body("m", None, b""),
            p.key_for_body("m", None, b"a")
        );
    }

    fn chat_body(system: &str, user: &str) -> Value {
        json!({"model": "m", "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user}]})
    }

    proptest! {
        /// Changing only what lies beyond prefix_length characters keeps the key.
        #[test]
        fn tail_beyond_prefix_does_not_matter(
            system in "[a-zé日 ]{0,1500}",
            tail_a in "[a-z ]{0,100}",
            tail_b in "[a-z ]{0,100}",
            len in 1024usize..1600,
        ) {
            let p = PrefixExtractor::new(len).unwrap();
            let a = chat_body(&system, &tail_a);
            let b = chat_body(&system, &tail_b);
            let ka = p.key_for_request("m", None, &req(&a));
            let kb = p.key_for_request("m", None, &req(&b));
            // "system\n" + system + "\n" + "user\n" precede the user's text.
            let before_tail = 7 + system.chars().count() + 1 + 5;
            if before_tail >= len || tail_a == tail_b {
                prop_assert_eq!(ka, kb);
            } else {
                let ta = text(p.extract(&req(&a)));
                let tb = text(p.extract(&req(&b)));
                prop_assert_eq!(ta == tb, ka == kb);
            }
        }

        /// The extracted text is exactly the first prefix_length characters of
        /// the whole documented layout.
        #[test]
        fn extracted_is_a_char_prefix_of_the_layout(
            system in "[a-zé日\n ]{0,1200}", user in "[a-z ]{0,300}", len in 1024usize..1400,
        ) {
            let p = PrefixExtractor::new(len).unwrap();
            let layout = format!("system\n{system}\nuser\n{user}\n");
            let want: String = layout.chars().take(len).collect();
            prop_assert_eq!(text(p.extract(&req(&chat_body(&system, &user)))), want);
        }

        /// The same with mostly-ASCII text, where the cut is taken by bytes
        /// (multi-byte characters just before, at and after the cut).
        #[test]
        fn ascii_cut_is_a_char_prefix_of_the_layout(
            head in "[a-z\n ]{1000,1300}", wide in "[é日]{0,3}", rest in "[a-z ]{0,200}",
            user in "[a-zé ]{0,300}", len in 1024usize..1400,
        ) {
            let p = PrefixExtractor::new(len).unwrap();
            let system = format!("{head}{wide}{rest}");
            let layout = format!("system\n{system}\nuser\n{user}\n");
            let want: String = layout.chars().take(len).collect();
            prop_assert_eq!(text(p.extract(&req(&chat_body(&system, &user)))), want);
        }
    }
}

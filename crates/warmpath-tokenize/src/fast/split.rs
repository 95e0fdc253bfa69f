//! Cutting a text at added tokens as the `tokenizers` library does (its two
//! leftmost-longest passes), only where every added token is `<…>` with no `>`
//! inside and nothing else changes the cut; else [`AddedCut::new`] gives `None`.

use std::collections::HashMap;
use tokenizers::Tokenizer;

/// One piece of a cut text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Piece<'a> {
    /// Text between added tokens (never empty).
    Text(&'a str),
    /// An added token, by id.
    Added(u32),
}

/// Token content → id, for one pass.
type Pass = HashMap<Box<str>, u32>;

#[derive(Debug)]
pub(crate) struct AddedCut {
    raw: Pass,
    /// Empty when no token is matched in the normalized pass.
    normalized: Pass,
}

impl AddedCut {
    /// The cut for `tokenizer`, or `None` when its configuration needs the
    /// library's own (see module docs).
    pub(crate) fn new(tokenizer: &Tokenizer) -> Option<Self> {
        if tokenizer.get_encode_special_tokens() {
            return None;
        }
        let has_normalizer = tokenizer.get_normalizer().is_some();
        let shaped =
            |t: &str| t.len() >= 2 && t.starts_with('<') && t.find('>') == Some(t.len() - 1);
        let (mut raw, mut normalized) = (Pass::new(), Pass::new());
        for token in tokenizer.get_added_tokens_decoder().into_values() {
            if token.content.is_empty() {
                continue; // the library never adds these
            }
            let context = token.lstrip || token.rstrip || token.single_word;
            if context || (token.normalized && has_normalizer) || !shaped(&token.content) {
                return None;
            }
            // The library maps content to id through its own lookup; do the same.
            let id = tokenizer.token_to_id(&token.content)?;
            let pass = if token.normalized {
                &mut normalized
            } else {
                &mut raw
            };
            pass.insert(token.content.into(), id);
        }
        Some(AddedCut { raw, normalized })
    }

    /// Cuts `text` into pieces, in order, calling `out` for each; stops at
    /// the first error `out` returns.
    pub(crate) fn split<'a, E>(
        &self,
        text: &'a str,
        mut out: impl FnMut(Piece<'a>) -> Result<(), E>,
    ) -> Result<(), E> {
        if self.normalized.is_empty() {
            return cut(&self.raw, text, &mut |p| out(p));
        }
        // The second pass runs on each text piece the first one leaves.
        cut(&self.raw, text, &mut |p| match p {
            Piece::Text(t) => cut(&self.normalized, t, &mut out),
            added => out(added),
        })
    }
}

/// One pass of `tokens` over `text`.
fn cut<'a, E>(
    tokens: &Pass,
    text: &'a str,
    out: &mut impl FnMut(Piece<'a>) -> Result<(), E>,
) -> Result<(), E> {
    let bytes = text.as_bytes();
    let (mut at, mut from) = (0, 0);
    while let Some(k) = memchr::memchr(b'<', &bytes[from..]) {
        let start = from + k;
        let Some(e) = memchr::memchr(b'>', &bytes[start..]) else {
            break; // no token can end anywhere after this
        };
        let end = start + e + 1;
        from = start + 1;
        if let Some(&id) = text.get(start..end).and_then(|t| tokens.get(t)) {
            if at < start {
                out(Piece::Text(&text[at..start]))?;
            }
            out(Piece::Added(id))?;
            at = end;
            from = end;
        }
    }
    if at < text.len() {
        out(Piece::Text(&text[at..]))?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::tiny;
    use serde_json::{json, Value};
    use std::str::FromStr;

    fn with_token(content: &str, flag: &str) -> Tokenizer {
        let mut doc: Value = serde_json::from_str(&tiny::tokenizer_json()).unwrap();
        let added = doc["added_tokens"].as_array_mut().unwrap();
        let mut t = json!({"id": tiny::VOCAB_SIZE, "content": content, "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true});
        t[flag] = json!(true);
        added.push(t);
        Tokenizer::from_str(&doc.to_string()).unwrap()
    }

    #[test]
    fn configurations_the_cut_cannot_mirror_are_refused() {
        for flag in ["lstrip", "rstrip", "single_word"] {
            assert!(AddedCut::new(&with_token("<x>", flag)).is_none(), "{flag}");
        }
        for odd in ["[INST]", "<a>b", "<a>b>", "x>"] {
            assert!(
                AddedCut::new(&with_token(odd, "special")).is_none(),
                "{odd}"
            );
        }
        let mut t = with_token("<x>", "normalized");
        assert!(AddedCut::new(&t).is_some());
        t.set_encode_special_tokens(true);
        assert!(AddedCut::new(&t).is_none());
    }

    #[test]
    fn a_nested_candidate_is_matched_from_its_own_start() {
        let cut = AddedCut::new(&with_token("<||>", "special")).unwrap();
        let mut got = Vec::new();
        cut.split("x<|<||>|><|eot_id|>", |p| {
            got.push(p);
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(
            got,
            vec![
                Piece::Text("x<|"),
                Piece::Added(tiny::VOCAB_SIZE as u32),
                Piece::Text("|>"),
                Piece::Added(tiny::EOT_ID_ID),
            ]
        );
    }
}

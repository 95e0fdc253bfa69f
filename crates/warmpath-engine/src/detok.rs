//! Incremental detokenization for streaming: a growing list of ids to text
//! pieces, never splitting a UTF-8 character that spans several tokens.

use warmpath_core::tokenize::ChatTokenizer;

/// The text sent so far of one generation.
#[derive(Debug, Default)]
pub struct IncrementalText {
    sent: String,
}

impl IncrementalText {
    /// The new text since the last call. Unless `last`, text ending in an
    /// incomplete character (U+FFFD) is held back.
    pub fn advance(&mut self, tok: &ChatTokenizer, ids: &[u32], last: bool) -> String {
        let Ok(text) = tok.tokenizer().decode(ids, true) else {
            return String::new();
        };
        if !last && text.ends_with('\u{FFFD}') {
            return String::new();
        }
        match text.strip_prefix(self.sent.as_str()) {
            Some(rest) => {
                let piece = rest.to_owned();
                self.sent = text;
                piece
            }
            // Decoding changed earlier text (rare); send nothing until it settles.
            None => String::new(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use warmpath_core::tokenize::{tiny, CacheConfig};

    #[test]
    fn incremental_text_reassembles_multibyte_characters() {
        let tok = ChatTokenizer::new(&tiny::files().unwrap(), CacheConfig::default()).unwrap();
        let text = "naïve café – ok";
        let ids = tok.encode_text(text, false).unwrap();
        let mut inc = IncrementalText::default();
        let mut out = String::new();
        for i in 1..=ids.len() {
            let piece = inc.advance(&tok, &ids[..i], i == ids.len());
            assert!(!piece.contains('\u{FFFD}'));
            out.push_str(&piece);
        }
        assert_eq!(out, text);
    }
}

//! The split patterns of [`super::presplit`] on ASCII text, as plain code.
//!
//! Warm, the `regex` crate's lazy DFA splits a 70-character question in well
//! under a microsecond; on a router core that sat idle for a few
//! milliseconds the same call costs ~15 µs, bringing back the meta engine's
//! search code and the DFA's state tables. On ASCII text the pattern's
//! classes are a few byte ranges (`\p{L}` is `A-Za-z`, `\p{N}` is `0-9`, `\s`
//! is `\t`..`\r` and space) and its leftmost-first alternation is decided by
//! at most three bytes, so this module walks the bytes directly. The pattern,
//! for reference (Qwen 2 has `\p{N}` where Llama 3 has `\p{N}{1,3}`):
//!
//! ```text
//! (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! ```
//!
//! Proptests compare the splits with the regex and with the library on ASCII
//! text rich in the cases that matter (apostrophes, runs of white space with
//! and without line breaks, digits, symbols, control characters).

fn letter(c: u8) -> bool {
    c.is_ascii_alphabetic()
}

fn digit(c: u8) -> bool {
    c.is_ascii_digit()
}

/// `\s` on ASCII: Unicode White_Space is `\t`, `\n`, `\v`, `\f`, `\r`, space.
fn space(c: u8) -> bool {
    matches!(c, b'\t'..=b'\r' | b' ')
}

fn line_break(c: u8) -> bool {
    c == b'\r' || c == b'\n'
}

/// `[^\s\p{L}\p{N}]`.
fn other(c: u8) -> bool {
    !letter(c) && !digit(c) && !space(c)
}

/// The end of the run of `class` bytes starting at `from`.
fn run(b: &[u8], from: usize, class: fn(u8) -> bool) -> usize {
    b[from..]
        .iter()
        .position(|&c| !class(c))
        .map_or(b.len(), |n| from + n)
}

/// The end of the split that starts at `at` (< `b.len()`) of the ASCII text
/// `b`, for a pattern with `\p{N}{1,max_digits}`.
pub(crate) fn split_end(b: &[u8], at: usize, max_digits: usize) -> usize {
    let c = b[at];
    let next = b.get(at + 1).copied();
    let lower = |i: usize| b.get(i).map(u8::to_ascii_lowercase);
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if c == b'\'' {
        match lower(at + 1) {
            Some(b's' | b't' | b'm' | b'd') => return at + 2,
            Some(b'r' | b'v') if lower(at + 2) == Some(b'e') => return at + 3,
            Some(b'l') if lower(at + 2) == Some(b'l') => return at + 3,
            _ => {}
        }
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if letter(c) {
        return run(b, at, letter);
    }
    if !line_break(c) && !digit(c) && next.is_some_and(letter) {
        return run(b, at + 1, letter);
    }
    // \p{N}{1,max_digits}
    if digit(c) {
        return run(b, at, digit).min(at + max_digits);
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let symbols = if c == b' ' && next.is_some_and(other) {
        Some(at + 1)
    } else if other(c) {
        Some(at)
    } else {
        None
    };
    if let Some(from) = symbols {
        let end = run(b, from, other);
        return run(b, end, line_break);
    }
    // `c` is white space from here on.
    let end = run(b, at, space);
    // \s*[\r\n]+ : up to and including the run's last line break.
    if let Some(last) = b[at..end].iter().rposition(|&c| line_break(c)) {
        return at + last + 1;
    }
    // \s+(?!\S) takes the whole run at the end of the text, and all of it
    // but the last character before a non-space when two or more remain;
    // otherwise \s+ takes the one character.
    if end == b.len() || end - at == 1 {
        end
    } else {
        end - 1
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use regex::Regex;

    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

    fn ours(text: &str, max_digits: usize) -> Vec<&str> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let end = split_end(text.as_bytes(), at, max_digits);
            assert!(end > at, "progress at {at} in {text:?}");
            out.push(&text[at..end]);
            at = end;
        }
        out
    }

    /// The pattern by the `regex` crate, with the lookahead resolved by
    /// trying `\s+(?!\S)` by hand (an independent statement of the rule).
    fn by_regex(text: &str, max_digits: usize) -> Vec<&str> {
        let digits = if max_digits == 3 {
            r"\p{N}{1,3}"
        } else {
            r"\p{N}"
        };
        let head = Regex::new(&format!(
            r"^(?:(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|{digits}| ?[^\s\p{{L}}\p{{N}}]+[\r\n]*|\s*[\r\n]+)"
        ))
        .unwrap();
        let mut out = Vec::new();
        let mut at = 0;
        while at < text.len() {
            let rest = &text[at..];
            let end = match head.find(rest) {
                Some(m) if !m.as_str().is_empty() => m.end(),
                _ => {
                    // \s+(?!\S): the longest white-space prefix not followed by
                    // a non-space; else \s+.
                    let run = rest.len() - rest.trim_start().len();
                    assert!(run > 0, "the pattern matches every character");
                    let fits = |k: usize| rest[k..].chars().next().is_none_or(char::is_whitespace);
                    (1..=run).rev().find(|&k| fits(k)).unwrap_or(run)
                }
            };
            out.push(&rest[..end]);
            at += end;
        }
        out
    }

    #[test]
    fn cases() {
        for (text, want) in [
            (
                "\n\nQuestion 123: what?",
                vec!["\n\n", "Question", " ", "123", ":", " what", "?"],
            ),
            (
                "it's  'S    1234567 !!\r\n  ok",
                vec![
                    "it", "'s", " ", " '", "S", "   ", " ", "123", "456", "7", " !!\r\n", " ",
                    " ok",
                ],
            ),
            ("a \n  b", vec!["a", " \n", " ", " b"]),
            ("x \t y", vec!["x", " \t", " y"]),
            ("end  ", vec!["end", "  "]),
            ("'ll'LL'x'", vec!["'ll", "'LL", "'x", "'"]),
        ] {
            assert_eq!(ours(text, 3), want, "{text:?}");
            assert_eq!(by_regex(text, 3), want, "{text:?}");
        }
        let full = Regex::new(&LLAMA3.replace(r"|\s+(?!\S)", "")).unwrap();
        assert!(full.is_match("x"), "the reference pattern compiles");
    }

    fn ascii_text() -> impl Strategy<Value = String> {
        let atoms = prop::sample::select(vec![
            " ", "  ", "   ", "\t", "\n", "\r", "\r\n", "\x0b", "\x0c", "a", "Z", "word", "Ab",
            "1", "42", "12345", "'", "'s", "'T", "'re", "'VE", "'m", "'ll", "'d", "'x", "!", "?!",
            ".", "#", "_", "-", "\u{0}", "\u{1c}", "\u{7f}",
        ]);
        prop::collection::vec(atoms, 0..40).prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]
        #[test]
        fn equals_the_regex(text in ascii_text(), qwen in any::<bool>()) {
            let d = if qwen { 1 } else { 3 };
            prop_assert_eq!(ours(&text, d), by_regex(&text, d));
        }
    }
}

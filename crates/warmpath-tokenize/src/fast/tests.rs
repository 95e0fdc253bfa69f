//! The one differential harness of the fast path: every step against the
//! `tokenizers` library, and whole chats rendered by minijinja against the
//! library's encoding of the same text.

use super::chunks::{self, ChunkMemo};
use super::presplit::{FastPieces, KNOWN_PATTERNS};
use super::split::{AddedCut, Piece};
use super::*;
use crate::{tiny, ChatTokenizer, TokenizerFiles};
use proptest::prelude::*;
use serde_json::{json, Value};
use std::str::FromStr;
use std::sync::OnceLock;
use tokenizers::{
    NormalizerWrapper, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer,
};
use warmpath_request::{Expect, Request, RequestBody};

fn tiny_json() -> Value {
    serde_json::from_str(&tiny::tokenizer_json()).unwrap()
}

fn tokenizer(doc: &Value) -> Tokenizer {
    Tokenizer::from_str(&doc.to_string()).unwrap()
}

fn with_pattern(pattern: &str) -> Value {
    let mut v = tiny_json();
    v["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern.into();
    v
}

/// The library, in one call.
fn library(t: &Tokenizer, text: &str, special: bool) -> Vec<u32> {
    t.encode_fast(text, special).unwrap().get_ids().to_vec()
}

/// The library's Split step alone.
fn library_splits(tok: &Tokenizer, text: &str) -> Vec<String> {
    let mut pre = PreTokenizedString::from(text);
    tok.get_pre_tokenizer()
        .unwrap()
        .pre_tokenize(&mut pre)
        .unwrap();
    pre.get_splits(OffsetReferential::Original, OffsetType::Byte)
        .into_iter()
        .map(|(_, (a, b), _)| text[a..b].to_owned())
        .collect()
}

/// The library's added-token cut.
fn library_cut(t: &Tokenizer, text: &str) -> Vec<(String, Option<u32>)> {
    t.get_added_vocabulary()
        .extract_and_normalize(None::<&NormalizerWrapper>, text)
        .get_splits(OffsetReferential::Original, OffsetType::None)
        .into_iter()
        .filter(|(piece, _, _)| !piece.is_empty())
        .map(|(piece, _, added)| match added {
            Some(tokens) => (String::new(), Some(tokens[0].id)),
            None => (piece.to_owned(), None),
        })
        .collect()
}

fn our_cut(s: &AddedCut, text: &str) -> Vec<(String, Option<u32>)> {
    let mut v = Vec::new();
    s.split(text, |p| {
        v.push(match p {
            Piece::Text(t) => (t.to_owned(), None),
            Piece::Added(id) => (String::new(), Some(id)),
        });
        Ok::<(), ()>(())
    })
    .unwrap();
    v
}

/// The tiny tokenizer plus `<…>` tokens that nest in each other and in the
/// special ones, half of them matched in the second (normalized) pass.
fn nested() -> Tokenizer {
    let mut doc = tiny_json();
    let added = doc["added_tokens"].as_array_mut().unwrap();
    for (i, (content, normalized)) in [
        ("<a>", true),
        ("<b<a>", false),
        ("<c>", false),
        ("<|eot<c>", true),
        ("<é>", true),
    ]
    .into_iter()
    .enumerate()
    {
        added.push(json!({"id": tiny::VOCAB_SIZE + i, "content": content,
            "single_word": false, "lstrip": false, "rstrip": false,
            "normalized": normalized, "special": i % 2 == 0}));
    }
    tokenizer(&doc)
}

#[test]
fn recognises_llama3_and_qwen_and_refuses_others() {
    let tok = tokenizer(&tiny_json());
    let fast = FastPieces::new(&tok).unwrap();
    assert!(fast.deterministic(), "BPE without dropout caches words");
    assert_eq!(
        fast.word_stats().map(|s| s.entries),
        Some(1110),
        "every digit group 0-999 is cached up front"
    );
    let single = FastPieces::new(&tokenizer(&with_pattern(KNOWN_PATTERNS[1].0))).unwrap();
    assert_eq!(single.word_stats().map(|s| s.entries), Some(10), "0-9 only");
    let other = tokenizer(&with_pattern(r"\s+(?!\S)|\s+|\S+"));
    assert!(FastPieces::new(&other).is_none());
    assert!(FastPath::new(&other, CacheConfig::default()).is_some_and(|f| !f.chunks_pieces()));
    let mut v = tiny_json();
    v["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true.into();
    assert!(FastPieces::new(&tokenizer(&v)).is_none());
    let mut v = tiny_json();
    v["model"]["dropout"] = 0.1.into();
    let random = FastPieces::new(&tokenizer(&v)).unwrap();
    assert!(!random.deterministic(), "BPE dropout: no word cache");
    let mut v = tiny_json();
    v["truncation"] =
        json!({"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0});
    assert!(FastPath::new(&tokenizer(&v), CacheConfig::default()).is_none());
}

#[test]
fn lookahead_cases_split_like_the_library() {
    let tok = tokenizer(&tiny_json());
    let fast = FastPieces::new(&tok).unwrap();
    for text in [
        "a  b",
        "a b",
        "a   ",
        "  ",
        " ",
        "x \t y",
        "a\u{3000}\u{3000}b",
        "a \u{a0}b",
        "1  2",
        "a \n  b",
        "\n\nQuestion 12: what?",
        "it's  'S    123456 !!\r\n  ok",
        "",
    ] {
        let ours: Vec<&str> = fast.splits(text).collect();
        assert_eq!(ours, library_splits(&tok, text), "{text:?}");
    }
}

#[test]
fn a_repeated_document_with_new_tails_encodes_only_the_tails() {
    let tok = tokenizer(&tiny_json());
    let config = CacheConfig {
        min_segment_bytes: 256,
        capacity_tokens: 1 << 20,
    };
    let fast = FastPath::new(&tok, config).unwrap();
    let doc = tiny::corpus_slice(0, 1 << 20);
    // Where the memo cuts `text`: the end of each chunk.
    let ends = |text: &str| {
        let memo = ChunkMemo::new(config.min_segment_bytes, 0);
        let mut at = 0;
        let mut ends = Vec::new();
        while at < text.len() {
            at = chunks::safe_point(text.as_bytes(), at + memo.chunk_bytes).unwrap_or(text.len());
            ends.push(at);
        }
        ends
    };
    let mut before = fast.chunk_stats();
    for (i, question) in ["What is it about?", "Who wrote it?", "Summarise it."]
        .iter()
        .enumerate()
    {
        // RAG: the document and the question in one piece.
        let text = format!("{doc}\n\nQuestion: {question}");
        assert_eq!(
            fast.encode(&tok, &text, false, None).unwrap(),
            library(&tok, &text, false)
        );
        let now = fast.chunk_stats();
        let (hits, misses) = (now.hits - before.hits, now.misses - before.misses);
        let ends = ends(&text);
        let in_doc = ends.iter().filter(|&&e| e <= doc.len()).count() as u64;
        assert!(in_doc > 10, "{in_doc} chunks");
        if i == 0 {
            assert_eq!((hits, misses), (0, ends.len() as u64));
        } else {
            // The document's chunks again; only the tail is new.
            assert_eq!(
                (hits, misses),
                (in_doc, ends.len() as u64 - in_doc),
                "question {i}"
            );
            assert!(misses <= 2);
        }
        before = now;
    }
}

fn rich_text() -> impl Strategy<Value = String> {
    let atoms = prop::sample::select(vec![
        " ", "  ", "\t", "\n", "\r\n", "\r", "\x0b", "\u{a0}", "\u{3000}", "\u{2009}", "a", "Z",
        "word", " word", " a", "é", " é", "ß", "Ω", "я", "中文", "ひら", "1", "42", "12345", "٣",
        "'s", "'LL", "'re", "'", "!", "?!", ".", "—", "😀", "#", "_", "\u{0}", "\u{7f}",
    ]);
    prop::collection::vec(atoms, 0..40).prop_map(|v| v.concat())
}

/// Text with added tokens (whole, broken and nested), corpus slices and
/// rich text around them.
fn text_with_tokens() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just(tiny::BEGIN_OF_TEXT.to_string()),
        Just(tiny::EOT_ID.to_string()),
        Just("<|start_header_id|>user<|end_header_id|>\n\n".to_string()),
        Just("<|eot".to_string()),
        Just("|>".to_string()),
        Just("<".to_string()),
        Just(" <|eot_id|>a".to_string()),
        rich_text(),
        "\\PC{0,30}",
        (0usize..5000, 1usize..400).prop_map(|(at, len)| tiny::corpus_slice(at, len)),
    ];
    prop::collection::vec(piece, 0..8).prop_map(|v| v.concat())
}

/// The tiny tokenizer with each known pattern, its fast path sized `bytes`.
fn fast_paths(bytes: usize) -> [(Tokenizer, FastPath); 2] {
    KNOWN_PATTERNS.map(|(p, _)| {
        let tok = tokenizer(&with_pattern(p));
        let config = CacheConfig {
            min_segment_bytes: bytes,
            capacity_tokens: 1 << 16,
        };
        let fast = FastPath::new(&tok, config).unwrap();
        (tok, fast)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// The cut equals the library's, on nested tokens in two passes and on
    /// the tiny tokenizer's own.
    #[test]
    fn cut_equals_library(text in text_with_tokens(), extra in "[<>|éabc]{0,12}") {
        let text = format!("{extra}{text}<b<a><a><|eot<c>{extra}");
        for t in [nested(), tokenizer(&tiny_json())] {
            let cut = AddedCut::new(&t).unwrap();
            prop_assert_eq!(our_cut(&cut, &text), library_cut(&t, &text));
        }
    }

    /// Splits and ids of pieces equal the library's, for both patterns; the
    /// word cache is shared across cases as in the router.
    #[test]
    fn splits_and_ids_equal_the_library(text in rich_text(), qwen in any::<bool>()) {
        static SHARED: OnceLock<[(Tokenizer, FastPieces); 2]> = OnceLock::new();
        let shared = SHARED.get_or_init(|| KNOWN_PATTERNS.map(|(p, _)| {
            let tok = tokenizer(&with_pattern(p));
            let fast = FastPieces::new(&tok).unwrap();
            (tok, fast)
        }));
        let (tok, fast) = &shared[usize::from(qwen)];
        let ours: Vec<&str> = fast.splits(&text).collect();
        prop_assert_eq!(ours, library_splits(tok, &text));
        let lib = library(tok, &text, false);
        // Twice: the second time every short split comes from the word cache.
        for _ in 0..2 {
            let mut ids = Vec::new();
            fast.encode(tok, &text, &mut ids).unwrap();
            prop_assert_eq!(&ids, &lib);
        }
    }

    /// The whole fast path, chunk memo included, equals the library: cold,
    /// warm, after the same text with another tail, with and without
    /// special tokens, chunk targets landing anywhere (inside multi-byte
    /// characters, inside white-space runs, next to added tokens).
    #[test]
    fn fast_path_equals_library(
        text in text_with_tokens(),
        tail in text_with_tokens(),
        bytes in 1usize..64,
        special in any::<bool>(),
        qwen in any::<bool>(),
    ) {
        let paths = fast_paths(bytes);
        let (tok, fast) = &paths[usize::from(qwen)];
        let longer = format!("{text}{tail}");
        for t in [&text, &text, &longer, &longer] {
            prop_assert_eq!(fast.encode(tok, t, special, None).unwrap(), library(tok, t, special), "{:?}", t);
        }
    }

    /// A capped encode answers the full ids exactly when the library's count
    /// is within the cap, and otherwise refuses with a count past the cap
    /// that never exceeds the library's.
    #[test]
    fn a_capped_encode_refuses_exactly_the_prompts_over_the_cap(
        text in text_with_tokens(),
        tail in text_with_tokens(),
        bytes in 1usize..64,
        cap in 0usize..200,
        special in any::<bool>(),
    ) {
        let paths = fast_paths(bytes);
        let (tok, fast) = &paths[0];
        let t = format!("{text}{tail}{text}");
        let full = library(tok, &t, special);
        match fast.encode(tok, &t, special, Some(cap)) {
            Ok(ids) => prop_assert_eq!(ids, full),
            Err(TokenizeError::PromptTooLong { cap: c, seen, .. }) => {
                prop_assert_eq!(c, cap);
                prop_assert!(full.len() > cap && seen > cap && seen <= full.len(),
                    "cap {} seen {} full {}", cap, seen, full.len());
            }
            Err(e) => prop_assert!(false, "{}", e),
        }
    }

    /// Chats rendered by minijinja, then encoded by the fast path, equal the
    /// library's encoding of the rendered text.
    #[test]
    fn chats_equal_library(
        system in text_with_tokens(),
        questions in prop::collection::vec(rich_text(), 1..3),
    ) {
        static TOK: OnceLock<(ChatTokenizer, Tokenizer)> = OnceLock::new();
        let (chat_tok, lib) = TOK.get_or_init(|| {
            let config = CacheConfig { min_segment_bytes: 16, capacity_tokens: 1 << 16 };
            let files: TokenizerFiles = tiny::files().unwrap();
            (ChatTokenizer::new(&files, config).unwrap(), tokenizer(&tiny_json()))
        });
        for q in &questions {
            let v = json!({"model": "tiny", "messages": [
                {"role": "system", "content": system}, {"role": "user", "content": q}]});
            let req = Request::from_value(&v, Expect::Chat).unwrap();
            let RequestBody::Chat(chat) = &req.body else { unreachable!() };
            let rendered = chat_tok.render_chat(chat).unwrap();
            prop_assert_eq!(chat_tok.encode_request(&req).unwrap(), library(lib, &rendered, false));
        }
    }
}

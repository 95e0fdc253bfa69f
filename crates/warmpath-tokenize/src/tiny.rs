//! A small but real tokenizer, generated deterministically: byte-level BPE in the
//! style of Llama 3 (its pre-tokenizer regex, special tokens and chat template).
//! Ids: `0..256` the bytes in GPT-2's alphabet, then [`NUM_MERGES`] merges learned
//! on `tiny_corpus.txt` (most frequent pair first, ties to the lower pair), then
//! the 5 [`SPECIAL_TOKENS`]; [`tokenizer_json`] is byte-identical on every run.

use super::error::TokenizeError;
use super::fast::byte_alphabet;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;
use std::sync::OnceLock;
use tokenizers::{OffsetReferential, OffsetType};
use tokenizers::{PreTokenizedString, PreTokenizer, PreTokenizerWrapper, Tokenizer};

pub const NUM_MERGES: usize = 763;
pub const VOCAB_SIZE: usize = 256 + NUM_MERGES + SPECIAL_TOKENS.len();
pub const BEGIN_OF_TEXT: &str = "<|begin_of_text|>";
pub const END_OF_TEXT: &str = "<|end_of_text|>";
pub const START_HEADER_ID: &str = "<|start_header_id|>";
pub const END_HEADER_ID: &str = "<|end_header_id|>";
/// The end of a turn and the EOS token of the chat model.
pub const EOT_ID: &str = "<|eot_id|>";
/// The special tokens in id order, starting at [`BOS_ID`].
pub const SPECIAL_TOKENS: [&str; 5] = [
    BEGIN_OF_TEXT,
    END_OF_TEXT,
    START_HEADER_ID,
    END_HEADER_ID,
    EOT_ID,
];
pub const BOS_ID: u32 = (256 + NUM_MERGES) as u32;
pub const EOT_ID_ID: u32 = BOS_ID + 4;

/// Llama 3's chat template (Meta-Llama-3-8B-Instruct).
pub const CHAT_TEMPLATE: &str = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

/// Llama 3's pre-tokenizer regex.
const SPLIT_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const CORPUS: &str = include_str!("tiny_corpus.txt");

fn pre_tokenizer_json() -> Value {
    json!({
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": SPLIT_REGEX}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
        ]
    })
}

/// Plain BPE training on the corpus: (vocabulary in id order, merges in rank order).
fn train() -> (Vec<String>, Vec<(String, String)>) {
    let alphabet = byte_alphabet();
    let mut vocab: Vec<String> = alphabet.iter().map(|c| c.to_string()).collect();
    let pre: PreTokenizerWrapper =
        serde_json::from_value(pre_tokenizer_json()).expect("the constant pre-tokenizer is valid");
    let mut text = PreTokenizedString::from(CORPUS);
    pre.pre_tokenize(&mut text)
        .expect("the constant pre-tokenizer runs");
    // Words in first-seen order with their counts: deterministic.
    let mut index: HashMap<&str, usize> = HashMap::new();
    let mut words: Vec<(Vec<u32>, u64)> = Vec::new();
    let lookup: HashMap<char, u32> = alphabet
        .iter()
        .enumerate()
        .map(|(i, c)| (*c, i as u32))
        .collect();
    let splits = text.get_splits(OffsetReferential::Original, OffsetType::None);
    for &(w, _, _) in &splits {
        let i = *index.entry(w).or_insert_with(|| {
            let symbols = w
                .chars()
                .map(|c| lookup.get(&c).copied().unwrap_or(0))
                .collect();
            words.push((symbols, 0));
            words.len() - 1
        });
        words[i].1 += 1;
    }
    let mut merges = Vec::with_capacity(NUM_MERGES);
    let mut ids: HashMap<String, u32> = vocab
        .iter()
        .enumerate()
        .map(|(i, s)| (s.clone(), i as u32))
        .collect();
    while vocab.len() < 256 + NUM_MERGES {
        let mut counts: HashMap<(u32, u32), u64> = HashMap::new();
        for (syms, n) in &words {
            for p in syms.windows(2) {
                *counts.entry((p[0], p[1])).or_insert(0) += n;
            }
        }
        // Highest count; among equals, the lowest pair of ids.
        let Some((&(a, b), _)) = counts.iter().max_by(|x, y| x.1.cmp(y.1).then(y.0.cmp(x.0)))
        else {
            break;
        };
        let merged = format!("{}{}", vocab[a as usize], vocab[b as usize]);
        let id = *ids.entry(merged.clone()).or_insert_with(|| {
            vocab.push(merged);
            (vocab.len() - 1) as u32
        });
        merges.push((vocab[a as usize].clone(), vocab[b as usize].clone()));
        for (syms, _) in &mut words {
            let mut out = Vec::with_capacity(syms.len());
            let mut i = 0;
            while i < syms.len() {
                if i + 1 < syms.len() && syms[i] == a && syms[i + 1] == b {
                    out.push(id);
                    i += 2;
                } else {
                    out.push(syms[i]);
                    i += 1;
                }
            }
            *syms = out;
        }
    }
    (vocab, merges)
}

fn build_json() -> String {
    let (vocab, merges) = train();
    let vocab_map: serde_json::Map<String, Value> = vocab
        .iter()
        .enumerate()
        .map(|(i, s)| (s.clone(), json!(i)))
        .collect();
    let added: Vec<Value> = SPECIAL_TOKENS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({"id": BOS_ID as usize + i, "content": t, "single_word": false, "lstrip": false,
                   "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let bos = |type_id: u32| json!({"SpecialToken": {"id": BEGIN_OF_TEXT, "type_id": type_id}});
    let seq = |id: &str, type_id: u32| json!({"Sequence": {"id": id, "type_id": type_id}});
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer_json(),
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [bos(0), seq("A", 0)],
            "pair": [bos(0), seq("A", 0), bos(1), seq("B", 1)],
            "special_tokens": {BEGIN_OF_TEXT: {"id": BEGIN_OF_TEXT, "ids": [BOS_ID], "tokens": [BEGIN_OF_TEXT]}}
        },
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab_map, "merges": merges
        }
    });
    // Round-trip through the library: validates the file and gives it the
    // library's canonical field order.
    let tok = Tokenizer::from_str(&doc.to_string()).expect("the generated tiny tokenizer is valid");
    tok.to_string(true).expect("a loaded tokenizer serialises")
}

/// The text of the tiny tokenizer.json (generated once per process).
pub fn tokenizer_json() -> String {
    static JSON: OnceLock<String> = OnceLock::new();
    JSON.get_or_init(build_json).clone()
}

/// The text of the tiny tokenizer_config.json (Llama-3-style, with the chat
/// template; keys in sorted order).
pub fn tokenizer_config_json() -> String {
    let decoder: serde_json::Map<String, Value> = SPECIAL_TOKENS
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let token = json!({"content": t, "lstrip": false, "normalized": false, "rstrip": false,
                               "single_word": false, "special": true});
            ((BOS_ID as usize + i).to_string(), token)
        })
        .collect();
    let config = json!({
        "added_tokens_decoder": decoder,
        "bos_token": BEGIN_OF_TEXT,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": true,
        "eos_token": EOT_ID,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 8192,
        "tokenizer_class": "PreTrainedTokenizerFast"
    });
    let mut s = serde_json::to_string_pretty(&config).unwrap_or_default();
    s.push('\n');
    s
}

/// Writes `tokenizer.json` and `tokenizer_config.json` into `dir` (created if
/// missing). The files are byte-identical on every run.
pub fn write_model_dir(dir: &Path) -> Result<(), TokenizeError> {
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| TokenizeError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let tok = dir.join("tokenizer.json");
    std::fs::write(&tok, tokenizer_json()).map_err(io(&tok))?;
    let cfg = dir.join("tokenizer_config.json");
    std::fs::write(&cfg, tokenizer_config_json()).map_err(io(&cfg))?;
    Ok(())
}

/// Up to `len` bytes of the embedded corpus starting near byte `at` (both cut
/// to character boundaries; wraps around): realistic text for tests and benches.
pub fn corpus_slice(at: usize, len: usize) -> String {
    let start = at % CORPUS.len();
    let floor = |mut i: usize| {
        while !CORPUS.is_char_boundary(i) {
            i -= 1;
        }
        i
    };
    let (start, end) = (floor(start), floor((start + len).min(CORPUS.len())));
    CORPUS[start..end].to_owned()
}

/// The tiny tokenizer's files, in memory.
pub fn files() -> Result<super::files::TokenizerFiles, TokenizeError> {
    super::files::TokenizerFiles::from_strings(tokenizer_json(), Some(&tokenizer_config_json()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn tok() -> Tokenizer {
        Tokenizer::from_str(&tokenizer_json()).unwrap()
    }

    #[test]
    fn alphabet_is_gpt2_byte_level() {
        let ours: std::collections::BTreeSet<char> = byte_alphabet().into_iter().collect();
        let lib: std::collections::BTreeSet<char> =
            tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
                .into_iter()
                .collect();
        assert_eq!(ours, lib);
        assert_eq!(byte_alphabet()[b' ' as usize], 'Ġ');
        assert_eq!(byte_alphabet()[b'\n' as usize], 'Ċ');
    }

    #[test]
    fn vocabulary_layout() {
        let t = tok();
        assert_eq!(t.get_vocab_size(true), VOCAB_SIZE);
        assert_eq!(VOCAB_SIZE, 1024);
        for (i, s) in SPECIAL_TOKENS.iter().enumerate() {
            assert_eq!(t.token_to_id(s), Some(BOS_ID + i as u32), "{s}");
        }
        assert_eq!(t.token_to_id(EOT_ID), Some(EOT_ID_ID));
        assert_eq!(t.token_to_id("!"), Some(b'!' as u32));
        assert_eq!(t.token_to_id("Ġ"), Some(b' ' as u32));
        // Common English became single tokens.
        for w in ["Ġthe", "Ġand", "Ġserver", "Ġprefix"] {
            assert!(
                t.token_to_id(w)
                    .is_some_and(|id| (256..BOS_ID).contains(&id)),
                "{w}"
            );
        }
    }

    #[test]
    fn generation_is_deterministic_and_files_are_identical() {
        assert_eq!(build_json(), tokenizer_json());
        let base = std::env::temp_dir().join(format!("warmpath-tiny-{}", std::process::id()));
        let (a, b) = (base.join("a"), base.join("b"));
        write_model_dir(&a).unwrap();
        write_model_dir(&b).unwrap();
        for f in ["tokenizer.json", "tokenizer_config.json"] {
            assert_eq!(
                std::fs::read(a.join(f)).unwrap(),
                std::fs::read(b.join(f)).unwrap(),
                "{f}"
            );
        }
        let files = super::super::TokenizerFiles::load(&a).unwrap();
        assert_eq!(files.chat_template.as_deref(), Some(CHAT_TEMPLATE));
        assert_eq!(files.special_tokens.bos.as_deref(), Some(BEGIN_OF_TEXT));
        assert_eq!(files.special_tokens.eos.as_deref(), Some(EOT_ID));
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn golden_ids() {
        // Pins the trained merges: a change here changes every tiny-model test.
        let ids = tok()
            .encode("Hello world, the cache is warm.", false)
            .unwrap()
            .get_ids()
            .to_vec();
        assert_eq!(ids, GOLDEN_HELLO);
        assert_eq!(
            xxhash_rust::xxh3::xxh3_64(tokenizer_json().as_bytes()),
            GOLDEN_JSON_HASH
        );
    }

    const GOLDEN_HELLO: &[u32] = &[72, 101, 320, 111, 395, 314, 44, 259, 401, 285, 548, 46];
    const GOLDEN_JSON_HASH: u64 = 0xf15d_642e_0b6f_261f;

    #[test]
    fn completions_get_bos_chats_do_not() {
        let t = tok();
        let with = t.encode("the cat", true).unwrap().get_ids().to_vec();
        let without = t.encode("the cat", false).unwrap().get_ids().to_vec();
        assert_eq!(with[0], BOS_ID);
        assert_eq!(&with[1..], &without[..]);
        let chat = t
            .encode("<|start_header_id|>user<|end_header_id|>", false)
            .unwrap();
        assert_eq!(chat.get_ids()[0], BOS_ID + 2, "<|start_header_id|>");
        assert_eq!(
            *chat.get_ids().last().unwrap(),
            BOS_ID + 3,
            "<|end_header_id|>"
        );
    }

    proptest! {
        /// Byte-level BPE is lossless for any text.
        #[test]
        fn decode_inverts_encode(s in "\\PC{0,200}") {
            let t = tok();
            let ids = t.encode(s.as_str(), false).unwrap().get_ids().to_vec();
            prop_assert!(ids.iter().all(|&i| (i as usize) < VOCAB_SIZE));
            prop_assert_eq!(t.decode(&ids, false).unwrap(), s);
        }
    }
}

//! Chat templates and tokenization, as vLLM does them (feature `tokenizer`).
//!
//! - [`TokenizerFiles`]: what a model folder holds (tokenizer.json, chat
//!   template, special tokens). [`TokenizerFiles::load`] is the **one place in
//!   warmpath-core that reads files**; it is meant for start-up only.
//! - [`ChatTokenizer`]: renders chat messages through the model's Jinja template
//!   (minijinja with Python-compatible methods, `trim_blocks`/`lstrip_blocks`
//!   like Hugging Face) and turns any [`Request`](warmpath_request::Request) into
//!   the token ids vLLM would compute: chat -> rendered text encoded without
//!   special tokens (the template already has BOS); completion text -> encoded
//!   with special tokens; token-id prompts -> used as they are.
//! - `fast`: the one fast path of encoding (the added-token cut, the chunk
//!   memo, the regex pre-split with its word cache), switched on per
//!   tokenizer only where it gives the library's ids. Its chunk memo keeps the
//!   ids of ~1 KiB chunks of long texts, cut where the pre-tokenizer always
//!   splits, so a repeated document (system prompt, RAG document, source
//!   file) with a new tail is encoded only from its tail. Sized by
//!   [`CacheConfig`].
//! - [`tiny`]: a small, real, deterministically generated Llama-3-style
//!   tokenizer for tests, the tiny engine, the simulator and the demo.

mod chat;
mod error;
mod fast;
mod files;
mod pyfuncs;
mod template;
pub mod tiny;
mod weighted_lru;

pub use chat::ChatTokenizer;
pub use error::TokenizeError;
pub use fast::{CacheConfig, CacheStats};
pub use files::{SpecialTokens, TokenizerFiles};
pub use template::ChatTemplate;

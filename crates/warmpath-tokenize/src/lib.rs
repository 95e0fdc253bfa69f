//! Chat templates and tokenization, as vLLM does them (feature `tokenizer`):
//! [`TokenizerFiles`] (the model folder, read at start-up), [`ChatTokenizer`]
//! (any [`Request`](warmpath_request::Request) to vLLM's token ids), the `fast`
//! path and [`tiny`], a small real tokenizer for tests. See docs/tokenization.md.

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
pub use fast::CacheConfig;
pub use files::{SpecialTokens, TokenizerFiles};
pub use weighted_lru::CacheStats;

//! A forwarded request body -> the warmpath block hashes the router computes
//! for the same request.
//!
//! Same rules as the router: the body is parsed with
//! [`warmpath_core::Request::from_slice`], tokenized with
//! [`ChatTokenizer::encode_request`] (chat template, special tokens, first
//! prompt of a batch) and hashed with [`hash_tokens`] (full blocks only).
//!
//! The hash seed:
//! - model: the agent's `--model`; a request naming another model is taken to
//!   name a LoRA adapter (vLLM serves adapters under their own name), which
//!   becomes the seed's LoRA;
//! - tenant: the body's `cache_salt`, and nothing else, since that is all the
//!   engine isolates its cache by (as events mode reads it from the engine's
//!   own events). Under `isolation: engine` the router forwards the tenant
//!   as `cache_salt`, and salts its hashes with it; under `route_only` it
//!   forwards none, the engine shares one cache, and the router hashes
//!   unsalted: so does the mirror. A tenant named only by
//!   `X-Prefix-Aware-Id` or `prompt_cache_key` picks a route, not a cache.

use std::sync::Arc;
use thiserror::Error;
use warmpath_core::tokenize::{ChatTokenizer, TokenizeError};
use warmpath_core::{
    hash_tokens, BlockHash, Expect, HashSeed, Request, RequestError, TenantError, TenantId,
    TenantSource,
};

/// Why a forwarded request could not be mirrored. The request itself is still
/// forwarded untouched: the engine has the last word on what it accepts. None
/// of these is retryable with the same body.
#[derive(Debug, Error)]
pub enum PromptError {
    /// The body is not a chat or completion request the router would parse.
    #[error("request body not understood: {0}")]
    Request(#[from] RequestError),
    /// The `cache_salt` tenant id is invalid.
    #[error("invalid tenant id: {0}")]
    Tenant(#[from] TenantError),
    /// Template rendering or tokenization failed.
    #[error("cannot tokenize the prompt: {0}")]
    Tokenize(#[from] TokenizeError),
}

impl PromptError {
    /// A short, stable label for metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            PromptError::Request(_) => "bad_request",
            PromptError::Tenant(_) => "bad_tenant",
            PromptError::Tokenize(_) => "tokenize",
        }
    }
}

/// Hashes prompts like the router does. Cheap to share.
#[derive(Debug, Clone)]
pub struct PromptHasher {
    tokenizer: Arc<ChatTokenizer>,
    model: String,
    block_size: usize,
}

impl PromptHasher {
    /// A hasher for the served `model` with the engine's `block_size` (>= 1).
    pub fn new(tokenizer: Arc<ChatTokenizer>, model: impl Into<String>, block_size: usize) -> Self {
        PromptHasher {
            tokenizer,
            model: model.into(),
            block_size: block_size.max(1),
        }
    }

    /// The block size hashed with.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The full-block hashes of `body` as sent to an endpoint expecting
    /// `expect`. CPU-bound (template + tokenizer): call it off the async
    /// runtime.
    pub fn hash_body(&self, body: &[u8], expect: Expect) -> Result<Vec<BlockHash>, PromptError> {
        let req = Request::from_slice(body, expect)?;
        let tenant = req
            .cache_salt
            .as_deref()
            .map(|salt| TenantId::parse(salt, TenantSource::CacheSalt))
            .transpose()?;
        let lora = if req.model == self.model {
            ""
        } else {
            req.model.as_ref()
        };
        let ids = self.tokenizer.encode_request(&req)?;
        let seed = HashSeed::new(
            &self.model,
            lora,
            tenant.as_ref().map_or("", TenantId::as_str),
        );
        Ok(hash_tokens(seed, self.block_size, &ids))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use warmpath_core::tokenize::{tiny, CacheConfig};

    fn hasher() -> PromptHasher {
        let tok = ChatTokenizer::new(&tiny::files().unwrap(), CacheConfig::default()).unwrap();
        PromptHasher::new(Arc::new(tok), "m", 4)
    }

    fn ids(h: &PromptHasher, body: &str, expect: Expect) -> Vec<u32> {
        let req = Request::from_slice(body.as_bytes(), expect).unwrap();
        h.tokenizer.encode_request(&req).unwrap()
    }

    #[test]
    fn completion_hashes_match_the_router_rule() {
        let h = hasher();
        let body =
            serde_json::json!({"model": "m", "prompt": tiny::corpus_slice(0, 200)}).to_string();
        let want = hash_tokens(
            HashSeed::new("m", "", ""),
            4,
            &ids(&h, &body, Expect::Completion),
        );
        assert!(!want.is_empty());
        assert_eq!(
            h.hash_body(body.as_bytes(), Expect::Completion).unwrap(),
            want
        );
    }

    #[test]
    fn chat_uses_the_template_and_only_cache_salt_salts() {
        let h = hasher();
        let text = tiny::corpus_slice(0, 200);
        let msgs = serde_json::json!([{"role": "user", "content": text}]);
        let body = serde_json::json!({"model": "m", "messages": msgs}).to_string();
        let toks = ids(&h, &body, Expect::Chat);
        // A route_only tenant (prompt_cache_key, or the header the proxy
        // no longer reads): the engine shares its cache, unsalted.
        let keyed = serde_json::json!({"model": "m", "prompt_cache_key": "acme", "messages": msgs})
            .to_string();
        let toks_keyed = ids(&h, &keyed, Expect::Chat);
        assert_eq!(
            h.hash_body(keyed.as_bytes(), Expect::Chat).unwrap(),
            hash_tokens(HashSeed::new("m", "", ""), 4, &toks_keyed)
        );
        let salted = serde_json::json!({"model": "m", "cache_salt": "globex",
            "prompt_cache_key": "acme", "messages": msgs})
        .to_string();
        let by_salt = h.hash_body(salted.as_bytes(), Expect::Chat).unwrap();
        assert_eq!(
            by_salt,
            hash_tokens(HashSeed::new("m", "", "globex"), 4, &toks),
            "the engine isolates by cache_salt, so it alone salts"
        );
    }

    #[test]
    fn another_model_name_is_a_lora_adapter() {
        let h = hasher();
        let body =
            serde_json::json!({"model": "sql", "prompt": tiny::corpus_slice(0, 200)}).to_string();
        let toks = ids(&h, &body, Expect::Completion);
        assert_eq!(
            h.hash_body(body.as_bytes(), Expect::Completion).unwrap(),
            hash_tokens(HashSeed::new("m", "sql", ""), 4, &toks)
        );
    }

    #[test]
    fn bad_bodies_and_tenants_are_errors_not_panics() {
        let h = hasher();
        let e = h.hash_body(b"{not json", Expect::Chat).unwrap_err();
        assert_eq!(e.reason(), "bad_request");
        let e = h
            .hash_body(
                br#"{"model":"m","prompt":"hi","cache_salt":""}"#,
                Expect::Completion,
            )
            .unwrap_err();
        assert_eq!(e.reason(), "bad_tenant");
        let e = h
            .hash_body(br#"{"model":"m","prompt":"hi"}"#, Expect::Chat)
            .unwrap_err();
        assert_eq!(e.reason(), "bad_request", "chat endpoint without messages");
    }
}

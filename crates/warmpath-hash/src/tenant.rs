//! Tenant ids: where they come from and what is accepted (docs/tenants.md).
//! Authenticated tenants ([`TenantId::from_api_key`], [`TenantId::scoped`]) are
//! derived from a client's API key, so no key text ends up in ids or logs.

use sha2::{Digest, Sha256};
use std::fmt;
use thiserror::Error;
use xxhash_rust::xxh3::{xxh3_128, xxh3_64};

/// The largest tenant id, in bytes (= characters, being ASCII).
pub const MAX_TENANT_LEN: usize = 64;

/// The longest accepted `prompt_cache_key`, in characters.
pub const MAX_PROMPT_CACHE_KEY_LEN: usize = 1024;

/// Where a tenant id was found; part of every error message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TenantSource {
    /// The `X-Prefix-Aware-Id` request header.
    Header,
    /// The body field `prompt_cache_key`.
    PromptCacheKey,
    /// The body field `cache_salt`, supplied by the client.
    CacheSalt,
}

impl TenantSource {
    /// The name the client used.
    pub fn name(self) -> &'static str {
        match self {
            TenantSource::Header => "X-Prefix-Aware-Id header",
            TenantSource::PromptCacheKey => "prompt_cache_key",
            TenantSource::CacheSalt => "cache_salt",
        }
    }

    /// The longest value accepted from this source.
    pub fn max_len(self) -> usize {
        match self {
            TenantSource::PromptCacheKey => MAX_PROMPT_CACHE_KEY_LEN,
            TenantSource::Header | TenantSource::CacheSalt => MAX_TENANT_LEN,
        }
    }
}

/// Why a tenant id was refused. Never retryable: the client must fix the id.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TenantError {
    /// Empty string.
    #[error("tenant id in {} is empty; it must be 1 to {} printable ASCII characters", .0.name(), .0.max_len())]
    Empty(TenantSource),
    /// Longer than the source's [`TenantSource::max_len`].
    #[error("tenant id in {src} is {len} characters long; at most {max} printable ASCII characters are allowed", src = .0.name(), len = .1, max = .0.max_len())]
    TooLong(TenantSource, usize),
    /// A character outside printable ASCII.
    #[error("tenant id in {src} has a character that is not printable ASCII at byte {pos}", src = .0.name(), pos = .1)]
    BadChar(TenantSource, usize),
}

/// A validated tenant id.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(String);

impl TenantId {
    /// Validates `raw` as found in `source`.
    pub fn parse(raw: &str, source: TenantSource) -> Result<Self, TenantError> {
        if raw.is_empty() {
            return Err(TenantError::Empty(source));
        }
        if let Some((i, _)) = raw.char_indices().find(|(_, c)| !(' '..='~').contains(c)) {
            return Err(TenantError::BadChar(source, i));
        }
        if raw.len() > source.max_len() {
            return Err(TenantError::TooLong(source, raw.len()));
        }
        if raw.len() > MAX_TENANT_LEN {
            // Stable across routers and restarts: the same key, the same id.
            return Ok(TenantId(format!("pck:{:032x}", xxh3_128(raw.as_bytes()))));
        }
        Ok(TenantId(raw.to_owned()))
    }

    /// The tenant of a client's API key: `key:` and 128 bits of
    /// SHA-256 in hex. A one-way hash, because ids show in `/cache-index`
    /// answers, logs and the forwarded `cache_salt`.
    pub fn from_api_key(key: &str) -> Self {
        let digest = Sha256::new()
            .chain_update(b"warmpath/tenant-key/1\0")
            .chain_update(key.as_bytes())
            .finalize();
        let mut id = String::with_capacity(36);
        id.push_str("key:");
        for b in &digest[..16] {
            id.push_str(&format!("{b:02x}"));
        }
        TenantId(id)
    }

    /// `client`'s id scoped under this one: `<self>/<client>`, or
    /// `<self>/h:<xxh3-64 hex of client>` when that would pass
    /// [`MAX_TENANT_LEN`]. Another key's scope cannot be named.
    pub fn scoped(&self, client: &TenantId) -> Self {
        let joined = format!("{}/{}", self.0, client.0);
        if joined.len() <= MAX_TENANT_LEN {
            return TenantId(joined);
        }
        TenantId(format!(
            "{}/h:{:016x}",
            self.0,
            xxh3_64(client.0.as_bytes())
        ))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn accepts_printable_ascii_up_to_64() {
        assert!(TenantId::parse("acme", TenantSource::Header).is_ok());
        assert!(TenantId::parse(&"x".repeat(64), TenantSource::Header).is_ok());
        assert!(TenantId::parse("a b~!", TenantSource::Header).is_ok());
    }

    #[test]
    fn refuses_empty_long_and_non_printable() {
        let s = TenantSource::PromptCacheKey;
        assert_eq!(TenantId::parse("", s), Err(TenantError::Empty(s)));
        assert_eq!(
            TenantId::parse(&"x".repeat(65), TenantSource::Header),
            Err(TenantError::TooLong(TenantSource::Header, 65))
        );
        assert_eq!(
            TenantId::parse(&"x".repeat(1025), s),
            Err(TenantError::TooLong(s, 1025))
        );
        assert_eq!(TenantId::parse("a\tb", s), Err(TenantError::BadChar(s, 1)));
        assert_eq!(
            TenantId::parse("caf\u{e9}", s),
            Err(TenantError::BadChar(s, 3))
        );
        let msg = TenantId::parse("", s).unwrap_err().to_string();
        assert!(msg.contains("prompt_cache_key"), "{msg}");
    }

    #[test]
    fn a_long_prompt_cache_key_is_hashed_stably() {
        let s = TenantSource::PromptCacheKey;
        let a = TenantId::parse(&"a".repeat(1024), s).unwrap();
        assert_eq!(a, TenantId::parse(&"a".repeat(1024), s).unwrap());
        assert!(
            a.as_str().starts_with("pck:") && a.as_str().len() == 36,
            "{a}"
        );
        let b = TenantId::parse(&"a".repeat(200), s).unwrap();
        assert_ne!(a, b);
        // Up to 64 stays as sent; the salt header and cache_salt keep 64.
        assert_eq!(
            TenantId::parse(&"k".repeat(64), s).unwrap().as_str().len(),
            64
        );
        assert!(TenantId::parse(&"a".repeat(65), TenantSource::CacheSalt).is_err());
        let msg = TenantId::parse(&"a".repeat(1025), s)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("at most 1024"), "{msg}");
    }

    #[test]
    fn api_key_tenants_hide_the_key_and_scope_client_ids() {
        let a = TenantId::from_api_key("sk-secret-a");
        let b = TenantId::from_api_key("sk-secret-b");
        assert_ne!(a, b);
        assert_eq!(a, TenantId::from_api_key("sk-secret-a"));
        assert!(!a.as_str().contains("secret"));
        assert_eq!(a.as_str().len(), 36);
        let short = TenantId::parse("team1", TenantSource::Header).unwrap();
        assert_eq!(a.scoped(&short).as_str(), format!("{a}/team1"));
        assert_ne!(a.scoped(&short), b.scoped(&short));
        let long = TenantId::parse(&"x".repeat(64), TenantSource::Header).unwrap();
        let scoped = a.scoped(&long);
        assert!(scoped.as_str().len() <= MAX_TENANT_LEN, "{scoped}");
        assert!(TenantId::parse(scoped.as_str(), TenantSource::Header).is_ok());
    }

    proptest::proptest! {
        /// Every derived id is itself a valid id (so it can be forwarded as
        /// `cache_salt` and shown), and distinct keys or client ids stay apart.
        #[test]
        fn derived_ids_are_valid_and_distinct(
            k1 in "[ -~]{1,80}", k2 in "[ -~]{1,80}",
            c1 in "[ -~]{1,64}", c2 in "[ -~]{1,64}",
            pck in "[ -~]{1,1024}",
        ) {
            let (a, b) = (TenantId::from_api_key(&k1), TenantId::from_api_key(&k2));
            let (c1, c2) = (
                TenantId::parse(&c1, TenantSource::Header).unwrap(),
                TenantId::parse(&c2, TenantSource::Header).unwrap(),
            );
            for id in [a.scoped(&c1), a.scoped(&c2), b.scoped(&c1), a.clone()] {
                proptest::prop_assert!(TenantId::parse(id.as_str(), TenantSource::Header).is_ok());
            }
            proptest::prop_assert_eq!(k1 == k2, a == b);
            proptest::prop_assert_eq!(c1 == c2, a.scoped(&c1) == a.scoped(&c2));
            if k1 != k2 {
                proptest::prop_assert_ne!(a.scoped(&c1), b.scoped(&c1));
            }
            let p = TenantId::parse(&pck, TenantSource::PromptCacheKey).unwrap();
            proptest::prop_assert!(p.as_str().len() <= MAX_TENANT_LEN);
        }
    }
}

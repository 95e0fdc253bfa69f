//! Tenant ids: where they come from and what is accepted.
//!
//! A tenant id arrives in the `X-Prefix-Aware-Id` header, else in the body field
//! `prompt_cache_key`, else in a client-supplied `cache_salt`. It must be 1 to 64
//! printable ASCII characters (0x20..=0x7E). Anything else is refused with a
//! [`TenantError`], which the router answers with HTTP 400.

use std::fmt;
use thiserror::Error;

/// The largest accepted tenant id, in bytes (= characters, being ASCII).
pub const MAX_TENANT_LEN: usize = 64;

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
}

/// Why a tenant id was refused. Never retryable: the client must fix the id.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum TenantError {
    /// Empty string.
    #[error("tenant id in {} is empty; it must be 1 to 64 printable ASCII characters", .0.name())]
    Empty(TenantSource),
    /// Longer than [`MAX_TENANT_LEN`].
    #[error("tenant id in {src} is {len} characters long; at most 64 printable ASCII characters are allowed", src = .0.name(), len = .1)]
    TooLong(TenantSource, usize),
    /// A character outside printable ASCII.
    #[error("tenant id in {src} has a character that is not printable ASCII at byte {pos}", src = .0.name(), pos = .1)]
    BadChar(TenantSource, usize),
    /// The value is not a string (e.g. a number in the JSON body).
    #[error("tenant id in {} must be a string", .0.name())]
    NotAString(TenantSource),
}

/// A validated tenant id.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
        if raw.len() > MAX_TENANT_LEN {
            return Err(TenantError::TooLong(source, raw.len()));
        }
        Ok(TenantId(raw.to_owned()))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TenantId({:?})", self.0)
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Picks the tenant by precedence: header, then `prompt_cache_key`, then
/// `cache_salt`. Each present value is validated; the first present one wins.
/// A present but invalid value is an error even if a later source is valid.
pub fn resolve_tenant(
    header: Option<&str>,
    prompt_cache_key: Option<&serde_json::Value>,
    cache_salt: Option<&serde_json::Value>,
) -> Result<Option<TenantId>, TenantError> {
    if let Some(h) = header {
        return TenantId::parse(h, TenantSource::Header).map(Some);
    }
    for (v, src) in [
        (prompt_cache_key, TenantSource::PromptCacheKey),
        (cache_salt, TenantSource::CacheSalt),
    ] {
        match v {
            None | Some(serde_json::Value::Null) => continue,
            Some(serde_json::Value::String(s)) => return TenantId::parse(s, src).map(Some),
            Some(_) => return Err(TenantError::NotAString(src)),
        }
    }
    Ok(None)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

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
            TenantId::parse(&"x".repeat(65), s),
            Err(TenantError::TooLong(s, 65))
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
    fn precedence_header_then_key_then_salt() {
        let k = json!("key");
        let s = json!("salt");
        let t = resolve_tenant(Some("hdr"), Some(&k), Some(&s)).unwrap();
        assert_eq!(t.unwrap().as_str(), "hdr");
        let t = resolve_tenant(None, Some(&k), Some(&s)).unwrap();
        assert_eq!(t.unwrap().as_str(), "key");
        let t = resolve_tenant(None, None, Some(&s)).unwrap();
        assert_eq!(t.unwrap().as_str(), "salt");
        assert_eq!(resolve_tenant(None, None, None).unwrap(), None);
        assert_eq!(
            resolve_tenant(None, Some(&json!(5)), None),
            Err(TenantError::NotAString(TenantSource::PromptCacheKey))
        );
    }
}

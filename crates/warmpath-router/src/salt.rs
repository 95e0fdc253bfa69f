//! Forwarding the tenant to the engine as `cache_salt`, touching the body as
//! little as possible.
//!
//! - The body already carries `cache_salt` equal to the tenant: unchanged.
//! - No `cache_salt`: `,"cache_salt":"<tenant>"` is spliced in before the
//!   closing `}` of the top-level object; every other byte stays as sent.
//! - A different `cache_salt` (the tenant came from the header or
//!   `prompt_cache_key`): the JSON is re-serialised with `cache_salt`
//!   replaced, so that the engine isolates exactly as the router hashed.

use bytes::{Bytes, BytesMut};
use serde_json::Value;
use warmpath_core::TenantId;

/// The body to forward for a request parsed as `parsed` from `raw`.
pub fn with_cache_salt(raw: &Bytes, parsed: &Value, tenant: &TenantId) -> Bytes {
    match parsed.get("cache_salt") {
        Some(Value::String(s)) if s == tenant.as_str() => raw.clone(),
        None => splice(raw, parsed, tenant).unwrap_or_else(|| rewrite(parsed, tenant, raw)),
        Some(_) => rewrite(parsed, tenant, raw),
    }
}

/// Splices the field before the final `}`; `None` if the body does not end
/// with one (after whitespace), which a parsed object always does.
fn splice(raw: &Bytes, parsed: &Value, tenant: &TenantId) -> Option<Bytes> {
    let close = raw.iter().rposition(|b| !b.is_ascii_whitespace())?;
    if raw[close] != b'}' {
        return None;
    }
    let empty = parsed.as_object().is_some_and(serde_json::Map::is_empty);
    // A TenantId is printable ASCII; serde_json escapes `"` and `\`.
    let value = serde_json::to_string(tenant.as_str()).ok()?;
    let mut out = BytesMut::with_capacity(raw.len() + value.len() + 16);
    out.extend_from_slice(&raw[..close]);
    if !empty {
        out.extend_from_slice(b",");
    }
    out.extend_from_slice(b"\"cache_salt\":");
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(&raw[close..]);
    Some(out.freeze())
}

fn rewrite(parsed: &Value, tenant: &TenantId, raw: &Bytes) -> Bytes {
    let mut v = parsed.clone();
    match v.as_object_mut() {
        Some(obj) => {
            obj.insert(
                "cache_salt".into(),
                Value::String(tenant.as_str().to_owned()),
            );
            serde_json::to_vec(&v).map_or_else(|_| raw.clone(), Bytes::from)
        }
        None => raw.clone(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use warmpath_core::TenantSource;

    fn t(s: &str) -> TenantId {
        TenantId::parse(s, TenantSource::Header).unwrap()
    }

    fn run(raw: &str, tenant: &str) -> String {
        let raw = Bytes::from(raw.to_owned());
        let v: Value = serde_json::from_slice(&raw).unwrap();
        String::from_utf8(with_cache_salt(&raw, &v, &t(tenant)).to_vec()).unwrap()
    }

    #[test]
    fn splices_without_touching_other_bytes() {
        let raw = "{ \"model\" : \"m\",\n  \"prompt\": \"x\" }\n";
        let out = run(raw, "acme");
        assert_eq!(
            out,
            "{ \"model\" : \"m\",\n  \"prompt\": \"x\" ,\"cache_salt\":\"acme\"}\n"
        );
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["cache_salt"], "acme");
    }

    #[test]
    fn escapes_quotes_and_backslashes() {
        let out = run("{\"model\":\"m\"}", "a\"b\\c");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["cache_salt"], "a\"b\\c");
    }

    #[test]
    fn equal_salt_is_left_alone_and_a_different_one_replaced() {
        let raw = "{\"model\":\"m\",  \"cache_salt\":\"acme\"}";
        assert_eq!(run(raw, "acme"), raw);
        let out = run(raw, "other");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["cache_salt"], "other");
        assert_eq!(v["model"], "m");
    }
}

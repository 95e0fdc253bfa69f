//! Forwarding the tenant to the engine as `cache_salt`, touching the body as
//! little as possible (spliced in when absent, re-serialised when different).

use bytes::{Bytes, BytesMut};
use serde_json::Value;
use warmpath_core::TenantId;

/// The body to forward for `raw`, whose `cache_salt` is `cache_salt`.
pub(crate) fn with_cache_salt(raw: &Bytes, cache_salt: Option<&str>, tenant: &TenantId) -> Bytes {
    match cache_salt {
        Some(s) if s == tenant.as_str() => raw.clone(),
        Some(_) => rewrite(raw, tenant),
        // No `"cache_salt"` in the bytes: absent (an escaped key with a null
        // value stays, and the spliced field after it wins in Python's JSON).
        None if memchr::memmem::find(raw, b"\"cache_salt\"").is_none() => {
            splice(raw, tenant).unwrap_or_else(|| rewrite(raw, tenant))
        }
        // Present as null (or some string value is exactly `cache_salt`).
        None => rewrite(raw, tenant),
    }
}

/// Splices the field before the final `}`; `None` without one.
fn splice(raw: &Bytes, tenant: &TenantId) -> Option<Bytes> {
    let close = raw.iter().rposition(|b| !b.is_ascii_whitespace())?;
    if raw[close] != b'}' {
        return None;
    }
    // `{` then white space only: an empty object gets no comma.
    let empty = raw[..close]
        .iter()
        .rposition(|b| !b.is_ascii_whitespace())
        .is_some_and(|i| raw[i] == b'{');
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

/// Re-serialises the body with `cache_salt` set (the rare path).
fn rewrite(raw: &Bytes, tenant: &TenantId) -> Bytes {
    let Ok(mut v) = serde_json::from_slice::<Value>(raw) else {
        return raw.clone();
    };
    let Some(obj) = v.as_object_mut() else {
        return raw.clone();
    };
    obj.insert("cache_salt".into(), tenant.as_str().into());
    serde_json::to_vec(&v).map_or_else(|_| raw.clone(), Bytes::from)
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
        let salt = v.get("cache_salt").and_then(Value::as_str);
        String::from_utf8(with_cache_salt(&raw, salt, &t(tenant)).to_vec()).unwrap()
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

    #[test]
    fn a_null_salt_is_replaced_not_repeated() {
        let out = run("{\"model\":\"m\",\"cache_salt\":null}", "acme");
        assert_eq!(out.matches("cache_salt").count(), 1, "{out}");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["cache_salt"], "acme");
    }

    #[test]
    fn the_key_text_as_a_value_is_not_a_field() {
        for raw in [
            "{\"model\":\"m\",\"prompt\":\"cache_salt\"}",
            "{\"model\":\"m\",\"prompt\":\"what is \\\"cache_salt\\\"?\"}",
        ] {
            let out = run(raw, "acme");
            let v: Value = serde_json::from_str(&out).unwrap();
            assert_eq!(v["cache_salt"], "acme");
            let sent: Value = serde_json::from_str(raw).unwrap();
            assert_eq!(v["prompt"], sent["prompt"]);
        }
    }

    #[test]
    fn an_empty_object_gets_no_comma() {
        let out = run("{ }", "acme");
        assert_eq!(out, "{ \"cache_salt\":\"acme\"}");
    }
}

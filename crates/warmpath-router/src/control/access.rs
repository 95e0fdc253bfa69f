//! Who may use admin and introspection, and the edge checks against a browser
//! as a hostile client (docs/trust.md, docs/hostile-edges.md).

use crate::config::split_port;
use crate::control::state::Shared;
use crate::http::error::ApiError;
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};

/// The `Authorization: Bearer` token, if one.
pub(crate) fn presented(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

fn matches(headers: &HeaderMap, token: &str) -> bool {
    presented(headers).is_some_and(|given| warmpath_proto::same_token(given, token))
}

/// The password of an `Authorization: Basic` header, if one.
fn basic_password(headers: &HeaderMap) -> Option<String> {
    use base64::Engine;
    let encoded = headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Basic ")?
        .trim();
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let pair = String::from_utf8(decoded).ok()?;
    pair.split_once(':')
        .map(|(_, password)| password.to_owned())
}

/// `Ok` when `headers` may use the admin API.
pub(crate) fn admin(s: &Shared, headers: &HeaderMap) -> Result<(), ApiError> {
    match &s.config.admin_token {
        Some(t) if !matches(headers, t) => Err(ApiError::unauthorized()),
        _ => Ok(()),
    }
}

/// Whether `headers` present the admin token (never when none is set).
pub(crate) fn admin_presented(s: &Shared, headers: &HeaderMap) -> bool {
    s.config
        .admin_token
        .as_deref()
        .is_some_and(|t| matches(headers, t))
}

/// `Ok` when `headers` may read the cache index.
pub(crate) fn inspect(s: &Shared, headers: &HeaderMap) -> Result<(), ApiError> {
    let tokens = [&s.config.inspect_token, &s.config.admin_token];
    let mut set = tokens.iter().filter_map(|t| t.as_deref()).peekable();
    if set.peek().is_none() {
        return Ok(());
    }
    let basic = basic_password(headers);
    let given = |t: &str| {
        matches(headers, t)
            || basic
                .as_deref()
                .is_some_and(|p| warmpath_proto::same_token(p, t))
    };
    set.any(given)
        .then_some(())
        .ok_or_else(ApiError::unauthorized)
}

/// The authority the client addressed: `Host`, else the URI's (HTTP/2).
fn authority<'a>(headers: &'a HeaderMap, uri: &'a Uri) -> Option<&'a str> {
    match headers.get(header::HOST) {
        Some(v) => v.to_str().ok(),
        None => uri.authority().map(|a| a.as_str()),
    }
}

/// Whether `path` is the admin API or introspection (refuses a foreign `Origin`).
fn guarded(path: &str) -> bool {
    path.starts_with("/admin/") || path == "/cache-index" || path.starts_with("/cache-index/")
}

/// The checks every request passes before its handler: `Host` on a loopback
/// listener, `Origin` on the guarded paths, the content type of an admin write.
pub(crate) fn edge(
    hosts: Option<&[String]>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<(), ApiError> {
    let addressed = authority(headers, uri);
    if let (Some(names), Some(a)) = (hosts, addressed) {
        let host = split_port(a).0;
        if !names.iter().any(|n| n.eq_ignore_ascii_case(host)) {
            return Err(ApiError::forbidden(
                "host_not_allowed",
                format!(
                    "this router listens on loopback and does not answer for Host {:?}; \
                     add the name to server.allowed_hosts if it is yours",
                    truncated(a)
                ),
            ));
        }
    }
    let path = uri.path();
    if !guarded(path) {
        return Ok(());
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let same = origin.to_str().ok().zip(addressed).is_some_and(|(o, a)| {
            // Either scheme: a TLS-terminating proxy in front forwards the same `Host`.
            o.strip_prefix("http://")
                .or_else(|| o.strip_prefix("https://"))
                .is_some_and(|rest| same_authority(rest, a))
        });
        if !same {
            return Err(ApiError::forbidden(
                "cross_origin",
                "the admin API and the cache index answer only their own origin \
                 (a page of another site sent this request)",
            ));
        }
    }
    let writes = matches!(*method, Method::POST | Method::PUT | Method::PATCH);
    if writes && path.starts_with("/admin/") && !json(headers) {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "admin writes take `Content-Type: application/json`",
        ));
    }
    Ok(())
}

/// Whether two authorities name the same host and port (a missing port matches any).
fn same_authority(a: &str, b: &str) -> bool {
    let (ha, pa) = split_port(a);
    let (hb, pb) = split_port(b);
    ha.eq_ignore_ascii_case(hb) && (pa.is_none() || pb.is_none() || pa == pb)
}

/// Whether the body is declared JSON (`application/json`, parameters aside).
fn json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// A peer's string cut for an error message.
fn truncated(s: &str) -> &str {
    match s.char_indices().nth(64) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn check(
        hosts: Option<&[String]>,
        method: Method,
        uri: &str,
        h: &[(&str, &str)],
    ) -> Result<(), u16> {
        let mut headers = HeaderMap::new();
        for (k, v) in h {
            headers.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        edge(hosts, &method, &uri.parse().unwrap(), &headers).map_err(|e| e.status.as_u16())
    }

    #[test]
    fn foreign_hosts_origins_and_plain_text_writes_are_refused() {
        let names = crate::config::loopback_hosts("127.0.0.1:8000", &[]).unwrap();
        let n = Some(names.as_slice());
        let get = Method::GET;
        assert_eq!(
            check(n, get.clone(), "/v1/models", &[("host", "localhost:1")]),
            Ok(())
        );
        assert_eq!(
            check(n, get.clone(), "/v1/models", &[("host", "[::1]:1")]),
            Ok(())
        );
        assert_eq!(
            check(n, get.clone(), "/v1/models", &[]),
            Ok(()),
            "no Host: not a browser"
        );
        assert_eq!(
            check(
                n,
                get.clone(),
                "/cache-index",
                &[("host", "evil.example:8000")]
            ),
            Err(403)
        );
        assert_eq!(
            check(
                None,
                get.clone(),
                "/cache-index",
                &[("host", "evil.example")]
            ),
            Ok(())
        );
        let tls = [
            ("host", "router.example"),
            ("origin", "https://router.example"),
        ];
        assert_eq!(check(None, get.clone(), "/cache-index", &tls), Ok(()));
        let port = [
            ("host", "127.0.0.1:8000"),
            ("origin", "http://127.0.0.1:9000"),
        ];
        assert_eq!(check(n, get.clone(), "/cache-index", &port), Err(403));
        let own = [
            ("host", "127.0.0.1:8000"),
            ("origin", "http://127.0.0.1:8000"),
        ];
        assert_eq!(check(n, get.clone(), "/cache-index", &own), Ok(()));
        let foreign = [
            ("host", "127.0.0.1:8000"),
            ("origin", "http://evil.example"),
        ];
        assert_eq!(check(n, get.clone(), "/cache-index", &foreign), Err(403));
        assert_eq!(
            check(n, get.clone(), "/v1/models", &foreign),
            Ok(()),
            "not guarded"
        );
        let null = [("host", "127.0.0.1:8000"), ("origin", "null")];
        assert_eq!(
            check(n, Method::POST, "/cache-index/query", &null),
            Err(403)
        );
        let text = [("host", "127.0.0.1:8000"), ("content-type", "text/plain")];
        assert_eq!(
            check(n, Method::POST, "/admin/pools/m/backends", &text),
            Err(415)
        );
        assert_eq!(
            check(n, Method::POST, "/admin/pools/m/backends", &text[..1]),
            Err(415)
        );
        let json = [
            ("host", "127.0.0.1:8000"),
            ("content-type", "application/json; charset=utf-8"),
        ];
        assert_eq!(
            check(n, Method::POST, "/admin/pools/m/backends", &json),
            Ok(())
        );
        assert_eq!(
            check(n, Method::DELETE, "/admin/pools/m/backends/w", &text[..1]),
            Ok(())
        );
        assert_eq!(check(n, Method::POST, "/v1/completions", &text), Ok(()));
    }
}

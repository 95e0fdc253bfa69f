//! The reverse proxy's header filter (RFC 9110 section 7.6.1): `Connection`, the
//! headers it names and the fixed hop-by-hop set (including `Proxy-Authenticate`
//! and `Proxy-Authorization`: a proxy's credentials are not the engine's) stay on
//! the hop; the rest passes in order.

use http::header::{self, HeaderMap, HeaderName};

/// The hop-by-hop headers every message drops, lowercase.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// The headers a message's `Connection` header names (comma-separated,
/// over every `Connection` line): hop-by-hop for that hop only. Tokens
/// that are no header name are ignored. Empty, without allocating, when
/// there is no `Connection` header.
fn connection_named(headers: &HeaderMap) -> Vec<HeaderName> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect()
}

/// Appends to `into` the headers of `from` that are end-to-end: not
/// hop-by-hop, not named by `Connection`, and not in `skip` (those the
/// caller sets itself, such as `host` and `content-length`).
pub fn copy_end_to_end(from: &HeaderMap, into: &mut HeaderMap, skip: &[HeaderName]) {
    let named = connection_named(from);
    for (name, value) in from {
        let hop = HOP_BY_HOP.contains(&name.as_str()) || named.contains(name);
        if !hop && !skip.contains(name) {
            into.append(name.clone(), value.clone());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use http::HeaderValue;
    use proptest::prelude::*;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn end_to_end(from: &HeaderMap, skip: &[HeaderName]) -> HeaderMap {
        let mut out = HeaderMap::new();
        copy_end_to_end(from, &mut out, skip);
        out
    }

    fn pairs(h: &HeaderMap) -> Vec<(String, String)> {
        h.iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap().to_owned()))
            .collect()
    }

    #[test]
    fn hop_by_hop_named_and_skipped_headers_stay_behind() {
        let h = map(&[
            ("connection", "close, X-Secret , keep-alive"),
            ("connection", "x-other"),
            ("x-secret", "1"),
            ("x-other", "2"),
            ("te", "trailers"),
            ("upgrade", "h2c"),
            ("proxy-authorization", "Basic x"),
            ("host", "router"),
            ("authorization", "Bearer k"),
            ("x-kept", "a"),
            ("x-kept", "b"),
        ]);
        let out = end_to_end(&h, &[header::HOST]);
        assert_eq!(
            pairs(&out),
            [
                ("authorization".into(), "Bearer k".into()),
                ("x-kept".into(), "a".into()),
                ("x-kept".into(), "b".into()),
            ]
        );
    }

    #[test]
    fn without_connection_nothing_is_allocated_for_named_ones() {
        assert_eq!(connection_named(&map(&[("x", "1")])).capacity(), 0);
    }

    /// Header names: the hop-by-hop ones (in any case), a few ordinary ones
    /// and random tokens.
    fn name() -> impl Strategy<Value = String> {
        prop_oneof![
            proptest::sample::select(HOP_BY_HOP.to_vec()).prop_map(String::from),
            proptest::sample::select(vec!["Keep-Alive", "TE", "Upgrade", "Trailer"])
                .prop_map(String::from),
            proptest::sample::select(vec!["host", "content-type", "authorization", "x-a", "x-b"])
                .prop_map(String::from),
            "[a-z][a-z0-9-]{0,8}",
        ]
    }

    proptest! {
        /// For random headers and random `Connection` lists, no hop-by-hop
        /// or named header survives, and every other one survives
        /// unchanged and in order.
        #[test]
        fn only_end_to_end_headers_pass_in_order(
            headers in proptest::collection::vec((name(), "[ -~]{0,12}"), 0..16),
            lists in proptest::collection::vec(
                proptest::collection::vec((name(), " {0,2}"), 0..5), 0..3),
        ) {
            let mut h = HeaderMap::new();
            for (k, v) in &headers {
                h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(),
                         HeaderValue::from_str(v).unwrap());
            }
            let mut named: Vec<String> = Vec::new();
            for list in &lists {
                let value = list.iter().map(|(n, pad)| format!("{pad}{n}{pad}"))
                    .collect::<Vec<_>>().join(",");
                named.extend(list.iter().map(|(n, _)| n.to_ascii_lowercase()));
                h.append(header::CONNECTION, HeaderValue::from_str(&value).unwrap());
            }
            // The plain reference: by lowercase name, against the lists.
            let hop = |n: &str| HOP_BY_HOP.contains(&n) || named.iter().any(|m| m == n);
            let expected: Vec<_> = pairs(&h).into_iter().filter(|(n, _)| !hop(n)).collect();
            let out = end_to_end(&h, &[]);
            prop_assert_eq!(pairs(&out), expected);
        }
    }
}

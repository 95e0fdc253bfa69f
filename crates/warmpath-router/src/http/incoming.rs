//! Reading a client's request: the body under its size limit, deadline and the
//! budget of bodies in flight, and the tenant header.

use crate::http::error::ApiError;
use axum::body::Body;
use axum::http::{header, HeaderMap, Uri};
use bytes::Bytes;
use http_body_util::BodyExt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

pub(crate) const TENANT_HEADER: &str = "x-prefix-aware-id";

/// The request body bytes the router holds at once, counted as they arrive.
#[derive(Debug)]
pub(crate) struct BodyBudget {
    held: AtomicUsize,
    max: usize,
}

impl BodyBudget {
    pub(crate) fn new(max: usize) -> Arc<Self> {
        Arc::new(BodyBudget {
            held: AtomicUsize::new(0),
            max,
        })
    }

    /// Bytes held now.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

/// Bytes of a [`BodyBudget`] held by one request until it is dropped.
#[derive(Debug)]
pub(crate) struct Held {
    budget: Arc<BodyBudget>,
    bytes: usize,
}

impl Held {
    pub(crate) fn new(budget: &Arc<BodyBudget>) -> Self {
        Held {
            budget: Arc::clone(budget),
            bytes: 0,
        }
    }

    /// Takes `n` more bytes of the budget; false (nothing taken) past its max.
    fn grow(&mut self, n: usize) -> bool {
        let b = &self.budget;
        let ok = b
            .held
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                h.checked_add(n).filter(|&t| t <= b.max)
            })
            .is_ok();
        if ok {
            self.bytes += n;
        }
        ok
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Reads a body of at most `limit` bytes (413 above) within `deadline` (408
/// after), counting its bytes in `held` (503 when the budget is spent).
pub(crate) async fn read_body(
    mut body: Body,
    headers: &HeaderMap,
    limit: usize,
    deadline: Duration,
    held: &mut Held,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let read = async {
        let mut parts: Vec<Bytes> = Vec::new();
        let mut total = 0usize;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                ApiError::bad_request(
                    "body_read_failed",
                    format!("could not read the request body: {e}"),
                )
            })?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            total += data.len();
            if total > limit {
                return Err(ApiError::too_large(limit));
            }
            if !held.grow(data.len()) {
                metrics::counter!("warmpath_request_bodies_refused_total").increment(1);
                return Err(ApiError::overloaded(format!(
                    "the router holds its limit of request bodies ({} bytes in all); retry shortly",
                    held.budget.max
                )));
            }
            parts.push(data);
        }
        Ok(match parts.len() {
            0 => Bytes::new(),
            1 => parts.swap_remove(0),
            _ => parts.concat().into(),
        })
    };
    tokio::time::timeout(deadline, read)
        .await
        .unwrap_or_else(|_| Err(ApiError::body_timeout(deadline)))
}

/// The `X-Prefix-Aware-Id` header as text (400 when not visible ASCII, or repeated).
pub(crate) fn tenant_header(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
    let mut all = headers.get_all(TENANT_HEADER).iter();
    let Some(v) = all.next() else {
        return Ok(None);
    };
    if all.next().is_some() {
        return Err(ApiError::bad_request(
            "invalid_tenant",
            "the X-Prefix-Aware-Id header is given more than once; send one tenant id",
        ));
    }
    v.to_str().map(Some).map_err(|_| {
        ApiError::bad_request(
            "invalid_tenant",
            "tenant id in X-Prefix-Aware-Id header must be 1 to 64 printable ASCII characters",
        )
    })
}

/// `path` with `uri`'s query, as the backend is asked.
pub(crate) fn path_and_query(path: &str, uri: &Uri) -> String {
    match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn body_of(parts: &[&'static str]) -> Body {
        let chunks: Vec<Result<Bytes, std::io::Error>> = parts
            .iter()
            .map(|p| Ok(Bytes::from_static(p.as_bytes())))
            .collect();
        Body::from_stream(futures::stream::iter(chunks))
    }

    #[tokio::test]
    async fn bodies_are_counted_as_they_arrive_and_given_back() {
        let budget = BodyBudget::new(10);
        let limit = Duration::from_secs(5);
        let none = HeaderMap::new();
        let mut a = Held::new(&budget);
        let got = read_body(body_of(&["abc", "def"]), &none, 100, limit, &mut a).await;
        assert_eq!(got.unwrap(), "abcdef");
        assert_eq!(budget.held(), 6);
        // Past the budget: 503, and what it took so far is given back.
        let mut b = Held::new(&budget);
        let e = read_body(body_of(&["xy", "zzzz"]), &none, 100, limit, &mut b).await;
        assert_eq!(e.unwrap_err().code, "overloaded");
        drop(b);
        assert_eq!(budget.held(), 6);
        drop(a);
        assert_eq!(budget.held(), 0);
        // Over the request limit: 413 whatever the budget.
        let mut c = Held::new(&budget);
        let e = read_body(body_of(&["0123", "4567"]), &none, 5, limit, &mut c).await;
        assert_eq!(e.unwrap_err().code, "request_too_large");
    }
}

//! Reading a client's request: the body under a size limit and the tenant
//! header (shared by the proxied endpoints and the inspection queries).

use crate::error::ApiError;
use axum::body::Body;
use axum::http::{header, HeaderMap, Uri};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use std::time::Duration;

/// The tenant header.
pub const TENANT_HEADER: &str = "x-prefix-aware-id";

/// Reads a body of at most `limit` bytes (413 above) within `deadline`
/// (408 after: a body shorter than its `Content-Length`, or a chunked one
/// that stalls, holds the request no longer).
pub async fn read_body(
    body: Body,
    headers: &HeaderMap,
    limit: usize,
    deadline: Duration,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ApiError::too_large(limit));
    }
    let Ok(read) = tokio::time::timeout(deadline, Limited::new(body, limit).collect()).await else {
        return Err(ApiError::body_timeout(deadline));
    };
    match read {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::too_large(limit)),
        Err(e) => Err(ApiError::bad_request(
            "body_read_failed",
            format!("could not read the request body: {e}"),
        )),
    }
}

/// The `X-Prefix-Aware-Id` header as text (400 when it is not visible ASCII,
/// or when the request carries it more than once: which one is meant is
/// unknowable, and taking the first would let a proxy's header be overridden
/// silently).
pub fn tenant_header(headers: &HeaderMap) -> Result<Option<&str>, ApiError> {
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
pub fn path_and_query(path: &str, uri: &Uri) -> String {
    match uri.query() {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    }
}

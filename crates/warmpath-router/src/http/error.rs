//! Errors: [`RouterError`] for start-up, [`ApiError`] for HTTP answers in
//! OpenAI's error shape (`{"error":{"message","type","param","code"}}`).

use crate::config::ConfigError;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use std::path::PathBuf;
use thiserror::Error;
use warmpath_core::tokenize::TokenizeError;
use warmpath_core::{IndexError, PolicyError, RequestError, TenantError};
use warmpath_edge::{ErrorBody, ErrorCode};

/// Why the router could not start (or reload).
#[derive(Debug, Error)]
pub enum RouterError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("pool {model:?}: cannot load tokenizer {}: {source}", path.display())]
    Tokenizer {
        model: String,
        path: PathBuf,
        #[source]
        source: TokenizeError,
    },
    #[error("pool {model:?}: {source}")]
    Policy {
        model: String,
        #[source]
        source: PolicyError,
    },
    #[error("pool {model:?}: {source}")]
    Index {
        model: String,
        #[source]
        source: IndexError,
    },
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

/// An error answer. `status` is the HTTP status; the body is OpenAI-shaped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI error `type`.
    pub kind: &'static str,
    /// The offending request field, if one.
    pub param: Option<String>,
    /// A stable machine-readable code.
    pub code: &'static str,
}

impl ApiError {
    /// An error with no offending field, of the OpenAI `type` of `status`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        let kind = match status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            502 | 504 => "upstream_error",
            503 => "service_unavailable_error",
            500..=599 => "server_error",
            _ => "invalid_request_error",
        };
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code,
        }
    }

    /// A 400 `invalid_request_error`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// Sets the offending field.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// 404: no pool serves `model`.
    pub fn unknown_model(model: &str) -> Self {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "model_not_found",
            format!("The model `{model}` does not exist."),
        )
        .with_param("model")
    }

    /// 413: the body is over the limit.
    pub fn too_large(limit: usize) -> Self {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
            format!("request body is larger than the limit of {limit} bytes"),
        )
    }

    /// 503 `overloaded` (answered with `Retry-After: 1`).
    pub fn overloaded(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded", message)
    }

    /// 502: the chosen backend failed.
    pub fn upstream(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_GATEWAY, "upstream_failed", message)
    }

    /// 504: the chosen backend did not answer in time.
    pub fn upstream_timeout(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::GATEWAY_TIMEOUT, "upstream_timeout", message)
    }

    /// 408: the client did not send its whole body in time.
    pub fn body_timeout(limit: std::time::Duration) -> Self {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!(
                "the request body did not arrive within {} ms",
                limit.as_millis()
            ),
        )
    }

    /// 503: the router is shutting down and its deadline passed.
    pub fn shutting_down() -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the router is shutting down",
        )
    }

    /// 401: missing or wrong bearer token.
    pub fn unauthorized() -> Self {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_token",
            "missing or invalid bearer token",
        )
    }

    /// 403: the client may not do what it asked (valid credentials).
    pub fn forbidden(code: &'static str, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::FORBIDDEN, code, message)
    }

    /// 500: a server-side failure that is not the client's fault.
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal_error", message)
    }

    /// The whole HTTP/1.1 answer as bytes, for a socket written directly.
    pub fn raw_http1(&self) -> Vec<u8> {
        warmpath_edge::raw_http1(self.status, &[], &self.body())
    }

    pub fn body(&self) -> serde_json::Value {
        ErrorBody {
            message: &self.message,
            kind: self.kind,
            param: self.param.as_deref(),
            code: ErrorCode::Name(self.code),
        }
        .json()
    }
}

/// 405, naming the methods `allow`s (an `Allow` header value) in the body too.
pub(crate) fn method_not_allowed(allow: &'static str) -> Response {
    let message = format!("this endpoint takes {allow}");
    let mut resp = ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        message,
    )
    .into_response();
    resp.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    resp
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = (self.status, axum::Json(self.body())).into_response();
        let h = resp.headers_mut();
        if self.code == "overloaded" {
            h.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        // After a 408 the rest of the body may still come, and after a
        // shutdown's 503 nothing more is served: close the connection.
        if self.status == StatusCode::REQUEST_TIMEOUT || self.code == "shutting_down" {
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

impl From<RequestError> for ApiError {
    fn from(e: RequestError) -> Self {
        let (code, param) = match &e {
            RequestError::InvalidJson(_) | RequestError::NotAnObject => ("invalid_json", None),
            RequestError::Missing(f) => ("missing_field", Some((*f).to_owned())),
            RequestError::WrongType { field, .. } => ("invalid_type", Some(field.clone())),
            RequestError::Empty(f) => ("empty_field", Some(f.clone())),
            RequestError::UnknownKind => ("missing_field", None),
        };
        ApiError {
            param,
            ..ApiError::bad_request(code, e.to_string())
        }
    }
}

impl From<TenantError> for ApiError {
    fn from(e: TenantError) -> Self {
        ApiError::bad_request("invalid_tenant", e.to_string())
    }
}

impl From<TokenizeError> for ApiError {
    fn from(e: TokenizeError) -> Self {
        if matches!(e, TokenizeError::PromptTooLong { .. }) {
            // vLLM's code and param for the same refusal.
            ApiError::bad_request("context_length_exceeded", e.to_string())
                .with_param("input_tokens")
        } else if e.is_client_error() {
            ApiError::bad_request("invalid_chat", e.to_string())
        } else {
            ApiError::internal(format!("tokenization failed: {e}"))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_body_has_the_openai_shape() {
        let b = ApiError::unknown_model("x").body();
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(b["error"]["param"], "model");
        assert_eq!(b["error"]["code"], "model_not_found");
        assert!(b["error"]["message"].as_str().unwrap().contains("`x`"));
        let b = ApiError::too_large(10).body();
        assert!(b["error"]["param"].is_null());
    }

    #[test]
    fn request_errors_name_the_field() {
        let e: ApiError = RequestError::Missing("model").into();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("model"));
    }
}

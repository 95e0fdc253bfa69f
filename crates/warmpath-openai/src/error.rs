//! Error answers in vLLM's shape:
//! `{"error": {"message", "type", "param", "code"}}` (the body is
//! [`warmpath_edge::ErrorBody`], with the status as `code`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use warmpath_edge::{ErrorBody, ErrorCode};

/// An error answer: a status and a message for the client.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    /// An error with `status`.
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    /// A 400.
    pub fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The message for the client.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// vLLM's error `type` for the status.
    fn kind(&self) -> &'static str {
        match self.status {
            StatusCode::NOT_FOUND => "NotFoundError",
            s if s.is_client_error() => "BadRequestError",
            _ => "InternalServerError",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            message: &self.message,
            kind: self.kind(),
            param: None,
            code: ErrorCode::Status(self.status),
        };
        (self.status, axum::Json(body.json())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_follow_the_status() {
        assert_eq!(
            ApiError::new(StatusCode::NOT_FOUND, "x").kind(),
            "NotFoundError"
        );
        assert_eq!(ApiError::bad("x").kind(), "BadRequestError");
        let e = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "busy");
        assert_eq!(e.kind(), "InternalServerError");
        assert_eq!((e.status().as_u16(), e.message()), (503, "busy"));
    }
}

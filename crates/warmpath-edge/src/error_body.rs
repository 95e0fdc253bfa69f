//! The OpenAI error body, `{"error":{"message","type","param","code"}}`,
//! which OpenAI's and vLLM's clients parse, and the raw HTTP/1.1 answer that
//! carries one where an answer is written to a socket directly.

use http::StatusCode;
use serde_json::{json, Value};

/// The `code` field. OpenAI gives a stable name (the router does); vLLM
/// gives the HTTP status as a number (the engine and the agent do).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode<'a> {
    /// A machine-readable name, e.g. `model_not_found`.
    Name(&'a str),
    /// The answer's status, as a number.
    Status(StatusCode),
}

/// One error answer's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorBody<'a> {
    /// For a person.
    pub message: &'a str,
    /// The error `type`, e.g. `invalid_request_error`.
    pub kind: &'a str,
    /// The request field at fault, if one (`null` otherwise).
    pub param: Option<&'a str>,
    pub code: ErrorCode<'a>,
}

impl ErrorBody<'_> {
    pub fn json(&self) -> Value {
        let code = match self.code {
            ErrorCode::Name(name) => json!(name),
            ErrorCode::Status(status) => json!(status.as_u16()),
        };
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": code,
        }})
    }
}

/// A whole HTTP/1.1 answer with a JSON `body` that closes the connection,
/// for answers written to a socket outside the HTTP library (a refused
/// connection). `extra` headers go between `content-type` and
/// `content-length`.
pub fn raw_http1(status: StatusCode, extra: &[(&str, &str)], body: &Value) -> Vec<u8> {
    let body = body.to_string();
    let mut head = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    );
    for (name, value) in extra {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!(
        "content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    ));
    head.into_bytes()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_body_has_the_openai_shape_with_either_code() {
        let named = ErrorBody {
            message: "The model `x` does not exist.",
            kind: "invalid_request_error",
            param: Some("model"),
            code: ErrorCode::Name("model_not_found"),
        };
        assert_eq!(
            named.json(),
            json!({"error": {"message": "The model `x` does not exist.",
                "type": "invalid_request_error", "param": "model", "code": "model_not_found"}})
        );
        let numbered = ErrorBody {
            message: "busy",
            kind: "agent_busy",
            param: None,
            code: ErrorCode::Status(StatusCode::SERVICE_UNAVAILABLE),
        };
        assert_eq!(
            numbered.json(),
            json!({"error": {"message": "busy", "type": "agent_busy", "param": null, "code": 503}})
        );
    }

    #[test]
    fn a_raw_answer_is_complete_and_closes() {
        let body = json!({"error": {"message": "full"}});
        let raw = raw_http1(
            StatusCode::SERVICE_UNAVAILABLE,
            &[("retry-after", "1")],
            &body,
        );
        let raw = String::from_utf8(raw).unwrap();
        let (head, rest) = raw.split_once("\r\n\r\n").unwrap();
        assert_eq!(
            head,
            format!(
                "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
                 retry-after: 1\r\ncontent-length: {}\r\nconnection: close",
                body.to_string().len()
            )
        );
        assert_eq!(serde_json::from_str::<Value>(rest).unwrap(), body);
    }
}

//! What the router's and the agent's network edges share, so each rule is
//! written once: the hop-by-hop header filter, the OpenAI error body,
//! "log at most every N s" and an accept loop's backoff and cap. No sockets and no runtime.

pub mod accept;
pub mod error_body;
pub mod headers;
pub mod throttle;

pub use accept::{open_file_share, AcceptBackoff};
pub use error_body::{raw_http1, ErrorBody, ErrorCode};
pub use headers::copy_end_to_end;
pub use throttle::LogEvery;

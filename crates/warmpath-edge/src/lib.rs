//! What the router's and the agent's network edges share, so that each rule
//! is written once:
//!
//! - [`headers`]: the reverse proxy's hop-by-hop filter (RFC 9110
//!   section 7.6.1), for requests going upstream and answers coming back;
//! - [`error_body`]: the OpenAI error body,
//!   `{"error":{"message","type","param","code"}}`, and the raw HTTP/1.1
//!   answer that carries one where no HTTP library writes the response;
//! - [`throttle`]: "log at most every N s", counting the lines held back,
//!   for events a peer can cause at will.
//!
//! No sockets and no runtime: only `http` types and JSON values.

pub mod error_body;
pub mod headers;
pub mod throttle;

pub use error_body::{raw_http1, ErrorBody, ErrorCode};
pub use headers::{copy_end_to_end, end_to_end, is_hop_by_hop};
pub use throttle::LogEvery;

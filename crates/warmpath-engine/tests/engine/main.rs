//! The engine's integration tests, one binary (fewer links on two cores).
//! One module per area: `cargo test -p warmpath-engine --test engine http::`.
#![allow(clippy::unwrap_used)]

// The published events need the publisher.
#[cfg(feature = "kv-events")]
mod events;
mod http;
mod model_dir;
mod prefix_reuse;
mod worker;

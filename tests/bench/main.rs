//! The bench's integration tests, one binary (each test binary links the
//! whole router; on two cores that was most of CI's link time). One module
//! per area: `cargo test -p warmpath-bench --test bench demo::`. `soak` and
//! `share_cost` are behind `--ignored`.
#![allow(clippy::unwrap_used)]

#[path = "../support/poll.rs"]
mod poll;

mod demo;
mod share_cost;
mod sidechannel;
mod soak;

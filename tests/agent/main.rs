//! The agent's integration tests, one binary (each test binary links the
//! whole router; on two cores that was most of CI's link time). One module
//! per area: `cargo test -p warmpath-agent --test agent pipeline_ingest::`.
//! `health` and `pipeline` test the agent against a test router
//! (`common`); the `pipeline_*` modules run it against the real router.
//! They share a process: a router started in-process shares the one metrics
//! recorder and `ingest::captured_logs`' subscriber.
#![allow(clippy::unwrap_used)]

#[path = "../support/dns.rs"]
mod dns;
#[path = "../support/ingest.rs"]
mod ingest;
#[path = "../support/poll.rs"]
mod poll;
#[path = "../support/tools.rs"]
mod tools;

mod common;

mod health;
mod pipeline;
mod pipeline_agent;
mod pipeline_e2e;
mod pipeline_ingest;
mod pipeline_members;
mod pipeline_replicas;

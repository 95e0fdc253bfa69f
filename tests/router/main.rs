//! The router's integration tests, one binary (each test binary links the
//! whole router; on two cores that was most of CI's link time). One module
//! per area: `cargo test -p warmpath-router --test router access::` runs
//! one. They share a process: a router started in-process shares the one
//! metrics recorder, so a test that reads `/metrics` names its pool apart.
#![allow(clippy::unwrap_used)]

#[path = "../support/dns.rs"]
mod dns;
#[path = "../support/raw_agent.rs"]
mod raw_agent;
#[path = "../support/mod.rs"]
mod support;
#[path = "../support/tools.rs"]
mod tools;

mod access;
mod bounds;
mod deploy_kubernetes;
mod discovery;
mod e2e;
mod health;
mod identity;
#[cfg(feature = "kubernetes")]
mod k8s;
mod kv;
mod lifecycle;
mod members;
mod ops;
mod replicate;
mod responses;
mod stale;
mod surface;
mod tenants;
mod ui;
mod upstream;
mod work;

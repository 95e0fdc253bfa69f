//! The control wing: admin and access checks, membership and discovery, health
//! and readiness, `/cache-index` and its page, metrics and the shared state.

pub(crate) mod access;
pub(crate) mod admin;
pub(crate) mod caches;
pub(crate) mod discovery;
pub(crate) mod health;
pub(crate) mod inspect;
pub(crate) mod members;
pub(crate) mod metrics;
pub(crate) mod readiness;
pub(crate) mod state;
pub(crate) mod ui;

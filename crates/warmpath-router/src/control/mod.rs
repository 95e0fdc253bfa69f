//! The control wing: the admin API (`admin`) and the access checks in
//! front of it (`access`), membership (`members`) and discovery
//! (`discovery`), health probes (`health`) and readiness (`readiness`),
//! `/cache-index` (`inspect`, `caches`) and its page (`ui`), the metrics
//! recorder (`metrics`) and the state every handler shares (`state`).

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

//! Who a backend is and what it serves: id, URL, index slot, origin,
//! credentials, and the adapters and model cards learned from its `/v1/models`.

use crate::config::{BackendConfig, BackendUrl};
use axum::http::{HeaderMap, HeaderValue};
use parking_lot::RwLock;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use warmpath_core::WorkerSlot;

/// Where a member came from: a reload or provider changes only its own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// The configuration file or flags.
    Config,
    /// `POST /admin/pools/{model}/backends`.
    Admin,
    /// A discovery provider (its name, e.g. `dns:engines.svc`).
    Discovery(String),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Config => f.write_str("config"),
            Origin::Admin => f.write_str("admin"),
            Origin::Discovery(name) => f.write_str(name),
        }
    }
}

/// A backend's identity, address and what it serves.
pub(crate) struct Endpoint {
    pub(crate) url: BackendUrl,
    /// Slot in the pool's cache index.
    pub(crate) slot: WorkerSlot,
    pub(crate) origin: Origin,
    /// The config it was added with (a reload compares url and adapters).
    pub(crate) configured: BackendConfig,
    /// Its own `api_key` as an `Authorization` value.
    auth: Option<HeaderValue>,
    /// Whether a probe answered 401/403 was logged (once a backend).
    warned_credentials: AtomicBool,
    learned_adapters: RwLock<BTreeSet<String>>,
    /// The engine's own model cards of this pool ([`crate::api::models`]).
    learned_cards: RwLock<Vec<serde_json::Value>>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("id", &self.id())
            .field("url", &self.url)
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// The endpoint of a (validated) backend config.
    pub(crate) fn new(
        cfg: &BackendConfig,
        url: BackendUrl,
        slot: WorkerSlot,
        origin: Origin,
    ) -> Self {
        Endpoint {
            url,
            slot,
            origin,
            configured: cfg.clone(),
            auth: cfg.api_key.as_ref().and_then(|k| k.bearer()),
            warned_credentials: AtomicBool::new(false),
            learned_adapters: RwLock::new(BTreeSet::new()),
            learned_cards: RwLock::new(Vec::new()),
        }
    }

    /// Worker id (the agent's id; `x-warmpath-backend`).
    pub(crate) fn id(&self) -> &str {
        self.configured.id()
    }

    /// Whether this backend serves `adapter` (learned from its `/v1/models`).
    pub(crate) fn serves_adapter(&self, adapter: &str) -> bool {
        self.learned_adapters.read().contains(adapter)
    }

    pub(crate) fn adapters(&self) -> BTreeSet<String> {
        self.learned_adapters.read().clone()
    }

    /// Replaces the adapters learned from the backend's `/v1/models`.
    pub(crate) fn set_learned_adapters(&self, adapters: BTreeSet<String>) {
        *self.learned_adapters.write() = adapters;
    }

    /// The engine's model cards of this pool, as its `/v1/models` last gave them.
    pub(crate) fn learned_cards(&self) -> Vec<serde_json::Value> {
        self.learned_cards.read().clone()
    }

    /// Replaces the model cards learned from the backend's `/v1/models`.
    pub(crate) fn set_learned_cards(&self, cards: Vec<serde_json::Value>) {
        *self.learned_cards.write() = cards;
    }

    /// Whether the engine's demand for credentials was already logged (marks it).
    pub(crate) fn warned_credentials(&self) -> bool {
        self.warned_credentials.swap(true, Ordering::Relaxed)
    }

    /// Sets the `Authorization` of a request to this backend: its own key, else `upstream`.
    pub(crate) fn authorize(&self, headers: &mut HeaderMap, upstream: Option<&HeaderValue>) {
        if let Some(v) = self.auth.as_ref().or(upstream) {
            headers.insert(axum::http::header::AUTHORIZATION, v.clone());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn adapters_are_learned() {
        let cfg = BackendConfig {
            url: "http://127.0.0.1:1".into(),
            worker_id: Some("w".into()),
            api_key: None,
        };
        let e = Endpoint::new(
            &cfg,
            BackendUrl::parse(&cfg.url).unwrap(),
            0,
            Origin::Config,
        );
        assert_eq!(e.id(), "w");
        assert!(!e.serves_adapter("chat"));
        e.set_learned_adapters(["chat".to_owned()].into());
        assert!(e.serves_adapter("chat"));
        assert_eq!(e.adapters().len(), 1);
    }
}

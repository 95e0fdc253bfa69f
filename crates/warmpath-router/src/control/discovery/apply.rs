//! One provider answer applied to its pool.

use super::answer::Answer;
use super::grace;
use super::provider::Provider;
use crate::config::BackendConfig;
use crate::control::state::Shared;
use crate::routing::backend::Origin;
use crate::routing::pool::Pool;
use std::sync::Arc;

/// Applies one answer to the pool: adds, brings back, sets aside or drains ([`grace`]).
pub(super) async fn apply(s: &Arc<Shared>, pool: &Arc<Pool>, p: &Provider, set: Answer) {
    let origin = Origin::Discovery(p.name.clone());
    let now = std::time::Instant::now();
    let members = pool.backends();
    let mut changed = false;
    for (id, url) in &set {
        if let Some(b) = members.iter().find(|b| b.endpoint.id() == id) {
            // Ours at a new URL (a pod at a new IP): replaced now, even the last one.
            let moved = b.endpoint.origin == origin && b.endpoint.url.to_string() != *url;
            if !moved {
                // Ours (back within its grace?), or a static member.
                if b.endpoint.origin == origin {
                    changed |= grace::returned(s, pool, p, b).await;
                }
                continue;
            }
            p.vanished.forget(id);
            match pool.remove_backend(id, false) {
                Ok(gone) => crate::control::members::forget(s, pool, &gone),
                Err(_) => continue,
            }
        }
        let mut cfg = BackendConfig::new(url.clone());
        if id != url {
            cfg.worker_id = Some(id.clone());
        }
        match crate::control::members::add_member(s, pool, &cfg, origin.clone()).await {
            Ok(_) => {
                changed = true;
                tracing::info!(pool = %pool.model, provider = %p.name, backend = %url, "discovered backend added");
            }
            Err(e) => {
                tracing::warn!(pool = %pool.model, provider = %p.name, backend = %url, error = %e, "discovered backend not added")
            }
        }
    }
    for b in members.iter().filter(|b| b.endpoint.origin == origin) {
        if !set.contains_key(b.endpoint.id()) {
            changed |= grace::missing(s, pool, p, b, now);
        }
    }
    let (model, name) = (pool.model.clone(), p.name.clone());
    metrics::counter!("warmpath_discovery_rounds_total", "pool" => model.clone(),
        "provider" => name.clone(), "result" => "ok")
    .increment(1);
    metrics::gauge!("warmpath_discovery_backends", "pool" => model.clone(), "provider" => name.clone())
        .set(set.len() as f64);
    let mut st = p.status.lock();
    st.resolutions += 1;
    st.last_error = None;
    st.last_result = set.into_values().collect();
    if changed {
        st.changes += 1;
        metrics::counter!("warmpath_discovery_changes_total", "pool" => model, "provider" => name)
            .increment(1);
    }
}

//! Discovery providers: each pool's `discovery:` entries, their answers
//! applied as members (origin `dns:NAME`, `kubernetes:NS/SERVICE`) through
//! [`crate::control::members`] next to the static `backends:`. A `dns` provider
//! resolves every interval; a `kubernetes` one (cargo feature
//! `kubernetes`) watches EndpointSlices and applies each settled change.
//!
//! A provider only adds and drains its own members. A member gone from an
//! answer is out of rotation at once but keeps its index for a grace of
//! a few intervals, and is back at once when it returns within it
//! ([`grace`]). One that fails (an error, a timeout, an empty answer) keeps
//! the last known set and logs: it never empties the pool, and the last
//! serving backend is never drained. Each provider's last result, error and change count are in
//! `/cache-index` (`pools[].discovery`) and `/metrics`
//! (`warmpath_discovery_*`).

mod dns;
mod grace;
#[cfg(feature = "kubernetes")]
mod kubernetes;
pub(crate) mod provider;
mod vanished;

use crate::config::BackendConfig;
use crate::control::state::Shared;
use crate::routing::backend::Origin;
use crate::routing::pool::Pool;
use provider::Provider;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long a member that vanished from its provider's answer may finish
/// its requests, once its grace is over, before it is removed.
const DRAIN_VANISHED: Duration = Duration::from_secs(120);

/// Why a provider produced no answer this round; the last set stays.
#[derive(Debug, Error)]
pub(crate) enum DiscoveryError {
    /// The resolver cannot be set up (system configuration unreadable).
    /// Retried every interval.
    #[error("cannot set up the resolver: {0}")]
    Setup(String),
    /// The lookup failed, timed out or found nothing. Retried every interval.
    #[error("lookup failed: {0}")]
    Lookup(String),
    /// A Kubernetes list or watch failed; it re-connects after a backoff.
    #[cfg(feature = "kubernetes")]
    #[error("watch failed: {0}")]
    Watch(String),
}

/// One answer: worker id → URL (the same for `dns`).
pub(crate) type Answer = BTreeMap<String, String>;

/// Resolves once; `None` when the round failed (recorded).
async fn answer(
    p: &Provider,
    pool: &str,
    dns: &mut Option<dns::Dns>,
    probe_ms: u64,
) -> Option<Answer> {
    // Validation made sure `dns` is set.
    let cfg = p.config.dns.as_ref()?;
    if dns.is_none() {
        match dns::Dns::new(cfg, provider::dns_timeout(p.interval(probe_ms))) {
            Ok(d) => *dns = Some(d),
            Err(e) => {
                p.failed(pool, &e);
                return None;
            }
        }
    }
    let d = dns.as_ref()?;
    let limit = p.round_limit(probe_ms);
    let r = match tokio::time::timeout(limit, d.resolve()).await {
        Ok(r) => r,
        Err(_) => Err(DiscoveryError::Lookup(format!(
            "no answer within {} ms",
            limit.as_millis()
        ))),
    };
    match r {
        Ok(set) => Some(set.into_iter().map(|u| (u.clone(), u)).collect()),
        Err(e) => {
            p.failed(pool, &e);
            None
        }
    }
}

/// Applies one answer to the pool: adds what is new, brings back what
/// returned within its grace, sets aside this provider's members that are
/// gone and drains those gone past their grace ([`grace`]).
async fn apply(s: &Arc<Shared>, pool: &Arc<Pool>, p: &Provider, set: Answer) {
    let origin = Origin::Discovery(p.name.clone());
    let now = std::time::Instant::now();
    let members = pool.backends();
    let mut changed = false;
    for (id, url) in &set {
        if let Some(b) = members.iter().find(|b| b.endpoint.id() == id) {
            // Ours at a new URL (a pod-name id whose pod came back at a new
            // IP): the old address is gone with its pod, so it is replaced
            // now, even when it is the last one (its successor follows).
            let moved = *b.endpoint.origin() == origin && b.endpoint.url().to_string() != *url;
            if !moved {
                // Ours (back within its grace?), or a static member.
                if *b.endpoint.origin() == origin {
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
    for b in members.iter().filter(|b| *b.endpoint.origin() == origin) {
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

/// One round of every provider of every pool, before the router serves
/// (each bounded by its round limit), so a pool made only of discovered
/// backends can route from the first request.
pub(crate) async fn first_round(s: &Arc<Shared>) {
    let probe_ms = s.config.health.probe_interval_ms;
    let rounds = s.pools.all().iter().flat_map(|pool| {
        pool.discovery.iter().map(move |p| async move {
            #[cfg(feature = "kubernetes")]
            if let Some(k) = &p.config.kubernetes {
                match kubernetes::list_once(k).await {
                    Ok(set) => apply(s, pool, p, set).await,
                    Err(e) => p.failed(&pool.model, &e),
                }
                return;
            }
            if let Some(set) = answer(p, &pool.model, &mut None, probe_ms).await {
                apply(s, pool, p, set).await;
            }
        })
    });
    futures::future::join_all(rounds).await;
}

/// Starts one task per provider; each ends when `cancel` fires.
pub(crate) fn spawn(s: &Arc<Shared>, cancel: &CancellationToken) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for pool in s.pools.all() {
        for p in &pool.discovery {
            let (s, pool, p, cancel) = (
                Arc::clone(s),
                Arc::clone(pool),
                Arc::clone(p),
                cancel.clone(),
            );
            #[cfg(feature = "kubernetes")]
            if let Some(k) = p.config.kubernetes.clone() {
                tasks.push(tokio::spawn(kubernetes::run(s, pool, p, k, cancel)));
                continue;
            }
            tasks.push(tokio::spawn(async move {
                let probe_ms = s.config.health.probe_interval_ms;
                let every = p.interval(probe_ms);
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut dns = None;
                loop {
                    tokio::select! {
                        () = cancel.cancelled() => return,
                        _ = tick.tick() => {}
                    }
                    let got = tokio::select! {
                        () = cancel.cancelled() => return,
                        got = answer(&p, &pool.model, &mut dns, probe_ms) => got,
                    };
                    if let Some(set) = got {
                        apply(&s, &pool, &p, set).await;
                    }
                }
            }));
        }
    }
    tasks
}

//! Discovery providers: each pool's `discovery:` entries, their answers
//! applied as members; a provider never empties a pool (docs/discovery.md).

mod answer;
mod apply;
mod dns;
mod grace;
#[cfg(feature = "kubernetes")]
mod kubernetes;
pub(crate) mod provider;
mod vanished;

use crate::control::state::Shared;
use answer::{Answer, DiscoveryError};
use apply::apply;
use provider::Provider;
use std::sync::Arc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Resolves once; `None` when the round failed (recorded).
async fn answer(
    p: &Provider,
    pool: &str,
    dns: &mut Option<dns::Dns>,
    probe_ms: u64,
) -> Option<Answer> {
    // Validation made sure `dns` is set.
    let cfg = p.config.dns.as_ref()?;
    let timeout = provider::dns_timeout(p.config.interval(probe_ms));
    if dns.is_none() {
        match dns::Dns::new(cfg, timeout) {
            Ok(d) => *dns = Some(d),
            Err(e) => {
                p.failed(pool, &e);
                return None;
            }
        }
    }
    let d = dns.as_ref()?;
    // A whole round looks SRV targets up one by one.
    let limit = timeout.saturating_mul(4);
    let late = |_| {
        let ms = limit.as_millis();
        Err(DiscoveryError::Lookup(format!("no answer within {ms} ms")))
    };
    match tokio::time::timeout(limit, d.resolve())
        .await
        .unwrap_or_else(late)
    {
        Ok(set) => Some(set.into_iter().map(|u| (u.clone(), u)).collect()),
        Err(e) => {
            p.failed(pool, &e);
            None
        }
    }
}

/// One round of every provider before the router serves (discovered-only pools route at once).
pub(crate) async fn first_round(s: &Arc<Shared>) {
    let probe_ms = s.config.health.probe_interval_ms;
    let rounds = s.pools.all.iter().flat_map(|pool| {
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
    for pool in &s.pools.all {
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
                let every = p.config.interval(probe_ms);
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

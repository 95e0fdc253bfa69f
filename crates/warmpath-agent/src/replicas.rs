//! The router list: a plain URL gets one link ([`crate::link`]); a
//! `dns://NAME:PORT` entry keeps one link per address NAME resolves to, looked
//! up again every `--router-dns-interval-ms` (docs/agent.md).

use crate::error::AgentError;
use crate::link::{Links, Running};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use warmpath_proto::dns::{http_url, Resolver};

/// `dns://NAME:PORT` as (NAME, PORT); `None` for any other URL.
pub fn dns_target(url: &str) -> Option<Result<(String, u16), AgentError>> {
    let rest = crate::tls::after_scheme(url, "dns://")?;
    let bad = || {
        AgentError::Config(format!(
            "--router {url}: expected dns://NAME:PORT (NAME resolved to every router replica)"
        ))
    };
    let Some((name, port)) = rest.rsplit_once(':') else {
        return Some(Err(bad()));
    };
    match port.parse::<u16>() {
        Ok(p) if p > 0 && !name.is_empty() && !name.contains('/') => Some(Ok((name.to_owned(), p))),
        _ => Some(Err(bad())),
    }
}

/// Follows `dns://name:port` until `cancel`: one link per resolved replica.
/// Owns its links: they stop with it.
pub(crate) async fn follow_dns(
    links: Arc<Links>,
    name: String,
    port: u16,
    resolver: Arc<Resolver>,
    every: Duration,
    cancel: CancellationToken,
) {
    let mut running: BTreeMap<String, Running> = BTreeMap::new();
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_error: Option<String> = None;
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = tick.tick() => {}
        }
        // The resolver's own timeout bounds each query.
        let answer = tokio::select! {
            () = cancel.cancelled() => break,
            a = resolver.lookup_ip(name.as_str()) => a.map_err(|e| e.to_string()),
        };
        // Every replica's `http://IP:PORT`.
        let set = answer.map(|ips| -> BTreeSet<String> {
            ips.iter()
                .map(|ip| http_url(SocketAddr::new(ip, port)))
                .collect()
        });
        let set = match set {
            Ok(set) if !set.is_empty() => set,
            r => {
                let e = r
                    .err()
                    .unwrap_or_else(|| format!("{name} has no addresses"));
                metrics::counter!("warmpath_agent_router_dns_failures_total", "name" => name.clone())
                    .increment(1);
                if last_error.as_deref() != Some(e.as_str()) {
                    tracing::warn!(%name, error = %e, replicas = running.len(),
                        "router lookup failed; keeping the links to the replicas known");
                }
                last_error = Some(e);
                continue;
            }
        };
        last_error = None;
        let gone: Vec<String> = running
            .keys()
            .filter(|u| !set.contains(*u))
            .cloned()
            .collect();
        for url in gone {
            if let Some(r) = running.remove(&url) {
                tracing::info!(%name, router = %url, "router replica gone: link dropped");
                links.stop(r).await;
            }
        }
        for url in set {
            if let std::collections::btree_map::Entry::Vacant(slot) = running.entry(url) {
                tracing::info!(%name, router = %slot.key(), "router replica found: linking (snapshot first)");
                let r = links.start(slot.key().clone(), &cancel);
                slot.insert(r);
            }
        }
        metrics::gauge!("warmpath_agent_router_replicas", "name" => name.clone())
            .set(running.len() as f64);
    }
    for (_, r) in std::mem::take(&mut running) {
        links.stop(r).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn dns_router_urls_name_a_host_and_a_port() {
        assert!(dns_target("http://127.0.0.1:1").is_none());
        assert_eq!(
            dns_target("dns://routers.svc:50051").unwrap().unwrap(),
            ("routers.svc".to_owned(), 50051)
        );
        assert_eq!(
            dns_target("DNS://r.test.:1").unwrap().unwrap(),
            ("r.test.".to_owned(), 1)
        );
        for bad in [
            "dns://routers",
            "dns://:1",
            "dns://r:0",
            "dns://r:x",
            "dns://a/b:1",
        ] {
            assert!(dns_target(bad).unwrap().is_err(), "{bad}");
        }
    }
}

//! The `kubernetes` provider: a Service's ready EndpointSlice endpoints,
//! watched with kube-rs, their union applied [`SETTLE`] after a change.

use super::answer::{Answer, DiscoveryError};
use crate::config::KubernetesDiscovery;
use crate::control::state::Shared;
use crate::routing::pool::Pool;
use futures::StreamExt;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use kube::runtime::utils::Backoff as _;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use warmpath_proto::dns::http_url;

use super::provider::Provider;

/// The label the EndpointSlice controller puts on a Service's slices.
const SERVICE_LABEL: &str = "kubernetes.io/service-name";

/// The server ends each watch after this many seconds (under its own
/// 5-minute cap); the watch resumes from its last resourceVersion.
const WATCH_TIMEOUT_S: u32 = 290;

/// The longest wait between re-connections.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The first wait before re-connecting after an error (doubling up to [`MAX_BACKOFF`]).
const FIRST_BACKOFF: Duration = Duration::from_millis(800);

/// Longest wait to connect, and for one list.
const TIMEOUT: Duration = Duration::from_secs(5);

/// Events within this window are applied together (a slice split moves endpoints).
const SETTLE: Duration = Duration::from_millis(200);

/// A client for the process's API server.
async fn client() -> Result<kube::Client, DiscoveryError> {
    // A watch is silent between events until the server ends it.
    let read = Duration::from_secs(WATCH_TIMEOUT_S.into()) + TIMEOUT;
    let made = crate::ingest::pods::kube_client(TIMEOUT, read).await;
    made.map_err(DiscoveryError::Setup)
}

fn selector(cfg: &KubernetesDiscovery) -> String {
    format!("{SERVICE_LABEL}={}", cfg.service)
}

/// The endpoints of one slice that take requests: worker id → URL.
pub(crate) fn slice_members(slice: &EndpointSlice, cfg: &KubernetesDiscovery) -> Answer {
    let mut out = Answer::new();
    let want = cfg.port_name.as_deref().unwrap_or("");
    let port = slice
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref().unwrap_or("") == want)
        .and_then(|p| p.port)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|&p| p != 0);
    let Some(port) = port else {
        return out; // the slice carries no such port (yet)
    };
    for ep in &slice.endpoints {
        let cond = ep.conditions.as_ref();
        if cond.and_then(|c| c.ready) == Some(false)
            || cond.and_then(|c| c.terminating) == Some(true)
        {
            continue;
        }
        // "All assumed to be fungible; clients may choose to only use the first."
        let Some(addr) = ep.addresses.first() else {
            continue;
        };
        let url = match slice.address_type.as_str() {
            "IPv4" | "IPv6" => match addr.parse::<IpAddr>() {
                Ok(ip) => http_url(SocketAddr::new(ip, port)),
                Err(_) => continue,
            },
            "FQDN" if addr.parse::<http::uri::Authority>().is_ok() => {
                format!("http://{addr}:{port}")
            }
            _ => continue,
        };
        out.insert(url.clone(), url);
    }
    out
}

/// The Service's slices as last seen, each reduced to its members.
#[derive(Debug, Default)]
pub(crate) struct Slices {
    by_name: HashMap<String, Answer>,
    /// Filled during a (re)list, swapped in at its end.
    relist: Option<HashMap<String, Answer>>,
    /// A full list has been seen: the union means something.
    listed: bool,
}

impl Slices {
    /// Takes one watcher event; true when the union may have changed.
    pub(crate) fn event(&mut self, ev: Event<EndpointSlice>, cfg: &KubernetesDiscovery) -> bool {
        let name = |s: &EndpointSlice| s.metadata.name.clone().unwrap_or_default();
        match ev {
            Event::Init => {
                self.relist = Some(HashMap::new());
                false
            }
            Event::InitApply(s) => {
                if let Some(r) = &mut self.relist {
                    r.insert(name(&s), slice_members(&s, cfg));
                }
                false
            }
            Event::InitDone => {
                if let Some(r) = self.relist.take() {
                    self.by_name = r;
                }
                self.listed = true;
                true
            }
            Event::Apply(s) => {
                self.by_name.insert(name(&s), slice_members(&s, cfg));
                self.listed
            }
            Event::Delete(s) => {
                self.by_name.remove(&name(&s));
                self.listed
            }
        }
    }

    /// The union over all slices.
    pub(crate) fn union(&self) -> Answer {
        self.by_name
            .values()
            .flat_map(|a| a.iter().map(|(k, v)| (k.clone(), v.clone())))
            .collect()
    }
}

fn nonempty(set: Answer, cfg: &KubernetesDiscovery) -> Result<Answer, DiscoveryError> {
    if set.is_empty() {
        return Err(DiscoveryError::Lookup(format!(
            "service {}/{} has no ready endpoints on port {:?}",
            cfg.namespace,
            cfg.service,
            cfg.port_name.as_deref().unwrap_or("")
        )));
    }
    Ok(set)
}

/// One list (the first round, before the router serves), within [`TIMEOUT`].
pub(crate) async fn list_once(cfg: &KubernetesDiscovery) -> Result<Answer, DiscoveryError> {
    let got = tokio::time::timeout(TIMEOUT, async {
        let api: Api<EndpointSlice> = Api::namespaced(client().await?, &cfg.namespace);
        let list = api
            .list(&ListParams::default().labels(&selector(cfg)))
            .await
            .map_err(|e| DiscoveryError::Lookup(e.to_string()))?;
        let mut slices = Slices::default();
        for s in list.items {
            slices.event(Event::Apply(s), cfg);
        }
        Ok::<_, DiscoveryError>(slices.union())
    })
    .await
    .map_err(|_| DiscoveryError::Lookup(format!("no list within {} ms", TIMEOUT.as_millis())))?;
    nonempty(got?, cfg)
}

/// Watches until `cancel` fires, applying the union after each settled change.
pub(crate) async fn run(
    s: Arc<Shared>,
    pool: Arc<Pool>,
    p: Arc<Provider>,
    cfg: KubernetesDiscovery,
    cancel: CancellationToken,
) {
    let mut backoff = Backoff::default();
    let client = loop {
        // Bounded too: a kubeconfig may run an exec credential plugin.
        let made = tokio::time::timeout(TIMEOUT, client())
            .await
            .unwrap_or_else(|_| {
                Err(DiscoveryError::Setup(format!(
                    "no client within {} ms",
                    TIMEOUT.as_millis()
                )))
            });
        match made {
            Ok(c) => break c,
            Err(e) => {
                p.failed(&pool.model, &e);
                let wait = backoff.next().unwrap_or(MAX_BACKOFF);
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(wait) => {}
                }
            }
        }
    };
    backoff.reset();
    let api: Api<EndpointSlice> = Api::namespaced(client, &cfg.namespace);
    let wc = watcher::Config::default()
        .labels(&selector(&cfg))
        .timeout(WATCH_TIMEOUT_S);
    let mut events = std::pin::pin!(watcher::watcher(api, wc).backoff(backoff));
    let mut slices = Slices::default();
    // `settle` after the first event of a burst, however many follow.
    let mut due: Option<Instant> = None;
    let every = p.config.interval(s.config.health.probe_interval_ms);
    let mut resync = tokio::time::interval_at(Instant::now() + every, every);
    resync.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let apply_at = due.unwrap_or_else(|| Instant::now() + MAX_BACKOFF);
        tokio::select! {
            () = cancel.cancelled() => return,
            // Re-applying adds what a drain removed after it came back.
            _ = resync.tick() => {
                if slices.listed && due.is_none() {
                    due = Some(Instant::now());
                }
            }
            ev = events.next() => match ev {
                // The watcher retries for ever; it ends only with us.
                None => return,
                Some(Ok(ev)) => {
                    if slices.event(ev, &cfg) && due.is_none() {
                        due = Some(Instant::now() + SETTLE);
                    }
                }
                Some(Err(e)) => p.failed(&pool.model, &DiscoveryError::Watch(e.to_string())),
            },
            () = tokio::time::sleep_until(apply_at), if due.is_some() => {
                due = None;
                match nonempty(slices.union(), &cfg) {
                    Ok(set) => super::apply::apply(&s, &pool, &p, set).await,
                    Err(e) => p.failed(&pool.model, &e),
                }
            }
        }
    }
}

/// Doubling waits up to [`MAX_BACKOFF`], jittered; reset by every event.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            next: FIRST_BACKOFF,
        }
    }
}

impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let d = self.next;
        self.next = (d * 2).min(MAX_BACKOFF);
        Some(d.mul_f64(1.0 - rand::random::<f64>() / 4.0))
    }
}

impl kube::runtime::utils::Backoff for Backoff {
    fn reset(&mut self) {
        self.next = FIRST_BACKOFF;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn cfg() -> KubernetesDiscovery {
        yaml_serde::from_str::<KubernetesDiscovery>("{service: vllm, port_name: http}").unwrap()
    }

    fn slice(name: &str, endpoints: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "resourceVersion": "7"},
            "addressType": "IPv4",
            "endpoints": endpoints,
            "ports": [{"name": "metrics", "port": 9100}, {"name": "http", "port": 8000}],
        }))
        .unwrap()
    }

    fn ep(ip: &str, pod: &str, conditions: serde_json::Value) -> serde_json::Value {
        serde_json::json!({"addresses": [ip], "conditions": conditions,
            "targetRef": {"kind": "Pod", "name": pod, "namespace": "default"}})
    }

    #[test]
    fn only_ready_endpoints_on_the_named_port_count() {
        let s = slice(
            "a",
            serde_json::json!([
                ep("10.0.0.1", "p1", serde_json::json!({"ready": true})),
                ep("10.0.0.2", "p2", serde_json::json!({"ready": false})),
                ep("10.0.0.3", "p3", serde_json::json!({})),
                ep("10.0.0.4", "p4", serde_json::json!({"ready": true, "terminating": true})),
                {"addresses": ["10.0.0.5"]},
            ]),
        );
        let got = slice_members(&s, &cfg());
        let ids: Vec<&str> = got.keys().map(String::as_str).collect();
        assert_eq!(
            ids,
            [
                "http://10.0.0.1:8000",
                "http://10.0.0.3:8000",
                "http://10.0.0.5:8000"
            ]
        );
        let mut other = cfg();
        other.port_name = Some("grpc".into());
        assert!(slice_members(&s, &other).is_empty());
    }

    #[test]
    fn ipv6_and_fqdn_addresses_make_urls() {
        let mut s = slice("a", serde_json::json!([{"addresses": ["fd00::1"]}]));
        s.address_type = "IPv6".into();
        let got = slice_members(&s, &cfg());
        assert_eq!(got.keys().next().unwrap(), "http://[fd00::1]:8000");
        s.address_type = "FQDN".into();
        s.endpoints[0].addresses = vec!["engine-0.svc".into()];
        let got = slice_members(&s, &cfg());
        assert_eq!(got.keys().next().unwrap(), "http://engine-0.svc:8000");
    }

    #[test]
    fn the_union_spans_slices_and_a_relist_replaces_them() {
        let c = cfg();
        let mut st = Slices::default();
        // Before a full list, single events change nothing to apply.
        assert!(!st.event(
            Event::Apply(slice(
                "a",
                serde_json::json!([ep("10.0.0.1", "p1", serde_json::json!({}))])
            )),
            &c
        ));
        assert!(!st.event(Event::Init, &c));
        st.event(
            Event::InitApply(slice(
                "a",
                serde_json::json!([ep("10.0.0.1", "p1", serde_json::json!({}))]),
            )),
            &c,
        );
        st.event(
            Event::InitApply(slice(
                "b",
                serde_json::json!([ep("10.0.0.2", "p2", serde_json::json!({}))]),
            )),
            &c,
        );
        assert!(st.event(Event::InitDone, &c));
        assert_eq!(st.union().len(), 2);
        // A split's halves, in the order that briefly drops nothing.
        assert!(st.event(
            Event::Apply(slice(
                "c",
                serde_json::json!([ep("10.0.0.2", "p2", serde_json::json!({}))])
            )),
            &c
        ));
        assert!(st.event(Event::Delete(slice("b", serde_json::json!([]))), &c));
        assert_eq!(st.union().len(), 2);
        // A relist forgets slices it does not list.
        st.event(Event::Init, &c);
        st.event(
            Event::InitApply(slice(
                "a",
                serde_json::json!([ep("10.0.0.1", "p1", serde_json::json!({}))]),
            )),
            &c,
        );
        st.event(Event::InitDone, &c);
        assert_eq!(
            st.union().keys().collect::<Vec<_>>(),
            ["http://10.0.0.1:8000"]
        );
        assert!(nonempty(Answer::new(), &c).is_err());
    }

    #[test]
    fn the_backoff_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::default();
        let waits: Vec<Duration> = (0..12).map(|_| b.next().unwrap()).collect();
        assert!(waits[0] <= FIRST_BACKOFF && waits[0] >= FIRST_BACKOFF.mul_f64(0.75));
        assert!(waits[1] >= FIRST_BACKOFF.mul_f64(1.5));
        assert!(waits.iter().all(|w| *w <= MAX_BACKOFF));
        assert!(waits[11] >= MAX_BACKOFF.mul_f64(0.75));
        b.reset();
        assert!(b.next().unwrap() <= FIRST_BACKOFF);
    }
}

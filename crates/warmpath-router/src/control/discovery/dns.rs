//! The `dns` provider: a name resolved with hickory-resolver (A/AAAA with the
//! configured port, else SRV), never parsed by hand.

use super::answer::DiscoveryError;
use crate::config::DnsDiscovery;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use warmpath_proto::dns::{http_url, Resolver};

#[derive(Debug)]
pub(crate) struct Dns {
    resolver: Resolver,
    name: String,
    /// Without one, SRV records give targets and ports.
    port: Option<u16>,
}

impl Dns {
    /// A resolver for `cfg` (validated), each answer awaited at most `timeout`.
    pub(crate) fn new(
        cfg: &DnsDiscovery,
        timeout: std::time::Duration,
    ) -> Result<Self, DiscoveryError> {
        let ns = cfg
            .nameserver
            .as_deref()
            .map(|s| {
                s.parse::<SocketAddr>()
                    .map_err(|e| DiscoveryError::Setup(format!("nameserver {s:?}: {e}")))
            })
            .transpose()?;
        let resolver = warmpath_proto::dns::resolver(ns, timeout)
            .map_err(|e| DiscoveryError::Setup(e.to_string()))?;
        Ok(Dns {
            resolver,
            name: cfg.name.clone(),
            port: cfg.port,
        })
    }

    /// The backends' URLs the name resolves to now (an empty answer is an error).
    pub(crate) async fn resolve(&self) -> Result<BTreeSet<String>, DiscoveryError> {
        let mut out = BTreeSet::new();
        if let Some(port) = self.port {
            let ips = self
                .resolver
                .lookup_ip(self.name.as_str())
                .await
                .map_err(|e| DiscoveryError::Lookup(e.to_string()))?;
            for ip in ips.iter() {
                out.insert(http_url(SocketAddr::new(ip, port)));
            }
        } else {
            let srv = self
                .resolver
                .srv_lookup(self.name.as_str())
                .await
                .map_err(|e| DiscoveryError::Lookup(e.to_string()))?;
            for rec in srv.iter() {
                let ips = self
                    .resolver
                    .lookup_ip(rec.target().clone())
                    .await
                    .map_err(|e| DiscoveryError::Lookup(format!("{}: {e}", rec.target())))?;
                for ip in ips.iter() {
                    out.insert(http_url(SocketAddr::new(ip, rec.port())));
                }
            }
        }
        if out.is_empty() {
            return Err(DiscoveryError::Lookup(format!(
                "{} has no addresses",
                self.name
            )));
        }
        Ok(out)
    }
}

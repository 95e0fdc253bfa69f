//! A pool's `discovery:` list: providers whose answers become members, next
//! to the static `backends:` (docs/discovery.md).

use super::error::{invalid, ConfigError};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::time::Duration;

/// One provider: exactly one of `dns` or `kubernetes` (a struct: the YAML
/// crate reads enums from `!tags`, the documented form is a one-key map).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// A DNS name, resolved every 2.5 `health.probe_interval_ms`.
    pub dns: Option<DnsDiscovery>,
    /// A Service's EndpointSlices, watched.
    pub kubernetes: Option<KubernetesDiscovery>,
}

/// `kubernetes:`: the ready endpoints of a Service's EndpointSlices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubernetesDiscovery {
    /// The Service's namespace.
    #[serde(default = "default_namespace")]
    pub namespace: String,
    /// The Service's name (the slices' `kubernetes.io/service-name` label).
    pub service: String,
    /// The EndpointPort to use, by name; default: the unnamed port.
    pub port_name: Option<String>,
}

fn default_namespace() -> String {
    "default".to_owned()
}

/// `dns:`: a name whose addresses are the backends, `http://IP:PORT` each.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsDiscovery {
    /// The name to resolve.
    pub name: String,
    /// The engines' port, for A/AAAA answers; without it SRV records are asked.
    pub port: Option<u16>,
    /// The nameserver (`IP:PORT`, UDP and TCP); default: `/etc/resolv.conf`.
    pub nameserver: Option<String>,
}

impl DiscoveryConfig {
    /// How often it resolves (`dns`: 2.5 probe intervals) or re-applies (`kubernetes`: 5).
    pub fn interval(&self, probe_ms: u64) -> Duration {
        let rounds = if self.dns.is_some() { 5 } else { 10 };
        Duration::from_millis(probe_ms.saturating_mul(rounds) / 2)
    }

    /// The provider's name in members' `origin`, logs and metrics.
    pub fn name(&self) -> String {
        match (&self.dns, &self.kubernetes) {
            (Some(d), _) => format!("dns:{}", d.name),
            (None, Some(k)) => format!("kubernetes:{}/{}", k.namespace, k.service),
            (None, None) => "none".to_owned(),
        }
    }

    /// Checks the provider at `at` (e.g. `pools[0].discovery[1]`).
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        match (&self.dns, &self.kubernetes) {
            (None, None) | (Some(_), Some(_)) => Err(invalid(
                at.to_owned(),
                "name exactly one provider (dns or kubernetes)",
            )),
            (None, Some(k)) => k.validate(&format!("{at}.kubernetes")),
            (Some(d), None) => {
                let field = |f: &str| format!("{at}.dns.{f}");
                if d.name.trim().is_empty() {
                    return Err(invalid(field("name"), "must not be empty"));
                }
                if d.port == Some(0) {
                    return Err(invalid(
                        field("port"),
                        "must be 1..=65535 (leave it out to take ports from SRV records)",
                    ));
                }
                if let Some(ns) = &d.nameserver {
                    ns.parse::<SocketAddr>().map_err(|e| {
                        invalid(field("nameserver"), format!("{ns:?} is not IP:PORT: {e}"))
                    })?;
                }
                Ok(())
            }
        }
    }
}

impl KubernetesDiscovery {
    fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let field = |f: &str| format!("{at}.{f}");
        if !cfg!(feature = "kubernetes") {
            return Err(invalid(
                at.to_owned(),
                "this router was built without the `kubernetes` cargo feature",
            ));
        }
        for (f, v) in [("namespace", &self.namespace), ("service", &self.service)] {
            if v.trim().is_empty() {
                return Err(invalid(field(f), "must not be empty"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_block_parses_and_bad_ones_are_named() {
        let yaml =
            "- dns:\n    name: engines.svc\n    port: 8000\n    nameserver: 127.0.0.1:5353\n";
        let d: Vec<DiscoveryConfig> = yaml_serde::from_str(yaml).unwrap();
        d[0].validate("pools[0].discovery[0]").unwrap();
        assert_eq!(d[0].name(), "dns:engines.svc");
        assert_eq!(d[0].interval(2_000), Duration::from_millis(5_000));
        let zero: Vec<DiscoveryConfig> = yaml_serde::from_str("- dns: {name: x, port: 0}").unwrap();
        let e = zero[0].validate("d").unwrap_err().to_string();
        assert!(e.contains("d.dns.port"), "{e}");
        let srv: Vec<DiscoveryConfig> = yaml_serde::from_str("- dns: {name: x}").unwrap();
        srv[0].validate("d").unwrap();
        assert_eq!(
            srv[0].dns.as_ref().unwrap().port,
            None,
            "SRV records are asked"
        );
        let ns: Vec<DiscoveryConfig> =
            yaml_serde::from_str("- dns: {name: x, port: 1, nameserver: nope}").unwrap();
        assert!(ns[0]
            .validate("d")
            .unwrap_err()
            .to_string()
            .contains("nameserver"));
        assert!(
            yaml_serde::from_str::<Vec<DiscoveryConfig>>("- dns: {name: x, bogus: 1}").is_err()
        );
        assert!(yaml_serde::from_str::<Vec<DiscoveryConfig>>("- consul: {}").is_err());
        let none: Vec<DiscoveryConfig> = yaml_serde::from_str("- {}").unwrap();
        assert!(none[0].validate("d").is_err());
    }

    #[test]
    fn a_kubernetes_block_parses_with_defaults_and_bad_ones_are_named() {
        let yaml = "- kubernetes:\n    service: vllm-engines\n    port_name: http\n";
        let d: Vec<DiscoveryConfig> = yaml_serde::from_str(yaml).unwrap();
        let k = d[0].kubernetes.as_ref().unwrap();
        assert_eq!(k.namespace, "default");
        assert_eq!(d[0].name(), "kubernetes:default/vllm-engines");
        assert_eq!(d[0].interval(2_000), Duration::from_millis(10_000));
        let r = d[0].validate("d");
        if !cfg!(feature = "kubernetes") {
            assert!(r
                .unwrap_err()
                .to_string()
                .contains("`kubernetes` cargo feature"));
            return;
        }
        r.unwrap();
        let bad = |y: &str| {
            let d: Vec<DiscoveryConfig> = yaml_serde::from_str(y).unwrap();
            d[0].validate("d").unwrap_err().to_string()
        };
        assert!(bad("- kubernetes: {service: ''}").contains("d.kubernetes.service"));

        assert!(
            bad("- {dns: {name: x, port: 1}, kubernetes: {service: s}}").contains("exactly one")
        );
        assert!(yaml_serde::from_str::<Vec<DiscoveryConfig>>(
            "- kubernetes: {service: s, worker_id: ip}"
        )
        .is_err());
    }
}

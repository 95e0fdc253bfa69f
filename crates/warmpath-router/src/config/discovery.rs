//! A pool's `discovery:` list: providers whose answers become members, next
//! to the static `backends:`.
//!
//! ```yaml
//! discovery:
//!   - dns:
//!       name: vllm-engines.default.svc.cluster.local
//!       port: 8000              # for A/AAAA answers; `srv: true` takes ports from SRV
//!       interval_ms: 5000
//!       nameserver: 127.0.0.1:5353   # optional; default: the system's resolv.conf
//! ```

use super::{invalid, ConfigError};
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;

/// One provider: exactly one of its keys is set (today only `dns`). A
/// struct rather than an enum: the YAML crate reads enums from `!tags`, and the
/// documented form is a one-key map.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// A DNS name resolved every `interval_ms`.
    pub dns: Option<DnsDiscovery>,
}

/// `dns:`: a name (e.g. a Kubernetes headless Service) whose addresses are
/// the backends, `http://IP:PORT` each (also their worker ids).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsDiscovery {
    /// The name to resolve.
    pub name: String,
    /// The engines' port, for A/AAAA answers (needed unless `srv`).
    #[serde(default)]
    pub port: Option<u16>,
    /// Resolve SRV records: targets and ports from the answer.
    #[serde(default)]
    pub srv: bool,
    /// How often to resolve, milliseconds (>= 100).
    #[serde(default = "default_interval_ms")]
    pub interval_ms: u64,
    /// The nameserver (`IP:PORT`, UDP and TCP); default: `/etc/resolv.conf`.
    #[serde(default)]
    pub nameserver: Option<String>,
    /// Longest wait for one answer, milliseconds (>= 10).
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
}

fn default_interval_ms() -> u64 {
    5_000
}

fn default_timeout_ms() -> u64 {
    2_000
}

impl DiscoveryConfig {
    /// The provider's name in members' `origin`, logs and metrics.
    pub fn name(&self) -> String {
        match &self.dns {
            Some(d) => format!("dns:{}", d.name),
            None => "none".to_owned(),
        }
    }

    /// Checks the provider at `at` (e.g. `pools[0].discovery[1]`).
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        match &self.dns {
            None => Err(invalid(at.to_owned(), "name one provider (dns)")),
            Some(d) => {
                let field = |f: &str| format!("{at}.dns.{f}");
                if d.name.trim().is_empty() {
                    return Err(invalid(field("name"), "must not be empty"));
                }
                if !d.srv && d.port.is_none_or(|p| p == 0) {
                    return Err(invalid(
                        field("port"),
                        "A/AAAA answers carry no port: set port (1..=65535) or srv: true",
                    ));
                }
                if d.interval_ms < 100 {
                    return Err(invalid(field("interval_ms"), "must be at least 100"));
                }
                if d.timeout_ms < 10 {
                    return Err(invalid(field("timeout_ms"), "must be at least 10"));
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_block_parses_and_bad_ones_are_named() {
        let yaml = "- dns:\n    name: engines.svc\n    port: 8000\n    interval_ms: 5000\n    nameserver: 127.0.0.1:5353\n";
        let d: Vec<DiscoveryConfig> = yaml_serde::from_str(yaml).unwrap();
        d[0].validate("pools[0].discovery[0]").unwrap();
        assert_eq!(d[0].name(), "dns:engines.svc");
        let no_port: Vec<DiscoveryConfig> = yaml_serde::from_str("- dns: {name: x}").unwrap();
        let e = no_port[0].validate("d").unwrap_err().to_string();
        assert!(e.contains("d.dns.port"), "{e}");
        let srv: Vec<DiscoveryConfig> =
            yaml_serde::from_str("- dns: {name: x, srv: true}").unwrap();
        srv[0].validate("d").unwrap();
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
}

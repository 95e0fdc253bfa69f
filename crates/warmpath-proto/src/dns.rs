//! The one DNS resolver setup of both ends (the router's `dns:` discovery and the
//! agent's `dns://` routers): uncached, so a change is seen within one interval
//! whatever the TTL; one try per query within `timeout`; an explicit nameserver
//! reads neither `/etc/resolv.conf` nor the hosts file.

use hickory_resolver::config::{NameServerConfigGroup, ResolveHosts, ResolverConfig};
use hickory_resolver::name_server::TokioConnectionProvider;
use std::net::SocketAddr;
use std::time::Duration;

pub use hickory_resolver::TokioResolver as Resolver;

/// Why no resolver could be built (the system configuration is unreadable).
/// Retrying helps only once `/etc/resolv.conf` is fixed.
#[derive(Debug, thiserror::Error)]
#[error("cannot read the system's resolver configuration: {0}")]
pub struct ResolverSetupError(String);

/// A resolver asking `nameserver` (default: the system's), uncached.
pub fn resolver(
    nameserver: Option<SocketAddr>,
    timeout: Duration,
) -> Result<Resolver, ResolverSetupError> {
    let provider = TokioConnectionProvider::default();
    let mut builder = match nameserver {
        Some(ns) => {
            let group = NameServerConfigGroup::from_ips_clear(&[ns.ip()], ns.port(), true);
            let mut b = Resolver::builder_with_config(
                ResolverConfig::from_parts(None, vec![], group),
                provider,
            );
            b.options_mut().use_hosts_file = ResolveHosts::Never;
            b
        }
        None => Resolver::builder(provider).map_err(|e| ResolverSetupError(e.to_string()))?,
    };
    let opts = builder.options_mut();
    opts.cache_size = 0;
    opts.positive_max_ttl = Some(Duration::ZERO);
    opts.negative_max_ttl = Some(Duration::ZERO);
    opts.timeout = timeout;
    opts.attempts = 1;
    Ok(builder.build())
}

/// `http://IP:PORT` (IPv6 in brackets): a resolved backend's or router's URL.
pub fn http_url(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn urls_bracket_ipv6() {
        assert_eq!(
            http_url("10.0.0.1:8000".parse().unwrap()),
            "http://10.0.0.1:8000"
        );
        assert_eq!(http_url("[::1]:8000".parse().unwrap()), "http://[::1]:8000");
    }

    #[tokio::test]
    async fn an_explicit_nameserver_needs_no_system_configuration() {
        let r = resolver(
            Some("127.0.0.1:1".parse().unwrap()),
            Duration::from_millis(50),
        );
        assert!(r.is_ok());
    }
}

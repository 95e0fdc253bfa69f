//! Client TLS for `https` routers (`--router-ca`, `--tls-domain`), checked at
//! start so a bad CA file or URL is a start-up error, not a link failing forever.

use crate::error::AgentError;
use std::path::Path;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

/// `url` after `scheme` (`"https://"`, any case), if it starts with it.
pub(crate) fn after_scheme<'a>(url: &'a str, scheme: &str) -> Option<&'a str> {
    url.get(..scheme.len())
        .filter(|s| s.eq_ignore_ascii_case(scheme))
        .map(|_| &url[scheme.len()..])
}

/// Whether `url` asks for TLS.
pub fn is_https(url: &str) -> bool {
    after_scheme(url, "https://").is_some()
}

/// Whether `url` is plain `http://` to a host other than this one, where a
/// token sent along could be read on the way. Unparsable URLs count as off
/// host (they fail later with their own error).
pub fn plain_text_off_host(url: &str) -> bool {
    let Some(rest) = after_scheme(url, "http://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => authority.rsplit_once(':').map_or(authority, |(h, _)| h),
    };
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    !loopback
}

fn read_ca(path: &Path) -> Result<Certificate, AgentError> {
    let pem = warmpath_proto::files::read_pem(path, "CERTIFICATE")
        .map_err(|why| AgentError::Config(format!("--router-ca {}: {why}", path.display())))?;
    Ok(Certificate::from_pem(pem))
}

/// Checks every router URL and builds the TLS settings the `https` ones
/// use (`None` when every router is plain `http`).
pub fn router_tls(
    routers: &[String],
    ca: Option<&Path>,
    domain: Option<&str>,
) -> Result<Option<ClientTlsConfig>, AgentError> {
    let tls = if routers.iter().any(|u| is_https(u)) {
        let mut tls = match ca {
            Some(path) => ClientTlsConfig::new().ca_certificate(read_ca(path)?),
            None => ClientTlsConfig::new().with_native_roots(),
        };
        if let Some(d) = domain {
            if d.is_empty() {
                return Err(AgentError::Config("--tls-domain must not be empty".into()));
            }
            tls = tls.domain_name(d);
        }
        Some(tls)
    } else {
        if ca.is_some() || domain.is_some() {
            tracing::warn!("--router-ca / --tls-domain ignored: no --router uses https://");
        }
        None
    };
    for url in routers {
        if !is_https(url) && after_scheme(url, "http://").is_none() {
            return Err(AgentError::Config(format!(
                "--router {url:?} must start with http:// or https://"
            )));
        }
        let ep = Endpoint::from_shared(url.clone())
            .map_err(|e| AgentError::Config(format!("--router {url:?} is not a valid URL: {e}")))?;
        // Building each https endpoint parses the roots now.
        if let Some(tls) = tls.as_ref().filter(|_| is_https(url)) {
            ep.tls_config(tls.clone()).map_err(|e| {
                AgentError::Config(format!(
                    "TLS settings for --router {url:?}: {}",
                    warmpath_proto::error_chain(&e)
                ))
            })?;
        }
    }
    Ok(tls)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_plain_http_to_other_hosts_is_off_host() {
        for off in [
            "http://router-1:50051",
            "http://10.0.0.1:1",
            "HTTP://[2001:db8::1]:5/x",
        ] {
            assert!(plain_text_off_host(off), "{off}");
        }
        for on in [
            "https://router-1:50051",
            "http://127.0.0.1:50051",
            "http://localhost:1",
            "http://[::1]:9/p",
            "http://127.8.0.1",
        ] {
            assert!(!plain_text_off_host(on), "{on}");
        }
    }

    fn urls(u: &[&str]) -> Vec<String> {
        u.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn plain_http_needs_no_tls() {
        let r = router_tls(&urls(&["http://127.0.0.1:1"]), None, None).unwrap();
        assert!(r.is_none());
        assert!(is_https("HTTPS://x:1") && !is_https("http://x"));
    }

    #[test]
    fn bad_urls_and_ca_files_are_start_up_errors() {
        let e = router_tls(&urls(&["127.0.0.1:50051"]), None, None).unwrap_err();
        assert!(e.to_string().contains("http:// or https://"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pem");
        let e = router_tls(&urls(&["https://r:1"]), Some(&missing), None).unwrap_err();
        assert!(e.to_string().contains("nope.pem"), "{e}");
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "not a certificate").unwrap();
        let e = router_tls(&urls(&["https://r:1"]), Some(&junk), None).unwrap_err();
        assert!(e.to_string().contains("no PEM \"CERTIFICATE\""), "{e}");
        let e = router_tls(&urls(&["https://r:1"]), None, Some("")).unwrap_err();
        assert!(e.to_string().contains("--tls-domain"), "{e}");
    }

    #[test]
    fn https_without_a_ca_uses_the_system_roots() {
        let r = router_tls(
            &urls(&["http://a:1", "https://b:2"]),
            None,
            Some("router.internal"),
        )
        .unwrap();
        assert!(r.is_some());
    }
}

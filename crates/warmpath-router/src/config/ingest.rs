//! The `ingest:` section: TLS for the agents' gRPC stream and the deadlines
//! after which a silent agent's entries stop counting, then are cleared.

use super::error::{invalid, ConfigError};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A silent agent's entries are cleared after this many `stale_after_ms`.
const DROP_AFTER_STALE: u32 = 12;

/// Agent ingest settings (the listen address is `grpc_listen`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IngestSettings {
    /// PEM certificate chain; with `tls_key` the ingest serves TLS only.
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// Silence after which an agent's entries stop counting, in milliseconds (>= 100; cleared after 12 times as long).
    pub stale_after_ms: u64,
    /// Share each routing decision with the other router replicas through the agents (docs/replicas.md).
    pub share_decisions: bool,
    /// Kubernetes: the audience of the pod ServiceAccount tokens agents may present (docs/trust.md).
    pub pod_token_audience: Option<String>,
}

impl Default for IngestSettings {
    fn default() -> Self {
        IngestSettings {
            tls_cert: None,
            tls_key: None,
            stale_after_ms: 10_000,
            share_decisions: true,
            pod_token_audience: None,
        }
    }
}

/// A PEM certificate chain and its PEM private key.
pub type TlsPem = (Vec<u8>, Vec<u8>);

/// Reads a PEM file holding a `kind` block; an error names `at`.
fn read_pem(at: &str, path: &Path, kind: &str) -> Result<Vec<u8>, ConfigError> {
    warmpath_proto::files::read_pem(path, kind)
        .map_err(|why| invalid(at, format!("{}: {why}", path.display())))
}

impl IngestSettings {
    /// Silence after which a worker's entries stop counting.
    pub fn stale_after(&self) -> Duration {
        Duration::from_millis(self.stale_after_ms)
    }

    /// Silence after which a worker's entries are cleared.
    pub fn drop_after(&self) -> Duration {
        self.stale_after().saturating_mul(DROP_AFTER_STALE)
    }

    /// Checks the section and reads the TLS files (`grpc_listen`: whether the ingest runs).
    pub(crate) fn validate(&self, grpc_listen: bool) -> Result<(), ConfigError> {
        if self.stale_after_ms < 100 {
            return Err(invalid("ingest.stale_after_ms", "must be at least 100"));
        }
        if let Some(a) = &self.pod_token_audience {
            if !cfg!(feature = "kubernetes") {
                return Err(invalid(
                    "ingest.pod_token_audience",
                    "this router was built without the `kubernetes` feature",
                ));
            }
            if a.is_empty() || a.len() > 253 || a.chars().any(char::is_whitespace) {
                return Err(invalid(
                    "ingest.pod_token_audience",
                    "must be a non-empty audience name without spaces (the agents' projected token's `audience`)",
                ));
            }
        }
        let tls = self.load_tls()?;
        if tls.is_some() && !grpc_listen {
            return Err(invalid(
                "ingest.tls_cert",
                "TLS is configured but grpc_listen is not: the ingest would not run",
            ));
        }
        Ok(())
    }

    /// The PEM certificate chain and key, when TLS is configured.
    pub fn load_tls(&self) -> Result<Option<TlsPem>, ConfigError> {
        match (&self.tls_cert, &self.tls_key) {
            (None, None) => Ok(None),
            (Some(_), None) => Err(invalid(
                "ingest.tls_key",
                "tls_cert is set without tls_key (--agent-tls-key)",
            )),
            (None, Some(_)) => Err(invalid(
                "ingest.tls_cert",
                "tls_key is set without tls_cert (--agent-tls-cert)",
            )),
            (Some(c), Some(k)) => Ok(Some((
                read_pem("ingest.tls_cert", c, "CERTIFICATE")?,
                read_pem("ingest.tls_key", k, "PRIVATE KEY")?,
            ))),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::RouterConfig;

    fn base() -> RouterConfig {
        RouterConfig::from_yaml(
            "listen: 127.0.0.1:0\ngrpc_listen: 127.0.0.1:0\npools:\n  - model: m\n    backends: [{url: 'http://127.0.0.1:9'}]\n",
        )
        .unwrap()
    }

    fn err(c: &RouterConfig) -> String {
        c.validate().unwrap_err().to_string()
    }

    const CERT: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    const KEY: &str = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";

    #[test]
    fn yaml_section_parses_and_converts() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&c, CERT).unwrap();
        std::fs::write(&k, KEY).unwrap();
        let yaml = format!(
            "grpc_listen: 127.0.0.1:0\nagent_secret: t\ningest:\n  tls_cert: {}\n  tls_key: {}\n  stale_after_ms: 500\npools:\n  - model: m\n    backends: [{{url: 'http://127.0.0.1:9'}}]\n",
            c.display(),
            k.display()
        );
        let cfg = RouterConfig::from_yaml(&yaml).unwrap();
        cfg.validate().unwrap();
        assert_eq!(cfg.ingest.stale_after(), Duration::from_millis(500));
        assert_eq!(cfg.ingest.drop_after(), Duration::from_millis(6_000));
        let (cert, key) = cfg.ingest.load_tls().unwrap().unwrap();
        assert_eq!(
            (cert.as_slice(), key.as_slice()),
            (CERT.as_bytes(), KEY.as_bytes())
        );
        assert!(RouterConfig::from_yaml("ingest: {tls_crt: x}\n").is_err());
    }

    #[test]
    fn bad_tls_and_deadlines_are_refused_with_their_place() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&c, CERT).unwrap();
        std::fs::write(&k, KEY).unwrap();

        let mut cfg = base();
        cfg.ingest.tls_cert = Some(c.clone());
        assert!(err(&cfg).contains("ingest.tls_key"), "{}", err(&cfg));
        let mut cfg = base();
        cfg.ingest.tls_key = Some(k.clone());
        assert!(err(&cfg).contains("without tls_cert"), "{}", err(&cfg));
        let mut cfg = base();
        cfg.ingest.tls_cert = Some(dir.path().join("missing.pem"));
        cfg.ingest.tls_key = Some(k.clone());
        let e = err(&cfg);
        assert!(
            e.contains("ingest.tls_cert") && e.contains("missing.pem"),
            "{e}"
        );
        let mut cfg = base();
        cfg.ingest.tls_cert = Some(k.clone());
        cfg.ingest.tls_key = Some(k.clone());
        assert!(
            err(&cfg).contains("no PEM \"CERTIFICATE\""),
            "{}",
            err(&cfg)
        );
        let mut cfg = base();
        cfg.ingest.tls_cert = Some(c.clone());
        cfg.ingest.tls_key = Some(c.clone());
        assert!(err(&cfg).contains("ingest.tls_key"), "{}", err(&cfg));
        let mut cfg = base();
        cfg.grpc_listen = None;
        cfg.ingest.tls_cert = Some(c.clone());
        cfg.ingest.tls_key = Some(k.clone());
        assert!(err(&cfg).contains("grpc_listen"), "{}", err(&cfg));

        let mut cfg = base();
        cfg.ingest.stale_after_ms = 10;
        assert!(err(&cfg).contains("ingest.stale_after_ms"), "{}", err(&cfg));
        base().validate().unwrap();
    }
}

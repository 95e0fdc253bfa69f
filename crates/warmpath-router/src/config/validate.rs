//! The one place the configuration is checked.

use super::error::{invalid, ConfigError};
use super::router::RouterConfig;
use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use warmpath_core::Strategy;

/// Largest accepted `block_size`.
pub(super) const MAX_BLOCK_SIZE: usize = 4096;

/// Why a backend URL was refused. Not retryable: the same text fails again.
#[derive(Debug, thiserror::Error)]
#[error("{raw:?} {why}")]
pub struct BadUrl {
    pub raw: String,
    /// What is wrong with it.
    pub why: String,
}

/// A backend base URL: `http://authority[/prefix]`, without a trailing slash.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct BackendUrl {
    authority: http::uri::Authority,
    prefix: String,
}

impl BackendUrl {
    /// Parses and checks a base URL (plain `http` only; no query).
    pub fn parse(raw: &str) -> Result<Self, BadUrl> {
        let bad = |why: &str| BadUrl {
            raw: raw.to_owned(),
            why: why.to_owned(),
        };
        let uri: http::Uri = raw
            .parse()
            .map_err(|e: http::uri::InvalidUri| bad(&format!("is not a URL: {e}")))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(s) => {
                return Err(bad(&format!(
                    "has scheme {s:?}, which is not supported; use http"
                )))
            }
            None => return Err(bad("has no scheme; write http://host:port")),
        }
        let authority = uri.authority().cloned().ok_or_else(|| bad("has no host"))?;
        if uri.query().is_some() {
            return Err(bad("must not have a query string"));
        }
        let prefix = uri.path().trim_end_matches('/').to_owned();
        Ok(BackendUrl { authority, prefix })
    }

    /// The URI of `path_and_query` (starting with `/`) on this backend.
    pub fn join(&self, path_and_query: &str) -> Result<http::Uri, http::Error> {
        http::Uri::builder()
            .scheme("http")
            .authority(self.authority.clone())
            .path_and_query(format!("{}{}", self.prefix, path_and_query))
            .build()
    }
}

impl fmt::Display for BackendUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}{}", self.authority, self.prefix)
    }
}

impl fmt::Debug for BackendUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BackendUrl({self})")
    }
}

fn addr(at: &str, raw: &str) -> Result<SocketAddr, ConfigError> {
    raw.parse()
        .map_err(|_| invalid(at, format!("{raw:?} is not an IP:port address")))
}

impl RouterConfig {
    /// Secure defaults: no listener other hosts can reach without a token.
    fn refuse_open_listeners(
        &self,
        listen: SocketAddr,
        grpc: Option<SocketAddr>,
    ) -> Result<(), ConfigError> {
        if !listen.ip().is_loopback() && self.admin_token.is_none() {
            return Err(invalid(
                "admin_token",
                format!(
                    "listen {listen} accepts other hosts, and without an admin token anyone there can change routing (PUT /admin/...) and read /cache-index: set admin_token (--admin-token or WARMPATH_ADMIN_TOKEN), listen on 127.0.0.1, or pass --insecure"
                ),
            ));
        }
        if let Some(g) = grpc.filter(|g| !g.ip().is_loopback()) {
            if self.agent_secret.is_none() && self.ingest.pod_token_audience.is_none() {
                return Err(invalid(
                    "agent_secret",
                    format!(
                        "grpc_listen {g} accepts other hosts, and without agent credentials anyone there can publish cache state for any worker: set agent_secret (--agent-secret or WARMPATH_AGENT_SECRET) and give each agent its credential (warmpath-router --print-agent-token WORKER), or pass --insecure"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks every setting; the only validation the router does.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let listen = addr("listen", &self.listen)?;
        let grpc = self
            .grpc_listen
            .as_deref()
            .map(|g| addr("grpc_listen", g))
            .transpose()?;
        for (name, tok) in [
            ("admin_token", &self.admin_token),
            ("inspect_token", &self.inspect_token),
            ("agent_secret", &self.agent_secret),
        ] {
            if tok.as_deref().is_some_and(str::is_empty) {
                return Err(invalid(name, "must not be empty when set"));
            }
        }
        if !self.insecure {
            self.refuse_open_listeners(listen, grpc)?;
        }
        self.ingest.validate(self.grpc_listen.is_some())?;
        let (sv, h) = (&self.server, &self.health);
        let size = |n: Option<usize>| n.map(|n| n as u64);
        for (name, v) in [
            ("max_body_bytes", size(Some(self.max_body_bytes))),
            ("server.header_timeout_ms", Some(sv.header_timeout_ms)),
            ("server.send_timeout_ms", sv.send_timeout_ms),
            (
                "server.max_body_bytes_in_flight",
                size(sv.max_body_bytes_in_flight),
            ),
            ("server.max_connections", size(sv.max_connections)),
            ("health.eject_after", Some(u64::from(h.eject_after))),
            (
                "upstream.first_byte_timeout_ms",
                Some(self.upstream.first_byte_timeout_ms),
            ),
        ] {
            if v == Some(0) {
                return Err(invalid(name, "must be at least 1"));
            }
        }
        let keys = std::iter::once(("upstream.api_key".to_owned(), &self.upstream.api_key)).chain(
            self.pools.iter().enumerate().flat_map(|(p, pool)| {
                pool.backends
                    .iter()
                    .enumerate()
                    .map(move |(b, be)| (format!("pools[{p}].backends[{b}].api_key"), &be.api_key))
            }),
        );
        for (at, key) in keys {
            if key
                .as_ref()
                .is_some_and(|k| k.0.is_empty() || k.bearer().is_none())
            {
                // Never echo the key itself.
                return Err(invalid(at, "must be 1 or more visible ASCII characters"));
            }
        }
        if h.max_ejection_percent > 100 {
            return Err(invalid("health.max_ejection_percent", "must be 0 to 100"));
        }
        if h.probe_interval_ms < 50 {
            return Err(invalid("health.probe_interval_ms", "must be at least 50"));
        }
        if self.pools.is_empty() {
            return Err(invalid(
                "pools",
                "no pool configured; give --model and --backend, or pools: in --config",
            ));
        }
        let mut names = HashSet::new();
        for (i, p) in self.pools.iter().enumerate() {
            let at = |f: &str| format!("pools[{i}].{f}");
            if p.model.is_empty() {
                return Err(invalid(at("model"), "must not be empty"));
            }
            if !names.insert(p.model.as_str()) {
                return Err(invalid(at("model"), format!("{:?} appears twice", p.model)));
            }
            if !(1..=MAX_BLOCK_SIZE).contains(&p.block_size) {
                return Err(invalid(
                    at("block_size"),
                    format!("{} is outside 1..={MAX_BLOCK_SIZE}", p.block_size),
                ));
            }
            p.policy_config()
                .validate()
                .map_err(|e| invalid(at("policy"), e.to_string()))?;
            if p.effective_strategy() == Strategy::KvAware && p.tokenizer.is_none() {
                return Err(invalid(
                    at("tokenizer"),
                    "strategy kv_aware needs a tokenizer (--tokenizer PATH) to compute block hashes",
                ));
            }
            if p.max_prompt_tokens == Some(0) {
                return Err(invalid(at("max_prompt_tokens"), "must be at least 1"));
            }
            p.index.validate(&format!("pools[{i}]"))?;
            if p.backends.is_empty() && p.discovery.is_empty() {
                return Err(invalid(
                    at("backends"),
                    "at least one backend (or a discovery provider) is needed",
                ));
            }
            for (j, d) in p.discovery.iter().enumerate() {
                d.validate(&format!("pools[{i}].discovery[{j}]"))?;
            }
            let mut ids = HashSet::new();
            for (j, b) in p.backends.iter().enumerate() {
                let bat = |f: &str| format!("pools[{i}].backends[{j}].{f}");
                BackendUrl::parse(&b.url).map_err(|e| invalid(bat("url"), e.to_string()))?;
                if b.id().is_empty() {
                    return Err(invalid(bat("worker_id"), "must not be empty"));
                }
                if !ids.insert(b.id()) {
                    return Err(invalid(
                        bat("worker_id"),
                        format!("{:?} appears twice", b.id()),
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn base() -> RouterConfig {
        RouterConfig::from_yaml(
            "listen: 127.0.0.1:0\npools:\n  - model: m\n    backends: [{url: 'http://127.0.0.1:9'}]\n",
        )
        .unwrap()
    }

    fn err(c: &RouterConfig) -> String {
        c.validate().unwrap_err().to_string()
    }

    #[test]
    fn a_minimal_config_is_valid() {
        base().validate().unwrap();
    }

    #[test]
    fn each_bad_setting_is_refused_with_its_place() {
        let mut c = base();
        c.pools[0].strategy = Some(Strategy::KvAware);
        assert!(err(&c).contains("pools[0].tokenizer"));
        let mut c = base();
        c.pools[0].prefix_aware.concurrency_threshold = 0;
        assert!(err(&c).contains("concurrency_threshold"));
        let mut c = base();
        c.pools[0].block_size = 0;
        assert!(err(&c).contains("block_size"));
        let mut c = base();
        c.pools[0].backends[0].url = "https://x:1".into();
        assert!(err(&c).contains("backends[0].url"));
        let mut c = base();
        c.pools.push(c.pools[0].clone());
        assert!(err(&c).contains("appears twice"));
        let mut c = base();
        c.listen = "nowhere".into();
        assert!(err(&c).contains("listen"));
        let mut c = base();
        c.pools[0].backends.clear();
        assert!(err(&c).contains("at least one backend"));
        let mut c = base();
        c.pools[0].max_prompt_tokens = Some(0);
        assert!(err(&c).contains("pools[0].max_prompt_tokens"));
        assert!(err(&RouterConfig::default()).contains("no pool"));
        // A pool without `model` parses (every key has a default) and is refused here.
        let yaml = "pools:\n  - backends: [{url: 'http://127.0.0.1:9'}]\n";
        let c = RouterConfig::from_yaml(yaml).unwrap();
        assert!(err(&c).contains("pools[0].model"), "{}", err(&c));
        let mut c = base();
        c.health.probe_interval_ms = 10;
        assert!(err(&c).contains("health.probe_interval_ms"));
        let mut c = base();
        c.server.max_connections = Some(0);
        assert!(err(&c).contains("server.max_connections"));
        let mut c = base();
        c.server.header_timeout_ms = 0;
        assert!(err(&c).contains("server.header_timeout_ms"));
        let mut c = base();
        c.server.send_timeout_ms = Some(0);
        assert!(err(&c).contains("server.send_timeout_ms"));
        let mut c = base();
        c.server.max_body_bytes_in_flight = Some(0);
        assert!(err(&c).contains("server.max_body_bytes_in_flight"));
        let mut c = base();
        c.upstream.first_byte_timeout_ms = 0;
        assert!(err(&c).contains("upstream.first_byte_timeout_ms"));
    }

    #[test]
    fn the_probe_kind_is_health_or_completion() {
        let c = RouterConfig::from_yaml("health: {probe: completion}\n").unwrap();
        assert_eq!(c.health.probe, crate::config::ProbeKind::Completion);
        let e = RouterConfig::from_yaml("health: {probe: models}\n").unwrap_err();
        assert!(e.to_string().contains("health"), "{e}");
    }

    #[test]
    fn listeners_other_hosts_reach_need_tokens_unless_insecure() {
        let mut c = base();
        c.listen = "0.0.0.0:8080".into();
        let e = err(&c);
        assert!(
            e.contains("at admin_token") && e.contains("--insecure"),
            "{e}"
        );
        c.admin_token = Some("a".into());
        c.validate().unwrap();
        c.grpc_listen = Some("[::]:50051".into());
        let e = err(&c);
        assert!(
            e.contains("at agent_secret") && e.contains("--print-agent-token"),
            "{e}"
        );
        c.agent_secret = Some("s".into());
        c.validate().unwrap();
        let mut c = base();
        (c.listen, c.grpc_listen) = ("0.0.0.0:1".into(), Some("0.0.0.0:2".into()));
        c.insecure = true;
        c.validate().unwrap();
        // Loopback needs nothing.
        let mut c = base();
        (c.listen, c.grpc_listen) = ("127.0.0.1:1".into(), Some("[::1]:2".into()));
        c.validate().unwrap();
    }

    #[test]
    fn the_example_config_is_valid() {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/router.yaml");
        RouterConfig::from_file(&p).unwrap().validate().unwrap();
    }

    #[test]
    fn unknown_yaml_fields_are_refused() {
        let e = RouterConfig::from_yaml("pools: []\nlisen: x\n").unwrap_err();
        assert!(e.to_string().contains("lisen"), "{e}");
    }

    #[test]
    fn backend_urls_join_paths() {
        let u = BackendUrl::parse("http://127.0.0.1:8000/").unwrap();
        assert_eq!(
            u.join("/v1/models").unwrap().to_string(),
            "http://127.0.0.1:8000/v1/models"
        );
        let u = BackendUrl::parse("http://h:1/engine").unwrap();
        assert_eq!(
            u.join("/health").unwrap().to_string(),
            "http://h:1/engine/health"
        );
        let why = |raw| BackendUrl::parse(raw).unwrap_err().why;
        assert_eq!(
            why("127.0.0.1:8000"),
            "has no scheme; write http://host:port"
        );
        assert_eq!(why("http://h:1/?a=b"), "must not have a query string");
        assert!(why("https://h:1").starts_with("has scheme \"https\""));
        let w = why("http://");
        assert!(w.starts_with("is not a URL") || w == "has no host", "{w}");
        assert!(why("not a url").starts_with("is not a URL"));
        let e = BackendUrl::parse("https://h:1").unwrap_err().to_string();
        assert_eq!(
            e,
            "\"https://h:1\" has scheme \"https\", which is not supported; use http"
        );
    }
}

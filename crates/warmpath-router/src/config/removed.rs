//! Keys a config file may no longer set, each with what took its place, so an
//! old file fails with the replacement named, not a bare "unknown field".

use super::error::{invalid, ConfigError};
use yaml_serde::Value;

/// A removed key (dotted; `[]` after a list) and what replaced it.
#[rustfmt::skip]
pub(crate) const REMOVED: &[(&str, &str)] = &[
    ("pools[].load_factor", "no backend takes more than 1.25 times the mean load (+1) on the ring"),
    ("forward_cache_salt", "the tenant goes to the engine as cache_salt unless the pool sets tenants.isolation: route_only"),
    ("upstream.max_idle_per_backend", "256 idle connections are kept per backend"),
    ("work.queue_timeout_ms", "a big body waits at most 10 s for a free thread of the work pool"),
    ("pools[].vnodes", "the ring has 160 virtual nodes per backend"),
    ("pools[].index.capacity_slack", "a worker may hold 1.25 times its engine's reported capacity"),
    ("pools[].discovery[].kubernetes.watch_timeout_s", "each watch lasts 290 s, then resumes"),
    ("health.learn_adapters", "adapters and model cards are always learned from /v1/models"),
    ("health.eject_max_ms", "the longest back-off is 60 times health.probe_interval_ms"),
    ("upstream.connect_timeout_ms", "a connect waits at most 2 s, then the next backend is tried"),
    ("pools[].discovery[].dns.srv", "SRV records are asked when dns.port is left out"),
    ("pools[].discovery[].dns.timeout_ms", "one answer waits at most the resolve interval, and at most 2 s"),
    ("server.body_timeout_ms", "a request body must arrive within 3 times server.header_timeout_ms"),
    ("server.keepalive_idle_ms", "an idle keep-alive connection is closed after 6 times server.header_timeout_ms"),
    ("server.shutdown_timeout_ms", "in-flight requests get 6 times server.drain_grace_ms (at least 1 s) after the drain grace"),
    ("upstream.stream_idle_timeout_ms", "an answer's body may be silent for upstream.first_byte_timeout_ms, at most 120 s"),
    ("work.offload_bytes", "bodies of 256 KiB and up are routed on the work pool"),
    ("work.threads", "the work pool has one thread per CPU"),
    ("health.eject_base_ms", "a first ejection lasts 2.5 times health.probe_interval_ms"),
    ("agent_token", "agents present per-worker credentials derived from agent_secret (warmpath-router --print-agent-token WORKER)"),
    ("pools[].discovery[].dns.interval_ms", "a dns provider resolves every 2.5 times health.probe_interval_ms"),
    ("pools[].discovery[].kubernetes.api_url", "the API server comes from KUBECONFIG, ~/.kube/config or the in-cluster service account"),
    ("pools[].discovery[].kubernetes.token_file", "credentials come from KUBECONFIG's kubeconfig (a user's tokenFile) or the in-cluster service account"),
    ("pools[].discovery[].kubernetes.kubeconfig", "the kubeconfig is the process's: KUBECONFIG, ~/.kube/config, else the in-cluster service account"),
    ("pools[].discovery[].kubernetes.timeout_ms", "a connect and the first list wait at most 5 s"),
    ("pools[].discovery[].kubernetes.settle_ms", "slice changes within 200 ms are applied together"),
    ("pools[].discovery[].kubernetes.backoff_ms", "a failed watch re-connects after 800 ms, doubling up to 30 s"),
    ("pools[].discovery[].kubernetes.resync_ms", "the last set is applied again every 5 times health.probe_interval_ms"),
    ("server.access_log", "access lines are written when RUST_LOG names their target: RUST_LOG=info,warmpath_router::access=info"),
    ("pools[].backends[].adapters", "each backend's LoRA adapters are learned from its /v1/models"),
    ("pools[].index.max_worker_blocks", "a worker's cap before its capacity is known, and its ceiling, is a quarter of index.max_entries"),
    ("pools[].response_ids", "a pool remembers the backends of 65536 stored /v1/responses ids"),
    ("pools[].prefix_aware.prefix_length", "the prefix key hashes the first 4096 characters (or tokens)"),
    ("pools[].index.compact_interval_ms", "the index is compacted every 30 s, and at once when cleared entries outnumber the live"),
    ("ingest.drop_after_ms", "a silent agent's entries are cleared after 12 times ingest.stale_after_ms"),
    ("pools[].discovery[].kubernetes.worker_id", "a discovered endpoint's worker id is its URL, http://IP:PORT: give its agent --worker-id-from-env POD_IP --worker-id-template http://{}:PORT"),
    ("health.probe_timeout_ms", "a probe waits at most health.probe_interval_ms, and at most 1 s"),
];

/// Fails on the first removed key `doc` sets, naming its replacement.
pub(crate) fn check(doc: &Value) -> Result<(), ConfigError> {
    for (path, instead) in REMOVED {
        let parts: Vec<&str> = path.split('.').collect();
        if let Some(at) = find(doc, &parts, String::new()) {
            return Err(invalid(
                at,
                format!("this key was removed: {instead}; delete it from the file"),
            ));
        }
    }
    Ok(())
}

/// Where `parts` is set under `v` (`pools[2].vnodes`), if anywhere.
fn find(v: &Value, parts: &[&str], at: String) -> Option<String> {
    let (first, rest) = parts.split_first()?;
    let (key, list) = match first.strip_suffix("[]") {
        Some(k) => (k, true),
        None => (*first, false),
    };
    let child = v.as_mapping()?.get(key)?;
    let here = if at.is_empty() {
        key.to_owned()
    } else {
        format!("{at}.{key}")
    };
    if !list {
        return if rest.is_empty() {
            Some(here)
        } else {
            find(child, rest, here)
        };
    }
    child
        .as_sequence()?
        .iter()
        .enumerate()
        .find_map(|(i, item)| find(item, rest, format!("{here}[{i}]")))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn err(yaml: &str) -> Option<String> {
        let v: Value = yaml_serde::from_str(yaml).unwrap();
        check(&v).err().map(|e| e.to_string())
    }

    #[test]
    fn a_removed_key_names_where_it_is_and_what_replaced_it() {
        let e = err("forward_cache_salt: false\n").unwrap();
        assert!(
            e.contains("at forward_cache_salt") && e.contains("route_only"),
            "{e}"
        );
        let e = err("pools:\n  - model: a\n  - model: b\n    vnodes: 40\n").unwrap();
        assert!(e.contains("at pools[1].vnodes") && e.contains("160"), "{e}");
        let e = err("pools:\n  - model: a\n    discovery:\n      - dns: {name: x}\n      - kubernetes: {service: s, watch_timeout_s: 5}\n").unwrap();
        assert!(
            e.contains("pools[0].discovery[1].kubernetes.watch_timeout_s"),
            "{e}"
        );
        assert_eq!(
            err("pools:\n  - model: a\n    index: {max_entries: 10}\n"),
            None
        );
        assert_eq!(err("[]"), None);
    }

    #[test]
    fn a_config_file_with_a_removed_key_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("router.yaml");
        std::fs::write(
            &path,
            "pools:\n  - model: m\n    vnodes: 3\n    backends: [{url: 'http://127.0.0.1:9'}]\n",
        )
        .unwrap();
        let e = super::super::RouterConfig::from_file(&path)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("pools[0].vnodes") && e.contains("160 virtual nodes"),
            "{e}"
        );
    }

    /// A document that sets exactly `path`.
    fn setting(path: &str) -> Value {
        path.rsplit('.').fold(Value::from(1), |inner, part| {
            let (key, list) = match part.strip_suffix("[]") {
                Some(k) => (k, true),
                None => (part, false),
            };
            let inner = if list {
                Value::Sequence(vec![inner])
            } else {
                inner
            };
            let mut m = yaml_serde::Mapping::new();
            m.insert(Value::from(key), inner);
            Value::Mapping(m)
        })
    }

    #[test]
    fn every_removed_key_is_found_and_not_a_field_any_more() {
        for (path, _) in REMOVED {
            let doc = setting(path);
            assert!(check(&doc).is_err(), "{path}: {doc:?}");
            let yaml = yaml_serde::to_string(&doc).unwrap();
            let e = super::super::RouterConfig::from_yaml(&yaml).unwrap_err();
            assert!(
                e.to_string().contains("unknown field"),
                "{path} is still a field: {e}"
            );
        }
    }
}

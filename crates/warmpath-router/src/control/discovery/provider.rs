//! One discovery provider of one pool and its status (what `/cache-index`
//! shows); the pool holds these, `discovery` runs them.

use super::answer::DiscoveryError;
use super::vanished::{Vanished, GRACE_ROUNDS};
use crate::config::DiscoveryConfig;
use parking_lot::Mutex;
use serde::Serialize;
use std::time::Duration;

/// What `/cache-index` shows of one provider.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct ProviderStatus {
    /// `dns:NAME` or `kubernetes:NAMESPACE/SERVICE`.
    pub provider: String,
    /// The backends of the last answer that was applied.
    pub last_result: Vec<String>,
    /// The last error, until an answer is applied again.
    pub last_error: Option<String>,
    pub resolutions: u64,
    pub errors: u64,
    /// Rounds whose answer changed the members.
    pub changes: u64,
}

/// One provider of one pool.
#[derive(Debug)]
pub(crate) struct Provider {
    pub config: DiscoveryConfig,
    pub(super) name: String,
    pub(super) status: Mutex<ProviderStatus>,
    /// Its members gone from its answers, waiting out their grace.
    pub(crate) vanished: Vanished,
}

/// Longest wait for one DNS answer: the interval, at most 2 s.
pub(super) fn dns_timeout(interval: Duration) -> Duration {
    interval.min(Duration::from_secs(2))
}

impl Provider {
    /// A provider that has not resolved yet.
    pub(crate) fn new(config: DiscoveryConfig) -> Self {
        let name = config.name();
        Provider {
            status: Mutex::new(ProviderStatus {
                provider: name.clone(),
                ..Default::default()
            }),
            name,
            config,
            vanished: Vanished::default(),
        }
    }

    pub(crate) fn status(&self) -> ProviderStatus {
        self.status.lock().clone()
    }

    /// How long a member gone from the answers stays, out of rotation.
    pub(crate) fn grace(&self, probe_ms: u64) -> Duration {
        self.config.interval(probe_ms).saturating_mul(GRACE_ROUNDS)
    }

    pub(super) fn failed(&self, pool: &str, e: &DiscoveryError) {
        let msg = e.to_string();
        let mut st = self.status.lock();
        st.errors += 1;
        let repeated = st.last_error.as_deref() == Some(msg.as_str());
        st.last_error = Some(msg);
        drop(st);
        metrics::counter!("warmpath_discovery_rounds_total", "pool" => pool.to_owned(),
            "provider" => self.name.clone(), "result" => "error")
        .increment(1);
        if repeated {
            tracing::debug!(pool, provider = %self.name, error = %e, "discovery failed again; keeping the last known backends");
        } else {
            tracing::warn!(pool, provider = %self.name, error = %e, "discovery failed; keeping the last known backends");
        }
    }
}

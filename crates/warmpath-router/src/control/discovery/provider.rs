//! One discovery provider of one pool and its status (what `/cache-index`
//! shows); the pool holds these, `discovery` runs them.

use super::vanished::{Vanished, GRACE_ROUNDS};
use super::DiscoveryError;
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
    /// Rounds that produced an answer.
    pub resolutions: u64,
    /// Rounds that failed.
    pub errors: u64,
    /// Rounds whose answer changed the members.
    pub changes: u64,
}

/// One provider of one pool.
#[derive(Debug)]
pub(crate) struct Provider {
    /// Its settings.
    pub config: DiscoveryConfig,
    pub(super) name: String,
    pub(super) status: Mutex<ProviderStatus>,
    /// Its members gone from its answers, waiting out their grace.
    pub(crate) vanished: Vanished,
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

    /// Its status now.
    pub(crate) fn status(&self) -> ProviderStatus {
        self.status.lock().clone()
    }

    pub(super) fn interval(&self) -> Duration {
        Duration::from_millis(self.config.dns.as_ref().map_or(5_000, |d| d.interval_ms))
    }

    /// How long a member gone from the answers stays a member, out of
    /// rotation, before its drain: [`GRACE_ROUNDS`] of the provider's
    /// intervals (`interval_ms`; `resync_ms`, when a Kubernetes watch
    /// re-applies its last set, for `kubernetes`).
    pub(crate) fn grace(&self) -> Duration {
        let every = match (&self.config.dns, &self.config.kubernetes) {
            (Some(d), _) => d.interval_ms,
            (None, Some(k)) => k.resync_ms,
            (None, None) => 5_000,
        };
        Duration::from_millis(every.saturating_mul(u64::from(GRACE_ROUNDS)))
    }

    /// Longest a whole round may take (an SRV answer's targets are looked
    /// up one by one, each within the resolver's own timeout).
    pub(super) fn round_limit(&self) -> Duration {
        let timeout = self
            .config
            .dns
            .as_ref()
            .map_or(Duration::from_secs(2), |d| d.timeout());
        timeout.saturating_mul(4)
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

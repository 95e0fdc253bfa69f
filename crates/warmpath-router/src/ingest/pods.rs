//! Pod identity for agents in Kubernetes: a TokenReview of the pod's token
//! says which pod it is, and the stream may publish only for it (docs/trust.md).

use super::guard::shown;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// How long an answer of the API server is kept, per token.
const KEEP: Duration = Duration::from_secs(60);

/// Tokens whose answers are kept; past this, expired ones go, then all.
const KEPT: usize = 4096;

/// Reviews in flight at once: a flood of made-up tokens queues here.
const IN_FLIGHT: usize = 4;

/// Longest wait for one review, queueing included.
pub(crate) const REVIEW_WITHIN: Duration = Duration::from_secs(5);

/// The longest token looked at (projected tokens are about 1 KiB).
const MAX_TOKEN: usize = 8192;

/// The TokenReview extra that names the pod a bound token belongs to.
const POD_NAME: &str = "authentication.kubernetes.io/pod-name";
/// ... and its uid, so a later pod of the same name is not taken for it.
const POD_UID: &str = "authentication.kubernetes.io/pod-uid";

/// Whether `t` has a JWT's shape (three base64url parts).
pub(crate) fn is_pod_token(t: &str) -> bool {
    t.len() <= MAX_TOKEN
        && t.split('.').count() == 3
        && t.split('.').all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

/// The pod a token names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PodId {
    pub(crate) name: String,
    pub(crate) ips: Vec<IpAddr>,
}

impl PodId {
    /// Whether `worker` is this pod: its name, or a URL on one of its IPs.
    pub(crate) fn names(&self, worker: &str) -> bool {
        if worker == self.name {
            return true;
        }
        let Ok(uri) = worker.parse::<http::Uri>() else {
            return false;
        };
        let host = uri.host().unwrap_or("");
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        host.parse::<IpAddr>()
            .is_ok_and(|ip| self.ips.contains(&ip))
    }
}

/// Why a token was not taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReviewError {
    /// The API server said no, or the pod is not one of ours.
    #[error("{0}")]
    Refused(String),
    /// The API server could not be asked in time; retrying may work.
    #[error("the pod token could not be reviewed: {0}")]
    Unavailable(String),
}

/// A client for the API server, inferred as kubectl does.
pub(crate) async fn kube_client(io: Duration, read: Duration) -> Result<kube::Client, String> {
    let mut config = kube::Config::infer().await.map_err(|e| e.to_string())?;
    (config.connect_timeout, config.write_timeout) = (Some(io), Some(io));
    config.read_timeout = Some(read);
    kube::Client::try_from(config).map_err(|e| e.to_string())
}

/// Reviews pod tokens against the API server.
pub struct PodTokens {
    client: kube::Client,
    audience: String,
    namespace: String,
    kept: Mutex<HashMap<[u8; 32], (PodId, Instant)>>,
    in_flight: Semaphore,
}

impl std::fmt::Debug for PodTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodTokens")
            .field("audience", &self.audience)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl PodTokens {
    /// A reviewer for tokens of `audience`.
    pub async fn connect(audience: &str) -> Result<Arc<Self>, super::error::IngestError> {
        let client = kube_client(REVIEW_WITHIN, REVIEW_WITHIN).await;
        let client = client.map_err(super::error::IngestError::PodTokens)?;
        Ok(Arc::new(PodTokens {
            namespace: client.default_namespace().to_owned(),
            client,
            audience: audience.to_owned(),
            kept: Mutex::default(),
            in_flight: Semaphore::new(IN_FLIGHT),
        }))
    }

    /// The pod `token` names, asked of the API server unless recently kept.
    pub(crate) async fn review(&self, token: &str) -> Result<PodId, ReviewError> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Some((pod, at)) = self.kept.lock().get(&key) {
            if at.elapsed() < KEEP {
                return Ok(pod.clone());
            }
        }
        let _permit = self
            .in_flight
            .acquire()
            .await
            .map_err(|e| ReviewError::Unavailable(e.to_string()))?;
        let pod = self.ask(token).await;
        metrics::counter!("warmpath_ingest_pod_token_reviews_total", "outcome" => match &pod {
            Ok(_) => "accepted",
            Err(ReviewError::Refused(_)) => "refused",
            Err(ReviewError::Unavailable(_)) => "unavailable",
        })
        .increment(1);
        let pod = pod?;
        let mut kept = self.kept.lock();
        if kept.len() >= KEPT {
            kept.retain(|_, (_, at)| at.elapsed() < KEEP);
            if kept.len() >= KEPT {
                kept.clear();
            }
        }
        kept.insert(key, (pod.clone(), Instant::now()));
        Ok(pod)
    }

    async fn ask(&self, token: &str) -> Result<PodId, ReviewError> {
        let unavailable = |e: kube::Error| ReviewError::Unavailable(e.to_string());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..Default::default()
        };
        let answer = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(unavailable)?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Err(ReviewError::Refused(format!(
                "the API server did not authenticate the pod token: {}",
                shown(status.error.as_deref().unwrap_or("no reason given"))
            )));
        }
        if !status
            .audiences
            .as_ref()
            .is_some_and(|a| a.contains(&self.audience))
        {
            return Err(ReviewError::Refused(format!(
                "the pod token is not for audience {:?}",
                self.audience
            )));
        }
        let user = status.user.unwrap_or_default();
        let namespace = user
            .username
            .as_deref()
            .and_then(|u| u.strip_prefix("system:serviceaccount:"))
            .and_then(|u| u.split(':').next())
            .unwrap_or("");
        let extra = user.extra.unwrap_or_default();
        let one = |k: &str| extra.get(k).and_then(|v| v.first()).cloned();
        let (Some(name), uid) = (one(POD_NAME), one(POD_UID)) else {
            return Err(ReviewError::Refused(
                "the token is not bound to a pod (mount a projected serviceAccountToken)".into(),
            ));
        };
        if namespace != self.namespace {
            return Err(ReviewError::Refused(format!(
                "pod {} is in namespace {}, not the routers' ({})",
                shown(&name),
                shown(namespace),
                self.namespace
            )));
        }
        let pod = Api::<Pod>::namespaced(self.client.clone(), &self.namespace)
            .get(&name)
            .await
            .map_err(|e| match e {
                kube::Error::Api(s) if s.code == 404 => {
                    ReviewError::Refused(format!("pod {} is gone", shown(&name)))
                }
                e => unavailable(e),
            })?;
        if uid.is_some() && pod.metadata.uid != uid {
            return Err(ReviewError::Refused(format!(
                "pod {} was replaced by another of the same name",
                shown(&name)
            )));
        }
        let status = pod.status.unwrap_or_default();
        let mut ips: Vec<IpAddr> = status
            .pod_ips
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p.ip.parse().ok())
            .collect();
        if let Some(ip) = status.pod_ip.and_then(|ip| ip.parse().ok()) {
            if !ips.contains(&ip) {
                ips.push(ip);
            }
        }
        Ok(PodId { name, ips })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn only_jwt_shaped_tokens_are_reviewed() {
        assert!(is_pod_token("eyJhbGciOi.eyJhdWQiOlsi.c2lnbmF0dXJl_-"));
        for t in [
            "",
            "a.b",
            "a.b.c.d",
            "a..c",
            "a.b.c\n",
            "wp1-00",
            "a b.c.d",
            &"a.b.".repeat(3000),
        ] {
            assert!(!is_pod_token(t), "{t:?}");
        }
        let long = format!("a.b.{}", "c".repeat(MAX_TOKEN));
        assert!(!is_pod_token(&long));
    }

    #[test]
    fn a_pod_names_itself_by_name_or_by_ip_and_nothing_else() {
        let pod = PodId {
            name: "vllm-a".into(),
            ips: vec!["10.1.0.5".parse().unwrap(), "fd00::5".parse().unwrap()],
        };
        for w in [
            "vllm-a",
            "http://10.1.0.5:8000",
            "http://[fd00::5]:8000",
            "https://10.1.0.5",
        ] {
            assert!(pod.names(w), "{w}");
        }
        for w in [
            "vllm-b",
            "vllm-a ",
            "http://10.1.0.6:8000",
            "http://10.1.0.50:8000",
            "http://vllm-a:8000",
            "http://user@10.1.0.6:8000/10.1.0.5",
            "",
        ] {
            assert!(!pod.names(w), "{w}");
        }
    }
}

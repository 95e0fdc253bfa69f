//! Who may publish for which worker: what a stream presented before its
//! Hello (nothing, a per-worker credential or a pod token), and the check of that against the Hello's worker id.

use super::auth::AgentAuth;
use super::guard::{self, shown};
use super::stream::Refusal;
use std::sync::Arc;
use tonic::metadata::MetadataMap;

/// Pod tokens are reviewed when `ingest.pod_token_audience` is set.
#[cfg(feature = "kubernetes")]
pub(crate) type Pods = Option<Arc<super::pods::PodTokens>>;
/// Without the `kubernetes` feature there are none (config refuses the key).
#[cfg(not(feature = "kubernetes"))]
pub(crate) type Pods = Option<Arc<std::convert::Infallible>>;

/// What a stream presented, to check against its Hello.
pub(crate) enum Presented {
    /// Nothing to check: an open ingest.
    Anyone,
    /// A per-worker credential: the HMAC of the routers' secret and the id.
    Credential { secret: String, token: String },
    /// A pod's projected ServiceAccount token.
    #[cfg(feature = "kubernetes")]
    Pod {
        tokens: Arc<super::pods::PodTokens>,
        token: String,
    },
}

/// The stream's credential, from its `authorization` header.
pub(crate) fn presented(
    auth: &AgentAuth,
    pods: &Pods,
    metadata: &MetadataMap,
) -> Result<Presented, &'static str> {
    let bearer = warmpath_proto::bearer_token(metadata);
    #[cfg(feature = "kubernetes")]
    if let (Some(tokens), Some(t)) = (pods, bearer) {
        if super::pods::is_pod_token(t) {
            return Ok(Presented::Pod {
                tokens: Arc::clone(tokens),
                token: t.to_owned(),
            });
        }
    }
    match auth {
        AgentAuth::Open if pods.is_none() => Ok(Presented::Anyone),
        AgentAuth::Open => Err("missing or malformed pod token (mount a projected serviceAccountToken and pass --agent-token-file)"),
        AgentAuth::PerWorker(secret) => match bearer {
            Some(t) if guard::is_worker_token(t) => Ok(Presented::Credential {
                secret: secret.clone(),
                token: t.to_owned(),
            }),
            _ => Err("missing or malformed agent credential (warmpath-router --print-agent-token WORKER)"),
        },
    }
}

impl Presented {
    /// Whether this credential speaks for `worker`; the refusal says why not.
    pub(crate) async fn check(&self, worker: &str) -> Result<(), Refusal> {
        match self {
            Presented::Anyone => Ok(()),
            Presented::Credential { secret, token } => {
                let expected = warmpath_proto::worker_token(secret, worker);
                if warmpath_proto::same_token(token, &expected) {
                    Ok(())
                } else {
                    Err(Refusal::fatal(format!(
                        "the agent credential does not name worker {}",
                        shown(worker)
                    )))
                }
            }
            #[cfg(feature = "kubernetes")]
            Presented::Pod { tokens, token } => {
                use super::pods::REVIEW_WITHIN;
                let pod = match tokio::time::timeout(REVIEW_WITHIN, tokens.review(token)).await {
                    Ok(Ok(pod)) => pod,
                    // A refused token may be a rotated one: retryable.
                    Ok(Err(e)) => return Err(Refusal::retry(e.to_string())),
                    Err(_) => {
                        return Err(Refusal::retry(format!(
                            "the pod token could not be reviewed within {} ms",
                            REVIEW_WITHIN.as_millis()
                        )))
                    }
                };
                if pod.names(worker) {
                    Ok(())
                } else {
                    Err(Refusal::fatal(format!(
                        "the pod token names pod {}, not worker {}",
                        shown(&pod.name),
                        shown(worker)
                    )))
                }
            }
        }
    }
}

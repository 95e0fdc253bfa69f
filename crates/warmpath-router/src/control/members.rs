//! Live pool membership: the admin API (docs/discovery.md) and the one place
//! a change is applied (the API, a reload and discovery all come here).

use crate::config::BackendConfig;
use crate::control::state::Shared;
use crate::http::clock::monotonic_ms;
use crate::http::error::ApiError;
use crate::routing::backend::{Backend, Origin};
use crate::routing::pool::{MemberError, Pool};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// How long a drain (by the API when not told, or by a reload) waits for requests in flight.
pub(crate) const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(600);

/// Body of `POST /admin/pools/{model}/backends`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AddBody {
    url: String,
    worker_id: Option<String>,
}

/// Body of `POST …/drain` (optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DrainBody {
    timeout_ms: Option<u64>,
}

/// What an admin path under `/admin/pools/` names.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Resource<'a> {
    /// `{model}/strategy`.
    Strategy(&'a str),
    /// `{model}/backends`.
    Backends(&'a str),
    /// `{model}/backends/{worker_id}`.
    Backend(&'a str, &'a str),
    /// `{model}/backends/{worker_id}/drain`.
    Drain(&'a str, &'a str),
}

/// Parses the path after `/admin/pools/`, given the pools' model names.
pub(crate) fn resource<'a>(rest: &'a str, models: &[&str]) -> Option<Resource<'a>> {
    let mut models: Vec<&str> = models.to_vec();
    models.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in models {
        let Some(tail) = rest.strip_prefix(m).and_then(|t| t.strip_prefix('/')) else {
            continue;
        };
        let model = &rest[..m.len()];
        return match tail {
            "strategy" => Some(Resource::Strategy(model)),
            "backends" => Some(Resource::Backends(model)),
            _ => {
                let id = tail.strip_prefix("backends/").filter(|id| !id.is_empty())?;
                Some(match id.strip_suffix("/drain") {
                    Some(w) if !w.is_empty() => Resource::Drain(model, w),
                    _ => Resource::Backend(model, id),
                })
            }
        };
    }
    None
}

/// An admin body of the given `shape`, or the 400 naming it.
pub(crate) fn json_body<T: serde::de::DeserializeOwned>(
    body: &[u8],
    shape: &str,
) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request("invalid_json", format!("body must be {shape}: {e}")))
}

impl MemberError {
    pub(crate) fn response(&self) -> Response {
        let (status, code) = match self {
            MemberError::Duplicate { .. } => (StatusCode::CONFLICT, "duplicate_worker_id"),
            MemberError::Unknown { .. } => (StatusCode::NOT_FOUND, "unknown_worker_id"),
            MemberError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_backend"),
            MemberError::LastBackend(_) => (StatusCode::CONFLICT, "last_backend"),
            MemberError::Index(_) | MemberError::Policy(_) => {
                (StatusCode::INTERNAL_SERVER_ERROR, "membership_failed")
            }
        };
        let mut e = ApiError::new(status, code, self.to_string());
        e.kind = "invalid_request_error"; // a failed membership change too
        e.into_response()
    }
}

/// One member as the listing shows it.
fn member_view(s: &Shared, p: &Pool, b: &Backend, now_ms: u64) -> Value {
    let agent = s
        .agents
        .as_ref()
        .and_then(|a| a.status_of(&p.model, b.endpoint.id(), now_ms));
    json!({
        "worker_id": b.endpoint.id(),
        "url": b.endpoint.url.to_string(),
        "origin": b.endpoint.origin.to_string(),
        "healthy": b.health.is_healthy(),
        "verified": b.health.is_verified(),
        "draining": b.load.is_draining(),
        "in_flight": b.load.in_flight(),
        "adapters": b.endpoint.adapters(),
        "index_blocks": p.index.block_count(b.endpoint.slot),
        // How long a discovered member has been gone from its provider's answers.
        "missing_for_ms": p.discovery.iter().find_map(|d| d.vanished.since(b.endpoint.id()))
            .map(|t| t.elapsed().as_millis() as u64),
        "agent": agent,
    })
}

/// `id` is no longer a discovery provider's to bring back.
fn unmark(p: &Pool, id: &str) {
    for d in &p.discovery {
        d.vanished.forget(id);
    }
}

pub(crate) fn list(s: &Shared, p: &Pool) -> Value {
    let now = monotonic_ms();
    let members: Vec<Value> = p
        .backends()
        .iter()
        .map(|b| member_view(s, p, b, now))
        .collect();
    json!({"model": p.model, "backends": members})
}

pub(crate) async fn add(s: &Arc<Shared>, p: &Arc<Pool>, body: &[u8]) -> Response {
    let shape = r#"{"url": "http://HOST:PORT", "worker_id": "..."}"#;
    let req: AddBody = match json_body(body, shape) {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let cfg = BackendConfig {
        url: req.url,
        worker_id: req.worker_id,
        api_key: None,
    };
    match add_member(s, p, &cfg, Origin::Admin).await {
        Ok(b) => (
            StatusCode::CREATED,
            Json(member_view(s, p, &b, monotonic_ms())),
        )
            .into_response(),
        Err(e) => e.response(),
    }
}

/// Adds a member and probes it once, so readiness is current on return.
pub(crate) async fn add_member(
    s: &Shared,
    p: &Pool,
    cfg: &BackendConfig,
    origin: Origin,
) -> Result<Arc<Backend>, MemberError> {
    Ok(joined(s, p, p.add_backend(cfg, origin)?).await)
}

/// Counts a member that joined the rotation and probes it once.
async fn joined(s: &Shared, p: &Pool, b: Arc<Backend>) -> Arc<Backend> {
    crate::control::metrics::membership_change(&p.model, "add");
    crate::control::health::probe(s, p, &b).await;
    crate::control::readiness::update_gauge(s);
    b
}

/// Removes a member now (see the module docs) and refuses its agent.
pub(crate) fn remove(
    s: &Shared,
    p: &Arc<Pool>,
    worker_id: &str,
) -> Result<Arc<Backend>, MemberError> {
    let b = p.remove_backend(worker_id, true)?;
    unmark(p, worker_id);
    forget(s, p, &b);
    Ok(b)
}

/// After a removal: refuses its agent, counts it, and purges its index holders.
pub(crate) fn forget(s: &Shared, p: &Arc<Pool>, b: &Backend) {
    if let Some(a) = &s.agents {
        a.remove_worker(&p.model, b.endpoint.id());
    }
    crate::control::metrics::membership_change(&p.model, "remove");
    crate::control::readiness::update_gauge(s);
    p.compact_removed();
}

/// Takes a member out of rotation, its index kept; refuses the last one.
pub(crate) fn set_aside(
    s: &Shared,
    p: &Pool,
    worker_id: &str,
) -> Result<Arc<Backend>, MemberError> {
    let b = p.drain_backend(worker_id)?;
    crate::control::metrics::membership_change(&p.model, "drain");
    crate::control::readiness::update_gauge(s);
    Ok(b)
}

/// Puts a member that was set aside back in rotation and probes it once.
pub(crate) async fn restore(
    s: &Shared,
    p: &Pool,
    old: &Arc<Backend>,
) -> Result<Arc<Backend>, MemberError> {
    Ok(joined(s, p, p.restore_backend(old)?).await)
}

pub(crate) fn drain_request(
    s: &Arc<Shared>,
    p: &Arc<Pool>,
    worker_id: &str,
    body: &[u8],
) -> Response {
    let req: DrainBody = if body.iter().all(u8::is_ascii_whitespace) {
        DrainBody::default()
    } else {
        match json_body(body, r#"empty or {"timeout_ms": N}"#) {
            Ok(b) => b,
            Err(e) => return e.into_response(),
        }
    };
    let timeout = req
        .timeout_ms
        .map_or(DEFAULT_DRAIN_TIMEOUT, Duration::from_millis);
    match drain(s, p, worker_id, timeout) {
        Ok(b) => (
            StatusCode::ACCEPTED,
            Json(
                json!({"model": p.model, "worker_id": b.endpoint.id(), "draining": true,
                        "in_flight": b.load.in_flight(), "timeout_ms": timeout.as_millis() as u64}),
            ),
        )
            .into_response(),
        Err(e) => e.response(),
    }
}

/// Starts draining a member; a task removes it once idle (or after `timeout`).
pub(crate) fn drain(
    s: &Arc<Shared>,
    p: &Arc<Pool>,
    worker_id: &str,
    timeout: Duration,
) -> Result<Arc<Backend>, MemberError> {
    let b = set_aside(s, p, worker_id)?;
    // Drained on purpose: no provider brings it back within a grace.
    unmark(p, worker_id);
    let (s, p, task_b) = (Arc::clone(s), Arc::clone(p), Arc::clone(&b));
    tokio::spawn(async move {
        let idle = tokio::select! {
            () = s.halt.cancelled() => return,
            r = tokio::time::timeout(timeout, task_b.load.wait_idle()) => r.is_ok(),
        };
        if !idle {
            tracing::warn!(pool = %p.model, backend = %task_b.endpoint.id(), in_flight = task_b.load.in_flight(),
                ?timeout, "drain timed out; removing the backend with requests still in flight");
        }
        // Still the same member (not removed and re-added meanwhile)?
        if p.backend(task_b.endpoint.id())
            .is_some_and(|cur| Arc::ptr_eq(&cur, &task_b))
        {
            match p.remove_backend(task_b.endpoint.id(), false) {
                Ok(gone) => forget(&s, &p, &gone),
                Err(e) => {
                    tracing::warn!(pool = %p.model, backend = %task_b.endpoint.id(), error = %e,
                    "drained backend not removed")
                }
            }
        }
    });
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_paths_split_at_a_known_model() {
        let models = ["m", "org/m", "org/m/x"];
        assert_eq!(
            resource("org/m/backends", &models),
            Some(Resource::Backends("org/m"))
        );
        assert_eq!(
            resource("org/m/x/strategy", &models),
            Some(Resource::Strategy("org/m/x"))
        );
        assert_eq!(
            resource("m/backends/http://127.0.0.1:1", &models),
            Some(Resource::Backend("m", "http://127.0.0.1:1"))
        );
        assert_eq!(
            resource("m/backends/http://h:1/drain", &models),
            Some(Resource::Drain("m", "http://h:1"))
        );
        assert_eq!(resource("m/backends/", &models), None);
        assert_eq!(resource("other/backends", &models), None);
        assert_eq!(resource("m/other", &models), None);
    }
}

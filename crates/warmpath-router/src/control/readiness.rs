//! `GET /livez`, `GET /readyz` (and `/health`, its alias) and the
//! `warmpath_ready` gauge (docs/operations.md).

use crate::control::state::Shared;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

/// Whether the router is ready (also set as `warmpath_ready`), and each pool's view.
fn readiness(s: &Shared) -> (bool, Vec<Value>) {
    let mut ready = !s.draining();
    let pools = s
        .pools
        .all
        .iter()
        .map(|p| {
            let members = p.backends();
            let serving = || members.iter().filter(|b| !b.load.is_draining());
            let verified = serving().filter(|b| b.health.is_verified()).count();
            let in_rotation = serving().filter(|b| b.health.is_healthy()).count();
            ready &= verified > 0;
            json!({"model": p.model, "healthy_backends": verified,
                   "in_rotation": in_rotation, "backends": members.len()})
        })
        .collect();
    metrics::gauge!("warmpath_ready").set(f64::from(u8::from(ready)));
    (ready, pools)
}

/// Sets `warmpath_ready`.
pub(crate) fn update_gauge(s: &Shared) {
    readiness(s);
}

/// `GET /livez`: 200 while the process serves.
pub(crate) async fn livez() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// `GET /readyz` (and `GET /health`): 200 when ready, else 503 saying why.
pub(crate) async fn readyz(State(s): State<Arc<Shared>>) -> Response {
    let (ready, pools) = readiness(&s);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "status": if ready { "ok" } else { "unavailable" },
        "draining": s.draining(),
        "pools": pools,
    });
    (status, Json(body)).into_response()
}

//! Stored `/v1/responses` responses through the real `warmpath-router`
//! binary: follow-ups (`previous_response_id`), `GET /v1/responses/{id}` and
//! `POST /v1/responses/{id}/cancel` reach the engine that stored the
//! response, which here, as in vLLM, is the only one that holds it; a second
//! router replica that never saw the response finds it by asking the
//! engines.

use crate::support;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post as route_post};
use axum::{Json, Router};
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use support::*;
use tokio::net::TcpListener;

/// An engine with vLLM's in-memory response store (`store: true`): ids it
/// did not make are a 404, as in vLLM.
struct Store {
    name: String,
    next: AtomicU32,
    held: Mutex<HashSet<String>>,
    /// `GET /v1/responses/{id}` asked, in all and at most at once.
    lookups: AtomicU32,
    looking: AtomicU32,
    most_looking: AtomicU32,
    /// How long a look-up takes.
    lookup_ms: AtomicU32,
}

fn not_found(id: &str) -> Response {
    let e = json!({"error": {"message": format!("Response with id '{id}' not found."),
        "type": "NotFoundError", "param": null, "code": 404}});
    (StatusCode::NOT_FOUND, Json(e)).into_response()
}

async fn create(State(st): State<Arc<Store>>, Json(v): Json<Value>) -> Response {
    if let Some(prev) = v["previous_response_id"].as_str() {
        if !st.held.lock().contains(prev) {
            return not_found(prev);
        }
    }
    let id = format!(
        "resp_{}x{}",
        st.name,
        st.next.fetch_add(1, Ordering::SeqCst)
    );
    st.held.lock().insert(id.clone());
    // The id first, as vLLM's response object has it; items have ids too.
    let object = json!({"id": id, "object": "response", "status": "completed",
        "output": [{"id": "msg_1", "type": "message", "role": "assistant",
                    "content": [{"type": "output_text", "text": "ok"}]}]});
    if v["stream"] == true {
        let created = json!({"type": "response.created", "sequence_number": 0,
            "response": {"id": object["id"], "object": "response", "status": "in_progress"}});
        let done = json!({"type": "response.completed", "sequence_number": 1, "response": object});
        let sse = format!(
            "event: response.created\ndata: {created}\n\nevent: response.completed\ndata: {done}\n\n"
        );
        return ([("content-type", "text/event-stream")], sse).into_response();
    }
    Json(object).into_response()
}

async fn retrieve(State(st): State<Arc<Store>>, Path(id): Path<String>) -> Response {
    st.lookups.fetch_add(1, Ordering::SeqCst);
    let now = st.looking.fetch_add(1, Ordering::SeqCst) + 1;
    st.most_looking.fetch_max(now, Ordering::SeqCst);
    let ms = st.lookup_ms.load(Ordering::SeqCst);
    tokio::time::sleep(std::time::Duration::from_millis(u64::from(ms))).await;
    st.looking.fetch_sub(1, Ordering::SeqCst);
    if st.held.lock().contains(&id) {
        Json(json!({"id": id, "object": "response", "status": "completed"})).into_response()
    } else {
        not_found(&id)
    }
}

async fn cancel(State(st): State<Arc<Store>>, Path(id): Path<String>) -> Response {
    if st.held.lock().contains(&id) {
        Json(json!({"id": id, "object": "response", "status": "cancelled"})).into_response()
    } else {
        not_found(&id)
    }
}

/// Starts an engine; its URL.
async fn engine(name: &str) -> String {
    engine_with(name).await.0
}

/// Starts an engine; its URL and its store.
async fn engine_with(name: &str) -> (String, Arc<Store>) {
    let st = Arc::new(Store {
        name: name.to_owned(),
        next: AtomicU32::new(0),
        held: Mutex::new(HashSet::new()),
        lookups: AtomicU32::new(0),
        looking: AtomicU32::new(0),
        most_looking: AtomicU32::new(0),
        lookup_ms: AtomicU32::new(0),
    });
    let store = Arc::clone(&st);
    let app = Router::new()
        .route("/v1/responses", route_post(create))
        .route("/v1/responses/{id}", get(retrieve))
        .route("/v1/responses/{id}/cancel", route_post(cancel))
        .route("/health", get(|| async { "ok" }))
        .with_state(st);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, store)
}

async fn router_over(urls: &[String]) -> RouterProcess {
    let mut args = vec!["--model", "m", "--strategy", "random"];
    for u in urls {
        args.push("--backend");
        args.push(u);
    }
    RouterProcess::spawn(&args).await
}

fn turn(previous: Option<&str>, stream: bool) -> Value {
    let mut b = json!({"model": "m", "input": "go on", "stream": stream, "store": true});
    if let Some(p) = previous {
        b["previous_response_id"] = json!(p);
    }
    b
}

/// The id of a response answer, plain JSON or a stream's first event.
fn id_of(reply: &Reply) -> String {
    let text = String::from_utf8_lossy(&reply.body);
    let json = match text.find("data: ") {
        Some(at) => text[at + 6..].lines().next().unwrap().to_owned(),
        None => text.into_owned(),
    };
    let v: Value = serde_json::from_str(&json).unwrap();
    let id = v["id"].as_str().or(v["response"]["id"].as_str());
    id.unwrap().to_owned()
}

fn counter(metrics: &str, outcome: &str) -> u64 {
    let want = format!("warmpath_response_affinity_total{{pool=\"m\",outcome=\"{outcome}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&want))
        .map_or(0, |v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ups_reach_the_engine_that_stored_the_response() {
    let urls = vec![engine("a").await, engine("b").await, engine("c").await];
    let r = router_over(&urls).await;
    let c = client();
    // Six conversations of five turns, streamed and not: under `random`
    // over three engines a follow-up lands elsewhere two times in three,
    // and there the engine does not have the response (404).
    let mut last = Vec::new();
    for conv in 0..6 {
        let stream = conv % 2 == 0;
        let first = post(&c, &r.url("/v1/responses"), &turn(None, stream), &[]).await;
        assert_eq!(first.status, 200, "{:?}", first.body);
        let home = first.backend().to_owned();
        let mut prev = id_of(&first);
        for t in 0..4 {
            let next = post(&c, &r.url("/v1/responses"), &turn(Some(&prev), stream), &[]).await;
            assert_eq!(
                next.status,
                200,
                "conversation {conv} turn {t}: {:?}",
                String::from_utf8_lossy(&next.body)
            );
            assert_eq!(
                (next.backend(), next.decision()),
                (home.as_str(), "affinity")
            );
            prev = id_of(&next);
        }
        last.push((prev, home));
    }
    // Retrieval and cancel go to the holder too.
    for (id, home) in &last {
        let got = get_url(&c, &r.url(&format!("/v1/responses/{id}"))).await;
        assert_eq!(got.status, 200);
        assert_eq!(got.backend(), home);
        assert_eq!(got.json()["id"], id.as_str());
        let empty = Value::Object(Default::default());
        let url = r.url(&format!("/v1/responses/{id}/cancel"));
        let cancelled = post(&c, &url, &empty, &[]).await;
        assert_eq!(cancelled.status, 200);
        assert_eq!(cancelled.json()["status"], "cancelled");
    }
    let metrics = String::from_utf8(get_url(&c, &r.url("/metrics")).await.body.to_vec()).unwrap();
    assert!(counter(&metrics, "known") >= 6 * 4 + 2 * 6, "{metrics}");
    assert_eq!(counter(&metrics, "located"), 0, "{metrics}");
    let index = get_url(&c, &r.url("/cache-index")).await.json();
    assert_eq!(index["pools"][0]["response_ids"], 6 * 5);

    // A second replica never saw these responses: it asks the engines.
    let replica = router_over(&urls).await;
    for (id, home) in &last {
        let next = post(
            &c,
            &replica.url("/v1/responses"),
            &turn(Some(id), false),
            &[],
        )
        .await;
        assert_eq!(
            next.status,
            200,
            "{:?}",
            String::from_utf8_lossy(&next.body)
        );
        assert_eq!(
            (next.backend(), next.decision()),
            (home.as_str(), "affinity")
        );
        let got = get_url(&c, &replica.url(&format!("/v1/responses/{id}"))).await;
        assert_eq!((got.status.as_u16(), got.backend()), (200, home.as_str()));
    }
    let metrics = replica.url("/metrics");
    let metrics = String::from_utf8(get_url(&c, &metrics).await.body.to_vec()).unwrap();
    assert_eq!(counter(&metrics, "located"), 6, "{metrics}");
    assert_eq!(counter(&metrics, "known"), 6, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_and_malformed_response_ids_get_clear_errors() {
    let urls = vec![engine("a").await, engine("b").await];
    let r = router_over(&urls).await;
    let c = client();
    let e = get_url(&c, &r.url("/v1/responses/resp_nobody"))
        .await
        .error(404);
    assert_eq!(e["code"], "response_not_found");
    assert!(
        e["message"].as_str().unwrap().contains("resp_nobody"),
        "{e}"
    );
    let url = r.url("/v1/responses/resp_nobody/cancel");
    let e = post(&c, &url, &json!({}), &[]).await.error(404);
    assert_eq!(e["code"], "response_not_found");
    let e = get_url(&c, &r.url("/v1/responses/a%3Fb")).await.error(400);
    assert_eq!(e["param"], "response_id");
    // A follow-up of a response nobody holds is routed by the policy, and
    // the engine's own 404 comes back.
    let reply = post(
        &c,
        &r.url("/v1/responses"),
        &turn(Some("resp_gone"), false),
        &[],
    )
    .await;
    assert_eq!(reply.status, 404);
    assert_ne!(reply.decision(), "affinity");
    let bad = json!({"model": "m", "input": "x", "previous_response_id": "a b"});
    let e = post(&c, &r.url("/v1/responses"), &bad, &[])
        .await
        .error(400);
    assert_eq!(e["param"], "previous_response_id");
    let metrics = String::from_utf8(get_url(&c, &r.url("/metrics")).await.body.to_vec()).unwrap();
    assert_eq!(counter(&metrics, "unknown"), 3, "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_response_ids_do_not_multiply_into_the_engines() {
    let mut engines = Vec::new();
    for name in ["a", "b", "c"] {
        engines.push(engine_with(name).await);
    }
    let urls: Vec<String> = engines.iter().map(|(u, _)| u.clone()).collect();
    let r = router_over(&urls).await;
    let c = client();
    let asked = || -> u32 {
        engines
            .iter()
            .map(|(_, s)| s.lookups.load(Ordering::SeqCst))
            .sum()
    };
    // The same unknown id, again and again: the engines are asked once
    // (every retry asked all of them).
    for _ in 0..20 {
        let got = get_url(&c, &r.url("/v1/responses/resp_nobody")).await;
        assert_eq!(got.status, 404);
    }
    assert_eq!(asked(), 3);
    // A flood of fresh ids with slow engines: at most a few look-ups at once.
    for (_, s) in &engines {
        s.lookup_ms.store(200, Ordering::SeqCst);
    }
    let mut flood = Vec::new();
    for i in 0..48 {
        let (c, url) = (c.clone(), r.url(&format!("/v1/responses/resp_flood{i}")));
        flood.push(tokio::spawn(async move { get_url(&c, &url).await.status }));
    }
    // A known response is still served meanwhile.
    let made = post(&c, &r.url("/v1/responses"), &turn(None, false), &[]).await;
    assert_eq!(made.status, 200);
    let id = id_of(&made);
    let got = get_url(&c, &r.url(&format!("/v1/responses/{id}"))).await;
    assert_eq!(got.status, 200, "{:?}", got.body);
    for f in flood {
        assert_eq!(f.await.unwrap(), 404);
    }
    for (_, s) in &engines {
        let most = s.most_looking.load(Ordering::SeqCst);
        // 16 look-ups, and the known response's own GET relayed there.
        assert!(most <= 17, "{most} look-ups at once");
    }
}

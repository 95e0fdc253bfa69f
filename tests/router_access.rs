//! Who may use what, end to end on the real router binary: introspection and
//! admin behind their tokens, routing headers switched off for untrusted
//! clients, and listeners other hosts can reach refused without tokens.
#![allow(clippy::unwrap_used)]

mod support;

use serde_json::json;
use support::*;

fn with_token<'a>(t: &'a str, auth: &'a mut String) -> Vec<(&'a str, &'a str)> {
    *auth = format!("Bearer {t}");
    vec![("authorization", auth.as_str())]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn introspection_and_admin_need_their_tokens() {
    let bs = backends(1).await;
    let r = router(&bs, &["--admin-token", "adm", "--inspect-token", "ins"]).await;
    let c = client();
    let query = json!({"model": "m", "prompt": "hello"}).to_string();
    let strategy = json!({"strategy": "random"}).to_string();
    let mut buf = String::new();
    for (who, index, admin) in [
        (None, 401, 401),
        (Some("wrong"), 401, 401),
        (Some("ins"), 200, 401),
        (Some("adm"), 200, 200),
    ] {
        let h = who.map_or_else(Vec::new, |t| with_token(t, &mut buf));
        let got = send(&c, request("GET", &r.url("/cache-index"), "", &h)).await;
        assert_eq!(got.status, index, "GET /cache-index as {who:?}");
        if index == 401 {
            assert_eq!(got.error(401)["code"], "invalid_token");
        }
        let got = send(
            &c,
            request("POST", &r.url("/cache-index/query"), query.clone(), &h),
        )
        .await;
        assert_eq!(got.status, index, "POST /cache-index/query as {who:?}");
        let url = r.url("/admin/pools/m/strategy");
        let got = send(&c, request("PUT", &url, strategy.clone(), &h)).await;
        assert_eq!(got.status, admin, "PUT admin as {who:?}");
    }
    // The open endpoints stay open.
    for path in ["/metrics", "/health", "/v1/models"] {
        assert_eq!(get_url(&c, &r.url(path)).await.status, 200, "{path}");
    }
    assert_eq!(bs[0].count(), 0, "nothing went upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_headers_can_be_switched_off_per_pool() {
    let b = TestBackend::start("b").await;
    let pool = "    strategy: prefix_aware\n    expose_routing_headers: false";
    let r = yaml_router("", pool, &[&b]).await;
    let c = client();
    let ok = post(
        &c,
        &r.url("/v1/chat/completions"),
        &chat("m", "doc", "q"),
        &[],
    )
    .await;
    assert_eq!(ok.status, 200);
    let bad = post(
        &c,
        &r.url("/v1/completions"),
        &json!({"model": "m", "prompt": "x", "x_status": 500}),
        &[],
    )
    .await;
    assert_eq!(bad.status, 500);
    for reply in [&ok, &bad] {
        assert!(
            !reply.headers.contains_key("x-warmpath-backend")
                && !reply.headers.contains_key("x-warmpath-decision"),
            "{:?}",
            reply.headers
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listeners_other_hosts_reach_are_refused_without_tokens() {
    // Refused by validation, before anything binds.
    let pool = ["--model", "m", "--backend", "http://127.0.0.1:9"];
    let (ok, err) = run_to_exit(&[&["--listen", "0.0.0.0:0"][..], &pool].concat()).await;
    assert!(!ok);
    assert!(
        err.contains("admin_token") && err.contains("--insecure"),
        "{err}"
    );
    let (ok, err) = run_to_exit(
        &[
            &["--listen", "127.0.0.1:0", "--grpc-listen", "0.0.0.0:0"][..],
            &pool,
        ]
        .concat(),
    )
    .await;
    assert!(!ok);
    assert!(
        err.contains("agent_secret") && err.contains("--print-agent-token"),
        "{err}"
    );
}

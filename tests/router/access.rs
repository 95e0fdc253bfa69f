//! Who may use what, end to end on the real router binary: introspection and
//! admin behind their tokens, routing headers switched off for untrusted
//! clients, and listeners other hosts can reach refused without tokens.

use crate::support;

use serde_json::json;
use std::time::Duration;
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

/// Sends `head` (and no body) on a raw socket; the answer's first line and
/// how long it took, or `None` when nothing came within `limit`.
async fn raw_answer(
    addr: std::net::SocketAddr,
    head: String,
    limit: Duration,
) -> Option<(String, Duration)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(head.as_bytes()).await.unwrap();
    let t = std::time::Instant::now();
    let mut got = vec![0u8; 4096];
    let n = tokio::time::timeout(limit, s.read(&mut got))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&got[..n]).into_owned();
    Some((text.lines().next().unwrap_or("").to_owned(), t.elapsed()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_site_admin_writes_and_rebound_hosts_are_refused() {
    let bs = backends(1).await;
    let r = yaml_router(
        "server:\n  allowed_hosts: [router.internal]",
        "    strategy: prefix_aware",
        &[&bs[0]],
    )
    .await;
    let c = client();
    let port = r.addr.port();
    let own = format!("127.0.0.1:{port}");
    let backends_url = r.url("/admin/pools/m/backends");
    let attacker = json!({"url": "http://127.0.0.1:9", "worker_id": "evil"}).to_string();
    // What a foreign page can send without a preflight: a text/plain POST
    // with its own Origin. Refused before the body is looked at.
    let forged = |ct: &'static str, origin: Option<&'static str>| {
        let mut req = hyper::Request::builder()
            .method("POST")
            .uri(&backends_url)
            .header("content-type", ct);
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        req.body(http_body_util::Full::new(bytes::Bytes::from(
            attacker.clone(),
        )))
        .unwrap()
    };
    let got = send(&c, forged("text/plain", Some("http://evil.example"))).await;
    assert_eq!(got.error(403)["code"], "cross_origin");
    let got = send(&c, forged("application/json", Some("http://evil.example"))).await;
    assert_eq!(got.error(403)["code"], "cross_origin");
    let got = send(&c, forged("text/plain", None)).await;
    assert_eq!(got.error(415)["code"], "unsupported_media_type");
    let drain = r.url("/admin/pools/m/backends/b0/drain");
    let forged_drain = hyper::Request::builder()
        .method("POST")
        .uri(&drain)
        .header("origin", "null")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    assert_eq!(
        send(&c, forged_drain).await.error(403)["code"],
        "cross_origin"
    );
    let forged_strategy = request(
        "PUT",
        &r.url("/admin/pools/m/strategy"),
        json!({"strategy": "random"}).to_string(),
        &[("origin", "https://evil.example")],
    );
    assert_eq!(send(&c, forged_strategy).await.status, 403);
    // DNS rebinding: a foreign name for this loopback listener reads nothing.
    for path in ["/cache-index", "/v1/models", "/metrics"] {
        let rebound = request("GET", &r.url(path), "", &[("host", "evil.example:80")]);
        let got = send(&c, rebound).await;
        assert_eq!(got.error(403)["code"], "host_not_allowed", "{path}");
    }
    let rebound = request(
        "POST",
        &r.url("/v1/chat/completions"),
        chat("m", "doc", "q").to_string(),
        &[("host", &format!("attacker.example:{port}"))],
    );
    assert_eq!(send(&c, rebound).await.status, 403);
    // Nothing changed, and the operator's own requests still work: the
    // listener's names on any port, the configured extra name, the same
    // origin.
    let listed = get_url(&c, &backends_url).await.json();
    assert_eq!(listed["backends"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(bs[0].count(), 0, "nothing forged reached the engine");
    for host in [own.as_str(), "localhost:1", "[::1]", "router.internal:8000"] {
        let got = send(
            &c,
            request("GET", &r.url("/cache-index"), "", &[("host", host)]),
        )
        .await;
        assert_eq!(got.status, 200, "Host {host}");
    }
    let origin = format!("http://{own}");
    let same = request(
        "PUT",
        &r.url("/admin/pools/m/strategy"),
        json!({"strategy": "random"}).to_string(),
        &[("origin", &origin)],
    );
    assert_eq!(send(&c, same).await.status, 200);
    let ok = post(
        &c,
        &r.url("/v1/chat/completions"),
        &chat("m", "doc", "q"),
        &[],
    )
    .await;
    assert_eq!(ok.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_bodies_have_a_deadline_and_the_token_comes_first() {
    let bs = backends(1).await;
    let r = yaml_router("server:\n  header_timeout_ms: 150", "", &[&bs[0]]).await;
    // A body announced and never sent: 408 at the body deadline (3 header
    // timeouts), as on the
    // proxied endpoints (it was held for as long as the client liked).
    let head = |port: u16, len: usize| {
        format!(
            "POST /admin/pools/m/backends HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n"
        )
    };
    let held = tokio::spawn(raw_answer(
        r.addr,
        head(r.addr.port(), 1000),
        Duration::from_secs(10),
    ));
    // Meanwhile another client is served.
    let c = client();
    let ok = post(
        &c,
        &r.url("/v1/chat/completions"),
        &chat("m", "doc", "q"),
        &[],
    )
    .await;
    assert_eq!(ok.status, 200);
    let (line, took) = held.await.unwrap().expect("the router answered");
    assert!(line.starts_with("HTTP/1.1 408"), "{line}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    // Oversized: 413 from the announced length alone.
    let big = head(r.addr.port(), 10_000_000);
    let (line, _) = raw_answer(r.addr, big, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(line.starts_with("HTTP/1.1 413"), "{line}");

    // With a token, an anonymous client is refused before its body.
    let r = router(&bs, &["--admin-token", "adm"]).await;
    let (line, took) = raw_answer(r.addr, head(r.addr.port(), 1000), Duration::from_secs(10))
        .await
        .unwrap();
    assert!(line.starts_with("HTTP/1.1 401"), "{line}");
    assert!(took < Duration::from_secs(2), "{took:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_bodies_name_no_internal_address_or_socket_error() {
    // A backend that is gone: every connect is refused.
    let dead = TestBackend::start("dead").await;
    let url = dead.url();
    dead.kill();
    drop(dead);
    let pool = "    strategy: random\n    expose_routing_headers: false";
    let yaml = format!("pools:\n  - model: m\n{pool}\n    backends: [{{url: '{url}'}}]\n");
    let r = RouterProcess::from_yaml(&yaml).await;
    let c = client();
    let got = post(
        &c,
        &r.url("/v1/completions"),
        &json!({"model": "m", "prompt": "x"}),
        &[],
    )
    .await;
    let e = got.error(502);
    let text = String::from_utf8_lossy(&got.body).into_owned();
    let host = url.trim_start_matches("http://");
    for secret in [host, "127.0.0.1", "refused", "os error", "tcp connect"] {
        assert!(!text.contains(secret), "{secret:?} shown: {text}");
    }
    assert_eq!(e["code"], "upstream_failed");
}

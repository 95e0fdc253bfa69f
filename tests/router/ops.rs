//! What an operator reads of the real `warmpath-router` binary: the request
//! id (`x-request-id` honoured, generated, forwarded upstream, returned),
//! the log formats on stderr (JSON lines that parse, no ANSI codes in a
//! pipe), the opt-in access log, and the per-backend and end-to-end series
//! of `/metrics`.

use crate::support;

use serde_json::{json, Value};
use std::time::Duration;
use support::*;

/// The router binary over `b` (pool `m`) with `extra` flags, its stderr in
/// a file (read with [`Logged::stderr`] once it has exited).
struct Logged {
    child: tokio::process::Child,
    addr: std::net::SocketAddr,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Logged {
    async fn spawn(b: &TestBackend, extra: &[&str], rust_log: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("stderr");
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_warmpath-router"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--model",
                "m",
                "--strategy",
                "random",
            ])
            .args(["--backend", &b.url(), "--drain-grace-ms", "0"])
            .args(extra)
            .env("RUST_LOG", rust_log)
            .env_remove("NO_COLOR")
            .env_remove("WARMPATH_LOG_FORMAT")
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let addr = support::listen_addr(&mut child).await;
        Logged {
            child,
            addr,
            log,
            _dir: dir,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// SIGTERM, wait for the exit, and the whole stderr.
    async fn stderr(mut self) -> String {
        let pid = self.child.id().unwrap().to_string();
        assert!(std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success());
        let status = tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .unwrap()
            .unwrap();
        assert!(status.success(), "{status:?}");
        std::fs::read_to_string(&self.log).unwrap()
    }
}

/// A log filter that turns the access log on (plain `info` leaves it off).
const ACCESS_ON: &str = "info,warmpath_router::access=info";

fn completion() -> Value {
    json!({"model": "m", "prompt": "a secret prompt"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sent_request_id_goes_upstream_and_comes_back_and_one_is_made_otherwise() {
    let b = TestBackend::start("b").await;
    let r = router(std::slice::from_ref(&b), &["--strategy", "random"]).await;
    let c = client();
    let url = r.url("/v1/completions");

    let reply = post(
        &c,
        &url,
        &completion(),
        &[("x-request-id", "client-42.a_b")],
    )
    .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("x-request-id"), "client-42.a_b");
    let sent = b.requests().pop().unwrap();
    assert_eq!(sent.headers["x-request-id"], "client-42.a_b");

    // None sent, or one unfit for logs (a space, too long): a fresh one,
    // the same upstream and back.
    let long = "x".repeat(129);
    for given in [None, Some("has a space"), Some(long.as_str())] {
        let headers: Vec<(&str, &str)> = given.iter().map(|g| ("x-request-id", *g)).collect();
        let reply = post(&c, &url, &completion(), &headers).await;
        let id = reply.header("x-request-id").to_owned();
        assert!(
            id.len() == 32 && id.bytes().all(|c| c.is_ascii_hexdigit()),
            "{id:?}"
        );
        assert_eq!(
            b.requests().pop().unwrap().headers["x-request-id"],
            id.as_str()
        );
    }
    // Every answer carries one, errors and other endpoints included.
    let e = post(&c, &url, &json!({"model": "nope", "prompt": "x"}), &[]).await;
    assert_eq!(e.header("x-request-id").len(), 32);
    assert_eq!(
        get_url(&c, &r.url("/v1/models"))
            .await
            .header("x-request-id")
            .len(),
        32
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_parse_and_the_access_log_line_names_the_request_but_not_its_prompt() {
    let b = TestBackend::start("b").await;
    let r = Logged::spawn(&b, &["--log-format", "json"], ACCESS_ON).await;
    let reply = post(
        &client(),
        &r.url("/v1/completions"),
        &completion(),
        &[("x-request-id", "rid-7")],
    )
    .await;
    assert_eq!(reply.status, 200);
    let log = r.stderr().await;
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect();
    let access: Vec<&Value> = lines
        .iter()
        .filter(|l| l["target"] == "warmpath_router::access")
        .collect();
    assert_eq!(access.len(), 1, "{log}");
    let a = &access[0];
    assert_eq!(a["level"], "INFO");
    assert_eq!(a["span"]["request_id"], "rid-7", "{a}");
    let f = &a["fields"];
    assert_eq!(
        (f["method"].as_str(), f["path"].as_str()),
        (Some("POST"), Some("/v1/completions")),
        "{a}"
    );
    assert_eq!(
        (f["status"].as_u64(), f["pool"].as_str()),
        (Some(200), Some("m")),
        "{a}"
    );
    assert_eq!(
        (f["backend"].as_str(), f["decision"].as_str()),
        (Some(b.url().as_str()), Some("random")),
        "{a}"
    );
    assert_eq!(f["complete"], true, "{a}");
    assert!(
        f["head_ms"].as_f64().unwrap() <= f["total_ms"].as_f64().unwrap(),
        "{a}"
    );
    assert!(!log.contains("secret prompt"), "{log}");
    assert!(
        !log.contains("\"WARN\""),
        "a normal run and shutdown warn of nothing: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn piped_text_logs_have_no_colour_codes_and_no_access_lines_unless_asked() {
    let b = TestBackend::start("b").await;
    let r = Logged::spawn(&b, &[], "info").await;
    let reply = post(&client(), &r.url("/v1/completions"), &completion(), &[]).await;
    assert_eq!(reply.status, 200);
    let log = r.stderr().await;
    assert!(log.contains("router started"), "{log}");
    assert!(!log.contains('\x1b'), "ANSI codes in a pipe: {log:?}");
    assert!(!log.contains("warmpath_router::access"), "{log}");

    // RUST_LOG naming the access target turns it on, in text too.
    let r = Logged::spawn(&b, &[], ACCESS_ON).await;
    post(
        &client(),
        &r.url("/v1/completions"),
        &completion(),
        &[("x-request-id", "rid-9")],
    )
    .await;
    let log = r.stderr().await;
    let line = log
        .lines()
        .find(|l| l.contains("warmpath_router::access"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(
        line.contains("request_id=rid-9") && line.contains("status=200"),
        "{line}"
    );
    assert!(!log.contains('\x1b'), "{log:?}");
}

/// The value of the sample `name{labels}` in a /metrics page (labels in
/// the exporter's order), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_backend_counts_its_requests_by_outcome_and_requests_have_a_duration() {
    let b = TestBackend::start("b").await;
    let r = router(std::slice::from_ref(&b), &["--strategy", "random"]).await;
    let c = client();
    let url = r.url("/v1/completions");
    assert_eq!(post(&c, &url, &completion(), &[]).await.status, 200);
    let mut failing = completion();
    failing["x_status"] = json!(500);
    assert_eq!(post(&c, &url, &failing, &[]).await.status, 500);
    let mut stream = completion();
    stream["stream"] = json!(true);
    assert_eq!(post(&c, &url, &stream, &[]).await.status, 200);

    let series = |o: &str| {
        format!(
            "warmpath_backend_requests_total{{pool=\"m\",backend=\"{}\",outcome=\"{o}\"}}",
            b.url()
        )
    };
    let mut text = String::new();
    poll::poll(
        "the outcomes counted",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || {
            text =
                String::from_utf8_lossy(&get_url(&c, &r.url("/metrics")).await.body).into_owned();
            (sample(&text, &series("ok")) == Some(2.0)).then_some(())
        },
    )
    .await;
    assert_eq!(sample(&text, &series("server_error")), Some(1.0), "{text}");
    assert_eq!(sample(&text, &series("connect_error")), Some(0.0), "{text}");
    assert_eq!(
        sample(&text, "warmpath_request_duration_seconds_count{pool=\"m\"}"),
        Some(3.0),
        "{text}"
    );
    assert!(
        text.contains("warmpath_request_duration_seconds_bucket{pool=\"m\",le=\"600\"}"),
        "buckets reach minutes: {text}"
    );
}

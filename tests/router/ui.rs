//! The cache page `GET /cache-index/ui`: its access rules (those of
//! `/cache-index`, with HTTP Basic for browsers), and the page itself
//! loaded in headless Chromium (Debian's `chromium`; the browser test skips
//! with a loud message when it is absent, and fails under
//! `WARMPATH_REQUIRE_TOOLS=1`, as in CI) against a router running
//! in-process whose index is filled through the core API and whose warmest
//! chains come from routed requests. The screenshot is kept under
//! `target/tmp/`.

use crate::{support, tools};

use base64::Engine;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use support::*;
use tokio_util::sync::CancellationToken;
use warmpath_core::{hash_tokens, HashSeed, Tier};
use warmpath_router::config::{BackendConfig, PoolConfig, RouterConfig};
use warmpath_router::RunningRouter;

const BLOCK: usize = 4;

async fn start(bs: &[TestBackend], inspect_token: &str, admin_token: &str) -> RunningRouter {
    let mut pool = PoolConfig::new("m");
    pool.block_size = BLOCK;
    pool.backends = bs.iter().map(TestBackend::config).collect();
    let config = RouterConfig {
        listen: "127.0.0.1:0".into(),
        pools: vec![pool],
        inspect_token: Some(inspect_token.to_owned()),
        admin_token: Some(admin_token.to_owned()),
        ..Default::default()
    };
    warmpath_router::start(config, CancellationToken::new())
        .await
        .unwrap()
}

fn tokens(from: u32, n: u32) -> Vec<u32> {
    (from..from + n).collect()
}

/// Worker `w0` holds chain A (8 blocks, GPU), `w1` the first 2 blocks of A
/// on CPU and chain B (3 blocks) on disk; A is routed 3 times, B twice.
async fn warm(r: &RunningRouter) -> (String, String) {
    let index = r.index("m").unwrap();
    let seed = HashSeed::new("m", "", "");
    let a = hash_tokens(seed, BLOCK, &tokens(0, 32));
    let b = hash_tokens(seed, BLOCK, &tokens(1000, 12));
    let (w0, w1) = (
        index.worker_slot("w0").unwrap(),
        index.worker_slot("w1").unwrap(),
    );
    index.store(w0, Tier::Gpu, &a).unwrap();
    index.store(w1, Tier::Cpu, &a[..2]).unwrap();
    index.store(w1, Tier::Disk, &b).unwrap();
    let c = client();
    let url = format!("http://{}/v1/completions", r.http_addr);
    for (prompt, times) in [(tokens(0, 32), 3), (tokens(1000, 12), 2)] {
        for _ in 0..times {
            let reply = post(&c, &url, &json!({"model": "m", "prompt": prompt}), &[]).await;
            assert_eq!(reply.status, 200);
        }
    }
    (a[0].to_hex(), b[0].to_hex())
}

async fn get_with(r: &RunningRouter, path: &str, headers: &[(&str, &str)]) -> Reply {
    let url = format!("http://{}{path}", r.http_addr);
    send(
        &client(),
        request("GET", &url, bytes::Bytes::new(), headers),
    )
    .await
}

fn basic(user: &str, password: &str) -> String {
    let pair = format!("{user}:{password}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_guarded_like_the_index_and_asks_browsers_for_basic_auth() {
    let bs = [
        TestBackend::start("w0").await,
        TestBackend::start("w1").await,
    ];
    let r = start(&bs, "s3cret", "adm1n").await;
    let refused = get_with(&r, "/cache-index/ui", &[]).await;
    refused.error(401);
    assert!(
        refused
            .header("www-authenticate")
            .starts_with("Basic realm="),
        "a browser prompts for the token"
    );
    let wrong = basic("ops", "guess");
    get_with(&r, "/cache-index/ui", &[("authorization", &wrong)])
        .await
        .error(401);
    let right = basic("anyone", "s3cret");
    for auth in [right.as_str(), "Bearer s3cret"] {
        let page = get_with(&r, "/cache-index/ui", &[("authorization", auth)]).await;
        assert_eq!(page.status, 200, "{auth}");
        assert_eq!(page.header("content-type"), "text/html; charset=utf-8");
        assert!(page
            .header("content-security-policy")
            .contains("connect-src 'self'"));
        let html = String::from_utf8(page.body.to_vec()).unwrap();
        assert!(html.contains("\"worker_id\":\"w0\""), "snapshot embedded");
        assert!(!html.contains("s3cret"), "the page never holds the token");
        // The page's own requests carry the same credentials.
        let index = get_with(&r, "/cache-index", &[("authorization", auth)]).await;
        assert_eq!(index.status, 200, "{auth}");
    }
    // The page's lookup box posts this body, with the same credentials.
    let c = client();
    let query = format!("http://{}/cache-index/query", r.http_addr);
    let ask = json!({"model": "m", "messages": [{"role": "user", "content": "where?"}]});
    let answer = post(&c, &query, &ask, &[("authorization", &right)]).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.json()["workers"].as_array().unwrap().len(), 2);
    post(&c, &query, &ask, &[("authorization", &wrong)])
        .await
        .error(401);
    // Basic counts for inspection only, never for the admin API.
    let url = format!("http://{}/admin/pools/m/strategy", r.http_addr);
    let put = request(
        "PUT",
        &url,
        r#"{"strategy":"random"}"#,
        &[("authorization", &right)],
    );
    assert_ne!(send(&c, put).await.status, 200);
}

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|name| {
            let out = Command::new("sh")
                .args(["-c", &format!("command -v {name}")])
                .output()
                .ok()?;
            out.status
                .success()
                .then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        })
}

/// Runs headless Chromium on `url` with `what` (`--dump-dom`,
/// `--screenshot=...`); returns stdout.
fn browse(chrome: &Path, profile: &Path, what: &str, url: &str) -> String {
    let out = Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1280,1100",
            "--virtual-time-budget=2000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(what)
        .arg(url)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headless_chromium_shows_workers_tiers_and_the_warmest_chains() {
    let Some(chrome) = chromium() else {
        tools::missing(
            "chromium",
            "the cache page in a browser (Debian's `chromium`)",
        );
        return;
    };
    let bs = [
        TestBackend::start("w0").await,
        TestBackend::start("w1").await,
    ];
    let r = start(&bs, "s3cret", "adm1n").await;
    let (root_a, root_b) = warm(&r).await;
    let profile = tempfile::tempdir().unwrap();
    let (chrome2, dir) = (chrome.clone(), profile.path().to_owned());
    // Credentials in the URL: Chromium answers the Basic challenge with
    // them and sends them on the page's own requests.
    let url = format!("http://ops:s3cret@{}/cache-index/ui", r.http_addr);
    let url2 = url.clone();
    let dom = tokio::task::spawn_blocking(move || browse(&chrome2, &dir, "--dump-dom", &url2))
        .await
        .unwrap();
    for worker in ["w0", "w1"] {
        assert!(
            dom.contains(&format!("class=\"worker\" data-worker=\"{worker}\"")),
            "worker {worker} on the page:\n{dom}"
        );
    }
    let a_row = format!("class=\"chain\" data-root=\"{root_a}\"");
    let b_row = format!("class=\"chain\" data-root=\"{root_b}\"");
    let (a_at, b_at) = (dom.find(&a_row), dom.find(&b_row));
    assert!(
        a_at.is_some() && b_at.is_some(),
        "both chains shown:\n{dom}"
    );
    assert!(a_at < b_at, "the warmest chain first");
    assert!(dom.contains("3 hits") && dom.contains("2 hits"), "{dom}");
    assert!(
        dom.contains("held by w0 8/8, w1 2/8"),
        "holders of A:\n{dom}"
    );
    assert!(
        dom.contains("class=\"gpu\"") && dom.contains("class=\"disk\""),
        "tier bars"
    );
    assert!(
        dom.contains(r#"<span id="error" role="alert"></span>"#),
        "no error shown:\n{dom}"
    );
    // The screenshot is kept for a person to look at.
    let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("router_ui");
    std::fs::create_dir_all(&shots).unwrap();
    let png = shots.join("cache-page.png");
    let _ = std::fs::remove_file(&png);
    let (dir, arg) = (
        profile.path().to_owned(),
        format!("--screenshot={}", png.display()),
    );
    tokio::task::spawn_blocking(move || browse(&chrome, &dir, &arg, &url))
        .await
        .unwrap();
    let size = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
    assert!(
        size > 10_000,
        "a screenshot at {} ({size} bytes)",
        png.display()
    );
    eprintln!("cache page screenshot: {}", png.display());
}

/// Prompt text is shown only for a pool with `show_prompts`: the same
/// traffic through two routers, one with it and one without.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_previews_appear_only_with_show_prompts() {
    use warmpath_core::tokenize::tiny;
    let dir = tempfile::tempdir().unwrap();
    tiny::write_model_dir(dir.path()).unwrap();
    let secret = "the quarterly numbers for the merger";
    for show in [false, true] {
        let b = TestBackend::start("w0").await;
        let mut pool = PoolConfig::new("m");
        pool.tokenizer = Some(dir.path().to_owned());
        pool.show_prompts = show;
        pool.backends = vec![BackendConfig {
            url: b.url(),
            worker_id: Some("w0".into()),
            api_key: None,
        }];
        let config = RouterConfig {
            listen: "127.0.0.1:0".into(),
            pools: vec![pool],
            ..Default::default()
        };
        let r = warmpath_router::start(config, CancellationToken::new())
            .await
            .unwrap();
        let text = format!("{secret}. {}", tiny::corpus_slice(0, 600));
        let url = format!("http://{}/v1/chat/completions", r.http_addr);
        let chat = json!({"model": "m", "messages": [{"role": "user", "content": text}]});
        assert_eq!(post(&client(), &url, &chat, &[]).await.status, 200);
        let index = get_with(&r, "/cache-index", &[]).await.json();
        let chain = &index["pools"][0]["warmest_chains"][0];
        assert_eq!(chain["hits"], 1, "{index}");
        let page = get_with(&r, "/cache-index/ui", &[]).await;
        let html = String::from_utf8(page.body.to_vec()).unwrap();
        if show {
            let preview = chain["prompt_preview"].as_str().unwrap();
            assert!(preview.contains(secret), "{preview}");
            assert!(preview.chars().count() <= 160, "{preview}");
            assert!(html.contains(secret));
        } else {
            assert!(chain["prompt_preview"].is_null(), "{chain}");
            assert!(!html.contains(secret) && !index.to_string().contains(secret));
        }
    }
}

//! Tenants end to end on the real router binary (`tenants:` per pool): ids
//! derived from the API key (a client cannot claim another key's tenant),
//! client ids scoped or refused, `route_only` isolation (no `cache_salt`,
//! shared block hashes), and long `prompt_cache_key`s.

use crate::support;

use serde_json::{json, Value};
use support::*;

async fn router_with(b: &TestBackend, tenants: &str) -> RouterProcess {
    let pool = format!("    strategy: prefix_aware\n    tenants: {tenants}");
    yaml_router("", &pool, &[b]).await
}

fn last_salt(b: &TestBackend) -> Value {
    b.requests().last().unwrap().json()["cache_salt"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_tenants_cannot_be_claimed() {
    let b = TestBackend::start("b").await;
    let r = router_with(&b, "{from: api_key}").await;
    let c = client();
    let url = r.url("/v1/chat/completions");
    let body = chat("m", "doc", "q");
    let (ka, kb) = ("Bearer sk-tenant-a", "Bearer sk-tenant-b");
    assert_eq!(
        post(&c, &url, &body, &[("authorization", ka)]).await.status,
        200
    );
    let salt_a = last_salt(&b);
    assert_eq!(
        post(&c, &url, &body, &[("authorization", kb)]).await.status,
        200
    );
    let salt_b = last_salt(&b);
    assert!(salt_a.is_string() && salt_b.is_string());
    assert_ne!(salt_a, salt_b);
    assert!(!salt_a.as_str().unwrap().contains("sk-tenant"), "{salt_a}");
    // B naming A's salt as its id lands under B's key, not in A's tenant.
    let claim = [
        ("authorization", kb),
        ("x-prefix-aware-id", salt_a.as_str().unwrap()),
    ];
    assert_eq!(post(&c, &url, &body, &claim).await.status, 200);
    let scoped = last_salt(&b);
    assert_ne!(scoped, salt_a);
    assert!(
        scoped
            .as_str()
            .unwrap()
            .starts_with(salt_b.as_str().unwrap()),
        "{scoped}"
    );
    // So does a client-sent cache_salt: the forwarded one is the key's.
    let mut forged = body.clone();
    forged["cache_salt"] = salt_a.clone();
    assert_eq!(
        post(&c, &url, &forged, &[("authorization", kb)])
            .await
            .status,
        200
    );
    assert_ne!(last_salt(&b), salt_a);
    // No key: 401 in the OpenAI shape, nothing forwarded.
    let n = b.count();
    let e = post(&c, &url, &body, &[("x-prefix-aware-id", "a")])
        .await
        .error(401);
    assert_eq!(e["code"], "invalid_token");
    assert_eq!(b.count(), n);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_tenants_can_refuse_client_ids() {
    let b = TestBackend::start("b").await;
    let r = router_with(&b, "{from: api_key, client_ids: refuse}").await;
    let c = client();
    let url = r.url("/v1/chat/completions");
    let key = ("authorization", "Bearer sk-a");
    let body = chat("m", "doc", "q");
    assert_eq!(post(&c, &url, &body, &[key]).await.status, 200);
    let e = post(&c, &url, &body, &[key, ("x-prefix-aware-id", "x")])
        .await
        .error(403);
    assert_eq!(e["code"], "tenant_id_not_allowed");
    let mut keyed = body.clone();
    keyed["prompt_cache_key"] = json!("x");
    post(&c, &url, &keyed, &[key]).await.error(403);
    // The native API follows the same rule.
    let inv = r.url("/invocations");
    let raw = json!({"model": "m", "inputs": "x"});
    let e = post(&c, &inv, &raw, &[key, ("x-prefix-aware-id", "x")]).await;
    assert_eq!(e.error(403)["code"], "tenant_id_not_allowed");
    post(&c, &inv, &raw, &[]).await.error(401);
    assert_eq!(b.count(), 1, "refused requests are not forwarded");
    assert_eq!(post(&c, &inv, &raw, &[key]).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_only_tenants_share_the_engine_cache() {
    let b = TestBackend::start("b").await;
    let r = router_with(&b, "{isolation: route_only}").await;
    let c = client();
    let ids: Vec<u32> = (0..64).collect();
    let query = json!({"model": "m", "prompt": ids});
    let hashes = |t: &'static str| {
        let (c, url, q) = (&c, r.url("/cache-index/query"), query.to_string());
        async move {
            let got = send(c, request("POST", &url, q, &[("x-prefix-aware-id", t)])).await;
            assert_eq!(got.status, 200);
            let v = got.json();
            assert_eq!(v["tenant"], t);
            v["block_hashes"].clone()
        }
    };
    let (ha, hb) = (hashes("a").await, hashes("b").await);
    assert_eq!(ha.as_array().unwrap().len(), 4);
    assert_eq!(
        ha, hb,
        "route_only: the tenants' blocks are the same blocks"
    );
    let url = r.url("/v1/completions");
    let got = post(&c, &url, &query, &[("x-prefix-aware-id", "a")]).await;
    assert_eq!(got.status, 200);
    assert!(b
        .requests()
        .last()
        .unwrap()
        .json()
        .get("cache_salt")
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_isolation_salts_block_hashes_per_tenant() {
    // The default, for contrast with route_only above.
    let b = TestBackend::start("b").await;
    let r = router_with(&b, "{}").await;
    let c = client();
    let query = json!({"model": "m", "prompt": (0..64).collect::<Vec<u32>>()}).to_string();
    let mut seen = Vec::new();
    for t in ["a", "b"] {
        let url = r.url("/cache-index/query");
        let got = send(
            &c,
            request("POST", &url, query.clone(), &[("x-prefix-aware-id", t)]),
        )
        .await;
        seen.push(got.json()["block_hashes"].clone());
    }
    assert_ne!(seen[0], seen[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_prompt_cache_keys_are_hashed_into_the_salt() {
    let b = TestBackend::start("b").await;
    let r = router_with(&b, "{}").await;
    let c = client();
    let url = r.url("/v1/chat/completions");
    let mut body = chat("m", "doc", "q");
    body["prompt_cache_key"] = json!("k".repeat(200));
    assert_eq!(post(&c, &url, &body, &[]).await.status, 200);
    let salt = last_salt(&b);
    let s = salt.as_str().unwrap();
    assert!(s.starts_with("pck:") && s.len() <= 64, "{s}");
    assert_eq!(post(&c, &url, &body, &[]).await.status, 200);
    assert_eq!(last_salt(&b), salt, "the hash is stable");
    body["prompt_cache_key"] = json!("k".repeat(1025));
    let e = post(&c, &url, &body, &[]).await.error(400);
    assert_eq!(e["code"], "invalid_tenant");
    // The SageMaker-style header keeps its 64-character limit.
    let long = "k".repeat(65);
    let e = post(
        &c,
        &url,
        &chat("m", "doc", "q"),
        &[("x-prefix-aware-id", long.as_str())],
    )
    .await;
    assert_eq!(e.error(400)["code"], "invalid_tenant");
}

/// `POST /cache-index/query` answers for the caller's own tenant only
/// (issue 17 item 6): under `from: api_key` the tenant is the caller's key's,
/// as for a proxied request; naming another with `X-Warmpath-Tenant` is a
/// 403 unless the admin token is presented, and the admin sees exactly what
/// that tenant sees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_answer_for_the_callers_own_tenant_only() {
    let b = TestBackend::start("b").await;
    let pool = "    strategy: prefix_aware\n    tenants: {from: api_key}";
    let open = yaml_router("", pool, &[&b]).await;
    let guarded = yaml_router("admin_token: adm\ninspect_token: ins", pool, &[&b]).await;
    let c = client();
    let query = json!({"model": "m", "prompt": (0..64).collect::<Vec<u32>>()}).to_string();
    let ask = |r: &RouterProcess, headers: &[(&str, &str)]| {
        let req = request("POST", &r.url("/cache-index/query"), query.clone(), headers);
        send(&c, req)
    };
    let (ka, kb) = (
        ("authorization", "Bearer sk-a"),
        ("authorization", "Bearer sk-b"),
    );
    let a = ask(&open, &[ka]).await.json();
    let id_a = a["tenant"].as_str().unwrap().to_owned();
    assert_eq!(id_a, warmpath_core::TenantId::from_api_key("sk-a").as_str());
    let name_a = ("x-warmpath-tenant", id_a.as_str());
    // Naming one's own tenant is fine; naming another's is refused.
    assert_eq!(
        ask(&open, &[ka, name_a]).await.json()["block_hashes"],
        a["block_hashes"]
    );
    let e = ask(&open, &[kb, name_a]).await.error(403);
    assert_eq!(e["code"], "tenant_not_allowed");
    // B claiming A's id as a client id stays in B's tenant: other hashes.
    let claim = ask(&open, &[kb, ("x-prefix-aware-id", id_a.as_str())])
        .await
        .json();
    assert_ne!(claim["tenant"], a["tenant"]);
    assert_ne!(claim["block_hashes"], a["block_hashes"]);
    ask(&open, &[]).await.error(401);
    // With tokens: the admin may name any tenant and sees what it sees.
    let (adm, ins) = (
        ("authorization", "Bearer adm"),
        ("authorization", "Bearer ins"),
    );
    let seen = ask(&guarded, &[adm, name_a]).await.json();
    assert_eq!(seen["tenant"], a["tenant"]);
    assert_eq!(seen["block_hashes"], a["block_hashes"]);
    let e = ask(&guarded, &[ins, name_a]).await.error(403);
    assert_eq!(e["code"], "tenant_not_allowed");
    // The inspect token is no client's key: it sees its own, empty, tenant.
    let own = ask(&guarded, &[ins]).await.json();
    assert_eq!(
        own["tenant"],
        warmpath_core::TenantId::from_api_key("ins").as_str()
    );
    ask(&guarded, &[kb, name_a]).await.error(401);
    let e = ask(&guarded, &[adm, ("x-warmpath-tenant", "")])
        .await
        .error(400);
    assert_eq!(e["code"], "invalid_tenant");
    assert_eq!(b.count(), 0, "queries send nothing upstream");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_api_salts_api_key_tenants_and_refuses_body_ids() {
    let b = TestBackend::start("b").await;
    let r = router_with(&b, "{from: api_key}").await;
    let c = client();
    let inv = r.url("/invocations");
    let raw = json!({"model": "m", "inputs": "the same document"});
    let (ka, kb) = (
        ("authorization", "Bearer sk-a"),
        ("authorization", "Bearer sk-b"),
    );
    // Each key's tenant reaches the engine as cache_salt (the body went
    // unsalted, so every tenant shared one cache there).
    assert_eq!(post(&c, &inv, &raw, &[ka]).await.status, 200);
    let salt_a = last_salt(&b);
    assert_eq!(post(&c, &inv, &raw, &[kb]).await.status, 200);
    let salt_b = last_salt(&b);
    assert!(
        salt_a.is_string() && salt_b.is_string(),
        "{salt_a} {salt_b}"
    );
    assert_ne!(salt_a, salt_b);
    // A cache_salt of the client's own cannot name another tenant's cache:
    // it is scoped under the key.
    let mut claimed = raw.clone();
    claimed["cache_salt"] = salt_b.clone();
    assert_eq!(post(&c, &inv, &claimed, &[ka]).await.status, 200);
    assert_ne!(last_salt(&b), salt_b);
    // A body that is not a JSON object cannot carry the salt: refused.
    let got = send(&c, request("POST", &inv, "[0,0,0]", &[ka])).await;
    assert_eq!(got.error(400)["code"], "invalid_json");

    // client_ids: refuse covers ids in the native body too.
    let r = router_with(&b, "{from: api_key, client_ids: refuse}").await;
    let inv = r.url("/invocations");
    let before = b.count();
    for field in ["prompt_cache_key", "cache_salt"] {
        let mut body = raw.clone();
        body[field] = json!("someone-else");
        let e = post(&c, &inv, &body, &[ka]).await;
        assert_eq!(e.error(403)["code"], "tenant_id_not_allowed", "{field}");
    }
    assert_eq!(b.count(), before, "refused requests are not forwarded");
    assert_eq!(post(&c, &inv, &raw, &[ka]).await.status, 200);
}

//! deploy/kubernetes: every document parses, `kubectl kustomize` renders the
//! folder offline, the manifests agree with each other (ports, names, the
//! agents' worker ids and the routers' discovery), and the ConfigMap's
//! router.yaml passes the router's own `--check-config` with the environment
//! the Deployment gives it.

use crate::tools;

use serde::Deserialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use yaml_serde::Value;

const NAMESPACE: &str = "warmpath";

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

fn docs(text: &str, what: &str) -> Vec<Value> {
    yaml_serde::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{what}: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

fn read(name: &str) -> String {
    std::fs::read_to_string(dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn s<'a>(v: &'a Value, path: &str) -> &'a str {
    let mut cur = v;
    for key in path.split('.') {
        cur = match key.parse::<usize>() {
            Ok(i) => &cur[i],
            Err(_) => &cur[key],
        };
    }
    cur.as_str()
        .unwrap_or_else(|| panic!("{path} is not a string in {v:?}"))
}

/// Every object of the folder (kustomization.yaml and router.yaml aside).
fn objects() -> Vec<Value> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        if !name.ends_with(".yaml") || name == "kustomization.yaml" || name == "router.yaml" {
            continue;
        }
        out.extend(docs(&read(&name), &name));
    }
    out
}

fn find<'a>(objs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objs.iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

fn container<'a>(deploy: &'a Value, name: &str) -> &'a Value {
    deploy["spec"]["template"]["spec"]["containers"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn args(c: &Value) -> Vec<String> {
    c["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

fn flag<'a>(args: &'a [String], name: &str) -> &'a str {
    let i = args
        .iter()
        .position(|a| a == name)
        .unwrap_or_else(|| panic!("no {name} in {args:?}"));
    &args[i + 1]
}

fn port(svc: &Value, name: &str) -> u64 {
    svc["spec"]["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .and_then(|p| p["port"].as_u64())
        .unwrap_or_else(|| panic!("no port {name}"))
}

#[test]
fn every_document_parses_and_every_file_is_a_resource() {
    let k = &docs(&read("kustomization.yaml"), "kustomization.yaml")[0];
    let listed: BTreeSet<String> = k["resources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    let mut files = BTreeSet::new();
    for entry in std::fs::read_dir(dir()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name.ends_with(".yaml") && name != "kustomization.yaml" && name != "router.yaml" {
            for d in docs(&read(&name), &name) {
                for key in ["apiVersion", "kind"] {
                    assert!(d[key].is_string(), "{name}: a document without {key}");
                }
                assert!(
                    d["metadata"]["name"].is_string(),
                    "{name}: a nameless object"
                );
            }
            files.insert(name);
        }
    }
    assert_eq!(listed, files, "kustomization.yaml resources vs the folder");
    assert_eq!(
        s(k, "configMapGenerator.0.files.0"),
        "router.yaml",
        "router.yaml is the ConfigMap"
    );
    assert_eq!(s(k, "namespace"), NAMESPACE);
    docs(&read("router.yaml"), "router.yaml");
}

#[test]
fn the_manifests_agree_with_each_other() {
    let objs = objects();
    let router = find(&objs, "Deployment", "warmpath-router");
    assert_eq!(router["spec"]["replicas"].as_u64(), Some(2));
    let rc = container(router, "router");
    assert_eq!(s(rc, "livenessProbe.httpGet.path"), "/livez");
    assert_eq!(s(rc, "readinessProbe.httpGet.path"), "/readyz");
    let router_labels = &router["spec"]["template"]["metadata"]["labels"];
    let pdb = find(&objs, "PodDisruptionBudget", "warmpath-router");
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], router_labels);

    let clients = find(&objs, "Service", "warmpath-router");
    assert_eq!(&clients["spec"]["selector"], router_labels);
    let agents_svc = find(&objs, "Service", "warmpath-router-agents");
    assert_eq!(s(agents_svc, "spec.clusterIP"), "None", "headless");
    assert_eq!(&agents_svc["spec"]["selector"], router_labels);
    let engines_svc = find(&objs, "Service", "vllm-engines");
    assert_eq!(s(engines_svc, "spec.clusterIP"), "None", "headless");

    let config = &docs(&read("router.yaml"), "router.yaml")[0];
    let grpc_port = s(config, "grpc_listen").rsplit(':').next().unwrap();
    assert_eq!(port(agents_svc, "grpc").to_string(), grpc_port);
    let http_port = s(config, "listen").rsplit(':').next().unwrap();
    assert_eq!(port(clients, "http").to_string(), http_port);

    // The routers find the engines through the headless Service...
    let dns = &config["pools"][0]["discovery"][0]["dns"];
    assert_eq!(
        s(dns, "name"),
        format!("vllm-engines.{NAMESPACE}.svc.cluster.local")
    );
    let engine_port = port(engines_svc, "http");
    assert_eq!(dns["port"].as_u64(), Some(engine_port));

    // ...and each agent names its engine as they do (http://POD_IP:PORT), and
    // reaches every router replica through theirs.
    let engines = find(&objs, "Deployment", "vllm");
    let agent = container(engines, "agent");
    let a = args(agent);
    assert_eq!(flag(&a, "--worker-id-from-env"), "POD_IP");
    assert_eq!(
        flag(&a, "--worker-id-template"),
        format!("http://{{}}:{engine_port}")
    );
    assert_eq!(
        flag(&a, "--router"),
        format!("dns://warmpath-router-agents.{NAMESPACE}.svc.cluster.local:{grpc_port}")
    );
    assert_eq!(
        flag(&a, "--model"),
        s(config, "pools.0.model"),
        "agent and pool"
    );
    let pod_ip = agent["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "POD_IP")
        .expect("POD_IP in the agent's env");
    assert_eq!(s(pod_ip, "valueFrom.fieldRef.fieldPath"), "status.podIP");
    assert_eq!(s(&agent["livenessProbe"], "httpGet.path"), "/livez");
    assert_eq!(s(&agent["readinessProbe"], "httpGet.path"), "/readyz");

    // vLLM publishes where the agent reads, with the pool's block size and name.
    let v = args(container(engines, "vllm"));
    let kv: serde_json::Value = serde_json::from_str(flag(&v, "--kv-events-config")).unwrap();
    assert_eq!(kv["enable_kv_cache_events"], true);
    let local = |ep: &serde_json::Value| ep.as_str().unwrap().replace("tcp://*", "tcp://127.0.0.1");
    assert_eq!(flag(&a, "--kv-events"), local(&kv["endpoint"]));
    assert_eq!(flag(&a, "--kv-replay"), local(&kv["replay_endpoint"]));
    assert_eq!(flag(&a, "--topic"), kv["topic"].as_str().unwrap());
    assert_eq!(flag(&v, "--port"), engine_port.to_string());
    assert_eq!(
        flag(&v, "--block-size"),
        config["pools"][0]["block_size"]
            .as_u64()
            .unwrap()
            .to_string()
    );
    assert_eq!(flag(&v, "--served-model-name"), s(config, "pools.0.model"));

    for name in ["warmpath-router", "vllm-engines"] {
        find(&objs, "ServiceMonitor", name);
    }
    pods_prove_who_they_are(&objs, config);
}

/// Each agent presents its own pod's projected token of the audience the
/// routers review, from the file the volume mounts; no engine container
/// reads the Secret; the routers' account may review tokens and get pods,
/// and the engines' account nothing.
fn pods_prove_who_they_are(objs: &[Value], config: &Value) {
    let engines = find(objs, "Deployment", "vllm");
    let pod = &engines["spec"]["template"]["spec"];
    let agent = container(engines, "agent");
    let a = args(agent);
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| !v["projected"].is_null())
        .expect("a projected token volume");
    let source = &volume["projected"]["sources"][0]["serviceAccountToken"];
    assert_eq!(
        s(source, "audience"),
        s(config, "ingest.pod_token_audience")
    );
    let mount = agent["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume["name"])
        .expect("the agent mounts the token");
    assert_eq!(
        flag(&a, "--agent-token-file"),
        format!("{}/{}", s(mount, "mountPath"), s(source, "path"))
    );
    let engine_yaml = read("vllm-deployment.yaml");
    assert!(
        !engine_yaml.contains("secretKeyRef") && !engine_yaml.contains("WARMPATH_AGENT_TOKEN"),
        "an engine pod holds no secret of the routers'"
    );
    let engine_sa = find(objs, "ServiceAccount", s(pod, "serviceAccountName"));
    assert_eq!(
        engine_sa["automountServiceAccountToken"].as_bool(),
        Some(false)
    );
    assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(false));
    let bindings_of = |sa: &str| -> Vec<&Value> {
        objs.iter()
            .filter(|o| o["kind"] == "RoleBinding" || o["kind"] == "ClusterRoleBinding")
            .filter(|b| {
                b["subjects"]
                    .as_sequence()
                    .unwrap()
                    .iter()
                    .any(|x| x["kind"] == "ServiceAccount" && x["name"] == sa)
            })
            .collect()
    };
    assert!(bindings_of(s(pod, "serviceAccountName")).is_empty());

    let router = find(objs, "Deployment", "warmpath-router");
    let sa = s(router, "spec.template.spec.serviceAccountName");
    find(objs, "ServiceAccount", sa);
    let mut granted = BTreeSet::new();
    for b in bindings_of(sa) {
        let role = find(objs, s(b, "roleRef.kind"), s(b, "roleRef.name"));
        for rule in role["rules"].as_sequence().unwrap() {
            for res in rule["resources"].as_sequence().unwrap() {
                for verb in rule["verbs"].as_sequence().unwrap() {
                    granted.insert(format!(
                        "{} {} {}",
                        s(role, "kind"),
                        res.as_str().unwrap(),
                        verb.as_str().unwrap()
                    ));
                }
            }
        }
    }
    let want: BTreeSet<String> = ["ClusterRole tokenreviews create", "Role pods get"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(granted, want, "the routers' account may do this, no more");
    let env: Vec<&str> = container(router, "router")["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| s(e, "name"))
        .collect();
    assert!(env.contains(&"WARMPATH_AGENT_SECRET") && !env.contains(&"WARMPATH_AGENT_TOKEN"));
}

/// Runs `kubectl kustomize` on the folder: (rendered objects) or None when
/// kubectl is absent (Debian's `kubernetes-client`; `.ci/run` installs it).
fn kustomize() -> Option<Vec<Value>> {
    let out = match Command::new("kubectl").arg("kustomize").arg(dir()).output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tools::missing(
                "kubectl",
                "`kubectl kustomize deploy/kubernetes` (Debian's `kubernetes-client`)",
            );
            return None;
        }
        Err(e) => panic!("running kubectl: {e}"),
    };
    assert!(
        out.status.success(),
        "kubectl kustomize failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(docs(&String::from_utf8(out.stdout).unwrap(), "rendered"))
}

#[test]
fn kustomize_renders_the_folder_offline() {
    let Some(objs) = kustomize() else { return };
    let cm = objs
        .iter()
        .find(|o| o["kind"] == "ConfigMap")
        .expect("the router ConfigMap");
    let cm_name = s(cm, "metadata.name");
    assert!(cm_name.starts_with("warmpath-router-"), "hashed: {cm_name}");
    assert_eq!(
        cm["data"]["router.yaml"].as_str(),
        Some(read("router.yaml").as_str())
    );
    let router = find(&objs, "Deployment", "warmpath-router");
    let volumes = router["spec"]["template"]["spec"]["volumes"]
        .as_sequence()
        .unwrap();
    assert!(
        volumes.iter().any(|v| v["configMap"]["name"] == cm_name),
        "the Deployment mounts the hashed ConfigMap"
    );
    for o in &objs {
        if o["kind"] == "ClusterRole" || o["kind"] == "ClusterRoleBinding" {
            // Cluster-scoped; the binding's account is the namespace's.
            if o["kind"] == "ClusterRoleBinding" {
                assert_eq!(s(o, "subjects.0.namespace"), NAMESPACE, "{o:?}");
            }
        } else if o["kind"] != "Namespace" {
            assert_eq!(s(o, "metadata.namespace"), NAMESPACE, "{o:?}");
        }
    }
}

fn check_config(config: &Path, env: &[(String, String)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_warmpath-router"));
    cmd.arg("--check-config").arg("--config").arg(config);
    for var in [
        "WARMPATH_ADMIN_TOKEN",
        "WARMPATH_INSPECT_TOKEN",
        "WARMPATH_AGENT_TOKEN",
        "WARMPATH_AGENT_SECRET",
    ] {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    cmd.output().unwrap()
}

#[test]
fn the_configmap_passes_the_routers_check_with_the_deployments_env() {
    let objs = objects();
    let rc = container(find(&objs, "Deployment", "warmpath-router"), "router");
    assert_eq!(args(rc), ["--config", "/etc/warmpath/router.yaml"]);
    // The Deployment's env, its Secret values stood in by fixed strings.
    let env: Vec<(String, String)> = rc["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|e| {
            (
                s(e, "name").to_owned(),
                "k8s-test-token-0123456789".to_owned(),
            )
        })
        .collect();
    let out = check_config(&dir().join("router.yaml"), &env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "--check-config refused it: {stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("configuration OK"));

    // Without the Secret's tokens the same file is refused (open listeners):
    // the check is real, and the env names above are the ones it reads.
    let out = check_config(&dir().join("router.yaml"), &[]);
    assert!(!out.status.success(), "accepted without tokens");
}

#[test]
fn check_config_refuses_a_bad_file_without_starting() {
    let tmp = tempfile::tempdir().unwrap();
    let bad = tmp.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "listen: 127.0.0.1:0\npools:\n  - model: m\n    block_size: 0\n    backends: [{url: 'http://127.0.0.1:9'}]\n",
    )
    .unwrap();
    let out = check_config(&bad, &[]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("block_size"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let good = tmp.path().join("good.yaml");
    std::fs::write(
        &good,
        "listen: 127.0.0.1:0\npools:\n  - model: m\n    backends: [{url: 'http://127.0.0.1:9'}]\n",
    )
    .unwrap();
    let out = check_config(&good, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "configuration OK: 1 pool(s)"
    );
}

// The `discovery-kubernetes` Component: the same deployment with the
// routers watching EndpointSlices (RBAC included) instead of DNS.

fn component(name: &str) -> String {
    read(&format!("discovery-kubernetes/{name}"))
}

#[test]
fn the_kubernetes_discovery_component_agrees_with_the_base() {
    let objs = objects();
    let base = &docs(&read("router.yaml"), "router.yaml")[0];
    let mut variant = docs(&component("router.yaml"), "component router.yaml")[0].clone();
    // Its config is the base's but for the discovery block.
    let k = variant["pools"][0]["discovery"][0]["kubernetes"].clone();
    let engines_svc = find(&objs, "Service", "vllm-engines");
    assert_eq!(s(&k, "namespace"), NAMESPACE);
    assert_eq!(s(&k, "service"), s(engines_svc, "metadata.name"));
    assert_eq!(port(engines_svc, s(&k, "port_name")), 8000);
    // An endpoint's id is its URL, as the agents' --worker-id-template: the
    // `worker_id` key is gone (the router refuses a file that sets it).
    assert!(k.get("worker_id").is_none(), "{k:?}");
    variant["pools"][0]["discovery"] = base["pools"][0]["discovery"].clone();
    assert_eq!(&variant, base, "only the discovery block differs");

    // The router's service account may read endpointslices, no more.
    let kz = &docs(&component("kustomization.yaml"), "component kustomization")[0];
    assert_eq!(s(kz, "kind"), "Component");
    let rbac = docs(&component("rbac.yaml"), "rbac.yaml");
    let sa = find(&objs, "ServiceAccount", "warmpath-router");
    let role = rbac.iter().find(|o| o["kind"] == "Role").expect("a Role");
    let rules = role["rules"].as_sequence().unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(s(&rules[0], "apiGroups.0"), "discovery.k8s.io");
    assert_eq!(s(&rules[0], "resources.0"), "endpointslices");
    let verbs: Vec<&str> = rules[0]["verbs"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(verbs, ["get", "list", "watch"]);
    let binding = rbac
        .iter()
        .find(|o| o["kind"] == "RoleBinding")
        .expect("a RoleBinding");
    assert_eq!(s(binding, "roleRef.name"), s(role, "metadata.name"));
    assert_eq!(s(binding, "subjects.0.kind"), "ServiceAccount");
    assert_eq!(s(binding, "subjects.0.name"), s(sa, "metadata.name"));
    assert_eq!(s(binding, "subjects.0.namespace"), NAMESPACE);
    assert_eq!(
        s(
            find(&objs, "Deployment", "warmpath-router"),
            "spec.template.spec.serviceAccountName"
        ),
        s(sa, "metadata.name"),
        "the Deployment runs as that account"
    );
}

#[test]
fn the_kubernetes_discovery_config_passes_the_routers_check() {
    let env: Vec<(String, String)> = ["WARMPATH_ADMIN_TOKEN", "WARMPATH_AGENT_SECRET"]
        .iter()
        .map(|k| ((*k).to_owned(), "k8s-test-token-0123456789".to_owned()))
        .collect();
    let out = check_config(&dir().join("discovery-kubernetes/router.yaml"), &env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if cfg!(feature = "kubernetes") {
        assert!(out.status.success(), "--check-config refused it: {stderr}");
    } else {
        assert!(stderr.contains("`kubernetes` cargo feature"), "{stderr}");
    }
}

#[test]
fn kustomize_renders_the_base_with_the_component() {
    // kustomize takes only relative paths to a base: an overlay in target/.
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let deploy = dir().canonicalize().unwrap();
    let here = tmp.path().canonicalize().unwrap();
    let common = deploy
        .ancestors()
        .find(|a| here.starts_with(a))
        .unwrap()
        .to_owned();
    let up = "../".repeat(here.strip_prefix(&common).unwrap().components().count());
    let rel = format!("{up}{}", deploy.strip_prefix(&common).unwrap().display());
    std::fs::write(
        tmp.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: {NAMESPACE}\nresources:\n  - {rel}\ncomponents:\n  - {rel}/discovery-kubernetes\n"
        ),
    )
    .unwrap();
    let out = match Command::new("kubectl")
        .arg("kustomize")
        .arg(tmp.path())
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tools::missing("kubectl", "the discovery-kubernetes Component");
            return;
        }
        Err(e) => panic!("running kubectl: {e}"),
    };
    assert!(
        out.status.success(),
        "kubectl kustomize failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let objs = docs(&String::from_utf8(out.stdout).unwrap(), "rendered");
    let cm = objs.iter().find(|o| o["kind"] == "ConfigMap").unwrap();
    assert_eq!(
        cm["data"]["router.yaml"].as_str(),
        Some(component("router.yaml").as_str()),
        "the component's config replaces the base's"
    );
    let router = find(&objs, "Deployment", "warmpath-router");
    assert_eq!(
        s(router, "spec.template.spec.serviceAccountName"),
        "warmpath-router"
    );
    for kind in ["ServiceAccount", "Role", "RoleBinding"] {
        let o = objs.iter().find(|o| o["kind"] == kind).unwrap();
        assert_eq!(s(o, "metadata.namespace"), NAMESPACE, "{kind}");
    }
}

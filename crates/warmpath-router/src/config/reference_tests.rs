//! `docs/configuration.md` is generated from the config types: every key a
//! YAML file may set, its default and the first sentence of its doc comment,
//! read from this folder's sources (and `KvConfig`'s in warmpath-core).
//! The test fails on any difference, so the page cannot drift; regenerate
//! it with `WARMPATH_BLESS=1 cargo test -p warmpath-router --lib reference`.

use super::RouterConfig;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One field of a config struct, as its source declares it.
struct Field {
    name: String,
    ty: String,
    doc: String,
}

/// The `pub struct`s of `text` and their `pub` fields, with doc comments.
fn structs_of(text: &str, out: &mut BTreeMap<String, Vec<Field>>) {
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line
            .strip_prefix("pub struct ")
            .and_then(|r| r.strip_suffix(" {"))
        else {
            continue;
        };
        let mut fields = Vec::new();
        let mut doc = Vec::new();
        for l in lines.by_ref() {
            if l == "}" {
                break;
            }
            let t = l.trim();
            if let Some(d) = t.strip_prefix("///") {
                doc.push(d.trim().to_owned());
            } else if let Some((n, ty)) = t
                .strip_prefix("pub ")
                .and_then(|r| r.strip_suffix(','))
                .and_then(|r| r.split_once(": "))
            {
                fields.push(Field {
                    name: n.to_owned(),
                    ty: ty.to_owned(),
                    doc: doc.join(" "),
                });
                doc.clear();
            } else if !t.starts_with("#[") {
                doc.clear();
            }
        }
        out.insert(name.to_owned(), fields);
    }
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Every config struct: this folder's and warmpath-core's policy tuning.
fn structs() -> BTreeMap<String, Vec<Field>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    rust_files(&root.join("src/config"), &mut files);
    rust_files(&root.join("../warmpath-core/src/policy"), &mut files);
    let mut out = BTreeMap::new();
    for f in files {
        structs_of(&std::fs::read_to_string(&f).unwrap_or_default(), &mut out);
    }
    out
}

/// `Option<X>`, `Vec<X>` → (`X`, the key suffix for a list).
fn inner(ty: &str) -> (&str, &str) {
    if let Some(t) = ty.strip_prefix("Option<").and_then(|t| t.strip_suffix('>')) {
        return (inner(t).0, inner(t).1);
    }
    if let Some(t) = ty.strip_prefix("Vec<").and_then(|t| t.strip_suffix('>')) {
        return (t, "[]");
    }
    (ty, "")
}

/// The first sentence of a doc comment (a period outside brackets and
/// code, followed by a space).
fn sentence(doc: &str) -> String {
    let (mut depth, mut code) = (0i32, false);
    let mut cut = doc.len();
    for (i, c) in doc.char_indices() {
        match c {
            '`' => code = !code,
            '(' | '[' if !code => depth += 1,
            ')' | ']' if !code => depth -= 1,
            '.' if !code && depth <= 0 && doc[i + 1..].starts_with(' ') => {
                let before = &doc[..i];
                if !before.ends_with("e.g") && !before.ends_with("i.e") {
                    cut = i;
                    break;
                }
            }
            _ => {}
        }
    }
    doc[..cut].trim_end_matches('.').replace('|', "\\|")
}

/// One row of the page.
struct Row {
    key: String,
    default: String,
    what: String,
    kv: bool,
}

fn shown(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "—".to_owned(),
        Some(Value::String(s)) if s.is_empty() => "\"\"".to_owned(),
        Some(Value::String(s)) => format!("`{s}`"),
        Some(Value::Array(a)) if a.is_empty() => "`[]`".to_owned(),
        Some(v) => format!("`{v}`"),
    }
}

/// The rows of struct `name` at `prefix`, its defaults in `defaults`.
fn walk(
    all: &BTreeMap<String, Vec<Field>>,
    name: &str,
    prefix: &str,
    defaults: Option<&Value>,
    kv: bool,
    out: &mut Vec<Row>,
) {
    for f in &all[name] {
        let key = format!("{prefix}{}", f.name);
        let (ty, list) = inner(&f.ty);
        let d = defaults.and_then(|d| d.get(&f.name));
        // A list's defaults are those of its sample's first item.
        let d_item = if list.is_empty() {
            d
        } else {
            d.and_then(|v| v.get(0))
        };
        match all.get(ty) {
            Some(_) if ty != "Secret" => {
                let kv = kv || f.name == "kv";
                walk(all, ty, &format!("{key}{list}."), d_item, kv, out);
            }
            _ => out.push(Row {
                key,
                default: if list.is_empty() {
                    shown(d)
                } else {
                    "`[]`".to_owned()
                },
                what: sentence(&f.doc),
                kv,
            }),
        }
    }
}

/// A config with one of each list item, so every nested default shows.
const SAMPLE: &str = "pools:\n  - model: MODEL\n    backends: [{url: 'http://engine:8000'}]\n    discovery:\n      - dns: {name: NAME, port: 8000}\n      - kubernetes: {service: SERVICE}\n";

fn page() -> (String, usize) {
    let all = structs();
    let sample = RouterConfig::from_yaml(SAMPLE).expect("the sample parses");
    let mut defaults = serde_json::to_value(&sample).expect("the config serializes");
    // The sample's own values are not defaults; both providers' defaults
    // stand at `discovery[0]`.
    let p = &mut defaults["pools"][0];
    p["model"] = Value::Null;
    p["backends"][0]["url"] = Value::Null;
    let mut dns = p["discovery"][0]["dns"].take();
    let mut kubernetes = p["discovery"][1]["kubernetes"].take();
    dns["name"] = Value::Null;
    dns["port"] = Value::Null;
    kubernetes["service"] = Value::Null;
    p["discovery"] = serde_json::json!([{"dns": dns, "kubernetes": kubernetes}]);
    let mut rows = Vec::new();
    walk(&all, "RouterConfig", "", Some(&defaults), false, &mut rows);
    let knobs = rows.iter().filter(|r| !r.kv).count();
    let kv = rows.len() - knobs;
    let mut md = format!(
        "# Router configuration\n\n\
         Generated from the config types by `crates/warmpath-router/src/config/reference_tests.rs`;\n\
         do not edit by hand (`WARMPATH_BLESS=1 cargo test -p warmpath-router --lib reference`).\n\
         Every key a YAML file (`--config`) may set, with its default; `—` is unset.\n\
         Annotated example: [examples/router.yaml](../examples/router.yaml).\n\n\
         **{knobs} router knobs**, and {kv} of kv_aware under `pools[].kv`.\n"
    );
    let mut section = String::new();
    for r in &rows {
        let top = r.key.split(['.', '[']).next().unwrap_or("").to_owned();
        let head = if r.key.contains('.') || r.key.contains('[') {
            top.clone()
        } else {
            "(top level)".to_owned()
        };
        if head != section {
            md.push_str(&format!(
                "\n## {head}\n\n| key | default | what |\n|---|---|---|\n"
            ));
            section = head;
        }
        md.push_str(&format!("| `{}` | {} | {} |\n", r.key, r.default, r.what));
    }
    (md, knobs)
}

#[test]
fn the_configuration_reference_is_generated_from_the_types() {
    let (md, _) = page();
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    if std::env::var_os("WARMPATH_BLESS").is_some() {
        std::fs::write(&path, &md).expect("docs/configuration.md is writable");
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == md,
        "docs/configuration.md differs from the config types: regenerate it with \
         WARMPATH_BLESS=1 cargo test -p warmpath-router --lib reference"
    );
}

#[test]
fn every_key_has_a_description_and_the_walk_sees_nested_lists() {
    let (md, knobs) = page();
    assert!(md.contains("| `pools[].backends[].url` |"), "{md}");
    assert!(
        md.contains("| `pools[].discovery[].kubernetes.service` |"),
        "{md}"
    );
    assert!(md.contains("| `pools[].kv.min_match_blocks` |"), "{md}");
    assert!(knobs > 10, "{knobs}");
    for line in md.lines().filter(|l| l.starts_with("| `")) {
        assert!(!line.ends_with("|  |"), "no description: {line}");
    }
}

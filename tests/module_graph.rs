//! Workspace-wide source check: no two modules of a crate import each other,
//! directly or through a cycle. Reads `crates/*/src`, takes every
//! `crate::…` / `super::…` path (use trees included) in code outside
//! `#[cfg(test)]`, resolves it to the longest module it names, and looks for
//! strongly connected components. Imports of an ancestor are edges like any
//! other (a child using its parent's items while the parent calls into the
//! child is a pair importing each other); declaring a child (`mod x;`) is not.
//! There are no exceptions: the last (`warmpath-core`'s `policy`, whose
//! `mod.rs` defined what its children import) was broken by moving those items
//! to `crate::route`. Hosted by the smallest crate so that it builds fast.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`; `lib.rs`/`main.rs` the root.
fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Module = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    if parts.first().map(String::as_str) == Some("bin") {
        parts.clear(); // a binary's root: not part of the library's graph
    }
    parts
}

/// The code without comments, string and char literals and `#[cfg(test)]`
/// items.
fn code_of(text: &str) -> String {
    without_test_items(&without_literals(text))
}

/// Drops each `#[cfg(test)]` item: up to its `;`, or its balanced `{…}`.
fn without_test_items(code: &str) -> String {
    const MARK: &str = "#[cfg(test)]";
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let b = rest.as_bytes();
        let mut i = at + MARK.len();
        let mut depth = 0usize;
        while i < b.len() {
            match b[i] {
                b';' if depth == 0 => {
                    i += 1;
                    break;
                }
                b'{' => depth += 1,
                b'}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        i += 1;
                        break;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        rest = &rest[i.min(rest.len())..];
    }
    out.push_str(rest);
    out
}

/// The code without comments and string or char literals (each literal
/// becomes `""`), so that neither can look like a path.
fn without_literals(text: &str) -> String {
    let b = text.as_bytes();
    let (mut out, mut i) = (String::with_capacity(b.len()), 0);
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                    i += 1;
                }
                i += 2;
            }
            b'\'' if b.get(i + 2) == Some(&b'\'') => i += 3,
            b'\'' if b.get(i + 1) == Some(&b'\\') => {
                i += 2;
                while i < b.len() && b[i] != b'\'' {
                    i += 1;
                }
                i += 1;
            }
            b'"' => {
                i += 1;
                while i < b.len() && b[i] != b'"' {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            b'r' if b.get(i + 1) == Some(&b'#') || b.get(i + 1) == Some(&b'"') => {
                // raw string r"…" / r#"…"#
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) != Some(&b'"') || (i > 0 && is_ident(b[i - 1])) {
                    out.push('r');
                    i += 1;
                    continue;
                }
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                j += 1;
                while j < b.len() && !b[j..].starts_with(&close) {
                    j += 1;
                }
                i = j + close.len();
                out.push_str("\"\"");
            }
            c => {
                out.push(c as char);
                i += 1;
            }
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Tokens: identifiers, `::`, `{`, `}`, `,` (everything else is a separator).
fn tokens(code: &str) -> Vec<String> {
    let b = code.as_bytes();
    let (mut out, mut i) = (Vec::new(), 0);
    while i < b.len() {
        if is_ident(b[i]) {
            let s = i;
            while i < b.len() && is_ident(b[i]) {
                i += 1;
            }
            out.push(code[s..i].to_owned());
        } else if b[i] == b':' && b.get(i + 1) == Some(&b':') {
            out.push("::".into());
            i += 2;
        } else {
            if matches!(b[i], b'{' | b'}' | b',') {
                out.push((b[i] as char).to_string());
            } else if !b[i].is_ascii_whitespace() {
                out.push(";".into());
            }
            i += 1;
        }
    }
    out
}

/// Every full path of the use tree starting at `t[*i]` (just after `::`).
fn tree(t: &[String], i: &mut usize, prefix: &Module, out: &mut Vec<Module>) {
    let mut path = prefix.clone();
    loop {
        match t.get(*i).map(String::as_str) {
            Some("{") => {
                *i += 1;
                loop {
                    tree(t, i, &path, out);
                    match t.get(*i).map(String::as_str) {
                        Some(",") => *i += 1,
                        Some("}") => {
                            *i += 1;
                            return;
                        }
                        _ => return,
                    }
                    if t.get(*i).map(String::as_str) == Some("}") {
                        *i += 1;
                        return;
                    }
                }
            }
            Some(id) if id.bytes().all(is_ident) => {
                path.push(id.to_owned());
                *i += 1;
                if t.get(*i).map(String::as_str) == Some("::") {
                    *i += 1;
                } else {
                    out.push(path);
                    return;
                }
            }
            _ => {
                out.push(path);
                return;
            }
        }
    }
}

/// The modules `module` names: `crate::…`, `super::…` and `self::…` paths
/// (use trees included), and paths that start with the name of one of
/// `children` (a child module named bare, as its parent may).
fn imports(module: &Module, children: &BTreeSet<String>, code: &str) -> Vec<Module> {
    let t = tokens(code);
    let mut out = Vec::new();
    let mut i = 0;
    while i < t.len() {
        let start = i;
        let preceded_by_path = start > 0 && t[start - 1] == "::";
        let followed_by_path = t.get(i + 1).map(String::as_str) == Some("::");
        let base: Option<Module> = match t[i].as_str() {
            "crate" => Some(Vec::new()),
            "super" => {
                let mut m = module.clone();
                m.pop();
                Some(m)
            }
            "self" => Some(module.clone()),
            child if children.contains(child) && followed_by_path => {
                // `child::…`: the path starts at the child's name.
                if !preceded_by_path {
                    tree(&t, &mut i, module, &mut out);
                    continue;
                }
                None
            }
            _ => None,
        };
        i += 1;
        let Some(mut base) = base.filter(|_| !preceded_by_path) else {
            continue;
        };
        if t.get(i).map(String::as_str) != Some("::") {
            continue;
        }
        i += 1;
        while t.get(i).map(String::as_str) == Some("super")
            && t.get(i + 1).map(String::as_str) == Some("::")
        {
            base.pop();
            i += 2;
        }
        tree(&t, &mut i, &base, &mut out);
    }
    out
}

/// Strongly connected components with more than one module (Tarjan).
fn cycles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct St<'a> {
        edges: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<&'a Module, (usize, usize)>,
        stack: Vec<&'a Module>,
        on: BTreeSet<&'a Module>,
        next: usize,
        out: Vec<Vec<Module>>,
    }
    fn visit<'a>(s: &mut St<'a>, v: &'a Module) {
        s.index.insert(v, (s.next, s.next));
        s.next += 1;
        s.stack.push(v);
        s.on.insert(v);
        for w in &s.edges[v] {
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.index[w].1.min(s.index[v].1);
                s.index.get_mut(v).unwrap().1 = low;
            } else if s.on.contains(w) {
                let low = s.index[w].0.min(s.index[v].1);
                s.index.get_mut(v).unwrap().1 = low;
            }
        }
        if s.index[v].0 == s.index[v].1 {
            let mut comp = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = St {
        edges,
        index: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// Every module of one crate's `src/` and its code (binaries aside).
fn crate_modules(src: &Path) -> BTreeMap<Module, String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    // Binaries are crates of their own: `src/bin/*` and `src/main.rs`.
    files
        .iter()
        .filter(|f| !f.starts_with(src.join("bin")) && **f != src.join("main.rs"))
        .map(|f| {
            (
                module_of(src, f),
                code_of(&std::fs::read_to_string(f).unwrap()),
            )
        })
        .collect()
}

/// The names of `m`'s child modules.
fn children_of(modules: &BTreeMap<Module, String>, m: &Module) -> BTreeSet<String> {
    modules
        .keys()
        .filter(|c| c.len() == m.len() + 1 && c.starts_with(m))
        .map(|c| c[m.len()].clone())
        .collect()
}

/// The module a path names: its longest prefix that is a module.
fn resolve(modules: &BTreeMap<Module, String>, path: &[String]) -> Module {
    (0..=path.len())
        .rev()
        .map(|k| path[..k].to_vec())
        .find(|p| modules.contains_key(p))
        .unwrap_or_default()
}

/// The import edges between the modules of one crate's `src/`.
fn crate_graph(src: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let modules = crate_modules(src);
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (m, code) in &modules {
        let children = children_of(&modules, m);
        let set = edges.entry(m.clone()).or_default();
        for path in imports(m, &children, code) {
            let target = resolve(&modules, &path);
            // An ancestor (or the module itself) is not an edge.
            if *m != target {
                set.insert(target);
            }
        }
    }
    edges
}

#[test]
fn no_module_pair_imports_each_other_in_any_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut found = Vec::new();
    let mut crates = 0;
    for entry in std::fs::read_dir(root.join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        let src = dir.join("src");
        if !src.is_dir() {
            continue;
        }
        crates += 1;
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        for comp in cycles(&crate_graph(&src)) {
            let names: Vec<String> = comp.iter().map(|m| m.join("::")).collect();
            found.push(format!("{name}: {}", names.join(" <-> ")));
        }
    }
    assert!(crates >= 5, "found only {crates} crates under crates/");
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

#[test]
fn the_checker_sees_a_cycle_through_use_trees_and_super() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "mod a; mod b; mod c;").unwrap();
    std::fs::write(
        src.join("a/mod.rs"),
        "mod inner; use crate::{c::X, b::{self, Y}};",
    )
    .unwrap();
    std::fs::write(
        src.join("a/inner.rs"),
        "use super::super::c::Z; // crate::b",
    )
    .unwrap();
    std::fs::write(
        src.join("b.rs"),
        "use super::a::inner::Q; const S: &str = \"crate::c\";",
    )
    .unwrap();
    std::fs::write(
        src.join("c.rs"),
        "#[cfg(test)]\nmod t;\n#[cfg(test)] mod u { use crate::a; }\nconst Q: char = '\"'; use crate::b;",
    )
    .unwrap();
    let g = crate_graph(src);
    let m = |s: &str| -> Module { s.split("::").map(str::to_owned).collect() };
    assert_eq!(g[&m("a")], [m("b"), m("c")].into_iter().collect());
    assert_eq!(g[&m("a::inner")], [m("c")].into_iter().collect());
    assert_eq!(g[&m("b")], [m("a::inner")].into_iter().collect());
    assert_eq!(
        g[&m("c")],
        [m("b")].into_iter().collect(),
        "test code and literals are not imports; code after them is"
    );
    // a -> c -> b -> a::inner -> c: one cycle of three (a::inner's parent
    // a is not an edge back).
    assert_eq!(cycles(&g), vec![vec![m("a::inner"), m("b"), m("c")]]);
    std::fs::write(src.join("b.rs"), "pub fn f() {}").unwrap();
    assert!(cycles(&crate_graph(src)).is_empty());
    // `self::` and a child named bare are imports too.
    std::fs::write(src.join("a/mod.rs"), "mod inner; fn f() { inner::g(); }").unwrap();
    std::fs::write(src.join("b.rs"), "use self::x; mod x;").unwrap();
    std::fs::write(src.join("c.rs"), "use crate::a::inner::Z;").unwrap();
    std::fs::write(src.join("a/inner.rs"), "use crate::c::Q;").unwrap();
    let g = crate_graph(src);
    assert_eq!(g[&m("a")], [m("a::inner")].into_iter().collect());
    assert_eq!(cycles(&g), vec![vec![m("a::inner"), m("c")]]);
    // A child importing its parent, which calls into it, is a pair too.
    std::fs::write(src.join("c.rs"), "pub fn h() {}").unwrap();
    std::fs::write(src.join("a/inner.rs"), "use super::P;").unwrap();
    std::fs::write(
        src.join("a/mod.rs"),
        "mod inner; pub struct P; fn f() { inner::g(); }",
    )
    .unwrap();
    assert_eq!(cycles(&crate_graph(src)), vec![vec![m("a"), m("a::inner")]]);
}

/// The breaks of the wing rules in the router crate at `src`.
fn wing_breaks(src: &Path) -> BTreeSet<String> {
    let modules = crate_modules(src);
    let mut found = BTreeSet::new();
    let name = |m: &Module| {
        if m.is_empty() {
            "lib".to_owned()
        } else {
            m.join("::")
        }
    };
    for (m, code) in &modules {
        let children = children_of(&modules, m);
        for path in imports(m, &children, code) {
            let to = resolve(&modules, &path);
            let (from_wing, to_wing) = (
                m.first().map_or("", String::as_str),
                to.first().map_or("", String::as_str),
            );
            // lib.rs defines nothing that lower modules import.
            let lib_item = to.is_empty() && !path.is_empty() && !m.is_empty();
            // Control does not import the API.
            let control_api = from_wing == "control" && to_wing == "api";
            // The data plane takes what it needs as arguments: not the
            // handlers' state, and decision sharing through a seam.
            let routing_up = from_wing == "routing"
                && (to.starts_with(&["control".to_owned(), "state".to_owned()])
                    || to_wing == "ingest");
            if lib_item {
                found.insert(format!("{} -> lib::{}", name(m), path.join("::")));
            } else if control_api || routing_up {
                found.insert(format!("{} -> {}", name(m), name(&to)));
            }
        }
    }
    found
}

#[test]
fn the_router_is_five_wings_and_keeps_their_rules() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crates/warmpath-router/src");
    let mut loose = BTreeSet::new();
    let mut folders = BTreeSet::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            folders.insert(name);
        } else {
            loose.insert(name);
        }
    }
    let set = |names: &[&str]| {
        names
            .iter()
            .map(|n| (*n).to_owned())
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(
        loose,
        set(&["lib.rs", "main.rs", "server.rs"]),
        "loose files"
    );
    assert_eq!(
        folders,
        set(&["api", "config", "control", "http", "ingest", "routing"]),
        "the five wings and the config"
    );
    let found = wing_breaks(&src);
    assert!(
        found.is_empty(),
        "imports that break the wing rules: {found:?}"
    );
}

#[test]
fn the_wing_rules_see_lib_items_control_to_api_and_routing_to_state() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    for w in ["api", "control", "routing", "ingest"] {
        std::fs::create_dir_all(src.join(w)).unwrap();
    }
    std::fs::write(
        src.join("lib.rs"),
        "mod api; mod control; mod routing; mod ingest; pub fn now() {}",
    )
    .unwrap();
    std::fs::write(src.join("api/mod.rs"), "pub mod tenancy;").unwrap();
    std::fs::write(src.join("api/tenancy.rs"), "use crate::now;").unwrap();
    std::fs::write(
        src.join("control/mod.rs"),
        "pub mod inspect; pub mod state;",
    )
    .unwrap();
    std::fs::write(
        src.join("control/inspect.rs"),
        "use crate::api::tenancy::Tenant; fn f() { super::super::api::tenancy::g(); }",
    )
    .unwrap();
    std::fs::write(src.join("control/state.rs"), "").unwrap();
    std::fs::write(src.join("ingest/mod.rs"), "pub mod peers;").unwrap();
    std::fs::write(src.join("ingest/peers.rs"), "").unwrap();
    std::fs::write(
        src.join("routing/mod.rs"),
        "pub mod proxy; use self::proxy::forward;",
    )
    .unwrap();
    std::fs::write(
        src.join("routing/proxy.rs"),
        "use crate::control::state::Shared; use crate::ingest::peers; // crate::api::x",
    )
    .unwrap();
    let found: Vec<String> = wing_breaks(src).into_iter().collect();
    assert_eq!(
        found,
        [
            "api::tenancy -> lib::now",
            "control::inspect -> api::tenancy",
            "routing::proxy -> control::state",
            "routing::proxy -> ingest::peers",
        ]
    );
}

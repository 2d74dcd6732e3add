//! The library's shape, checked on its source: data flows one way, so no module imports one that
//! imports it back, and `lib.rs`'s layout section names every module there is.
//!
//! Read from the text of `src/`, as `use crate::…`, `crate::…` paths and `super::…` paths: a
//! folder module (`src/http1/`) is one module seen from outside, and its files are modules among
//! themselves. Each file's `#[cfg(test)] mod tests` is left out: test code may set things up with
//! any module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module paths (`http1::body`) of every file under `src/`, except the crate roots.
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    // Bounded by the tree: each directory is read once.
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("read src entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|p| p == "mod") {
                parts.pop();
            }
            let name = parts.join("::");
            if name == "lib" || name == "main" {
                continue;
            }
            found.insert(name, path);
        }
    }
    found
}

/// The file's code without its unit tests and comments.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("read module");
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every `prefix` path in `code`, as its `::`-separated segments (`crate::http1::body::X` →
/// `["http1", "body", "X"]`); a `{` group counts each of its first segments.
fn paths(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let first: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !first.is_empty() {
                    out.push(vec![first]);
                }
            }
            continue;
        }
        let segment: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        out.push(segment.split("::").map(str::to_string).collect());
    }
    out
}

/// The longest known module a path names, if any.
fn resolve(segments: &[String], known: &BTreeMap<String, PathBuf>) -> Option<String> {
    (1..=segments.len())
        .rev()
        .map(|n| segments[..n].join("::"))
        .find(|m| known.contains_key(m))
}

/// What each module imports: edges between modules of the same folder (top level included),
/// where a folder module stands for everything in it.
fn imports(known: &BTreeMap<String, PathBuf>) -> BTreeMap<String, BTreeSet<String>> {
    let parent = |m: &str| m.rsplit_once("::").map(|(p, _)| p.to_string());
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, path) in known {
        let code = code(path);
        let mut targets: Vec<String> = paths(&code, "crate::")
            .iter()
            .filter_map(|s| resolve(s, known))
            .collect();
        if let Some(p) = parent(module) {
            for s in paths(&code, "super::") {
                let mut full: Vec<String> = p.split("::").map(str::to_string).collect();
                full.extend(s);
                targets.extend(resolve(&full, known));
            }
        }
        for target in targets {
            // Both ends seen from their closest common folder: `a::x` → `a::y::z` is `x` → `y`
            // inside `a`; `a::x` → `b` is `a` → `b` at the top.
            let from: Vec<&str> = module.split("::").collect();
            let to: Vec<&str> = target.split("::").collect();
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == from.len() || common == to.len() {
                // A module and its own folder or submodule: not an import between peers.
                continue;
            }
            let from = from[..=common].join("::");
            let to = to[..=common].join("::");
            edges.entry(from).or_default().insert(to);
        }
    }
    edges
}

/// A cycle in `edges`, as the modules along it, if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        marks.insert(node.to_string(), Mark::Open);
        stack.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            match marks.get(next).copied().unwrap_or(Mark::New) {
                Mark::Open => {
                    let start = stack.iter().position(|m| m == next).unwrap_or(0);
                    let mut cycle = stack[start..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Mark::New => {
                    if let Some(c) = visit(next, edges, marks, stack) {
                        return Some(c);
                    }
                }
                Mark::Done => {}
            }
        }
        stack.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in edges.keys() {
        if marks.get(node).copied().unwrap_or(Mark::New) == Mark::New {
            if let Some(c) = visit(node, edges, &mut marks, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let known = modules(&src());
    let edges = imports(&known);
    assert!(
        edges.get("proxy").is_some_and(|e| e.contains("upstream")),
        "the scan must see proxy's imports: {edges:#?}"
    );
    if let Some(cycle) = find_cycle(&edges) {
        panic!(
            "import cycle: {}\nwhat each module imports:\n{edges:#?}",
            cycle.join(" → ")
        );
    }
}

#[test]
fn the_cycle_check_finds_a_cycle() {
    let edges: BTreeMap<String, BTreeSet<String>> = [
        ("a", &["b"][..]),
        ("b", &["c"][..]),
        ("c", &["a"][..]),
        ("d", &["a"][..]),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.iter().map(|s| s.to_string()).collect()))
    .collect();
    assert_eq!(
        find_cycle(&edges),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}

#[test]
fn lib_rs_layout_lists_every_module_after_those_it_imports() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("read lib.rs");
    let top: BTreeSet<String> = modules(&src())
        .into_keys()
        .filter_map(|m| m.split("::").next().map(str::to_string))
        .collect();
    let missing: Vec<&String> = top
        .iter()
        .filter(|m| !lib.contains(&format!("[`{m}`]")))
        .collect();
    assert!(
        missing.is_empty(),
        "lib.rs's layout section does not name {missing:?}"
    );
    let place = |m: &str| lib.find(&format!("[`{m}`]"));
    let edges = imports(&modules(&src()));
    for (from, targets) in edges.iter().filter(|(m, _)| !m.contains("::")) {
        for to in targets {
            assert!(
                place(to) < place(from),
                "lib.rs lists {from} before {to}, which it imports"
            );
        }
    }
}

//! The library crates' shape, checked on their source: data flows one way, so no module imports
//! one that imports it back, and each `lib.rs`'s layout section names every module there is.
//!
//! Read from the text of each crate's `src/` (`proxy/src/`, `tools/src/`, `import/src/`), as
//! `use crate::…`, `crate::…` paths and `super::…` paths: a folder module (`proxy/src/http1/`)
//! is one module seen from outside, and its files are modules among
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
    // A top-level module's `super::` is the crate root.
    let parent = |m: &str| {
        m.rsplit_once("::")
            .map_or(String::new(), |(p, _)| p.to_string())
    };
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, path) in known {
        let code = code(path);
        let mut targets: Vec<String> = paths(&code, "crate::")
            .iter()
            .filter_map(|s| resolve(s, known))
            .collect();
        let p = parent(module);
        for s in paths(&code, "super::") {
            let mut full: Vec<String> = p
                .split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect();
            full.extend(s);
            targets.extend(resolve(&full, known));
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

/// The proxy crate's source, where the request path is.
fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("proxy/src")
}

/// The source of each library crate of the workspace. Crate dependencies keep the layers
/// between crates (the proxy depends on no tool); these checks keep the order inside each.
fn crates() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    ["proxy/src", "tools/src", "import/src"]
        .iter()
        .map(|c| root.join(c))
        .collect()
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    for src in crates() {
        let known = modules(&src);
        let edges = imports(&known);
        assert!(
            edges.len() > 5,
            "the scan must see {}'s imports: {edges:#?}",
            src.display()
        );
        if let Some(cycle) = find_cycle(&edges) {
            panic!(
                "import cycle in {}: {}\nwhat each module imports:\n{edges:#?}",
                src.display(),
                cycle.join(" → ")
            );
        }
    }
    let edges = imports(&modules(&src()));
    assert!(
        edges.get("proxy").is_some_and(|e| e.contains("upstream")),
        "the scan must see proxy's imports: {edges:#?}"
    );
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

/// The file that lists a folder's modules: `lib.rs` for the top, `mod.rs` for a folder.
fn listing(src: &Path, folder: &str) -> PathBuf {
    if folder.is_empty() {
        src.join("lib.rs")
    } else {
        src.join(folder.replace("::", "/")).join("mod.rs")
    }
}

#[test]
fn each_listing_names_its_modules_after_those_they_import() {
    let mut wrong = Vec::new();
    let mut seen = 0;
    for src in crates() {
        seen += listings_in_order(&src, &mut wrong);
    }
    assert!(seen > 10, "the scan must see the folders ({seen})");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Checks each listing of the crate at `src`, adding what is wrong to `wrong`; how many
/// listings it read.
fn listings_in_order(src: &Path, wrong: &mut Vec<String>) -> usize {
    let listing = |folder: &str| listing(src, folder);
    let known = modules(src);
    let edges = imports(&known);
    // Every folder with a `mod.rs` (and the top, with `lib.rs`), and the modules directly in it.
    let mut folders: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for m in known.keys() {
        let (folder, name) = m.rsplit_once("::").unwrap_or(("", m));
        // A folder's `tests.rs` is its unit tests, listed by no one.
        if name != "tests" {
            folders
                .entry(folder.to_string())
                .or_default()
                .insert(name.to_string());
        }
    }
    folders.retain(|f, _| listing(f).exists());
    for (folder, children) in &folders {
        let text = std::fs::read_to_string(listing(folder)).expect("read a listing");
        let place = |m: &str| text.find(&format!("[`{m}`]"));
        let missing: Vec<&String> = children.iter().filter(|m| place(m).is_none()).collect();
        if !missing.is_empty() {
            wrong.push(format!(
                "{} does not name {missing:?}",
                listing(folder).display()
            ));
        }
        let full = |m: &str| {
            if folder.is_empty() {
                m.to_string()
            } else {
                format!("{folder}::{m}")
            }
        };
        for from in children {
            for to in edges.get(&full(from)).into_iter().flatten() {
                let Some(to) = to
                    .strip_prefix(&full(""))
                    .filter(|_| !folder.is_empty())
                    .or(folder.is_empty().then_some(to.as_str()))
                else {
                    continue;
                };
                if place(to) > place(from) {
                    wrong.push(format!(
                        "{} lists {from} before {to}, which it imports",
                        listing(folder).display()
                    ));
                }
            }
        }
    }
    folders.len()
}

/// Every module under `folder/` and what it imports, as whole module paths.
fn imports_of(folder: &str, known: &BTreeMap<String, PathBuf>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (module, path) in known
        .iter()
        .filter(|(m, _)| m.starts_with(&format!("{folder}::")))
    {
        for s in paths(&code(path), "crate::") {
            if let Some(target) = resolve(&s, known) {
                out.push((module.clone(), target));
            }
        }
    }
    out
}

#[test]
fn the_request_path_imports_no_control_or_process_module() {
    // The tools are another crate, which the proxy crate does not depend on.
    let known = modules(&src());
    let request_path = ["http1", "upstream", "route", "downstream", "proxy"];
    let above = ["control", "process", "server"];
    let mut seen = 0;
    for folder in request_path {
        for (module, target) in imports_of(folder, &known) {
            seen += 1;
            let top = target.split("::").next().unwrap_or_default();
            assert!(
                !above.contains(&top),
                "{module} imports {target}: the request path must not reach up into {top}"
            );
        }
    }
    assert!(
        seen > 50,
        "the scan must see the request path's imports ({seen})"
    );
}

/// Each function's name and length in lines, from its `fn` line to the `}` at its indent.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let body = line.trim_start();
        let indent = &line[..line.len() - body.len()];
        let after = [
            "pub ",
            "pub(crate) ",
            "pub(super) ",
            "async ",
            "const ",
            "unsafe ",
        ]
        .iter()
        .fold(body, |b, p| b.strip_prefix(p).unwrap_or(b));
        let after = ["async ", "unsafe "]
            .iter()
            .fold(after, |b, p| b.strip_prefix(p).unwrap_or(b));
        let Some(sig) = after.strip_prefix("fn ") else {
            continue;
        };
        let name: String = sig
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let close = format!("{indent}}}");
        let mut end = None;
        let mut opened = false;
        for (k, l) in lines[i..].iter().enumerate() {
            if k == 0 && l.contains('{') && l.trim_end().ends_with('}') {
                end = Some(0);
                break;
            }
            opened |= l.contains('{');
            // A declaration without a body (a trait's) ends at its `;` before any `{`.
            if !opened && l.trim_end().ends_with(';') {
                break;
            }
            if opened && *l == close {
                end = Some(k);
                break;
            }
        }
        let Some(end) = end else {
            continue;
        };
        out.push((name, i + 1, end + 1));
    }
    out
}

#[test]
fn no_function_on_the_request_path_is_over_120_lines() {
    let known = modules(&src());
    let request_path = ["http1", "upstream", "route", "downstream", "proxy"];
    let mut long = Vec::new();
    let mut counted = 0;
    for (module, path) in &known {
        if !request_path.contains(&module.split("::").next().unwrap_or_default()) {
            continue;
        }
        for (name, line, len) in functions(&code_with_tests_cut(path)) {
            counted += 1;
            if len > 120 {
                long.push(format!("{}:{line} {name}: {len} lines", path.display()));
            }
        }
    }
    assert!(
        counted > 200,
        "the scan must see the request path's functions ({counted})"
    );
    assert!(
        long.is_empty(),
        "functions over 120 lines:\n{}",
        long.join("\n")
    );
}

/// The file without its unit tests, its lines kept as they are (comments too), so line numbers
/// hold.
fn code_with_tests_cut(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("read module");
    match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

#[test]
fn the_length_scan_measures_a_function() {
    let text = "fn a() {\n    x();\n}\n\n    pub async fn b(\n        y: u8,\n    ) {\n        z();\n    }\n";
    assert_eq!(
        functions(text),
        vec![("a".to_string(), 1, 3), ("b".to_string(), 5, 5)]
    );
}

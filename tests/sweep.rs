//! `pinlb sweep` end to end: real `pinlb backend` and `pinlb serve` children, pinned, loaded
//! by the bench, and the report's three files.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{allowed, bin};

/// Checks that `text` is well-formed XML as far as an SVG needs: every element opened is closed
/// in order, attribute quotes balance, and there is one root.
fn assert_well_formed_xml(text: &str) {
    let mut open: Vec<&str> = Vec::new();
    let mut roots = 0;
    let mut rest = text.trim_start();
    if let Some(r) = rest.strip_prefix("<?xml") {
        rest = &r[r.find("?>").expect("end of the XML declaration") + 2..];
    }
    // Bounded by the text: every pass takes a tag, or text before one.
    while let Some(start) = rest.find('<') {
        rest = &rest[start..];
        if let Some(r) = rest.strip_prefix("<!--") {
            rest = &r[r.find("-->").expect("end of a comment") + 3..];
            continue;
        }
        // Quotes may hold '>': find the tag's end outside them.
        let mut quote = None;
        let end = rest
            .char_indices()
            .find(|&(_, c)| match (quote, c) {
                (None, '"' | '\'') => {
                    quote = Some(c);
                    false
                }
                (Some(q), c) if c == q => {
                    quote = None;
                    false
                }
                (None, '>') => true,
                _ => false,
            })
            .map(|(i, _)| i)
            .unwrap_or_else(|| panic!("a tag that never ends: {}", &rest[..rest.len().min(80)]));
        let tag = &rest[1..end];
        rest = &rest[end + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(open.pop(), Some(name.trim()), "closing tag out of order");
            continue;
        }
        let name = tag.split_whitespace().next().unwrap_or("");
        assert!(!name.is_empty(), "a tag without a name: <{tag}>");
        if open.is_empty() {
            roots += 1;
        }
        if !tag.ends_with('/') {
            open.push(name);
        }
    }
    assert!(open.is_empty(), "elements left open: {open:?}");
    assert_eq!(roots, 1, "one root element");
}

#[test]
fn sweep_on_two_cores_completes_recommends_and_says_the_load_generator_shares_a_core() {
    let cores = allowed();
    // At most two cores, so the load generator always shares one and must say so.
    let cores = &cores[..cores.len().min(2)];
    let list = cores
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let out_dir =
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("sweep-{}", std::process::id()));
    let out = Command::new(bin())
        .args([
            "sweep",
            "--cores",
            &list,
            "--concurrency",
            "2,8",
            "--duration",
            "300ms",
            "--warmup",
            "100ms",
            "--rounds",
            "2",
            "--work",
            "20us",
            "--out",
        ])
        .arg(&out_dir)
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .output()
        .expect("run pinlb sweep");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("\nbest: "), "a recommendation: {stdout}");
    assert!(
        stdout.contains("(rounds within ±"),
        "the recommendation has its margin: {stdout}"
    );
    assert!(
        stdout.contains("note: only") && stdout.contains("load generator"),
        "the note that the load generator shares a core: {stdout}"
    );
    assert!(
        stdout.contains("reproduce: pinlb sweep --cores "),
        "the command that reproduces the run: {stdout}"
    );
    for layout in ["direct (1 backend)", "1 proxy core + 1 backend"] {
        for c in ["2", "8"] {
            let row = stdout
                .lines()
                .find(|l| l.starts_with(&format!("| {layout} ")) && l.contains(&format!(" | {c} ")))
                .unwrap_or_else(|| panic!("no row for {layout} at c={c}: {stdout}"));
            assert!(row.contains("| 0 "), "no failures: {row}");
        }
    }

    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("sweep.json")).unwrap())
            .expect("sweep.json parses");
    let cells = json["cells"].as_array().expect("cells");
    assert_eq!(cells.len(), 4, "2 layouts × 2 concurrencies: {json}");
    for cell in cells {
        assert!(
            cell["requests_per_sec"]["median"].as_f64().unwrap() > 0.0,
            "{cell}"
        );
        assert!(cell["latency"]["p99_us"].as_f64().unwrap() > 0.0, "{cell}");
        assert_eq!(cell["failures"]["timeout"], 0, "{cell}");
    }
    let layouts: Vec<&str> = json["plan"]["layouts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["id"].as_str().unwrap())
        .collect();
    assert_eq!(layouts, ["direct", "p1b1"]);
    assert!(json["recommendation"]["requests_per_sec"].as_f64().unwrap() > 0.0);
    assert!(
        json["plan"]["notes"][0]
            .as_str()
            .unwrap()
            .contains("load generator")
    );

    let svg = std::fs::read_to_string(out_dir.join("sweep.svg")).unwrap();
    assert!(svg.contains("<svg"), "{svg}");
    assert_well_formed_xml(&svg);
    for name in ["direct (1 backend)", "1 proxy core + 1 backend"] {
        assert!(svg.contains(name), "a legend entry for {name}");
    }
    let md = std::fs::read_to_string(out_dir.join("sweep.md")).unwrap();
    assert!(md.contains("**best: "), "{md}");

    // The processes it started are gone: their ports answer no more.
    for log in std::fs::read_dir(out_dir.join("logs")).unwrap() {
        let path = log.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let toml = std::fs::read_to_string(&path).unwrap();
            let addr = toml
                .lines()
                .find_map(|l| l.strip_prefix("address = \""))
                .and_then(|a| a.strip_suffix('"'))
                .expect("the proxy's listener");
            assert!(
                std::net::TcpStream::connect(addr).is_err(),
                "the proxy on {addr} was stopped"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn the_xml_check_refuses_what_is_not_well_formed() {
    assert_well_formed_xml("<?xml version=\"1.0\"?><svg a=\"x>y\"><g><path/></g></svg>");
    for bad in ["<svg><g></svg>", "<svg></svg><svg></svg>", "<svg><g>"] {
        assert!(
            std::panic::catch_unwind(|| assert_well_formed_xml(bad)).is_err(),
            "{bad}"
        );
    }
}

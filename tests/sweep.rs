//! `pinlb sweep` end to end: real `pinlb backend` and `pinlb serve` children, pinned, loaded
//! by the bench, and the report's three files.

use crate::common;

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
    let toml = std::fs::read_to_string(out_dir.join("logs/p1b1-pinlb/pinlb.toml")).unwrap();
    let addr = toml
        .lines()
        .find_map(|l| l.strip_prefix("address = \""))
        .and_then(|a| a.strip_suffix('"'))
        .expect("the proxy's listener");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "the proxy on {addr} was stopped"
    );
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

/// PATH with the system's sbin directories, where Debian installs nginx and HAProxy (a user's
/// PATH may lack them).
fn path_with_sbin() -> String {
    format!(
        "{}:/usr/sbin:/sbin",
        std::env::var("PATH").unwrap_or_default()
    )
}

/// A sweep of `--proxy LIST` on at most two cores at one concurrency, one short round; its
/// output, and the directory of its files.
fn sweep_with_proxies(list: &str, path: &str, name: &str) -> (String, PathBuf) {
    let cores = allowed();
    let cores = &cores[..cores.len().min(2)];
    let list_of_cores = cores
        .iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("sweep-{name}-{}", std::process::id()));
    let out = Command::new(bin())
        .args([
            "sweep",
            "--cores",
            &list_of_cores,
            "--proxy",
            list,
            "--concurrency",
            "4",
            "--duration",
            "300ms",
            "--warmup",
            "100ms",
            "--rounds",
            "1",
            "--work",
            "20us",
            "--out",
        ])
        .arg(&out_dir)
        .env("PATH", path)
        .env_remove("RUST_LOG")
        .output()
        .expect("run pinlb sweep");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    (stdout, out_dir)
}

#[test]
fn sweep_with_nginx_and_haproxy_reports_every_layout_per_proxy_with_cpu_per_request() {
    let (stdout, out_dir) = sweep_with_proxies("pinlb,nginx,haproxy", &path_with_sbin(), "peers");
    let proxied = "1 proxy core + 1 backend";
    let row = |layout: &str, proxy: &str| {
        stdout
            .lines()
            .find(|l| {
                l.starts_with(&format!("| {layout} "))
                    && l.split('|').nth(2).is_some_and(|p| p.trim() == proxy)
            })
            .unwrap_or_else(|| panic!("no row for {layout} with {proxy}: {stdout}"))
            .to_string()
    };
    let direct = row("direct (1 backend)", "–");
    assert!(direct.contains("| 0 "), "no failures: {direct}");
    let last = direct.trim_end_matches([' ', '|']).rsplit('|').next();
    assert_eq!(last.map(str::trim), Some("–"), "no learned limit: {direct}");
    for proxy in ["pinlb", "nginx", "haproxy"] {
        let r = row(proxied, proxy);
        assert!(r.contains("| 0 "), "no failures: {r}");
        // The last three columns: the proxy's CPU per request and the backend's, both read,
        // then the limit the backend learned in pinlb, read from its /status.
        let cols: Vec<&str> = r.split('|').map(str::trim).collect();
        let n = cols.len();
        for v in [cols[n - 4], cols[n - 3]] {
            assert!(v.parse::<f64>().is_ok_and(|v| v > 0.0), "CPU in {r}");
        }
        if proxy == "pinlb" {
            let limit = cols[n - 2].parse::<u64>();
            assert!(
                limit.is_ok_and(|l| (2..=1000).contains(&l)),
                "a learned limit in {r}"
            );
        } else {
            assert_eq!(cols[n - 2], "–", "{r}");
        }
    }
    for line in [
        "\nbest layout with pinlb: ",
        "\nbest layout with nginx: ",
        "\nbest layout with HAProxy: ",
        "\npinlb vs nginx here: by req/s ",
        "\npinlb vs HAProxy here: by req/s ",
    ] {
        assert!(stdout.contains(line), "{line:?} in {stdout}");
    }
    assert!(
        stdout.contains("by the proxy's CPU per request at "),
        "{stdout}"
    );
    assert!(
        stdout.contains("--proxy pinlb,nginx,haproxy"),
        "the command that reproduces it: {stdout}"
    );

    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("sweep.json")).unwrap())
            .expect("sweep.json parses");
    let cells = json["cells"].as_array().expect("cells");
    assert_eq!(cells.len(), 4, "direct and p1b1 × 3 proxies: {json}");
    for cell in cells {
        let backends = cell["backend_cpu_us_per_request"].as_array().unwrap();
        assert_eq!(backends.len(), 1, "{cell}");
        assert!(backends[0].as_f64().unwrap() > 0.0, "{cell}");
        let limits = cell["backend_concurrency_limit"].as_array().unwrap();
        if cell["proxy"] == "pinlb" {
            assert!(limits.len() == 1 && limits[0].as_u64().is_some(), "{cell}");
        } else {
            assert!(limits.is_empty(), "{cell}");
        }
        if cell["layout"] == "direct" {
            assert!(cell["proxy"].is_null(), "{cell}");
            assert!(cell["proxy_cpu_us_per_request"].is_null(), "{cell}");
        } else {
            assert!(cell["proxy"].is_string(), "{cell}");
            assert!(
                cell["proxy_cpu_us_per_request"].as_f64().unwrap() > 0.0,
                "{cell}"
            );
        }
    }
    let best: Vec<&str> = json["best_per_proxy"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["proxy"].as_str().unwrap())
        .collect();
    assert_eq!(best, ["pinlb", "nginx", "haproxy"]);
    assert_eq!(json["versus"].as_array().unwrap().len(), 2, "{json}");
    let proxies: Vec<&str> = json["proxies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["proxy"].as_str().unwrap())
        .collect();
    assert_eq!(proxies, ["pinlb", "nginx", "haproxy"]);
    let md = std::fs::read_to_string(out_dir.join("sweep.md")).unwrap();
    assert!(md.contains("**pinlb vs nginx here"), "{md}");
    let svg = std::fs::read_to_string(out_dir.join("sweep.svg")).unwrap();
    assert_well_formed_xml(&svg);
    for name in [
        "1 proxy core + 1 backend, nginx",
        "1 proxy core + 1 backend, HAProxy",
    ] {
        assert!(svg.contains(name), "a legend entry for {name}");
    }

    // The generated configurations: the same core, one worker, keep-alive to the backend.
    let core = json["plan"]["layouts"][1]["proxy"][0].as_u64().unwrap() as usize;
    let logs = out_dir.join("logs");
    let text = |name: &str| std::fs::read_to_string(logs.join(name)).unwrap();
    let nginx = text("p1b1-nginx/nginx.conf");
    let mask = format!("1{}", "0".repeat(core));
    for want in [
        "worker_processes 1;".to_string(),
        format!("worker_cpu_affinity {mask};"),
        "keepalive 64;".into(),
        "proxy_http_version 1.1;".into(),
        "access_log off;".into(),
    ] {
        assert!(nginx.contains(&want), "{want} in {nginx}");
    }
    let haproxy = text("p1b1-haproxy/haproxy.cfg");
    for want in [
        "nbthread 1\n".to_string(),
        format!("cpu-map 1/1 {core}\n"),
        "http-reuse always\n".into(),
        "option http-keep-alive\n".into(),
    ] {
        assert!(haproxy.contains(&want), "{want:?} in {haproxy}");
    }
    let pinlb = text("p1b1-pinlb/pinlb.toml");
    assert!(
        pinlb.contains(&format!("cpus = [{core}]")) && pinlb.contains("keepalive = 64"),
        "{pinlb}"
    );
    // Every proxy it started is stopped: their ports answer no more.
    for (file, key) in [
        ("p1b1-nginx/nginx.conf", "listen "),
        ("p1b1-haproxy/haproxy.cfg", "bind "),
        ("p1b1-pinlb/pinlb.toml", "address = \""),
    ] {
        let body = text(file);
        let addr = body
            .lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .map(|a| a.split([' ', '"', ';']).next().unwrap().to_string())
            .expect("the proxy's listener");
        assert!(
            std::net::TcpStream::connect(&addr).is_err(),
            "the proxy of {file} on {addr} was stopped"
        );
    }
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn a_peer_missing_from_path_is_skipped_with_how_to_install_it() {
    // A PATH with nginx on it and no HAProxy.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("path-without-haproxy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx", "/sbin/nginx"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("nginx is installed (scripts/test installs it)");
    let link = dir.join("nginx");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(nginx, &link).unwrap();
    let (stdout, out_dir) =
        sweep_with_proxies("pinlb,nginx,haproxy", &dir.display().to_string(), "missing");
    assert!(
        stdout
            .contains("note: haproxy not found on PATH: skipped (Debian: apt-get install haproxy)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("| nginx ")
            && stdout.contains("| pinlb ")
            && !stdout.contains("| haproxy "),
        "{stdout}"
    );
    assert!(stdout.contains("pinlb vs nginx here"), "{stdout}");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("sweep.json")).unwrap()).unwrap();
    assert!(
        json["skipped"][0]
            .as_str()
            .unwrap()
            .starts_with("haproxy not found on PATH"),
        "{json}"
    );
    let _ = std::fs::remove_dir_all(&out_dir);
    let _ = std::fs::remove_dir_all(&dir);
}

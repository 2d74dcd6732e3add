//! `deploy/kubernetes/`: the manifests validate against Kubernetes' own schemas (PyPI's
//! `kubernetes-validate`, which bundles them: `scripts/test` installs it into a virtual
//! environment, `target/pyenv`), pinlb's pod gets
//! whole CPUs with Guaranteed QoS and probes on `/ready` and `/live`, and the ConfigMap's TOML
//! passes `pinlb check`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::bin;

fn manifests() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "{files:?}");
    files
}

/// The Python that has kubernetes-validate: `$PINLB_TEST_PYTHON`, which `scripts/test` sets to
/// the virtual environment it installs it into; else that environment if a run of
/// `scripts/test` left it (`cargo test` alone after one); else `python3` from PATH.
fn python_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("PINLB_TEST_PYTHON") {
        return p.into();
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/pyenv/bin/python");
    if venv.exists() {
        return venv;
    }
    "python3".into()
}

/// `python ARGS` ([`python_bin`]), failing the test with a hint when it or the module is
/// missing.
fn python(args: &[&str], files: &[PathBuf]) -> std::process::Output {
    let bin = python_bin();
    let out = Command::new(&bin)
        .args(args)
        .args(files)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e} (scripts/test installs what tests/deploy.rs needs)",
                bin.display()
            )
        });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("No module named"),
        "{stderr}\n{} lacks it: run scripts/test, or: python3 -m venv target/pyenv && \
         target/pyenv/bin/python -m pip install kubernetes-validate",
        bin.display()
    );
    out
}

#[test]
fn the_manifests_validate_against_the_kubernetes_schemas() {
    let out = python(&["-m", "kubernetes_validate", "--strict"], &manifests());
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    // One line per resource: every kind the README lists is there and passed.
    for kind in [
        "deployment/pinlb",
        "configmap/pinlb",
        "service/pinlb",
        "poddisruptionbudget/pinlb",
        "service/app-backends",
        "job/pinlb-bench",
    ] {
        assert!(
            stdout.contains(&format!("passed for resource {kind} ")),
            "{kind}: {stdout}{stderr}"
        );
    }
}

/// Every document of every manifest, as JSON.
fn documents() -> Vec<serde_json::Value> {
    let out = python(
        &[
            "-c",
            "import sys, json, yaml\n\
             print(json.dumps([d for f in sys.argv[1:] for d in yaml.safe_load_all(open(f)) if d]))",
        ],
        &manifests(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn find<'a>(docs: &'a [serde_json::Value], kind: &str, name: &str) -> &'a serde_json::Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"))
}

#[test]
fn pinlb_gets_whole_cpus_with_guaranteed_qos_and_probes_on_ready_and_live() {
    let docs = documents();
    let pod = &find(&docs, "Deployment", "pinlb")["spec"]["template"]["spec"];
    for c in pod["containers"].as_array().unwrap() {
        let r = &c["resources"];
        // Guaranteed QoS: requests equal limits for cpu and memory in every container; the
        // static CPU manager gives exclusive cores only for a whole number of CPUs.
        assert_eq!(r["requests"], r["limits"], "{}", c["name"]);
        let cpu = r["limits"]["cpu"].as_str().expect("cpu as a string");
        assert!(
            cpu.parse::<u32>().is_ok_and(|n| n >= 1),
            "cpu {cpu:?} is not whole"
        );
        assert!(r["limits"]["memory"].is_string());
    }
    let c = &pod["containers"][0];
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/ready");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/live");
    // The probes' port is the admin listener's, as the ConfigMap binds it.
    let admin = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == c["readinessProbe"]["httpGet"]["port"])
        .expect("the probe's named port");
    assert_eq!(admin["containerPort"], 9901);
    let toml = config_map_toml(&docs);
    assert!(toml.contains("address = \"0.0.0.0:9901\""), "{toml}");
    // No `cpus`: the allowed set, which the CPU manager chose.
    assert!(
        !toml.lines().any(|l| l.trim_start().starts_with("cpus")),
        "{toml}"
    );

    let headless = find(&docs, "Service", "app-backends");
    assert_eq!(headless["spec"]["clusterIP"], "None");
    let job = &find(&docs, "Job", "pinlb-bench")["spec"];
    assert_eq!(job["completionMode"], "Indexed");
    assert_eq!(job["completions"], job["parallelism"]);
    let args = job["template"]["spec"]["containers"][0]["args"][0]
        .as_str()
        .unwrap();
    assert!(
        args.contains("--start-at") && args.contains("$JOB_COMPLETION_INDEX.json"),
        "{args}"
    );
}

fn config_map_toml(docs: &[serde_json::Value]) -> String {
    find(docs, "ConfigMap", "pinlb")["data"]["pinlb.toml"]
        .as_str()
        .expect("pinlb.toml in the ConfigMap")
        .to_string()
}

/// The ConfigMap's TOML passes `pinlb check --strict`, with what only a cluster has replaced:
/// the admin token file by one written here, the cluster's DNS by a server on loopback that
/// answers the same SRV name (under `test.`) with a backend on 127.0.0.1.
#[test]
fn the_config_maps_toml_passes_pinlb_check_strict() {
    let toml = config_map_toml(&documents());
    let dir = std::env::temp_dir().join(format!("pinlb-deploy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let token = dir.join("admin-token");
    std::fs::write(&token, "s3cret\n").unwrap();
    let dns = common::dns::DnsServer::start();
    dns.set_srv("_http._tcp.app-backends.test.", &[(8080, 1)]);
    assert!(toml.contains("/run/secrets/pinlb/admin-token"), "{toml}");
    assert!(toml.contains("default.svc.cluster.local"), "{toml}");
    let local = toml
        .replace(
            "/run/secrets/pinlb/admin-token",
            &token.display().to_string(),
        )
        .replace("default.svc.cluster.local", "test")
        + &format!("\n[resolver]\nnameservers = [\"{}\"]\n", dns.addr);
    let file = dir.join("pinlb.toml");
    std::fs::write(&file, &local).unwrap();
    let out = Command::new(bin())
        .args(["check", "--strict", "-c"])
        .arg(&file)
        .output()
        .expect("run pinlb check");
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success(), "{stdout}{stderr}\n{local}");
    assert!(stdout.contains("configuration is valid"), "{stdout}");
    assert!(
        stdout.contains("srv _http._tcp.app-backends.test resolves to 127.0.0.1:8080 (weight 1)"),
        "{stdout}"
    );
}

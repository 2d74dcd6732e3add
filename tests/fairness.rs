//! The fairness checks of `pinlb bench`, `sweep` and `demo` against conditions set up for real:
//! a debug build of `pinlb serve` (the test's binary is one), one started with debug logging,
//! a pinlb proxy with `keepalive = 0` in front of a real `pinlb backend`, the load generator's
//! core given to a pinned backend, a core kept busy by a pinned spinning thread, connections
//! left in TIME_WAIT; and `pinlb demo`'s own layout, which must say nothing but its 2-core note.
//!
//! What no test can set up for real (a frequency governor, SMT siblings, a narrow port range)
//! is tested in `tools/src/fairness.rs` on small trees of files in a temp dir.

use crate::common;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{BinBackend, BinProxy, allowed, bin, first_core};
use pinlb_tools::fairness::{self, Load, Placement, Ports, Target, Warning};

/// A pinlb proxy's configuration: one worker on `core`, one listener, `backend` behind it with
/// `keepalive` idle connections kept, and an admin listener when `admin`.
fn proxy_toml(core: usize, backend: SocketAddr, keepalive: usize, admin: bool) -> String {
    let admin = if admin {
        "[admin]\naddress = \"127.0.0.1:0\"\n"
    } else {
        ""
    };
    format!(
        "[runtime]\ncpus = [{core}]\nshutdown_timeout = \"1s\"\n\n[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\n\n[upstream.app]\nkeepalive = {keepalive}\nbackends = [{{ address = \"{backend}\" }}]\n\n{admin}"
    )
}

/// A bench target at `addr`, its process to say what it is.
fn target(name: &str, addr: SocketAddr) -> Target {
    Target {
        name: name.into(),
        addr,
        host: addr.to_string(),
        path: "/".into(),
        plain_http: true,
        proxied: None,
    }
}

fn load() -> Load {
    Load {
        connections: 8,
        keep_alive: true,
        rate: None,
        run: Duration::from_secs(3),
    }
}

/// The checks as `pinlb bench` runs them, without the second's busy-core sample.
fn bench_checks(targets: &[Target], load_cores: &[usize]) -> Vec<Warning> {
    fairness::check(targets, &load(), load_cores, None, false)
}

fn with<'a>(warnings: &'a [Warning], words: &str) -> Vec<&'a Warning> {
    warnings
        .iter()
        .filter(|w| w.problem.contains(words))
        .collect()
}

/// Another core than `core`, where this process may run on two.
fn other_core(core: usize) -> Option<usize> {
    allowed().into_iter().find(|c| *c != core)
}

#[tokio::test]
async fn a_debug_build_of_pinlb_serve_is_warned_about_and_a_server_of_no_pinlb_is_not() {
    let core = first_core();
    let backend = BinBackend::start(core);
    // With an admin listener, whose `/status` names the backend.
    let proxy = BinProxy::spawn_toml(&proxy_toml(core, backend.addr, 64, true), &[]).await;
    let w = bench_checks(&[target("proxied", proxy.addr)], &[]);
    let debug = with(&w, "is a debug build of pinlb");
    assert_eq!(debug.len(), 2, "the proxy and its backend: {w:#?}");
    assert!(
        debug[1].problem.starts_with(&format!(
            "backend {} of target proxied (pid {}, pinlb)",
            backend.addr,
            backend.child.id()
        )),
        "{w:#?}"
    );
    assert!(
        debug[0].problem.starts_with(&format!(
            "target proxied (pid {}, pinlb) is a debug build",
            proxy.pid
        )),
        "{w:#?}"
    );
    assert!(debug[0].fix.contains("cargo build --release"));

    // A server in this test process: not pinlb, so nothing to ask.
    let other = TcpListener::bind("127.0.0.1:0").unwrap();
    let w = bench_checks(&[target("other", other.local_addr().unwrap())], &[]);
    assert!(with(&w, "debug").is_empty(), "{w:#?}");
}

#[tokio::test]
async fn a_pinlb_started_with_debug_logging_is_warned_about() {
    let core = first_core();
    let backend = BinBackend::start(core);
    let toml = proxy_toml(core, backend.addr, 64, false);
    let debug = std::ffi::OsStr::new("debug");
    let proxy = BinProxy::spawn_toml(&toml, &[("RUST_LOG", debug)]).await;
    let w = bench_checks(&[target("proxied", proxy.addr)], &[]);
    let logging = with(&w, "logs at debug level (RUST_LOG=debug)");
    assert_eq!(logging.len(), 1, "{w:#?}");

    let quiet = BinProxy::spawn_toml(&toml, &[]).await;
    let w = bench_checks(&[target("proxied", quiet.addr)], &[]);
    assert!(with(&w, "logs at debug level").is_empty(), "{w:#?}");
}

#[tokio::test]
async fn a_proxy_without_keep_alive_is_seen_through_its_admin_api_and_through_pinlb_backend() {
    let core = first_core();
    let backend = BinBackend::start(core);
    let no_keepalive = "does not keep its backend connections alive";
    for admin in [true, false] {
        let toml = proxy_toml(core, backend.addr, 0, admin);
        let proxy = BinProxy::spawn_toml(&toml, &[]).await;
        let w = bench_checks(&[target("proxied", proxy.addr)], &[]);
        let found = with(&w, no_keepalive);
        assert_eq!(found.len(), 1, "admin {admin}: {w:#?}");
        assert!(
            found[0]
                .problem
                .contains(&format!("to backend {}", backend.addr)),
            "{found:#?}"
        );
        assert!(found[0].fix.contains("keepalive above 0"));

        let kept = BinProxy::spawn_toml(&proxy_toml(core, backend.addr, 64, admin), &[]).await;
        let w = bench_checks(&[target("proxied", kept.addr)], &[]);
        assert!(with(&w, no_keepalive).is_empty(), "admin {admin}: {w:#?}");
    }
    // Direct to the backend, on one connection: nothing to say.
    let w = bench_checks(&[target("direct", backend.addr)], &[]);
    assert!(with(&w, no_keepalive).is_empty(), "{w:#?}");
}

#[test]
fn the_load_generator_on_a_pinned_backends_core_is_warned_about() {
    let core = first_core();
    let backend = BinBackend::start(core);
    let w = bench_checks(&[target("direct", backend.addr)], &[core]);
    let shared = with(&w, "the load generator runs on");
    assert_eq!(shared.len(), 1, "{w:#?}");
    assert!(
        shared[0].problem.contains(&format!(
            "runs on core {core}, which target direct (pid {}, pinlb) may also run on",
            backend.child.id()
        )),
        "{shared:#?}"
    );
    assert!(shared[0].fix.contains("--cpus"));
    if let Some(other) = other_core(core) {
        let w = bench_checks(&[target("direct", backend.addr)], &[other]);
        assert!(with(&w, "the load generator runs on").is_empty(), "{w:#?}");
    }
}

#[test]
fn a_core_kept_busy_by_a_pinned_spinning_thread_is_warned_about() {
    let core = first_core();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            pinlb::sys::cpus::pin_current_thread(&[core]).expect("pin the spinning thread");
            // Bounded by the sample below, which sets `stop` when it is done.
            while !stop.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        });
        let w = fairness::sample_busy(Path::new("/"), &[core], Duration::from_secs(1));
        stop.store(true, Ordering::Relaxed);
        assert_eq!(w.len(), 1, "{w:#?}");
        assert!(w[0].problem.contains(&format!("(core {core} ")), "{w:#?}");
    });
}

#[test]
fn connections_left_in_time_wait_are_counted() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let before = Ports::read(Path::new("/")).expect("this Linux has a port range");
    // The side that closes first keeps the TIME_WAIT: here, the client.
    let n = 20;
    let mut accepted = Vec::new();
    for _ in 0..n {
        let c = TcpStream::connect(addr).unwrap();
        accepted.push(listener.accept().unwrap().0);
        drop(c);
    }
    // Each close completes once the server side closes too.
    drop(accepted);
    let seen = common::poll_blocking(50, Duration::from_millis(20), || {
        let now = Ports::read(Path::new("/"))?;
        (now.time_wait >= n).then_some(now)
    });
    let now = seen.unwrap_or_else(|| panic!("{n} connections in TIME_WAIT, before {before:?}"));
    assert!(now.range.0 <= now.range.1);
}

/// `pinlb demo`'s layout on this machine, checked as demo checks it: nothing but its own notes.
#[test]
fn the_demo_layout_of_this_machine_draws_no_warning_of_the_machine_checks() {
    let cores = allowed();
    let layout = pinlb_tools::demo::Layout::plan(&cores);
    let placement: Placement = layout.placement();
    let root = Path::new("/");
    let mut w = fairness::load_shares_a_core(&placement);
    if cores.len() == 2 {
        // The work backend's proxies run beside the load generator, so that the backend has a
        // core to itself; the 2-core note says so.
        assert_eq!(w.len(), 1, "{w:#?}");
        assert!(layout.notes[0].contains("share core"), "{:?}", layout.notes);
        w.clear();
    }
    if cores.len() == 1 {
        // One core: everything shares it, and the note says so.
        assert!(
            layout.notes[0].contains("all share it"),
            "{:?}",
            layout.notes
        );
        w.clear();
    }
    w.extend(fairness::smt_siblings(root, &placement));
    w.extend(fairness::governors(root, &placement.cores()));
    let demo = Load {
        connections: 32,
        keep_alive: true,
        rate: None,
        run: Duration::from_millis(2500),
    };
    let ports = Ports::read(root).expect("this Linux has a port range");
    let (rate, why) = fairness::opened_per_second(&demo, false, None).unwrap();
    w.extend(fairness::port_budget(&ports, rate, &why, true));
    assert!(w.is_empty(), "{w:#?}");
    if cores.len() == 2 {
        assert_eq!(layout.notes.len(), 1, "the 2-core note: {:?}", layout.notes);
    }
}

/// `pinlb demo` run briefly: every warning it prints is one about this build or this
/// machine's moment, never about its layout; and `--no-checks` prints none.
#[test]
fn pinlb_demo_warns_of_nothing_but_its_debug_build_and_no_checks_silences_it() {
    let demo = |extra: &[&str]| {
        let out = Command::new(bin())
            .args(["demo", "-d", "200ms", "--rounds", "1", "-c", "4"])
            .args(extra)
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .output()
            .expect("run pinlb demo");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{stdout}");
        stdout
    };
    let stdout = demo(&[]);
    let warnings: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("warning: "))
        .collect();
    // The test's binary is a debug build, and says so.
    assert!(
        warnings
            .iter()
            .any(|l| l.contains("is a debug build of pinlb")),
        "{stdout}"
    );
    // A busy core is the moment's (other tests run beside this one), not the layout's.
    let others: Vec<&&str> = warnings
        .iter()
        .filter(|l| !l.contains("is a debug build") && !l.contains("were busy before it started"))
        .collect();
    assert!(others.is_empty(), "{stdout}");
    if allowed().len() == 2 {
        assert!(stdout.contains("note: only 2 cores"), "{stdout}");
    }
    let quiet = demo(&["--no-checks"]);
    assert!(!quiet.contains("warning: "), "{quiet}");
}

#[test]
fn pinlb_bench_warns_before_the_run_unless_told_not_to() {
    let core = first_core();
    let backend = BinBackend::start(core);
    let bench = |extra: &[&str]| {
        let out = Command::new(bin())
            .args([
                "bench", "-d", "100ms", "--warmup", "0s", "--rounds", "1", "-c", "1",
            ])
            .arg("--cpus")
            .arg(core.to_string())
            .arg(format!("direct=http://{}/", backend.addr))
            .args(extra)
            .env("NO_COLOR", "1")
            .output()
            .expect("run pinlb bench");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let stderr = bench(&[]);
    assert!(
        stderr.contains("pinlb bench: warning: the load generator runs on core"),
        "{stderr}"
    );
    assert!(stderr.contains("is a debug build of pinlb"), "{stderr}");
    let quiet = bench(&["--no-checks"]);
    assert!(!quiet.contains("warning:"), "{quiet}");
}

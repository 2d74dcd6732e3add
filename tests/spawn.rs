//! Spawned backends (`[upstream.NAME.spawn]`) with real processes: this build's own
//! `pinlb backend` (and a Node.js server, when `node` is installed) started by pinlb, pinned,
//! restarted after a kill, rolled on a reload under load, and gone when pinlb is.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use http::{Method, StatusCode};
use nix::sys::signal::Signal;
use tokio::sync::watch;

/// A `port_base` with `2 * count` free ports from it (a rolling restart uses the second half).
///
/// The ports are free when checked and released at once, so another process could take one
/// before pinlb's children bind it: a tiny race, which would show as a child that can't bind
/// and a test that fails loudly rather than passing wrongly. Bases are drawn at random from a
/// range the kernel does not hand out for port 0 (32768-60999 on Linux), which makes it
/// smaller still.
fn free_port_base(count: usize) -> u16 {
    for _ in 0..200 {
        let base = 20_000 + fastrand::u16(0..10_000);
        let all_free = (0..2 * count as u16).all(|i| {
            std::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], base + i))).is_ok()
        });
        if all_free {
            return base;
        }
    }
    panic!("no {} consecutive free ports found", 2 * count);
}

/// The core the spawned processes go on: the last allowed one, apart from the proxy's worker
/// (on the first) when there are two or more.
fn child_core() -> usize {
    *allowed().last().unwrap()
}

/// A config with one worker on the first core, the admin listener, and upstream `app` spawning
/// `count` `pinlb backend` processes on [`child_core`] with `env`.
fn spawn_config(base: u16, count: usize, env: &str, extra: &str) -> String {
    format!(
        "[runtime]\ncpus = [{worker}]\nshutdown_timeout = \"5s\"\n\
         [admin]\naddress = \"127.0.0.1:0\"\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\n\
         [upstream.app]\n{extra}\n\
         [upstream.app.spawn]\n\
         command = [\"{bin}\", \"backend\", \"--listen\", \"127.0.0.1:{{port}}\"]\n\
         count = {count}\ncpus = [{core}]\nport_base = {base}\ngrace = \"2s\"\n\
         env = {{ {env} }}\n",
        worker = first_core(),
        bin = bin(),
        core = child_core(),
    )
}

/// The spawned processes' records from `/status`, once `count` of them are ready and `ok`
/// accepts them (bounded).
async fn ready(
    proxy: &Proxy,
    count: usize,
    ok: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let found = poll(200, Duration::from_millis(50), async || {
        let s = proxy.status().await;
        let spawned = s["spawned"].as_array()?.clone();
        let all_ready = spawned.len() == count && spawned.iter().all(|p| p["state"] == "ready");
        (all_ready && ok(&spawned)).then_some(spawned)
    })
    .await;
    match found {
        Some(s) => s,
        None => panic!(
            "the spawned processes never became ready: {}",
            proxy.status().await["spawned"]
        ),
    }
}

fn pid(p: &serde_json::Value) -> i32 {
    p["pid"].as_i64().expect("a pid") as i32
}

fn cpus_allowed(pid: i32) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("Cpus_allowed_list")
        .trim()
        .to_string()
}

/// Whether process `pid` is gone: no `/proc` entry, or a zombie waiting for init to reap it
/// (it runs no more code).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[tokio::test]
async fn a_spawned_process_runs_on_its_core_and_is_restarted_after_a_kill() {
    let base = free_port_base(2);
    let proxy = Proxy::start_file(&spawn_config(base, 2, "", ""));
    let spawned = ready(&proxy, 2, |_| true).await;
    for p in &spawned {
        assert_eq!(cpus_allowed(pid(p)), child_core().to_string(), "{p}");
        assert_eq!(p["restarts"], 0);
    }
    let ports: Vec<&str> = spawned
        .iter()
        .map(|p| p["address"].as_str().unwrap())
        .collect();
    assert_eq!(
        ports,
        [
            format!("127.0.0.1:{base}"),
            format!("127.0.0.1:{}", base + 1)
        ]
    );
    assert_eq!(get(proxy.addr, "/").await.status, StatusCode::OK);

    let killed = pid(&spawned[0]);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(killed), Signal::SIGKILL).unwrap();
    let back = ready(&proxy, 2, |s| s[0]["restarts"] == 1 && pid(&s[0]) != killed).await;
    assert_eq!(back[0]["address"], spawned[0]["address"], "the same port");
    assert_eq!(cpus_allowed(pid(&back[0])), child_core().to_string());
    assert!(
        back[0]["last_exit"].as_str().unwrap().contains("SIGKILL"),
        "{}",
        back[0]
    );
    assert_eq!(
        back[1]["pid"], spawned[1]["pid"],
        "the other one is left alone"
    );
    let m = proxy.metrics().await;
    assert_eq!(
        m.value(
            "pinlb_spawn_restarts_total",
            "upstream=\"app\",process=\"0\""
        ),
        1.0
    );
    assert_eq!(
        m.value(
            "pinlb_spawn_restarts_total",
            "upstream=\"app\",process=\"1\""
        ),
        0.0
    );
    // Both serve again: round robin over two backends, so four requests reach each twice.
    for _ in 0..4 {
        assert_eq!(get(proxy.addr, "/").await.status, StatusCode::OK);
    }
    let s = proxy.status().await;
    let backends = s["upstreams"][0]["backends"].as_array().unwrap();
    assert_eq!(backends.len(), 2, "{backends:?}");
}

#[tokio::test]
async fn a_reload_that_changes_the_spawn_table_rolls_the_processes_with_no_failed_request() {
    let base = free_port_base(2);
    let proxy = Proxy::start_file(&spawn_config(base, 2, "GREETING = \"a\"", ""));
    let before = ready(&proxy, 2, |_| true).await;

    // A reload that leaves the spawn table alone leaves the processes alone.
    proxy.rewrite(&spawn_config(base, 2, "GREETING = \"a\"", "keepalive = 8"));
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let same = ready(&proxy, 2, |_| true).await;
    assert_eq!(same, before);

    // Four clients on keep-alive connections, request after request, through the roll.
    let (stop_tx, stop) = watch::channel(false);
    let failed = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (addr, stop, failed, done) = (proxy.addr, stop.clone(), failed.clone(), done.clone());
        clients.push(tokio::spawn(async move {
            let mut conn = Conn::open(addr).await;
            for _ in 0..200_000 {
                if *stop.borrow() {
                    break;
                }
                if conn.get("/").await.status != StatusCode::OK {
                    failed.fetch_add(1, Ordering::SeqCst);
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
        }));
    }
    let started = done.load(Ordering::SeqCst);
    proxy.rewrite(&spawn_config(base, 2, "GREETING = \"b\"", "keepalive = 8"));
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    assert!(r.body.contains("spawn table changed"), "{}", r.body);
    let old: Vec<i32> = before.iter().map(pid).collect();
    let after = ready(&proxy, 2, |s| s.iter().all(|p| !old.contains(&pid(p)))).await;
    // Each new process took the port range the old ones did not hold.
    for (i, p) in after.iter().enumerate() {
        assert_eq!(p["address"], format!("127.0.0.1:{}", base + 2 + i as u16));
        assert_eq!(p["restarts"], 0, "a rolling restart is not a restart");
        assert_eq!(cpus_allowed(pid(p)), child_core().to_string());
    }
    // And the old ones are stopped and reaped: pinlb's children, so no zombie lingers.
    let reaped = poll_blocking(100, Duration::from_millis(50), || {
        old.iter().all(|&p| gone(p)).then_some(())
    });
    assert!(reaped.is_some(), "old processes {old:?} still there");
    // Some requests after the switch too.
    let switched = done.load(Ordering::SeqCst);
    let more = poll(100, Duration::from_millis(20), async || {
        (done.load(Ordering::SeqCst) > switched + 50).then_some(())
    })
    .await;
    assert!(more.is_some());
    stop_tx.send(true).unwrap();
    for c in clients {
        c.await.unwrap();
    }
    let total = done.load(Ordering::SeqCst);
    assert!(total > started, "no request ran during the roll");
    assert_eq!(failed.load(Ordering::SeqCst), 0, "of {total} requests");
    let s = proxy.status().await;
    let pool: Vec<&str> = s["upstreams"][0]["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["address"].as_str().unwrap())
        .collect();
    assert_eq!(
        pool,
        [
            format!("127.0.0.1:{}", base + 2),
            format!("127.0.0.1:{}", base + 3)
        ]
    );
}

#[tokio::test]
async fn a_graceful_stop_stops_the_children_and_a_sigkilled_pinlb_takes_them_along() {
    for signal in [Signal::SIGTERM, Signal::SIGKILL] {
        let base = free_port_base(2);
        let mut proxy = BinProxy::spawn_toml(&spawn_config(base, 2, "", ""), &[]).await;
        let mut children = Vec::new();
        for i in 0..2 {
            let line = proxy
                .wait_for_log(&format!("upstream app: process {i} (pid "))
                .await;
            assert!(line.contains("in the pool"), "{line}");
            let rest = &line[line.find("(pid ").unwrap() + 5..];
            children.push(rest.split(')').next().unwrap().parse::<i32>().unwrap());
        }
        assert_eq!(get(proxy.addr, "/").await.status, StatusCode::OK);
        proxy.signal(signal);
        let status = tokio::task::spawn_blocking(move || proxy.child.wait())
            .await
            .unwrap()
            .unwrap();
        if signal == Signal::SIGTERM {
            assert!(status.success(), "{status:?}");
        }
        let all_gone = poll_blocking(200, Duration::from_millis(50), || {
            children.iter().all(|&p| gone(p)).then_some(())
        });
        assert!(
            all_gone.is_some(),
            "after {signal:?} children {children:?} still run"
        );
    }
}

#[tokio::test]
async fn a_node_server_runs_spawned_and_pinned() {
    let Ok(node) = which_node() else {
        println!("skipped: node is not installed");
        return;
    };
    let base = free_port_base(1);
    let script = temp_config(
        "require('http').createServer((req, res) => { res.writeHead(200); res.end('node ' + process.env.GREETING); })\n\
         .listen(Number(process.env.PORT), '127.0.0.1', () => console.log('listening on', process.env.PORT));\n",
    );
    let toml = format!(
        "[runtime]\ncpus = [{worker}]\n\
         [admin]\naddress = \"127.0.0.1:0\"\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\n\
         [upstream.app.spawn]\ncommand = [\"{node}\", \"{script}\"]\ncpus = [{core}]\nport_base = {base}\n\
         env = {{ GREETING = \"hi\" }}\n",
        worker = first_core(),
        script = script.display(),
        core = child_core(),
    );
    let proxy = Proxy::start_file(&toml);
    let spawned = ready(&proxy, 1, |_| true).await;
    assert_eq!(cpus_allowed(pid(&spawned[0])), child_core().to_string());
    let r = get(proxy.addr, "/").await;
    assert_eq!((r.status, r.body.as_str()), (StatusCode::OK, "node hi"));
}

fn which_node() -> Result<String, ()> {
    let out = std::process::Command::new("sh")
        .args(["-c", "command -v node"])
        .output()
        .map_err(|_| ())?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && !path.is_empty() {
        Ok(path)
    } else {
        Err(())
    }
}

#[test]
fn spawn_table_errors_name_the_place_and_the_key() {
    let core = first_core();
    // A program that exists, so that each case fails on what it is about, whatever the order
    // of the checks (a program that can't be run is an error of its own, below).
    let x = bin();
    let listener = "[[listener]]\naddress = \"127.0.0.1:8080\"\nupstream = \"app\"\n";
    let cases = [
        (
            format!(
                "{listener}[upstream.app]\nbackends = [{{ address = \"127.0.0.1:9000\" }}]\n\
                 [upstream.app.spawn]\ncommand = [\"{x}\"]\ncpus = [{core}]\nport_base = 9100\n"
            ),
            "test.toml:5:12: upstream.app.backends: set together with [upstream.NAME.spawn]",
        ),
        (
            format!(
                "{listener}[upstream.app.spawn]\ncommand = []\ncpus = [{core}]\nport_base = 9100\n"
            ),
            "test.toml:5:11: upstream.app.spawn.command: expected the program",
        ),
        (
            format!(
                "{listener}[upstream.app.spawn]\ncommand = [\"{x}\"]\ncount = 0\ncpus = [{core}]\nport_base = 9100\n"
            ),
            "test.toml:6:9: upstream.app.spawn.count: 0 is not allowed",
        ),
        (
            format!(
                "{listener}[upstream.app.spawn]\ncommand = [\"{x}\"]\ncount = 2\ncpus = [{core}]\nport_base = 65534\n"
            ),
            "test.toml:8:13: upstream.app.spawn.port_base: 65534 is out of range",
        ),
        (
            format!(
                "{listener}[upstream.app.spawn]\ncommand = [\"{x}\"]\ncpus = [4095]\nport_base = 9100\n"
            ),
            "test.toml:6:8: upstream.app.spawn.cpus: core 4095 is not a core of this machine",
        ),
        (
            format!(
                "{listener}[upstream.app.spawn]\ncommand = [\"{x}\"]\ncount = 4\ncpus = [{core}]\nport_base = 8077\n"
            ),
            "test.toml:8:13: upstream.app.spawn.port_base: port 8080 (one of port_base to port_base + 2 × count - 1) is also a listener's",
        ),
        (
            format!(
                "{listener}[upstream.app.spawn]\ncommand = [\"{x}\"]\ncpus = [{core}]\nport_base = 9100\nenv = {{ \"A=B\" = \"1\" }}\n"
            ),
            "test.toml:8:17: upstream.app.spawn.env.A=B: expected a variable name without '='",
        ),
        (
            format!(
                "{listener}[upstream.app.spawn]\ncommand = [\"{x}\"]\ncpus = [{core}]\nport_base = 9100\nrestart = \"always\"\n"
            ),
            "test.toml:8:1: upstream.app.spawn.restart: unknown field `restart`",
        ),
        (
            format!("{listener}[upstream.app]\nkeepalive = 4\n"),
            "test.toml:4:1: upstream.app.backends: missing, expected a list of backends or an [upstream.NAME.spawn] table",
        ),
    ];
    for (toml, want) in cases {
        let e = pinlb::Config::parse("test.toml", &toml, &allowed())
            .expect_err(&toml)
            .to_string();
        assert!(e.starts_with(want), "got:  {e}\nwant: {want}…\n{toml}");
    }
}

#[test]
fn check_shows_the_spawned_processes_on_their_cores() {
    let toml = spawn_config(free_port_base(2), 2, "", "");
    let path = temp_config(&toml);
    let out = std::process::Command::new(bin())
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("spawn: 2 process(es)"), "{text}");
    assert!(
        text.contains(&format!("core {}:", child_core())) && text.contains("(spawned)"),
        "{text}"
    );
}

/// A config whose spawn table runs `command` (a TOML array), with `extra` keys in the table:
/// the program, `command`'s first element, is on line 7 at column 12.
fn command_config(command: &str, extra: &str) -> String {
    format!(
        "[runtime]\ncpus = [{worker}]\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\n\
         [upstream.app.spawn]\ncommand = {command}\ncpus = [{core}]\nport_base = {base}\n{extra}",
        worker = first_core(),
        core = child_core(),
        base = free_port_base(1),
    )
}

/// `pinlb CMD -c path` run in `dir`, waited for (bounded: `WAIT`; it is killed past that, as a
/// `serve` that accepted the file would run on).
fn run_in(dir: &std::path::Path, cmd: &str, path: &std::path::Path) -> std::process::Output {
    let mut child = std::process::Command::new(bin())
        .args([cmd, "-c"])
        .arg(path)
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let status = child.wait();
        let _ = tx.send(status);
    });
    let Ok(status) = rx.recv_timeout(WAIT) else {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
        panic!(
            "pinlb {cmd} -c {} still runs after {WAIT:?}",
            path.display()
        );
    };
    let read = |mut r: Box<dyn std::io::Read>| {
        let mut v = Vec::new();
        r.read_to_end(&mut v).unwrap();
        v
    };
    std::process::Output {
        status: status.unwrap(),
        stdout: read(Box::new(stdout)),
        stderr: read(Box::new(stderr)),
    }
}

/// A spawn command that `exec` could not run fails `pinlb check` (exit 1), and `pinlb serve`
/// with the same error before it starts anything, as every config error does: the file, line
/// and column of the program, the key and what was expected. The program is looked up as the
/// spawn will: a name without `/` in `PATH` (the table's `env.PATH` when it sets one), a path
/// with `/` from the processes' working directory (`cwd`, else pinlb's).
#[test]
fn check_and_serve_refuse_a_spawn_command_that_cannot_be_run() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let ok = dir.join("ok.sh");
    std::fs::write(&ok, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&ok, std::fs::Permissions::from_mode(0o755)).unwrap();
    let plain = dir.join("app.sh");
    std::fs::write(&plain, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    let key = "upstream.app.spawn.command[0]";
    let refused = [
        (
            command_config("[\"pinlb-no-such-program\", \"{port}\"]", ""),
            format!("{key}: \"pinlb-no-such-program\" is not in PATH ("),
        ),
        (
            // Relative to pinlb's working directory (`dir`), where there is no `./target`.
            command_config("[\"./target/release/pinlb\", \"backend\"]", ""),
            format!(
                "{key}: \"./target/release/pinlb\": no such file in {}",
                dir.display()
            ),
        ),
        (
            // Relative to `cwd` when it is set: `./ok.sh` is in `dir`, not in `sub`.
            command_config("[\"./ok.sh\"]", &format!("cwd = \"{}\"\n", sub.display())),
            format!("{key}: \"./ok.sh\": no such file in {}", sub.display()),
        ),
        (
            command_config(&format!("[\"{}\"]", plain.display()), ""),
            format!(
                "{key}: \"{}\" is not executable (mode 644)",
                plain.display()
            ),
        ),
        (
            // Found in the table's PATH, but not executable there.
            command_config(
                "[\"app.sh\"]",
                &format!("env = {{ PATH = \"{}\" }}\n", dir.display()),
            ),
            format!(
                "{key}: \"app.sh\" is not executable (mode 644) in {}",
                dir.display()
            ),
        ),
        (
            command_config(&format!("[\"{}\"]", dir.display()), ""),
            format!("{key}: \"{}\" is a directory", dir.display()),
        ),
    ];
    for (toml, want) in &refused {
        let path = dir.join("pinlb.toml");
        std::fs::write(&path, toml).unwrap();
        let want = format!("{}:7:12: {want}", path.display());
        for cmd in ["check", "serve"] {
            let out = run_in(dir, cmd, &path);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "pinlb {cmd}: {stderr}\n{toml}");
            assert!(
                stderr.starts_with(&want),
                "pinlb {cmd}\ngot:  {stderr}\nwant: {want}…\n{toml}"
            );
            assert!(stderr.contains("expected "), "{stderr}");
        }
    }
    // What the spawn would run is accepted: a path from `cwd`, a name in the table's PATH.
    let accepted = [
        command_config("[\"./ok.sh\"]", &format!("cwd = \"{}\"\n", dir.display())),
        command_config(
            "[\"ok.sh\"]",
            &format!("env = {{ PATH = \"{}\" }}\n", dir.display()),
        ),
        command_config("[\"sh\", \"-c\", \"exit 0\"]", ""),
    ];
    for toml in &accepted {
        let path = dir.join("pinlb.toml");
        std::fs::write(&path, toml).unwrap();
        let out = run_in(&sub, "check", &path);
        assert!(
            out.status.success(),
            "{}\n{toml}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn the_example_spawn_config_is_valid() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/spawn.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    // It runs the README's `cargo build --release` from the clone's root, where its comment
    // says to start pinlb; this test build has its own binary, which stands in for that one.
    let release = "\"./target/release/pinlb\", \"backend\"";
    assert!(text.contains(release), "{text}");
    let text = text.replace(release, &format!("\"{}\", \"backend\"", bin()));
    let config = pinlb::Config::parse("config/spawn.toml", &text, &allowed())
        .unwrap_or_else(|e| panic!("{e}"));
    let spawn = config.upstreams[0].spawn.as_ref().expect("a spawn table");
    assert_eq!((spawn.count, spawn.port_base), (4, 9100));
}

#[tokio::test]
async fn a_rolling_restart_whose_new_process_never_answers_keeps_the_old_one_serving() {
    let base = free_port_base(1);
    let config = |command: &str| {
        format!(
            "[runtime]\ncpus = [{worker}]\n\
             [admin]\naddress = \"127.0.0.1:0\"\n\
             [[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\n\
             [upstream.app.spawn]\ncommand = {command}\ncpus = [{core}]\nport_base = {base}\n\
             ready_timeout = \"300ms\"\ngrace = \"1s\"\n",
            worker = first_core(),
            core = child_core(),
        )
    };
    let good = format!(
        "[\"{}\", \"backend\", \"--listen\", \"127.0.0.1:{{port}}\"]",
        bin()
    );
    let proxy = Proxy::start_file(&config(&good));
    let before = ready(&proxy, 1, |_| true).await;
    let old = pid(&before[0]);

    // A program that never listens: its start fails after ready_timeout.
    proxy.rewrite(&config("[\"sleep\", \"30\"]"));
    let r = proxy.admin(Method::POST, "/reload", None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    // The record shows the new process starting, then the old one again once the roll stops.
    let started = poll(200, Duration::from_millis(20), async || {
        let s = proxy.status().await;
        let p = &s["spawned"][0];
        (p["state"] == "starting").then(|| pid(p))
    })
    .await
    .expect("the new process starts");
    assert_ne!(started, old);
    let back = ready(&proxy, 1, |s| pid(&s[0]) == old).await;
    assert_eq!(back[0]["restarts"], 0);
    let reaped = poll_blocking(100, Duration::from_millis(50), || {
        gone(started).then_some(())
    });
    assert!(
        reaped.is_some(),
        "the process that never answered still runs"
    );
    for _ in 0..3 {
        assert_eq!(get(proxy.addr, "/").await.status, StatusCode::OK);
    }
}

//! `pinlb upgrade`: a new binary takes over the running one's listening sockets while clients
//! keep connecting, and the old process drains and exits. pinlb and its backend run as the
//! binary (`pinlb serve`, `pinlb backend`); the clients are real TCP and hyper connections.

use crate::common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A process the test did not start itself (the upgraded pinlb, a child of the old one):
/// stopped with SIGTERM when the test ends, SIGKILL if it must.
struct Adopted(i32);

impl Adopted {
    fn alive(&self) -> bool {
        // A zombie (exited, not yet reaped by init) counts as gone.
        std::fs::read_to_string(format!("/proc/{}/stat", self.0))
            .map(|s| {
                !s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(false)
    }

    async fn stop(&self) -> bool {
        let pid = nix::unistd::Pid::from_raw(self.0);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        poll(250, Duration::from_millis(20), async || {
            (!self.alive()).then_some(())
        })
        .await
        .is_some()
    }
}

impl Drop for Adopted {
    fn drop(&mut self) {
        if self.alive() {
            let pid = nix::unistd::Pid::from_raw(self.0);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// A fresh upgrade socket path under cargo's scratch directory.
fn socket_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("upg-{}-{name}.sock", std::process::id()))
}

/// The proxy's configuration: `cpus`, one listener on port 0, an admin listener, and the
/// upgrade socket.
fn config(backend: SocketAddr, cpus: &[usize], socket: &Path) -> String {
    let mut setup = Setup::with(&[backend]);
    setup.cpus = cpus.to_vec();
    setup.extra = "[admin]\naddress = \"127.0.0.1:0\"\n".into();
    setup.toml().replacen(
        "[runtime]\n",
        &format!("[runtime]\nupgrade_socket = \"{}\"\n", socket.display()),
        1,
    )
}

/// Runs `pinlb upgrade ARGS` on a blocking thread, bounded.
async fn upgrade(args: Vec<std::ffi::OsString>) -> Output {
    let run = tokio::task::spawn_blocking(move || {
        Command::new(bin())
            .arg("upgrade")
            .args(args)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .output()
            .expect("run pinlb upgrade")
    });
    tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .expect("pinlb upgrade finished")
        .expect("its thread")
}

/// The pid in `pinlb upgrade`'s "upgraded: pid N serves now" line.
fn new_pid(out: &Output) -> i32 {
    let text = String::from_utf8_lossy(&out.stdout);
    text.strip_prefix("upgraded: pid ")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "no pid in pinlb upgrade's output: {text:?}, stderr {:?}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// Request outcomes of the client loops.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    failed: AtomicU64,
    errors: std::sync::Mutex<Vec<String>>,
}

impl Tally {
    fn fail(&self, e: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        self.errors.lock().unwrap().push(e);
    }
}

/// One request on a new connection, `Connection: close`, read to the end.
async fn fresh_request(addr: SocketAddr) -> Result<(), String> {
    let work = async {
        let mut s = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        s.write_all(b"GET / HTTP/1.1\r\nhost: up\r\nconnection: close\r\n\r\n")
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut got = Vec::new();
        s.read_to_end(&mut got)
            .await
            .map_err(|e| format!("read: {e}"))?;
        let text = String::from_utf8_lossy(&got);
        if text.starts_with("HTTP/1.1 200 ") && text.ends_with("hello world\n") {
            Ok(())
        } else {
            Err(format!("response {text:?}"))
        }
    };
    tokio::time::timeout(WAIT, work)
        .await
        .unwrap_or_else(|_| Err("no response in time".into()))
}

/// Requests on new connections until `stop`.
async fn fresh_loop(addr: SocketAddr, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    while !stop.load(Ordering::Relaxed) {
        match fresh_request(addr).await {
            Ok(()) => tally.ok.fetch_add(1, Ordering::Relaxed),
            Err(e) => {
                tally.fail(e);
                0
            }
        };
    }
}

/// Keep-alive requests on one connection, a new one when the server closes it, until `stop`.
async fn keepalive_loop(addr: SocketAddr, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let mut conn: Option<Conn> = None;
    while !stop.load(Ordering::Relaxed) {
        let c = match &mut conn {
            Some(c) => c,
            None => conn.insert(Conn::open(addr).await),
        };
        let req = request(http::Method::GET, "/", empty());
        match tokio::time::timeout(WAIT, c.try_send(req)).await {
            Ok(Ok(resp)) => {
                let closing = resp
                    .headers()
                    .get(http::header::CONNECTION)
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
                let reply = Reply::read(resp).await;
                if reply.status == 200 && reply.body == "hello world\n" {
                    tally.ok.fetch_add(1, Ordering::Relaxed);
                } else {
                    tally.fail(format!("keep-alive: {} {:?}", reply.status, reply.body));
                }
                if closing {
                    conn = None;
                }
            }
            // Seen closed before the request went out (after a response that said close): it
            // goes out again on a new one. A request that went out and met a close instead of
            // its response (the old process closing an idle connection as it was sent) is a
            // failure: the old process lets idle connections linger for that.
            Ok(Err(e)) if e.is_closed() || e.is_canceled() => conn = None,
            Ok(Err(e)) => {
                tally.fail(format!("keep-alive: {e}"));
                conn = None;
            }
            Err(_) => {
                tally.fail("keep-alive: no response in time".into());
                conn = None;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_upgrade_under_load_fails_no_request_and_the_old_process_drains_and_exits() {
    let cores = allowed();
    let backend = BinBackend::start(*cores.last().unwrap());
    let socket = socket_path("load");
    let cpus: Vec<usize> = cores.iter().copied().take(2).collect();
    let toml = config(backend.addr, &cpus, &socket);
    let mut old = BinProxy::spawn_toml(&toml, &[]).await;
    let admin = old.admin_addr().await;
    assert_eq!(get(old.addr, "/").await.status, 200);

    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let mut loops = Vec::new();
    for _ in 0..4 {
        loops.push(tokio::spawn(fresh_loop(
            old.addr,
            stop.clone(),
            tally.clone(),
        )));
        loops.push(tokio::spawn(keepalive_loop(
            old.addr,
            stop.clone(),
            tally.clone(),
        )));
    }
    // Load runs before, during and after the upgrade.
    let before = poll(200, Duration::from_millis(10), async || {
        (tally.ok.load(Ordering::Relaxed) >= 200).then_some(())
    })
    .await;
    assert!(before.is_some(), "the client loops never got going");

    let out = upgrade(vec![
        "-c".into(),
        old.config_path().into(),
        "--timeout".into(),
        "20s".into(),
    ])
    .await;
    assert!(
        out.status.success(),
        "pinlb upgrade failed: {}\nproxy log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        old.log().join("\n")
    );
    let new = Adopted(new_pid(&out));
    assert_ne!(new.0, old.pid);
    assert!(new.alive(), "the new process runs");

    // The old one drains and exits by itself, cleanly.
    let status = old.wait_exit().await;
    assert!(status.success(), "the old process exited with {status}");
    old.wait_for_log("handed over to the new process: draining")
        .await;
    // Load goes on after the old process is gone: only the new one can answer it now.
    let at_exit = tally.ok.load(Ordering::Relaxed);
    let after = poll(300, Duration::from_millis(10), async || {
        (tally.ok.load(Ordering::Relaxed) >= at_exit + 200).then_some(())
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for l in loops {
        l.await.expect("client loop");
    }
    assert!(
        after.is_some(),
        "no requests served after the old process exited"
    );
    let failed = tally.failed.load(Ordering::Relaxed);
    assert_eq!(
        failed,
        0,
        "{failed} of {} requests failed: {:?}",
        tally.ok.load(Ordering::Relaxed) + failed,
        tally.errors.lock().unwrap()
    );

    // The admin listener came over too, and the new process upgrades again in its turn.
    let status_page = get(admin, "/status").await;
    assert_eq!(status_page.status, 200);
    let again = upgrade(vec!["-c".into(), old.config_path().into()]).await;
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let newer = Adopted(new_pid(&again));
    let gone = poll(250, Duration::from_millis(20), async || {
        (!new.alive()).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "the first new process exits after the second upgrade"
    );
    assert_eq!(get(old.addr, "/").await.status, 200);
    assert!(newer.stop().await, "the last process stops on SIGTERM");
    assert!(
        !socket.exists(),
        "a process that stops (not upgraded) removes its upgrade socket"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upgrade_to_an_invalid_file_fails_with_its_error_and_the_old_process_keeps_serving() {
    let cores = allowed();
    let backend = BinBackend::start(*cores.last().unwrap());
    let socket = socket_path("invalid");
    let old = BinProxy::spawn_toml(&config(backend.addr, &[cores[0]], &socket), &[]).await;
    let bad = temp_config("[runtime]\nshutdown_timeout = \"soon\"\n");
    let out = upgrade(vec![
        "--socket".into(),
        socket.clone().into(),
        "-c".into(),
        bad.clone().into(),
    ])
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    // The new process's own validation error, with the place and the key, reaches the caller.
    assert!(
        stderr.contains("the running process keeps serving")
            && stderr.contains(&format!("{}:2:", bad.display()))
            && stderr.contains("runtime.shutdown_timeout"),
        "{stderr}"
    );
    assert_eq!(get(old.addr, "/").await.status, 200);
    assert_eq!(fresh_request(old.addr).await, Ok(()));
    let _ = std::fs::remove_file(bad);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_binary_that_exits_before_it_is_ready_leaves_the_old_process_serving() {
    let cores = allowed();
    let backend = BinBackend::start(*cores.last().unwrap());
    let socket = socket_path("crash");
    let old = BinProxy::spawn_toml(&config(backend.addr, &[cores[0]], &socket), &[]).await;
    let out = upgrade(vec![
        "-c".into(),
        old.config_path().into(),
        "--binary".into(),
        "/bin/false".into(),
    ])
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("exit status: 1"), "{stderr}");
    assert_eq!(get(old.addr, "/").await.status, 200);
    // It keeps listening for upgrades: a good one still works after the failed one.
    let out = upgrade(vec!["-c".into(), old.config_path().into()]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new = Adopted(new_pid(&out));
    assert_eq!(get(old.addr, "/").await.status, 200);
    assert!(new.stop().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_process_with_fewer_workers_accepts_on_every_inherited_socket() {
    let cores = allowed();
    if cores.len() < 2 {
        eprintln!("skipped: needs two allowed cores for two workers, this process has {cores:?}");
        return;
    }
    let backend = BinBackend::start(cores[1]);
    let socket = socket_path("fewer");
    let mut old = BinProxy::spawn_toml(&config(backend.addr, &cores[..2], &socket), &[]).await;
    let one = temp_config(&config(backend.addr, &cores[..1], &socket));
    let out = upgrade(vec!["-c".into(), one.clone().into()]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new = Adopted(new_pid(&out));
    assert!(old.wait_exit().await.success());
    // The kernel hashes new connections over both workers' SO_REUSEPORT sockets; with one of
    // them unread, about half of these would wait until they timed out.
    for i in 0..64 {
        assert_eq!(fresh_request(old.addr).await, Ok(()), "request {i}");
    }
    assert!(new.stop().await);
    let _ = std::fs::remove_file(one);
}

/// `msg` sent to a UDP listener at `addr`, and its answer, within a second.
async fn datagram(addr: SocketAddr, msg: &[u8]) -> Option<Vec<u8>> {
    let s = tokio::net::UdpSocket::bind("127.0.0.1:0").await.ok()?;
    s.connect(addr).await.ok()?;
    s.send(msg).await.ok()?;
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(1), s.recv(&mut buf))
        .await
        .ok()?
        .ok()?;
    Some(buf[..n].to_vec())
}

#[tokio::test]
async fn an_upgrade_hands_tcp_and_udp_listeners_over_and_the_old_process_drains_its_connections() {
    let (tcp_backend, udp_backend) = (tcp_echo(None).await, udp_echo().await);
    let socket = socket_path("relays");
    let toml = format!(
        "[runtime]\ncpus = [{core}]\nupgrade_socket = \"{}\"\n\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\nmode = \"tcp\"\nupstream = \"t\"\n\n\
         [[listener]]\naddress = \"127.0.0.1:0\"\nmode = \"udp\"\nupstream = \"u\"\nresponses = 1\n\n\
         [upstream.t]\nbackends = [{{ address = \"{tcp_backend}\" }}]\n\n\
         [upstream.u]\nbackends = [{{ address = \"{udp_backend}\" }}]\n",
        socket.display(),
        core = first_core()
    );
    let mut old = BinProxy::spawn_toml(&toml, &[]).await;
    let line = old.wait_for_log("for upstream u").await;
    let udp: SocketAddr = line
        .split("listening on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no UDP listener's address in {line:?}"));
    let tcp = old.addr;
    let mut before = tokio::net::TcpStream::connect(tcp).await.unwrap();
    assert_eq!(echoed(&mut before, b"one").await, b"one");
    assert_eq!(datagram(udp, b"q1").await.as_deref(), Some(&b"q1"[..]));

    let out = upgrade(vec!["-c".into(), old.config_path().clone().into()]).await;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new = Adopted(new_pid(&out));
    // The new process serves both sockets; the connection the old one holds runs on there.
    let mut after = tokio::net::TcpStream::connect(tcp).await.unwrap();
    assert_eq!(echoed(&mut after, b"two").await, b"two");
    for i in 0..8 {
        let q = format!("q2-{i}");
        assert_eq!(
            datagram(udp, q.as_bytes()).await.as_deref(),
            Some(q.as_bytes()),
            "datagram {i} after the upgrade"
        );
    }
    assert_eq!(echoed(&mut before, b"still").await, b"still");
    drop(before);
    assert!(
        old.wait_exit().await.success(),
        "the old process drains and exits"
    );
    assert_eq!(echoed(&mut after, b"three").await, b"three");
    // A stop, as an upgrade's, lets open relays run for up to shutdown_timeout: this one ends.
    drop(after);
    assert!(new.stop().await);
}

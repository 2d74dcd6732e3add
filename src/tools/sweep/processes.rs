//! Each layout's processes: backends (`pinlb backend`, or the user's `--cmd`) and the proxy (a
//! `pinlb serve` child on a generated configuration), started pinned, polled until they
//! answer, and stopped when the sweep ends.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{Layout, SweepArgs, SweepError};
use crate::sys::cpus::format_cpu_list;

/// How long a started process may take to answer its first request.
const READY_TIME: Duration = Duration::from_secs(15);
/// After SIGTERM, how long a child has to exit before it is killed.
const STOP_TIME: Duration = Duration::from_secs(2);

/// The children a sweep started; each is stopped (SIGTERM, then SIGKILL) when this is dropped,
/// however the sweep ends. They are also `child::pinned`: killed by the kernel if pinlb dies.
#[derive(Default)]
pub(super) struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &self.0 {
            if let Ok(pid) = i32::try_from(c.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
        let until = Instant::now() + STOP_TIME;
        for c in &mut self.0 {
            // Bounded by STOP_TIME over all children.
            while matches!(c.try_wait(), Ok(None)) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// A loopback port no one listens on now. The kernel could hand it out again before the child
/// binds it; the child then fails to start, which the readiness check reports.
fn free_port() -> Result<u16, SweepError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| SweepError::Start {
        what: "a loopback port".into(),
        reason: e.to_string(),
    })?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| SweepError::Start {
            what: "a loopback port".into(),
            reason: e.to_string(),
        })
}

/// Starts `command` pinned to `cpus`, its output in `log`.
fn spawn(
    what: &str,
    mut command: Command,
    cpus: &[usize],
    log: &Path,
    children: &mut Children,
) -> Result<(), SweepError> {
    let fail = |reason: String| SweepError::Start {
        what: what.to_string(),
        reason,
    };
    let out = File::create(log).map_err(|e| fail(format!("{}: {e}", log.display())))?;
    let err = out.try_clone().map_err(|e| fail(e.to_string()))?;
    command
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    crate::sys::child::pinned(&mut command, cpus).map_err(|e| fail(e.to_string()))?;
    let child = command.spawn().map_err(|e| fail(e.to_string()))?;
    children.0.push(child);
    Ok(())
}

/// The command of one backend process on `port`.
fn backend_command(args: &SweepArgs, port: u16, core: usize) -> Result<Command, SweepError> {
    let start = |reason: String| SweepError::Start {
        what: "a backend".into(),
        reason,
    };
    match &args.cmd {
        None => {
            let exe = std::env::current_exe().map_err(|e| start(e.to_string()))?;
            let mut c = Command::new(exe);
            c.arg("backend")
                .arg("--listen")
                .arg(format!("127.0.0.1:{port}"))
                .arg("--cpus")
                .arg(core.to_string())
                .arg("--work")
                .arg(humantime::format_duration(args.work).to_string());
            Ok(c)
        }
        Some(cmd) => {
            let argv = shlex::split(cmd).unwrap_or_default();
            let argv: Vec<String> = argv
                .iter()
                .map(|a| a.replace("{port}", &port.to_string()))
                .collect();
            let (program, rest) = argv
                .split_first()
                .ok_or_else(|| start("--cmd is empty".into()))?;
            let mut c = Command::new(program);
            c.args(rest).env("PORT", port.to_string());
            Ok(c)
        }
    }
}

/// Starts a layout's processes, waits until they answer, and returns the address to load.
pub(super) fn start_layout(
    args: &SweepArgs,
    layout: &Layout,
    logs: &Path,
    max_connections: usize,
    children: &mut Children,
) -> Result<SocketAddr, SweepError> {
    let mut addrs = Vec::with_capacity(layout.backends.len());
    for (i, &core) in layout.backends.iter().enumerate() {
        let port = free_port()?;
        let what = format!("{} backend {i} (core {core}, port {port})", layout.name);
        let log = logs.join(format!("{}-backend-{i}.log", layout.id));
        spawn(
            &what,
            backend_command(args, port, core)?,
            &[core],
            &log,
            children,
        )?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        wait_ready(&what, addr, &args.path, &log, children, |_| true)?;
        addrs.push(addr);
    }
    if layout.proxy.is_empty() {
        return Ok(addrs[0]);
    }
    let port = free_port()?;
    let toml = proxy_config(&layout.proxy, port, &addrs, max_connections);
    let config = logs.join(format!("{}-proxy.toml", layout.id));
    std::fs::write(&config, toml).map_err(|e| SweepError::Write {
        path: config.clone(),
        reason: e.to_string(),
    })?;
    let exe = std::env::current_exe().map_err(|e| SweepError::Start {
        what: "the proxy".into(),
        reason: e.to_string(),
    })?;
    let mut c = Command::new(exe);
    c.arg("serve")
        .arg("-c")
        .arg(&config)
        .env("RUST_LOG", "warn");
    let what = format!(
        "{} proxy (cores {}, port {port})",
        layout.name,
        format_cpu_list(&layout.proxy)
    );
    let log = logs.join(format!("{}-proxy.log", layout.id));
    spawn(&what, c, &layout.proxy, &log, children)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    // Through the proxy to a backend: a 502 or 503 means the proxy is up but not through yet.
    wait_ready(&what, addr, &args.path, &log, children, |s| s < 500)?;
    Ok(addr)
}

/// The configuration of a layout's proxy: a worker per proxy core, one listener, every backend.
fn proxy_config(cpus: &[usize], port: u16, backends: &[SocketAddr], max_c: usize) -> String {
    let list: Vec<String> = backends
        .iter()
        .map(|a| format!("{{ address = \"{a}\" }}"))
        .collect();
    let cpus: Vec<String> = cpus.iter().map(|c| c.to_string()).collect();
    format!(
        "# Written by pinlb sweep for one layout.\n[runtime]\ncpus = [{}]\nshutdown_timeout = \"1s\"\n\n[limits]\nmax_connections = {}\n\n[[listener]]\naddress = \"127.0.0.1:{port}\"\nupstream = \"app\"\n\n[upstream.app]\nbackends = [{}]\n",
        cpus.join(", "),
        (2 * max_c).max(10_000),
        list.join(", ")
    )
}

/// Polls `addr` with a GET of `path` until the status passes `ok`, the last child exited, or
/// `READY_TIME` is over.
fn wait_ready(
    what: &str,
    addr: SocketAddr,
    path: &str,
    log: &Path,
    children: &mut Children,
    ok: impl Fn(u16) -> bool,
) -> Result<(), SweepError> {
    let until = Instant::now() + READY_TIME;
    let mut last = String::from("nothing answered");
    let not_ready = |reason: String| SweepError::NotReady {
        what: what.to_string(),
        limit: READY_TIME,
        reason,
        log: log.display().to_string(),
    };
    // Bounded by READY_TIME: each pass takes at most a connect and a read timeout, or a pause.
    while Instant::now() < until {
        if let Some(child) = children.0.last_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                return Err(not_ready(format!("it exited ({status})")));
            }
        }
        match get_status(addr, path) {
            Ok(s) if ok(s) => return Ok(()),
            Ok(s) => last = format!("status {s}"),
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(not_ready(last))
}

/// One `GET path` on a connection of its own; the response's status.
fn get_status(addr: SocketAddr, path: &str) -> std::io::Result<u16> {
    let limit = Duration::from_secs(1);
    let mut s = TcpStream::connect_timeout(&addr, limit)?;
    s.set_read_timeout(Some(limit))?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head)?;
    std::str::from_utf8(&head[9..12])
        .ok()
        .and_then(|c| c.parse().ok())
        .filter(|_| head.starts_with(b"HTTP/1."))
        .ok_or_else(|| std::io::Error::other("not an HTTP/1.x response"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_gets_a_worker_per_core_and_every_backend() {
        let toml = proxy_config(
            &[0, 1],
            8080,
            &[
                "127.0.0.1:1".parse().unwrap(),
                "127.0.0.1:2".parse().unwrap(),
            ],
            20_000,
        );
        let cores = crate::sys::cpus::allowed_cpus().unwrap();
        // Parsed as `pinlb serve` would, when this machine has the cores.
        if cores.len() >= 2 {
            let toml = toml.replace(
                "cpus = [0, 1]",
                &format!("cpus = [{}, {}]", cores[0], cores[1]),
            );
            let c = crate::Config::parse("sweep.toml", &toml, &cores).unwrap();
            assert_eq!(c.runtime.cpus, [cores[0], cores[1]]);
        }
        assert!(toml.contains("max_connections = 40000"), "{toml}");
        assert!(toml.contains("{ address = \"127.0.0.1:1\" }, { address = \"127.0.0.1:2\" }"));
    }
}

//! Processes `pinlb sweep` and `pinlb bench --proxy` start for themselves (backends, and the
//! proxies in front of them): started pinned (`child::pinned`), their output in a log, polled
//! until they answer, and stopped (SIGTERM, then SIGKILL) when the run ends, however it ends.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a started process may take to answer its first request.
pub const READY_TIME: Duration = Duration::from_secs(15);
/// After SIGTERM, how long a child has to exit before it is killed.
const STOP_TIME: Duration = Duration::from_secs(2);

/// Why a process could not be started or did not come up.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("cannot start {what}: {reason}")]
    Start { what: String, reason: String },
    #[error("{what} did not answer within {limit:?}: {reason} (its log: {log})")]
    NotReady {
        what: String,
        limit: Duration,
        reason: String,
        log: String,
    },
    #[error("cannot write {path}: {reason}")]
    Write { path: PathBuf, reason: String },
}

/// The children a run started; each is stopped (SIGTERM, then SIGKILL) when this is dropped,
/// however the run ends. They are also `child::pinned`: killed by the kernel if pinlb dies.
#[derive(Default)]
pub struct Children(Vec<Child>);

impl Children {
    /// The process ID of the child started last.
    pub fn last_pid(&self) -> Option<u32> {
        self.0.last().map(Child::id)
    }
}

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
pub fn free_port() -> Result<u16, LaunchError> {
    let fail = |e: std::io::Error| LaunchError::Start {
        what: "a loopback port".into(),
        reason: e.to_string(),
    };
    let l = TcpListener::bind("127.0.0.1:0").map_err(fail)?;
    l.local_addr().map(|a| a.port()).map_err(fail)
}

/// Starts `command` pinned to `cpus`, its output in `log`; returns its process ID.
pub fn spawn(
    what: &str,
    mut command: Command,
    cpus: &[usize],
    log: &Path,
    children: &mut Children,
) -> Result<u32, LaunchError> {
    let fail = |reason: String| LaunchError::Start {
        what: what.to_string(),
        reason,
    };
    let out = File::create(log).map_err(|e| fail(format!("{}: {e}", log.display())))?;
    let err = out.try_clone().map_err(|e| fail(e.to_string()))?;
    command
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    pinlb::sys::child::pinned(&mut command, cpus).map_err(|e| fail(e.to_string()))?;
    let child = command
        .spawn()
        .map_err(|e| fail(format!("{:?}: {e}", command.get_program())))?;
    let pid = child.id();
    children.0.push(child);
    Ok(pid)
}

/// Polls `addr` with a GET of `path` until the status passes `ok`, the last child exited, or
/// [`READY_TIME`] is over.
pub fn wait_ready(
    what: &str,
    addr: SocketAddr,
    path: &str,
    log: &Path,
    children: &mut Children,
    ok: impl Fn(u16) -> bool,
) -> Result<(), LaunchError> {
    let until = Instant::now() + READY_TIME;
    let mut last = String::from("nothing answered");
    let not_ready = |reason: String| LaunchError::NotReady {
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
pub fn get_status(addr: SocketAddr, path: &str) -> std::io::Result<u16> {
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

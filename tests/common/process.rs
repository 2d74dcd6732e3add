//! pinlb run as the binary: `pinlb serve` as a child process, its log, signals and memory.

use std::io::{BufRead, BufReader as StdBufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::{Setup, WAIT, poll, temp_config};

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_pinlb")
}

/// `pinlb serve` as a child process; its stderr is collected line by line.
pub struct BinProxy {
    pub child: Child,
    pub pid: i32,
    pub addr: SocketAddr,
    log: watch::Receiver<Vec<String>>,
    config: PathBuf,
}

impl BinProxy {
    /// Starts the binary and waits until it logs its listening address.
    pub async fn spawn(setup: &Setup) -> BinProxy {
        BinProxy::spawn_toml(&setup.toml(), &[]).await
    }

    /// Starts the binary on the configuration `toml`, with `env` added to its environment, and
    /// waits until it logs its listening address.
    pub async fn spawn_toml(toml: &str, env: &[(&str, &std::ffi::OsStr)]) -> BinProxy {
        let config = temp_config(toml);
        let mut command = Command::new(bin());
        command
            .args(["serve", "-c"])
            .arg(&config)
            .envs(env.iter().copied());
        BinProxy::spawn_command(command, config).await
    }

    /// Starts the binary on `toml` with the open file limit `ulimit` sets (`"-n 1024"`: soft
    /// and hard; `"-Sn 1024"`: the soft one), as `sh -c 'ulimit -n 1024 && exec pinlb serve …'`
    /// does (the same process, by `exec`).
    pub async fn spawn_with_ulimit(toml: &str, ulimit: &str) -> BinProxy {
        let config = temp_config(toml);
        let mut command = Command::new("sh");
        command
            .arg("-c")
            .arg(format!("ulimit {ulimit} && exec \"$0\" serve -c \"$1\""))
            .arg(bin())
            .arg(&config);
        BinProxy::spawn_command(command, config).await
    }

    /// Runs `command` (which starts `pinlb serve` on `config`) and waits until it logs its
    /// listening address.
    pub async fn spawn_command(mut command: Command, config: PathBuf) -> BinProxy {
        // `info` unless the test asked for another level.
        if !command.get_envs().any(|(k, _)| k == "RUST_LOG") {
            command.env("RUST_LOG", "info");
        }
        let mut child = command
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start pinlb");
        let stderr = child.stderr.take().unwrap();
        let (tx, log) = watch::channel(Vec::new());
        // Keep draining stderr so pinlb never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in StdBufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                tx.send_modify(|v| v.push(line));
            }
        });
        let pid = child.id() as i32;
        let mut p = BinProxy {
            child,
            pid,
            addr: "0.0.0.0:0".parse().unwrap(),
            log,
            config,
        };
        let line = p.wait_for_log("listening on ").await;
        let rest = &line[line.find("listening on ").unwrap() + "listening on ".len()..];
        p.addr = rest
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .expect("listening address");
        p
    }

    /// Waits (bounded) for a stderr line containing `needle` and returns it.
    pub async fn wait_for_log(&mut self, needle: &str) -> String {
        let found = tokio::time::timeout(
            WAIT,
            self.log
                .wait_for(|lines| lines.iter().any(|l| l.contains(needle))),
        )
        .await
        .ok()
        .and_then(|r| r.ok())
        .and_then(|lines| lines.iter().find(|l| l.contains(needle)).cloned());
        found.unwrap_or_else(|| {
            panic!(
                "pinlb never logged {needle:?}; stderr so far:\n{}",
                self.log().join("\n")
            )
        })
    }

    pub fn log(&self) -> Vec<String> {
        self.log.borrow().clone()
    }

    /// The config file it was started with (rewrite it, then SIGHUP).
    pub fn config_path(&self) -> &PathBuf {
        &self.config
    }

    /// The admin listener's address, from its start-up log line.
    pub async fn admin_addr(&mut self) -> SocketAddr {
        let line = self.wait_for_log("admin listening on http://").await;
        let rest = &line[line.find("http://").unwrap() + "http://".len()..];
        rest.trim_end_matches('/')
            .split('/')
            .next()
            .unwrap()
            .parse()
            .expect("admin address")
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), signal).expect("kill");
    }

    /// The file descriptors the process has open now.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid))
            .expect("list the process's file descriptors")
            .count()
    }

    /// The file descriptors the process holds at rest, serving nothing: measured after one
    /// request pinlb answers itself (a head without Host gets 400), since each worker opens its
    /// runtime's descriptors on its first connection, and once the count holds still.
    pub async fn fds_at_rest(&self) -> usize {
        let mut conn = super::RawConn::open(self.addr).await;
        conn.send(b"GET / HTTP/1.1\r\n\r\n").await;
        conn.wait_closed().await;
        // Polls: what is awaited is the absence of change, which no event announces; the
        // connection's own descriptor goes a moment after the client sees the close.
        let mut last = self.open_fds();
        let mut still = 0;
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = self.open_fds();
            if now == last {
                still += 1;
                if still == 3 {
                    return now;
                }
            } else {
                (last, still) = (now, 0);
            }
        }
        panic!("pinlb's file descriptors never held still: {last} and changing");
    }

    /// Waits (polls: the count is another process's, announced by no event; at most 5 s) until
    /// the process has at most `n` file descriptors open, and returns the last count.
    pub async fn wait_fds_at_most(&self, n: usize) -> usize {
        let back = poll(100, Duration::from_millis(50), async || {
            let now = self.open_fds();
            (now <= n).then_some(now)
        })
        .await;
        back.unwrap_or_else(|| self.open_fds())
    }

    /// Resident memory now (VmRSS) in KiB.
    pub fn vm_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .expect("read /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc status")
    }

    /// Peak resident memory (VmHWM) in KiB.
    pub fn vm_hwm_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid))
            .expect("read /proc status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmHWM in /proc status")
    }

    /// Waits (bounded: 250 polls 20 ms apart) for the process to exit. Polled: a child's exit is
    /// no event this runtime can await.
    pub async fn wait_exit(&mut self) -> ExitStatus {
        let start = Instant::now();
        let child = &mut self.child;
        let exited = poll(250, Duration::from_millis(20), async || {
            child.try_wait().expect("try_wait")
        })
        .await;
        exited.unwrap_or_else(|| {
            panic!(
                "pinlb still running {:?} after it was asked to stop; stderr:\n{}",
                start.elapsed(),
                self.log().join("\n")
            )
        })
    }
}

/// `(thread id, name, Cpus_allowed_list)` of every thread of `pid` ("self" for this process).
pub fn threads(pid: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let dir = std::fs::read_dir(format!("/proc/{pid}/task")).expect("list threads");
    for entry in dir.flatten() {
        let path = entry.path();
        // A thread may exit between the listing and the reads: skip it.
        let (Ok(comm), Ok(status)) = (
            std::fs::read_to_string(path.join("comm")),
            std::fs::read_to_string(path.join("status")),
        ) else {
            continue;
        };
        let cpus = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .map(|v| v.trim().to_string())
            .unwrap_or_default();
        let tid = entry.file_name().to_string_lossy().into_owned();
        out.push((tid, comm.trim().to_string(), cpus));
    }
    out
}

impl Drop for BinProxy {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.config);
    }
}

/// A `pinlb backend` child on a port of the kernel's choosing, pinned to one core; killed when
/// dropped.
pub struct BinBackend {
    pub child: Child,
    pub addr: SocketAddr,
}

impl BinBackend {
    /// Starts it pinned to `core` and waits (bounded) for its "listening on" line.
    pub fn start(core: usize) -> BinBackend {
        let mut child = Command::new(bin())
            .args(["backend", "--listen", "127.0.0.1:0", "--cpus"])
            .arg(core.to_string())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run pinlb backend");
        let stdout = child.stdout.take().expect("its stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = StdBufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = rx
            .recv_timeout(WAIT)
            .expect("pinlb backend printed its address");
        // "backend 0 listening on 127.0.0.1:PORT (core C)"
        let addr = line
            .strip_prefix("backend 0 listening on ")
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("an address in {line:?}"));
        BinBackend { child, addr }
    }
}

impl Drop for BinBackend {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

//! The proxies `pinlb sweep --proxy` and `pinlb bench --proxy` put in front of the same
//! backends: pinlb itself, and nginx and HAProxy found on PATH, each on a configuration
//! equivalent to the others' for one layout.
//!
//! Equivalent means, for every proxy (as `benches/compare.sh`'s hand-written configurations in
//! `benches/peers/` do):
//!
//! - one worker per proxy core, each pinned to its core: pinlb `[runtime] cpus`, nginx
//!   `worker_processes N` and `worker_cpu_affinity`, HAProxy `nbthread N` and a `cpu-map` per
//!   thread; the process itself starts pinned to those cores too (`child::pinned`);
//! - every backend, round robin, with up to [`KEEPALIVE`] idle keep-alive connections kept per
//!   backend and worker (nginx `keepalive` in the upstream, HAProxy `http-reuse always`), and
//!   client connections kept alive without a request limit;
//! - pinlb's default timeouts ([`::pinlb::config::Timeouts`], [`::pinlb::config::Limits`]) written
//!   out in the others' terms (connect, response, send, client idle, request head, body);
//! - the same limit of open connections, `X-Forwarded-For` added, and no access log anywhere.
//!
//! Each proxy's files (configuration, pid file, error log, nginx's temporary directories) go
//! into a directory of its own that the caller gives. A peer that is not on PATH is skipped
//! with a line that says how to install it ([`available`]).
//!
//! - [`pinlb`], [`nginx`], [`haproxy`]: each proxy's configuration text.

pub mod haproxy;
pub mod nginx;
pub mod pinlb;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use crate::launch::LaunchError;

/// Idle keep-alive connections each proxy keeps per backend and worker: pinlb's default
/// `keepalive`.
pub const KEEPALIVE: usize = 64;

/// A proxy that can stand in front of the backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Proxy {
    Pinlb,
    Nginx,
    Haproxy,
}

impl Proxy {
    pub const ALL: [Proxy; 3] = [Proxy::Pinlb, Proxy::Nginx, Proxy::Haproxy];

    /// Its name on the command line and in reports: `pinlb`, `nginx`, `haproxy`.
    pub fn as_str(self) -> &'static str {
        match self {
            Proxy::Pinlb => "pinlb",
            Proxy::Nginx => "nginx",
            Proxy::Haproxy => "haproxy",
        }
    }

    /// How people write it: `pinlb`, `nginx`, `HAProxy`.
    pub fn display_name(self) -> &'static str {
        match self {
            Proxy::Pinlb => "pinlb",
            Proxy::Nginx => "nginx",
            Proxy::Haproxy => "HAProxy",
        }
    }

    /// The Debian package that installs it.
    fn package(self) -> &'static str {
        match self {
            Proxy::Pinlb => "pinlb",
            Proxy::Nginx => "nginx",
            Proxy::Haproxy => "haproxy",
        }
    }

    /// `--proxy`'s values: a comma-separated list, each proxy once, in the order given.
    pub fn parse_list(s: &str) -> Result<Vec<Proxy>, String> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim) {
            let p: Proxy = part.parse()?;
            if out.contains(&p) {
                return Err(format!("{p} is given twice"));
            }
            out.push(p);
        }
        Ok(out)
    }
}

impl fmt::Display for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Proxy {
    type Err = String;

    fn from_str(s: &str) -> Result<Proxy, String> {
        Proxy::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("unknown proxy {s:?} (known: pinlb, nginx, haproxy)"))
    }
}

/// A proxy that can run here: its program and version.
#[derive(Debug, Clone, Serialize)]
pub struct Found {
    pub proxy: Proxy,
    pub program: PathBuf,
    /// As the program says it (`nginx/1.22.1`, `2.6.12-1+deb12u4`, pinlb's own version).
    pub version: String,
}

/// The proxies of `wanted` that can run here, in order: pinlb always (this very program), a
/// peer when its program is on PATH. Each one that is not gets a line saying so and how to
/// install it, in the second list.
pub fn available(wanted: &[Proxy]) -> (Vec<Found>, Vec<String>) {
    let mut found = Vec::new();
    let mut skipped = Vec::new();
    for &proxy in wanted {
        let program = match proxy {
            Proxy::Pinlb => std::env::current_exe().ok(),
            _ => on_path(proxy.as_str()),
        };
        match program {
            Some(program) => {
                let version = version(proxy, &program);
                found.push(Found {
                    proxy,
                    program,
                    version,
                });
            }
            None => skipped.push(not_found(proxy)),
        }
    }
    (found, skipped)
}

/// "haproxy not found on PATH: skipped (Debian: apt-get install haproxy)", and where Debian
/// puts it when it is there but outside PATH (/usr/sbin, which a user's PATH may lack).
fn not_found(proxy: Proxy) -> String {
    let name = proxy.as_str();
    let mut s = format!(
        "{name} not found on PATH: skipped (Debian: apt-get install {})",
        proxy.package()
    );
    for dir in ["/usr/sbin", "/usr/local/sbin"] {
        let p = Path::new(dir).join(name);
        if is_executable(&p) {
            s.push_str(&format!(
                "; {} exists: add {dir} to PATH to include it",
                p.display()
            ));
            break;
        }
    }
    s
}

/// The first executable `name` in a directory of PATH.
pub fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    p.is_file() && nix::unistd::access(p, nix::unistd::AccessFlags::X_OK).is_ok()
}

/// What the program says its version is; "?" when it does not say.
fn version(proxy: Proxy, program: &Path) -> String {
    if proxy == Proxy::Pinlb {
        return env!("CARGO_PKG_VERSION").to_string();
    }
    let Ok(out) = Command::new(program).arg("-v").output() else {
        return "?".into();
    };
    // nginx writes "nginx version: nginx/1.22.1" to stderr; HAProxy "HAProxy version 2.6.12-1
    // 2026/10/17 - https://haproxy.org/" to stdout.
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text.lines().next().unwrap_or("");
    let v = match proxy {
        Proxy::Nginx => line.rsplit(' ').next(),
        _ => line.split_whitespace().nth(2),
    };
    v.filter(|v| !v.is_empty()).unwrap_or("?").to_string()
}

/// One proxy's place in a layout: the same for every proxy.
#[derive(Debug, Clone)]
pub struct Spec<'a> {
    /// One worker per core, pinned to it.
    pub cores: &'a [usize],
    /// It listens on 127.0.0.1:port.
    pub port: u16,
    pub backends: &'a [SocketAddr],
    /// Client connections open at once, at most.
    pub max_connections: usize,
    /// Its own directory: configuration, pid file, error log, temporary files.
    pub dir: &'a Path,
    /// pinlb's admin listener, whose `/status` gives each backend's learned concurrency limit;
    /// the other proxies have none, and ignore it.
    pub admin: Option<SocketAddr>,
}

/// The timeouts every proxy gets: pinlb's defaults.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    /// Until the backend's response head.
    pub response: Duration,
    /// Writing the request to a backend that takes no data.
    pub send: Duration,
    /// An idle client keep-alive connection.
    pub client_idle: Duration,
    /// The client's request head.
    pub header: Duration,
    /// The client's request body.
    pub body: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        let t = ::pinlb::config::Timeouts::default();
        let l = ::pinlb::config::Limits::default();
        Timeouts {
            connect: t.connect,
            response: t.response,
            send: t.send,
            client_idle: t.client_idle,
            header: l.header_timeout,
            body: l.body_timeout,
        }
    }
}

/// Seconds, as nginx and HAProxy write durations ("5s"); at least 1.
fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs().max(1))
}

impl Found {
    /// Writes the proxy's configuration for `spec` into `spec.dir` and returns the command that
    /// runs it in the foreground (not yet pinned nor started).
    pub fn command(&self, spec: &Spec) -> Result<Command, LaunchError> {
        let dir_error = |e: std::io::Error| LaunchError::Write {
            path: spec.dir.to_path_buf(),
            reason: e.to_string(),
        };
        // nginx's temporary files go in tmp/, which it does not make itself.
        std::fs::create_dir_all(spec.dir.join("tmp")).map_err(dir_error)?;
        // Absolute: nginx takes relative paths from its prefix, not from where it started.
        let dir = spec.dir.canonicalize().map_err(dir_error)?;
        let spec = &Spec {
            dir: &dir,
            ..spec.clone()
        };
        let write = |name: &str, text: String| {
            let path = spec.dir.join(name);
            std::fs::write(&path, text)
                .map(|()| path.clone())
                .map_err(|e| LaunchError::Write {
                    path,
                    reason: e.to_string(),
                })
        };
        let nofile = ::pinlb::sys::limits::nofile().ok().and_then(|n| n.hard);
        let mut c = Command::new(&self.program);
        match self.proxy {
            Proxy::Pinlb => {
                let config = write("pinlb.toml", pinlb::config(spec))?;
                c.arg("serve").arg("-c").arg(config).env("RUST_LOG", "warn");
            }
            Proxy::Nginx => {
                let built = Command::new(&self.program)
                    .arg("-V")
                    .output()
                    .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
                    .map_err(|e| LaunchError::Start {
                        what: format!("{} -V", self.program.display()),
                        reason: e.to_string(),
                    })?;
                let config = write("nginx.conf", nginx::config(spec, &built, nofile))?;
                // -e: the error log before the configuration is read, which would otherwise
                // be the system's (/var/log/nginx, not writable by everyone).
                c.arg("-p")
                    .arg(spec.dir)
                    .arg("-c")
                    .arg(config)
                    .arg("-e")
                    .arg(spec.dir.join("error.log"));
            }
            Proxy::Haproxy => {
                let config = write("haproxy.cfg", haproxy::config(spec, nofile))?;
                // -db: in the foreground, no daemon, so the child is the proxy.
                c.arg("-db").arg("-f").arg(config);
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_parses_in_order_and_refuses_unknown_or_repeated_names() {
        assert_eq!(
            Proxy::parse_list("pinlb,nginx,HAProxy").unwrap(),
            [Proxy::Pinlb, Proxy::Nginx, Proxy::Haproxy]
        );
        assert_eq!(Proxy::parse_list("nginx").unwrap(), [Proxy::Nginx]);
        assert!(
            Proxy::parse_list("pinlb,envoy")
                .unwrap_err()
                .contains("envoy")
        );
        assert!(Proxy::parse_list("nginx,nginx").is_err());
        assert!(Proxy::parse_list("").is_err());
    }

    #[test]
    fn a_missing_peer_says_how_to_install_it() {
        let line = not_found(Proxy::Haproxy);
        assert!(
            line.starts_with(
                "haproxy not found on PATH: skipped (Debian: apt-get install haproxy)"
            ),
            "{line}"
        );
    }

    #[test]
    fn timeouts_are_pinlbs_defaults() {
        let t = Timeouts::default();
        assert_eq!(t.connect, Duration::from_secs(5));
        assert_eq!(secs(t.response), "60s");
        assert_eq!(secs(Duration::from_millis(200)), "1s");
    }
}

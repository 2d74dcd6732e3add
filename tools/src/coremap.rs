//! The core map `pinlb check` prints: which cores run pinlb's workers, which run backends, and
//! whether a backend's process may share a core with pinlb.
//!
//! Declared backend cores come from the config. The processes actually serving the backends are
//! found the way `ss -ltnp` finds them: the listening sockets in `/proc/net/tcp` and
//! `/proc/net/tcp6` give socket inodes, `/proc/<pid>/fd/*` links name the inodes each process
//! holds, and `/proc/<pid>/status` gives the process's allowed cores. What cannot be seen (another
//! user's processes without root, a backend on another machine) is said, not guessed.
//!
//! A Unix-socket backend is found the same way through `/proc/net/unix`: the stream socket
//! listening on its path gives the inode, and the process holding it its cores.
//!
//! The `procfs` crate reads and parses those files; the map built from them is pure and
//! unit-tested, and [`CoreMap::discover`] does the reading.

use std::collections::BTreeSet;
use std::fmt::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use procfs::net::{TcpNetEntry, TcpState, UnixNetEntry, UnixState};
use procfs::process::{FDTarget, Status};

use pinlb::backend_address::BackendAddress;
use pinlb::config::Config;
use pinlb::sys::cpus::format_cpu_list;

/// A process found listening on a backend's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub pid: u32,
    /// The command name (`/proc/<pid>/comm`).
    pub command: String,
    /// The cores its threads may run on: the union of each thread's `Cpus_allowed_list`
    /// (`/proc/<pid>/task/*/status`), so a process whose threads are pinned one per core is
    /// pinned, whatever the mask it started with.
    pub allowed: Vec<usize>,
}

/// What was found about one backend's process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// One or more processes hold the listening socket (several with `SO_REUSEPORT` or after a
    /// fork).
    Processes(Vec<Process>),
    /// A listening socket exists, but no visible process holds it (another user's process
    /// without the right to read its descriptors).
    Hidden,
    /// Nothing listens on that address on this machine.
    NotListening,
    /// Not an address of this machine: the process cannot be seen from here.
    Remote,
    /// `/proc` could not be read (not Linux, or no procfs).
    Unknown(String),
}

/// One backend and its process.
#[derive(Debug, Clone)]
pub struct BackendProcess {
    pub upstream: String,
    pub address: BackendAddress,
    /// Cores the config says the backend is pinned to.
    pub declared: Option<Vec<usize>>,
    /// A process pinlb spawns (`[upstream.NAME.spawn]`) rather than one started by others.
    pub spawned: bool,
    pub found: Found,
}

/// The per-core picture of one config on this machine.
#[derive(Debug, Clone)]
pub struct CoreMap {
    /// Every online core.
    pub cores: Vec<usize>,
    /// pinlb's worker cores, worker `i` on `workers[i]`.
    pub workers: Vec<usize>,
    pub backends: Vec<BackendProcess>,
}

impl CoreMap {
    /// Reads this machine's cores, listening sockets and processes for `config`'s backends.
    pub fn discover(config: &Config) -> CoreMap {
        let cores = pinlb::sys::cpus::online_cpus()
            .or_else(|| pinlb::sys::cpus::allowed_cpus().ok())
            .unwrap_or_default();
        let listening = read_listening();
        let unix = read_unix_listening();
        let mut wanted: BTreeSet<u64> = BTreeSet::new();
        if let Ok(sockets) = &listening {
            wanted.extend(sockets.iter().map(|s| s.1));
        }
        if let Ok(sockets) = &unix {
            wanted.extend(sockets.iter().map(|s| s.1));
        }
        let owners = if wanted.is_empty() {
            Vec::new()
        } else {
            socket_owners(&wanted)
        };
        let mut backends = Vec::new();
        let look = |address: BackendAddress| match (address, &listening, &unix) {
            (BackendAddress::Tcp(_), Err(e), _) | (BackendAddress::Unix(_), _, Err(e)) => {
                Found::Unknown(e.clone())
            }
            (BackendAddress::Tcp(a), Ok(sockets), _) => find(a, sockets, &owners),
            (BackendAddress::Unix(p), _, Ok(sockets)) => find_unix(p, sockets, &owners),
        };
        for u in &config.upstreams {
            for (i, b) in u.backends.iter().enumerate() {
                let mut address = b.address;
                let mut found = look(address);
                // A running pinlb may have rolled a spawned process onto its second port.
                if let (Some(s), Found::NotListening) = (&u.spawn, &found) {
                    let second = s.backend_address(i, 1);
                    if let f @ Found::Processes(_) = look(second) {
                        (address, found) = (second, f);
                    }
                }
                backends.push(BackendProcess {
                    upstream: u.name.clone(),
                    address,
                    declared: b.cpus.clone(),
                    spawned: u.spawn.is_some(),
                    found,
                });
            }
        }
        CoreMap {
            cores,
            workers: config.runtime.cpus.clone(),
            backends,
        }
    }

    /// The map as `check` prints it: one line per core, then each backend's process.
    pub fn render(&self) -> String {
        let mut s = String::from("core map:\n");
        let mut cores: BTreeSet<usize> = self.cores.iter().copied().collect();
        cores.extend(&self.workers);
        for b in &self.backends {
            cores.extend(b.declared.iter().flatten());
        }
        for core in cores {
            let mut on = Vec::new();
            for (i, w) in self.workers.iter().enumerate() {
                if *w == core {
                    on.push(format!("pinlb worker {i}"));
                }
            }
            // One entry per backend address: two upstreams may list one address, and a
            // backend may be both declared on a core and found running there.
            let mut addresses: Vec<BackendAddress> =
                self.backends.iter().map(|b| b.address).collect();
            addresses.sort_unstable();
            addresses.dedup();
            for addr in addresses {
                let same: Vec<&BackendProcess> =
                    self.backends.iter().filter(|b| b.address == addr).collect();
                let declared = same
                    .iter()
                    .any(|b| b.declared.as_ref().is_some_and(|d| d.contains(&core)));
                let how = if same.iter().any(|b| b.spawned) {
                    "(spawned)"
                } else {
                    "(declared)"
                };
                let mut pids: Vec<String> = Vec::new();
                for b in &same {
                    if let Found::Processes(ps) = &b.found {
                        for p in ps
                            .iter()
                            .filter(|p| self.pinned(p) && p.allowed.contains(&core))
                        {
                            let pid = format!("pid {} ({})", p.pid, p.command);
                            if !pids.contains(&pid) {
                                pids.push(pid);
                            }
                        }
                    }
                }
                match (declared, pids.is_empty()) {
                    (false, true) => {}
                    (true, true) => on.push(format!("backend {addr} {how}")),
                    (false, false) => on.push(format!("backend {addr} {}", pids.join(", "))),
                    (true, false) => {
                        on.push(format!("backend {addr} {how} {}", pids.join(", ")));
                    }
                }
            }
            let on = if on.is_empty() {
                "-".to_string()
            } else {
                on.join(", ")
            };
            let missing = if self.cores.contains(&core) {
                ""
            } else {
                " (not a core of this machine)"
            };
            let _ = writeln!(s, "  core {core}{missing}: {on}");
        }
        for b in &self.backends {
            let _ = write!(s, "  backend {} (upstream {}): ", b.address, b.upstream);
            let _ = match &b.found {
                Found::Processes(ps) => {
                    let list: Vec<String> = ps
                        .iter()
                        .map(|p| {
                            format!(
                                "pid {} ({}), allowed on cores {}{}",
                                p.pid,
                                p.command,
                                format_cpu_list(&p.allowed),
                                if self.pinned(p) { "" } else { " (not pinned)" }
                            )
                        })
                        .collect();
                    writeln!(s, "served by {}", list.join("; "))
                }
                Found::Hidden => writeln!(
                    s,
                    "a socket listens there, but its process is not visible (another user's; run check as root to see it)"
                ),
                Found::NotListening if b.spawned => {
                    writeln!(s, "not running; pinlb starts it when it runs")
                }
                Found::NotListening => writeln!(s, "nothing listens there yet"),
                Found::Remote => writeln!(
                    s,
                    "not an address of this machine; its process and cores cannot be seen from here"
                ),
                Found::Unknown(why) => writeln!(s, "cannot look for its process: {why}"),
            };
        }
        s
    }

    /// A process is pinned when it may not run on every online core.
    fn pinned(&self, p: &Process) -> bool {
        !self.cores.iter().all(|c| p.allowed.contains(c))
    }

    /// A warning for every backend process that may run on one of pinlb's cores, once however
    /// many upstreams list its address.
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for b in &self.backends {
            let Found::Processes(ps) = &b.found else {
                continue;
            };
            for p in ps {
                let shared: Vec<usize> = self
                    .workers
                    .iter()
                    .copied()
                    .filter(|c| p.allowed.contains(c))
                    .collect();
                if shared.is_empty() {
                    continue;
                }
                let warning = format!(
                    "backend {} is served by pid {} ({}), allowed on cores {}, which include pinlb's core{} {}",
                    b.address,
                    p.pid,
                    p.command,
                    format_cpu_list(&p.allowed),
                    if shared.len() > 1 { "s" } else { "" },
                    format_cpu_list(&shared)
                );
                if !out.contains(&warning) {
                    out.push(warning);
                }
            }
        }
        out
    }
}

/// Listening TCP sockets on this machine: address and socket inode.
fn read_listening() -> Result<Vec<(SocketAddr, u64)>, String> {
    let tables: Vec<Vec<TcpNetEntry>> = [procfs::net::tcp(), procfs::net::tcp6()]
        .into_iter()
        .filter_map(Result::ok)
        .collect();
    if tables.is_empty() {
        return Err("/proc/net/tcp is not readable (not Linux?)".into());
    }
    Ok(listening(tables.into_iter().flatten()))
}

/// Listening Unix stream sockets on this machine (`/proc/net/unix`): path and socket inode.
fn read_unix_listening() -> Result<Vec<(PathBuf, u64)>, String> {
    let table = procfs::net::unix()
        .map_err(|e| format!("/proc/net/unix is not readable (not Linux?): {e}"))?;
    Ok(unix_listening(table))
}

/// The listening sockets of `/proc/net/unix`: a stream socket bound to a path and not
/// connected. A connection a listener accepted shows its listener's path too, but connected.
pub fn unix_listening(table: impl IntoIterator<Item = UnixNetEntry>) -> Vec<(PathBuf, u64)> {
    const SOCK_STREAM: u16 = 1;
    table
        .into_iter()
        .filter(|e| e.socket_type == SOCK_STREAM && e.state == UnixState::UNCONNECTED)
        .filter_map(|e| Some((e.path?, e.inode)))
        .collect()
}

/// The processes holding the socket listening on `path`. A socket file nobody holds (its
/// process gone without removing it) is not listening.
fn find_unix(path: &Path, listening: &[(PathBuf, u64)], owners: &[(u64, u32)]) -> Found {
    let inodes: Vec<u64> = listening
        .iter()
        .filter(|(on, _)| on == path)
        .map(|s| s.1)
        .collect();
    if inodes.is_empty() {
        return Found::NotListening;
    }
    held_by(&inodes, owners)
}

/// The processes holding one of the listening sockets `inodes`, of `owners` (inode, PID).
fn held_by(inodes: &[u64], owners: &[(u64, u32)]) -> Found {
    let pids: BTreeSet<u32> = owners
        .iter()
        .filter(|(inode, _)| inodes.contains(inode))
        .map(|o| o.1)
        .collect();
    if pids.is_empty() {
        return Found::Hidden;
    }
    Found::Processes(pids.into_iter().filter_map(process).collect())
}

/// The listening sockets of a socket table (`/proc/net/tcp` or `tcp6`): address and inode.
pub fn listening(table: impl IntoIterator<Item = TcpNetEntry>) -> Vec<(SocketAddr, u64)> {
    table
        .into_iter()
        .filter(|e| e.state == TcpState::Listen)
        .map(|e| (e.local_address, e.inode))
        .collect()
}

/// Whether a socket listening on `on` accepts connections to `backend`: the same port, and the
/// same IP or a wildcard one (`::` also takes IPv4 unless the socket is v6-only, which
/// `/proc/net/tcp6` does not say; assume it does, as Linux's default does).
pub fn serves(on: SocketAddr, backend: SocketAddr) -> bool {
    if on.port() != backend.port() {
        return false;
    }
    let backend_ip = match backend.ip() {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        ip => ip,
    };
    match on.ip() {
        // An IPv4 wildcard takes IPv4 only; an IPv6 one takes both (dual-stack, the default).
        IpAddr::V4(any) if any.is_unspecified() => backend_ip.is_ipv4(),
        ip if ip.is_unspecified() => true,
        ip => ip == backend_ip || ip == backend.ip(),
    }
}

/// Who listens where pinlb would listen on `addr`, for `check` and for a failed bind: the
/// processes holding a listening socket that takes connections to `addr`, or one that `addr`
/// would take (a wildcard listener collides with every address on its port).
pub fn listening_on(addr: SocketAddr) -> Found {
    let listening = match read_listening() {
        Ok(l) => l,
        Err(e) => return Found::Unknown(e),
    };
    let taken: Vec<(SocketAddr, u64)> = listening
        .into_iter()
        .filter(|(on, _)| serves(*on, addr) || serves(addr, *on))
        .collect();
    if taken.is_empty() {
        return Found::NotListening;
    }
    let wanted: BTreeSet<u64> = taken.iter().map(|s| s.1).collect();
    let owners = socket_owners(&wanted);
    let pids: BTreeSet<u32> = owners.iter().map(|o| o.1).collect();
    let ps: Vec<Process> = pids.into_iter().filter_map(process).collect();
    if ps.is_empty() {
        Found::Hidden
    } else {
        Found::Processes(ps)
    }
}

/// "pid 42 (nginx), pid 43 (nginx)", or why none can be named; `None` when nothing listens.
pub fn describe_holders(found: &Found) -> Option<String> {
    match found {
        Found::Processes(ps) => Some(
            ps.iter()
                .map(|p| format!("pid {} ({})", p.pid, p.command))
                .collect::<Vec<_>>()
                .join(", "),
        ),
        Found::Hidden => Some("a process of another user (run as root to see which)".into()),
        Found::NotListening | Found::Remote | Found::Unknown(_) => None,
    }
}

/// Whether `ip` is an address of this machine: binding to it works only then.
pub fn is_local(ip: IpAddr) -> bool {
    ip.is_loopback()
        || ip.is_unspecified()
        || std::net::TcpListener::bind(SocketAddr::new(ip, 0)).is_ok()
}

fn find(backend: SocketAddr, listening: &[(SocketAddr, u64)], owners: &[(u64, u32)]) -> Found {
    let inodes: Vec<u64> = listening
        .iter()
        .filter(|(on, _)| serves(*on, backend))
        .map(|s| s.1)
        .collect();
    if inodes.is_empty() {
        return if is_local(backend.ip()) {
            Found::NotListening
        } else {
            Found::Remote
        };
    }
    held_by(&inodes, owners)
}

/// Every address process `pid` listens on (its descriptors among the listening sockets), for
/// `pinlb bench`'s fairness checks to find a pinlb's admin listener; empty when its
/// descriptors or the socket tables cannot be read.
pub fn listening_sockets_of(pid: u32) -> Vec<SocketAddr> {
    let Ok(listening) = read_listening() else {
        return Vec::new();
    };
    let Ok(fds) = procfs::process::Process::new(pid as i32).and_then(|p| p.fd()) else {
        return Vec::new();
    };
    let held: BTreeSet<u64> = fds
        .flatten()
        .filter_map(|fd| match fd.target {
            FDTarget::Socket(inode) => Some(inode),
            _ => None,
        })
        .collect();
    let mut out: Vec<SocketAddr> = listening
        .into_iter()
        .filter(|(_, inode)| held.contains(inode))
        .map(|(addr, _)| addr)
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// `(inode, pid)` for every wanted socket inode held by a process whose descriptors we may read.
fn socket_owners(wanted: &BTreeSet<u64>) -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    let Ok(processes) = procfs::process::all_processes() else {
        return out;
    };
    for p in processes.flatten() {
        // Another user's process: not readable without root; `find` reports it as hidden.
        let Ok(fds) = p.fd() else {
            continue;
        };
        for fd in fds.flatten() {
            if let FDTarget::Socket(inode) = fd.target {
                if wanted.contains(&inode) {
                    out.push((inode, p.pid() as u32));
                }
            }
        }
    }
    out
}

/// Process `pid`'s command and allowed cores, if it can be read.
pub fn process(pid: u32) -> Option<Process> {
    let p = procfs::process::Process::new(pid as i32).ok()?;
    let status = p.status().ok()?;
    // Every thread's mask, where the threads can be read; the process's own otherwise.
    let threads: Vec<Vec<usize>> = p
        .tasks()
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| t.status().ok())
        .filter_map(|s| allowed_cores(&s))
        .collect();
    let allowed = if threads.is_empty() {
        allowed_cores(&status)?
    } else {
        union(&threads)
    };
    let command = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| "?".into());
    Some(Process {
        pid,
        command,
        allowed,
    })
}

/// Every core in any of `masks`, in order.
pub fn union(masks: &[Vec<usize>]) -> Vec<usize> {
    let all: BTreeSet<usize> = masks.iter().flatten().copied().collect();
    all.into_iter().collect()
}

/// The cores a `/proc/<pid>/status` allows: its `Cpus_allowed_list`.
fn allowed_cores(status: &Status) -> Option<Vec<usize>> {
    status.cpus_allowed_list.as_deref().map(cores)
}

/// The cores of a core list's ranges (`0-1,3` is `[(0, 1), (3, 3)]`), in its order.
pub fn cores(ranges: &[(u32, u32)]) -> Vec<usize> {
    ranges
        .iter()
        .flat_map(|&(first, last)| first as usize..=last as usize)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:22B8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 777 1 0000000000000000 100 0 0 10 0
   2: 0100007F:22B8 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 999 1 0000000000000000 20 4 30 10 -1
";

    const TCP6: &str = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1F91 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 555 1 0000000000000000 100 0 0 10 0
";

    /// A socket table as `procfs` parses it, for a little-endian machine (the order the fixtures'
    /// addresses are written in).
    fn table(text: &str) -> Vec<TcpNetEntry> {
        use procfs::FromBufReadSI as _;
        let little_endian = procfs::ExplicitSystemInfo {
            boot_time_secs: 0,
            ticks_per_second: 100,
            page_size: 4096,
            is_little_endian: true,
        };
        procfs::net::TcpNetEntries::from_buf_read(text.as_bytes(), &little_endian)
            .unwrap()
            .0
    }

    #[test]
    fn listening_sockets_are_parsed_and_connections_ignored() {
        assert_eq!(
            listening(table(TCP)),
            vec![
                ("127.0.0.1:8888".parse().unwrap(), 4242),
                ("0.0.0.0:8080".parse().unwrap(), 777),
            ]
        );
        assert_eq!(
            listening(table(TCP6)),
            vec![("[::1]:8081".parse().unwrap(), 555)]
        );
    }

    #[test]
    fn a_wildcard_listener_serves_every_address_on_its_port() {
        let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
        assert!(serves(any, "127.0.0.1:8080".parse().unwrap()));
        assert!(!serves(any, "127.0.0.1:8081".parse().unwrap()));
        let lo: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert!(!serves(lo, "10.0.0.1:8080".parse().unwrap()));
        assert!(serves("[::]:8080".parse().unwrap(), lo));
        assert!(!serves(any, "[::1]:8080".parse().unwrap()));
    }

    #[test]
    fn a_backend_with_no_local_listener_is_remote_or_not_listening() {
        let listening = listening(table(TCP));
        assert_eq!(
            find("10.9.9.9:80".parse().unwrap(), &listening, &[]),
            Found::Remote
        );
        assert_eq!(
            find("127.0.0.1:9999".parse().unwrap(), &listening, &[]),
            Found::NotListening
        );
        assert_eq!(
            find("127.0.0.1:8888".parse().unwrap(), &listening, &[]),
            Found::Hidden
        );
    }

    #[test]
    fn allowed_cores_come_from_the_ranges_of_the_status_file() {
        // `Cpus_allowed_list:\t0-1,3`, as procfs parses it.
        assert_eq!(cores(&[(0, 1), (3, 3)]), vec![0, 1, 3]);
        assert_eq!(cores(&[(2, 2)]), vec![2]);
    }

    #[test]
    fn a_socket_this_process_listens_on_is_found_with_its_command_and_cores() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let Found::Processes(ps) = listening_on(addr) else {
            panic!("{addr}: {:?}", listening_on(addr));
        };
        let me = ps.iter().find(|p| p.pid == std::process::id());
        let me = me.unwrap_or_else(|| panic!("{ps:?}"));
        let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
        assert_eq!(me.command, comm.trim());
        // Every thread's mask is in the union, this test's thread's too.
        let mine = pinlb::sys::cpus::allowed_cpus().unwrap();
        assert!(
            mine.iter().all(|c| me.allowed.contains(c)),
            "{me:?}, {mine:?}"
        );
    }

    #[test]
    fn the_sockets_this_process_listens_on_are_found_by_its_pid() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert!(listening_sockets_of(std::process::id()).contains(&addr));
        drop(listener);
        assert!(!listening_sockets_of(std::process::id()).contains(&addr));
    }

    #[test]
    fn a_backend_process_allowed_on_a_pinlb_core_is_warned_about() {
        let map = CoreMap {
            cores: vec![0, 1, 2, 3],
            workers: vec![0],
            backends: vec![BackendProcess {
                upstream: "app".into(),
                address: "127.0.0.1:8881".parse().unwrap(),
                declared: Some(vec![1]),
                spawned: false,
                found: Found::Processes(vec![Process {
                    pid: 4242,
                    command: "node".into(),
                    allowed: vec![0, 1, 2, 3],
                }]),
            }],
        };
        assert_eq!(
            map.warnings(),
            vec![
                "backend 127.0.0.1:8881 is served by pid 4242 (node), allowed on cores 0-3, which include pinlb's core 0"
            ]
        );
        let text = map.render();
        assert!(text.contains("  core 0: pinlb worker 0\n"), "{text}");
        assert!(
            text.contains("  core 1: backend 127.0.0.1:8881 (declared)\n"),
            "{text}"
        );
        assert!(
            text.contains("served by pid 4242 (node), allowed on cores 0-3 (not pinned)"),
            "{text}"
        );
    }

    #[test]
    fn a_process_is_pinned_when_its_threads_are_whatever_its_first_mask() {
        // pinlb backend's threads, one per core, after a main thread that pinned itself too.
        assert_eq!(union(&[vec![2], vec![2], vec![3]]), vec![2, 3]);
        let map = CoreMap {
            cores: vec![0, 1, 2, 3],
            workers: vec![0],
            backends: vec![BackendProcess {
                upstream: "app".into(),
                address: "127.0.0.1:8881".parse().unwrap(),
                declared: None,
                spawned: false,
                found: Found::Processes(vec![Process {
                    pid: 7,
                    command: "pinlb".into(),
                    allowed: union(&[vec![2], vec![3]]),
                }]),
            }],
        };
        let text = map.render();
        assert!(!text.contains("not pinned"), "{text}");
        assert!(
            text.contains("  core 2: backend 127.0.0.1:8881 pid 7 (pinlb)\n"),
            "{text}"
        );
    }

    #[test]
    fn an_address_two_upstreams_list_is_one_process_on_the_map() {
        let listed = |upstream: &str| BackendProcess {
            upstream: upstream.into(),
            address: "127.0.0.1:8881".parse().unwrap(),
            declared: Some(vec![0]),
            spawned: false,
            found: Found::Processes(vec![Process {
                pid: 4242,
                command: "node".into(),
                allowed: vec![0],
            }]),
        };
        let map = CoreMap {
            cores: vec![0, 1],
            workers: vec![0],
            backends: vec![listed("api"), listed("app")],
        };
        assert_eq!(map.warnings().len(), 1, "{:?}", map.warnings());
        let text = map.render();
        assert!(
            text.contains(
                "  core 0: pinlb worker 0, backend 127.0.0.1:8881 (declared) pid 4242 (node)\n"
            ),
            "{text}"
        );
        assert!(text.contains("  backend 127.0.0.1:8881 (upstream api): served by pid 4242"));
        assert!(text.contains("  backend 127.0.0.1:8881 (upstream app): served by pid 4242"));
    }
}

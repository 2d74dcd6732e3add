//! Fairness checks for `pinlb bench`, `pinlb sweep` and `pinlb demo`: what would make a run's
//! numbers unfair, found before it starts and printed before the table as warnings, each with
//! what to do about it. `--no-checks` turns them off.
//!
//! | check | reads | warns when |
//! |---|---|---|
//! | the load generator shares a core | the load cores, each process's allowed cores (`coremap`) | a load core is one a proxy or backend may run on (bench only: sweep's and demo's plans say so in their notes) |
//! | debug build | a pinlb's `/proc/PID/exe --version` (or its `/status`'s `build`), or this process's own build | a target or its backend is a debug build of pinlb |
//! | debug logging | nginx's `-c` file, HAProxy's and Envoy's flags, pinlb's `RUST_LOG` | a peer logs at debug level |
//! | keep-alive | a pinlb target's `/status` (per backend `connections_opened`, `connections_reused`), or `pinlb backend`'s `x-pinlb-accepted` | over [`PROBE_REQUESTS`] requests on one client connection, a backend took a new connection for half of them or more |
//! | SMT siblings | `/sys/devices/system/cpu/cpuN/topology/thread_siblings_list` | a proxy and a backend of one layout are pinned to two threads of one physical core |
//! | frequency governor | `/sys/devices/system/cpu/cpuN/cpufreq/scaling_governor` | a core of the run is not on `performance` |
//! | local ports | `/proc/sys/net/ipv4/ip_local_port_range`, `tcp_tw_reuse`, TIME_WAIT (state `06`) in `/proc/net/tcp` and `tcp6` | new connections per second × 60 s of TIME_WAIT (1 s where the kernel reuses TIME_WAIT ports) exceed the range, or TIME_WAIT already holds half of it |
//! | busy core | `/proc/stat`, twice a second apart | a core of the run was more than [`BUSY`] busy before the run |
//!
//! Each check is a plain function over what it reads: files under a root (`/` for real, a small
//! tree in a temp dir in tests, for what no test can set up for real, such as a governor or SMT
//! siblings), the placement of the run's processes, the targets. [`check`] reads the real
//! system and calls them all. They are best effort: a file that cannot be read (no `cpufreq` in
//! a VM, another user's process, a remote target) skips that check rather than guessing, and a
//! peer's debug logging is seen only where its command line, environment or main configuration
//! file says so.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::coremap::{self, Found};
use pinlb::sys::cpus::format_cpu_list;

/// The header the keep-alive probe sends, and `pinlb backend`'s answer with the connections its
/// server has accepted (`x-pinlb-accepted: 127.0.0.1:8881 17`). Here rather than in `backend`:
/// the checks run before the bench, which `backend` builds on.
pub const ACCEPTED: &str = "x-pinlb-accepted";

/// Above this share of a second busy, a core is taken before the run starts: a load generator or
/// proxy sharing it loses that much, and more whenever the other work bursts. 20% leaves room
/// for a desktop's or a VM's background; a build or a spinning process is far above it.
pub const BUSY: f64 = 0.20;

/// Requests the keep-alive probe sends through a proxied target, on one client connection: with
/// a few backends round robin each still sees three or more, enough to tell one connection per
/// request from a kept one.
pub const PROBE_REQUESTS: usize = 16;

/// Requests a backend must have seen in the probe before its connections are judged.
const JUDGED: u64 = 3;

/// How long a TCP connection stays in TIME_WAIT on Linux (`TCP_TIMEWAIT_LEN`).
const TIME_WAIT: f64 = 60.0;

/// What is wrong, and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    pub problem: String,
    pub fix: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.problem, self.fix)
    }
}

/// What a process of the run is to the measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Proxy,
    Backend,
}

/// A process of the run other than the load generator, and the cores it may run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Role {
    /// For people: "the proxy of 1 proxy core + 1 backend", "target proxied (pid 42, nginx)".
    pub name: String,
    pub kind: Kind,
    pub cores: Vec<usize>,
    /// Roles that run at the same time share a group (one of sweep's layouts); only they are
    /// compared for SMT siblings.
    pub group: String,
}

/// Where the run's processes are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// The load generator's cores.
    pub load: Vec<usize>,
    pub roles: Vec<Role>,
}

impl Placement {
    /// Every core of the run, the load generator's too.
    pub fn cores(&self) -> Vec<usize> {
        let all: BTreeSet<usize> = self
            .load
            .iter()
            .chain(self.roles.iter().flat_map(|r| &r.cores))
            .copied()
            .collect();
        all.into_iter().collect()
    }
}

/// One target of the run, as the checks probe it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub name: String,
    pub addr: SocketAddr,
    /// The `Host` header to send.
    pub host: String,
    /// The path and query to request.
    pub path: String,
    /// Plain HTTP/1.1 requests reach it (not TLS, WebSocket or HTTP/2 runs): it can be probed.
    pub plain_http: bool,
    /// Whether it is a proxy in front of backends: known for sweep's and demo's own targets;
    /// `None` for bench's, where its process says (a pinlb `serve`, nginx, HAProxy, ...).
    pub proxied: Option<bool>,
}

/// How the load generator will load the targets: what the port check needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Load {
    pub connections: usize,
    /// The load generator keeps its connections alive (not `--disable-keepalive`).
    pub keep_alive: bool,
    /// Open loop at this many requests/s; `None` is closed loop.
    pub rate: Option<f64>,
    /// One run, warm-up and recorded window: a new set of connections each.
    pub run: Duration,
}

/// "core 1", "cores 0-3".
fn cores_word(cores: &[usize]) -> String {
    let s = if cores.len() == 1 { "" } else { "s" };
    format!("core{s} {}", format_cpu_list(cores))
}

/// Every role that may run on one of the load generator's cores.
pub fn load_shares_a_core(p: &Placement) -> Vec<Warning> {
    let mut out = Vec::new();
    for r in &p.roles {
        let shared: Vec<usize> = p
            .load
            .iter()
            .copied()
            .filter(|c| r.cores.contains(c))
            .collect();
        if shared.is_empty() {
            continue;
        }
        let w = Warning {
            problem: format!(
                "the load generator runs on {}, which {} may also run on",
                cores_word(&shared),
                r.name
            ),
            fix: "give it a core of its own with --cpus (and pin the target off it), or its CPU \
                  is taken from what it measures"
                .into(),
        };
        if !out.contains(&w) {
            out.push(w);
        }
    }
    out
}

/// How a pinlb binary was built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Build {
    Debug,
    Release,
}

/// `pinlb --version`'s output read: `pinlb 0.1.0 (debug build)` is a debug build; `None` when
/// it is not pinlb's.
pub fn build_of_version(text: &str) -> Option<Build> {
    let line = text.lines().next()?.trim();
    line.strip_prefix("pinlb ")?;
    Some(if line.ends_with("(debug build)") {
        Build::Debug
    } else {
        Build::Release
    })
}

/// A process the run measures, as the debug checks see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// "target proxied (pid 42, pinlb)".
    pub name: String,
    /// For a pinlb; `None` for other programs, or when it could not be asked.
    pub build: Option<Build>,
    /// Why it logs at debug level, where that can be read.
    pub debug_logging: Option<String>,
}

/// A warning for every peer that is a debug build of pinlb or logs at debug level.
pub fn debug_peers(peers: &[Peer]) -> Vec<Warning> {
    let mut out = Vec::new();
    for p in peers {
        if p.build == Some(Build::Debug) {
            out.push(Warning {
                problem: format!("{} is a debug build of pinlb, many times slower", p.name),
                fix: "run a release build (cargo build --release, target/release/pinlb)".into(),
            });
        }
        if let Some(why) = &p.debug_logging {
            out.push(Warning {
                problem: format!("{} logs at debug level ({why})", p.name),
                fix: "set its log level to warn or error for the run: debug logging costs more \
                      than the proxying measured"
                    .into(),
            });
        }
    }
    out
}

/// Why a process logs at debug level, from its command name, arguments, environment and
/// configuration (`read` reads a file of its, `None` when it cannot): nginx with `error_log ...
/// debug` in its main file (`-c`, or `/etc/nginx/nginx.conf`; includes are not followed),
/// HAProxy started with `-d` or `-V`, Envoy with `-l`/`--log-level` debug or trace, and pinlb
/// with `RUST_LOG` asking for debug or trace. `None` when none of that is seen.
pub fn debug_logging(
    command: &str,
    args: &[String],
    env: &[(String, String)],
    read: &dyn Fn(&Path) -> Option<String>,
) -> Option<String> {
    let verbose = |level: &str| matches!(level, "debug" | "trace");
    match command {
        "nginx" => {
            // nginx rewrites its arguments into one title: "nginx: master process nginx -c F".
            let words: Vec<&str> = args.iter().flat_map(|a| a.split_whitespace()).collect();
            let file = words
                .iter()
                .position(|a| *a == "-c")
                .and_then(|i| words.get(i + 1))
                .map_or_else(|| PathBuf::from("/etc/nginx/nginx.conf"), PathBuf::from);
            let text = read(&file)?;
            text.lines()
                .map(|l| l.split('#').next().unwrap_or_default())
                .filter_map(|l| l.trim().strip_prefix("error_log"))
                .any(|rest| {
                    rest.trim_end()
                        .trim_end_matches(';')
                        .split_whitespace()
                        .last()
                        .is_some_and(|level| level == "debug")
                })
                .then(|| format!("error_log ... debug in {}", file.display()))
        }
        "haproxy" => args
            .iter()
            .skip(1)
            .find(|a| *a == "-d" || *a == "-V")
            .map(|a| format!("started with {a}")),
        "envoy" => {
            let level = args.iter().enumerate().find_map(|(i, a)| {
                if a == "-l" || a == "--log-level" {
                    args.get(i + 1).cloned()
                } else {
                    a.strip_prefix("--log-level=").map(str::to_string)
                }
            })?;
            verbose(&level).then(|| format!("--log-level {level}"))
        }
        "pinlb" => {
            let (_, filter) = env.iter().find(|(k, _)| k == "RUST_LOG")?;
            // `debug`, `pinlb=trace`, `warn,pinlb::proxy=debug`: any directive's level.
            filter
                .split(',')
                .any(|d| verbose(d.rsplit('=').next().unwrap_or_default().trim()))
                .then(|| format!("RUST_LOG={filter}"))
        }
        _ => None,
    }
}

/// What one backend took over the keep-alive probe of one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reuse {
    pub target: String,
    pub backend: String,
    /// New connections the backend took (or the proxy opened to it).
    pub opened: u64,
    /// Requests it served over the probe.
    pub requests: u64,
}

/// A warning for every backend that took a new connection for half the probe's requests or
/// more: the proxy in front of it does not keep its backend connections alive.
pub fn no_keep_alive(seen: &[Reuse]) -> Vec<Warning> {
    seen.iter()
        .filter(|r| r.requests >= JUDGED && 2 * r.opened >= r.requests)
        .map(|r| Warning {
            problem: format!(
                "target {} opened {} connection{} to backend {} for {} request{} on one client \
                 connection: it does not keep its backend connections alive, so every request \
                 pays a connect",
                r.target,
                r.opened,
                if r.opened == 1 { "" } else { "s" },
                r.backend,
                r.requests,
                if r.requests == 1 { "" } else { "s" }
            ),
            fix: "turn keep-alive to the backends on (pinlb: the upstream's keepalive above 0; \
                  nginx: keepalive in the upstream block, proxy_http_version 1.1 and \
                  proxy_set_header Connection \"\"; HAProxy: http-reuse)"
                .into(),
        })
        .collect()
}

/// The SMT siblings of `core` (its `thread_siblings_list`, itself included), as written there.
fn siblings(root: &Path, core: usize) -> Option<(Vec<usize>, String)> {
    let path = root.join(format!(
        "sys/devices/system/cpu/cpu{core}/topology/thread_siblings_list"
    ));
    let text = std::fs::read_to_string(path).ok()?;
    let text = text.trim().to_string();
    let list = pinlb::sys::cpus::parse_cpu_list(&text).ok()?;
    Some((list, text))
}

/// A warning for every proxy and backend of one group pinned to different threads of one
/// physical core. Roles that share a core already, or whose topology cannot be read, are left
/// alone: the first is said elsewhere, the second cannot be told.
pub fn smt_siblings(root: &Path, p: &Placement) -> Vec<Warning> {
    let mut out = Vec::new();
    let proxies = p.roles.iter().filter(|r| r.kind == Kind::Proxy);
    for proxy in proxies {
        let backends = p
            .roles
            .iter()
            .filter(|r| r.kind == Kind::Backend && r.group == proxy.group);
        for backend in backends {
            if proxy.cores.iter().any(|c| backend.cores.contains(c)) {
                continue;
            }
            let pair = proxy.cores.iter().find_map(|&a| {
                let (list, text) = siblings(root, a)?;
                let b = backend.cores.iter().find(|b| list.contains(b))?;
                Some((a, *b, text))
            });
            if let Some((a, b, text)) = pair {
                out.push(Warning {
                    problem: format!(
                        "{} on core {a} and {} on core {b} are SMT siblings, two threads of one \
                         physical core (thread_siblings_list {text}): they share its execution \
                         units and caches",
                        proxy.name, backend.name
                    ),
                    fix: "put them on different physical cores".into(),
                });
            }
        }
    }
    out
}

/// A warning for the cores of the run whose CPU frequency governor is not `performance`, one per
/// governor; cores without `cpufreq` (most VMs) are skipped.
pub fn governors(root: &Path, cores: &[usize]) -> Vec<Warning> {
    let mut by: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for &c in cores {
        let path = root.join(format!(
            "sys/devices/system/cpu/cpu{c}/cpufreq/scaling_governor"
        ));
        if let Ok(g) = std::fs::read_to_string(path) {
            let g = g.trim();
            if !g.is_empty() && g != "performance" {
                by.entry(g.to_string()).or_default().push(c);
            }
        }
    }
    by.into_iter()
        .map(|(g, cs)| Warning {
            problem: format!(
                "{} use{} the {g} CPU frequency governor: the clock moves with the load, between \
                 runs and within them",
                cores_word(&cs),
                if cs.len() == 1 { "s" } else { "" }
            ),
            fix: "set performance for the run (sudo cpupower frequency-set -g performance)".into(),
        })
        .collect()
}

/// The kernel's local port state, for the port check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ports {
    /// `ip_local_port_range`: the first and last local port of outgoing connections.
    pub range: (u32, u32),
    /// Connections in TIME_WAIT now (`/proc/net/tcp` and `tcp6`).
    pub time_wait: usize,
    /// `tcp_tw_reuse`: 1 reuses TIME_WAIT ports for new outgoing connections everywhere, 2 on
    /// loopback only (Linux's default), 0 never.
    pub tw_reuse: u8,
}

impl Ports {
    /// Reads them under `root`; `None` without the port range.
    pub fn read(root: &Path) -> Option<Ports> {
        let text =
            std::fs::read_to_string(root.join("proc/sys/net/ipv4/ip_local_port_range")).ok()?;
        let mut it = text.split_whitespace().map(str::parse::<u32>);
        let range = match (it.next(), it.next()) {
            (Some(Ok(a)), Some(Ok(b))) if a <= b => (a, b),
            _ => return None,
        };
        let tw_reuse = std::fs::read_to_string(root.join("proc/sys/net/ipv4/tcp_tw_reuse"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        let time_wait = ["proc/net/tcp", "proc/net/tcp6"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(root.join(f)).ok())
            .map(|t| count_time_wait(&t))
            .sum();
        Some(Ports {
            range,
            time_wait,
            tw_reuse,
        })
    }

    fn size(&self) -> u64 {
        u64::from(self.range.1 - self.range.0) + 1
    }
}

/// Sockets in TIME_WAIT (state `06`) in a `/proc/net/tcp` table.
pub fn count_time_wait(table: &str) -> usize {
    table
        .lines()
        .skip(1)
        .filter(|l| l.split_whitespace().nth(3) == Some("06"))
        .count()
}

/// New connections per second the run opens, and how that was reckoned; `None` when it cannot
/// be told (a closed loop that opens a connection per request against a target not probed).
///
/// Kept-alive connections are opened once per run, `connections` of them. A connection per
/// request (`--disable-keepalive`, or a target that closes after each response) opens one at
/// the open loop's rate, or, closed loop, at most `connections` per `per_request` (the probe's
/// unloaded time per request, so an upper bound).
pub fn opened_per_second(
    load: &Load,
    closes: bool,
    per_request: Option<Duration>,
) -> Option<(f64, String)> {
    let c = load.connections as f64;
    if load.keep_alive && !closes {
        let run = load.run.as_secs_f64().max(0.001);
        return Some((
            c / run,
            format!(
                "{} connections for every run of {:.1} s",
                load.connections, run
            ),
        ));
    }
    let why = if closes {
        "the target closes each connection"
    } else {
        "--disable-keepalive"
    };
    if let Some(r) = load.rate {
        return Some((r, format!("{why}, at --rate {r}")));
    }
    let t = per_request?.as_secs_f64().max(1e-6);
    Some((
        c / t,
        format!(
            "{why}, {} connections of {:.2} ms per request",
            load.connections,
            t * 1000.0
        ),
    ))
}

/// Whether the local ports would run out: `per_second` new connections (`why`) each held a
/// TIME_WAIT long, or TIME_WAIT already holding half the range. Where the kernel reuses TIME_WAIT
/// ports for new connections (`tcp_tw_reuse` 1, or 2 and a `loopback` target) a port is free
/// again a second after its close, so only a rate above the range per second runs out, and the
/// count now does not matter.
pub fn port_budget(ports: &Ports, per_second: f64, why: &str, loopback: bool) -> Vec<Warning> {
    let reused = ports.tw_reuse == 1 || (ports.tw_reuse == 2 && loopback);
    let lifetime = if reused { 1.0 } else { TIME_WAIT };
    let (a, b) = ports.range;
    let size = ports.size();
    let mut out = Vec::new();
    let held = per_second * lifetime;
    if held > size as f64 {
        out.push(Warning {
            problem: format!(
                "about {per_second:.0} new connections/s ({why}) would hold {held:.0} local ports \
                 in TIME_WAIT ({lifetime:.0} s each), more than the {size} of \
                 ip_local_port_range {a}-{b}: connects fail once they run out"
            ),
            fix: "keep connections alive, lower the rate or the connections, or widen \
                  net.ipv4.ip_local_port_range"
                .into(),
        });
    }
    if !reused && ports.time_wait as u64 * 2 >= size {
        out.push(Warning {
            problem: format!(
                "{} connections are in TIME_WAIT already, half or more of the {size} local ports \
                 of ip_local_port_range {a}-{b}",
                ports.time_wait
            ),
            fix: "wait a minute for them to expire before the run, or widen \
                  net.ipv4.ip_local_port_range"
                .into(),
        });
    }
    out
}

/// Each core's busy and total jiffies in a `/proc/stat` text (`cpuN` lines; idle and iowait are
/// idle, guest time is already in user).
fn cpu_times(stat: &str) -> BTreeMap<usize, (u64, u64)> {
    let mut out = BTreeMap::new();
    for line in stat.lines() {
        let mut it = line.split_whitespace();
        let Some(core) = it
            .next()
            .and_then(|n| n.strip_prefix("cpu"))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        let v: Vec<u64> = it.take(8).filter_map(|x| x.parse().ok()).collect();
        if v.len() < 5 {
            continue;
        }
        let total: u64 = v.iter().sum();
        let idle = v[3] + v[4];
        out.insert(core, (total - idle, total));
    }
    out
}

/// A warning for every core of `cores` more than [`BUSY`] busy between two `/proc/stat` reads.
pub fn busy_cores(before: &str, after: &str, cores: &[usize]) -> Vec<Warning> {
    let (t0, t1) = (cpu_times(before), cpu_times(after));
    let mut busy = Vec::new();
    for c in cores {
        let (Some(a), Some(b)) = (t0.get(c), t1.get(c)) else {
            continue;
        };
        let total = b.1.saturating_sub(a.1);
        if total == 0 {
            continue;
        }
        let share = b.0.saturating_sub(a.0) as f64 / total as f64;
        if share > BUSY {
            busy.push(format!("core {c} {:.0}%", share * 100.0));
        }
    }
    if busy.is_empty() {
        return Vec::new();
    }
    vec![Warning {
        problem: format!(
            "cores of the run were busy before it started ({}), with none of its load on them \
             yet: something else runs there",
            busy.join(", ")
        ),
        fix: "stop what runs there (top, then 1, shows each core), or leave those cores out of \
              the run"
            .into(),
    }]
}

/// Reads `/proc/stat` under `root`, waits `over`, reads it again, and warns about busy cores.
pub fn sample_busy(root: &Path, cores: &[usize], over: Duration) -> Vec<Warning> {
    let read = || std::fs::read_to_string(root.join("proc/stat")).ok();
    let Some(before) = read() else {
        return Vec::new();
    };
    std::thread::sleep(over);
    let Some(after) = read() else {
        return Vec::new();
    };
    busy_cores(&before, &after, cores)
}

/// Every check, on this machine, for a run loading `targets` as `load` says, and the probes
/// they need. `layout` is the placement sweep and demo know (their notes already say when the
/// load generator shares a core, so that check is left out); without it (bench) the placement
/// is found from the processes listening on the targets, and a pinlb target's backends through
/// its admin API, with `load_cores` the load generator's cores.
///
/// Takes a second and a little more with `busy` (the busy-core sample, on a thread of its own
/// while the other checks read and probe with a few requests, no load); without it, a few
/// milliseconds.
pub fn check(
    targets: &[Target],
    load: &Load,
    load_cores: &[usize],
    layout: Option<&Placement>,
    busy: bool,
) -> Vec<Warning> {
    let root = Path::new("/");
    let seen = discover(targets, load_cores);
    let placement = layout.cloned().unwrap_or_else(|| seen.placement.clone());
    let cores = placement.cores();
    std::thread::scope(|s| {
        let busy = busy.then(|| s.spawn(|| sample_busy(root, &cores, Duration::from_secs(1))));
        let mut out = Vec::new();
        if layout.is_none() {
            out.extend(load_shares_a_core(&placement));
        }
        out.extend(debug_peers(&seen.peers));
        let mut reuse = Vec::new();
        let mut closes = false;
        let mut per_request: Option<Duration> = None;
        for (t, admin) in targets.iter().zip(&seen.admins) {
            let proxied = t.proxied.or(seen.proxies.get(&t.addr).copied());
            if !t.plain_http || proxied != Some(true) {
                continue;
            }
            let before = admin.and_then(admin_status);
            let Some(p) = probe(t, PROBE_REQUESTS) else {
                continue;
            };
            closes |= p.closes;
            per_request = per_request.max(Some(p.per_request));
            let after = admin.and_then(admin_status);
            match (before, after) {
                (Some(b), Some(a)) => reuse.extend(status_reuse(&t.name, &b, &a)),
                _ => reuse.extend(header_reuse(&t.name, &p.accepted)),
            }
        }
        out.extend(no_keep_alive(&reuse));
        out.extend(smt_siblings(root, &placement));
        out.extend(governors(root, &cores));
        if let (Some(ports), Some((rate, why))) = (
            Ports::read(root),
            opened_per_second(load, closes, per_request),
        ) {
            let loopback = targets.iter().all(|t| t.addr.ip().is_loopback());
            // Every target is loaded in turn, each run opening its own.
            out.extend(port_budget(&ports, rate, &why, loopback));
        }
        if let Some(busy) = busy {
            out.extend(busy.join().unwrap_or_default());
        }
        out
    })
}

/// What the processes behind the targets are, as [`check`] found them.
#[derive(Debug, Default)]
struct Seen {
    peers: Vec<Peer>,
    /// The load generator's cores and every process found, the targets' and their backends'.
    placement: Placement,
    /// Each target's pinlb admin listener, where its process is a pinlb `serve` with one.
    admins: Vec<Option<SocketAddr>>,
    /// Whether the process on each target address is a proxy, where it was found.
    proxies: BTreeMap<SocketAddr, bool>,
}

/// The commands of the proxies benches compare, as `/proc/PID/comm` names them.
const PROXIES: [&str; 6] = ["nginx", "haproxy", "envoy", "caddy", "traefik", "httpd"];

/// One process's arguments, from `/proc/PID/cmdline`.
fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// One process's environment, from `/proc/PID/environ` (empty when it is not ours to read).
fn environ(pid: u32) -> Vec<(String, String)> {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|b| {
            b.split(|&c| c == 0)
                .filter_map(|kv| {
                    let kv = String::from_utf8_lossy(kv);
                    let (k, v) = kv.split_once('=')?;
                    Some((k.to_string(), v.to_string()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// How pinlb process `pid` was built: this process's own build, or what its binary's
/// `--version` says (bounded to 2 s; `/proc/PID/exe` runs even when the file was replaced).
fn build_of(pid: u32) -> Option<Build> {
    if pid == std::process::id() {
        return Some(if cfg!(debug_assertions) {
            Build::Debug
        } else {
            Build::Release
        });
    }
    let mut child = Command::new(format!("/proc/{pid}/exe"))
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let until = Instant::now() + Duration::from_secs(2);
    // Bounded by `until`.
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    if matches!(child.try_wait(), Ok(None)) {
        let _ = child.kill();
        let _ = child.wait();
        return None;
    }
    let mut out = String::new();
    child.stdout.take()?.read_to_string(&mut out).ok()?;
    build_of_version(&out)
}

/// The processes serving one address (several: nginx's master and workers, `SO_REUSEPORT`)
/// as one peer: the first's build if it is pinlb (one binary for all), and the debug logging
/// the first that says so says.
fn peer(name: String, ps: &[&coremap::Process]) -> Peer {
    let logging = ps.iter().find_map(|p| {
        let cwd = std::fs::read_link(format!("/proc/{}/cwd", p.pid)).ok();
        let read = |f: &Path| match &cwd {
            Some(dir) if f.is_relative() => std::fs::read_to_string(dir.join(f)).ok(),
            _ => std::fs::read_to_string(f).ok(),
        };
        debug_logging(&p.command, &cmdline(p.pid), &environ(p.pid), &read)
    });
    let build = ps
        .first()
        .filter(|p| p.command == "pinlb")
        .and_then(|p| build_of(p.pid));
    Peer {
        name,
        build,
        debug_logging: logging,
    }
}

/// "pid 42, pinlb", "pids 42, 43, 44, nginx": the processes serving one address.
fn who(ps: &[&coremap::Process]) -> String {
    let pids: Vec<String> = ps.iter().map(|p| p.pid.to_string()).collect();
    let s = if ps.len() == 1 { "" } else { "s" };
    let command = ps.first().map_or("?", |p| p.command.as_str());
    format!("pid{s} {}, {command}", pids.join(", "))
}

/// Every core any of `ps` may run on.
fn cores_of(ps: &[&coremap::Process]) -> Vec<usize> {
    let masks: Vec<Vec<usize>> = ps.iter().map(|p| p.allowed.clone()).collect();
    coremap::union(&masks)
}

/// The processes behind `targets`: each target's, and the backends of a pinlb target with an
/// admin listener, each address's processes one peer and one role. A process seen before (two
/// targets on one pinlb) is not counted again.
fn discover(targets: &[Target], load_cores: &[usize]) -> Seen {
    let mut seen = Seen {
        placement: Placement {
            load: load_cores.to_vec(),
            roles: Vec::new(),
        },
        ..Seen::default()
    };
    let mut pids = BTreeSet::new();
    for t in targets {
        let mut admin = None;
        let mut own_peer = None;
        if let Found::Processes(ps) = coremap::listening_on(t.addr) {
            let first = ps.first();
            let serve = first.is_some_and(|p| {
                p.command == "pinlb" && cmdline(p.pid).get(1).is_some_and(|a| a == "serve")
            });
            let proxy = serve || first.is_some_and(|p| PROXIES.contains(&p.command.as_str()));
            seen.proxies.insert(t.addr, proxy);
            if serve {
                admin = ps.iter().find_map(|p| find_admin(p.pid, t.addr));
            }
            let fresh: Vec<&coremap::Process> = ps.iter().filter(|p| pids.insert(p.pid)).collect();
            if !fresh.is_empty() {
                let name = format!("target {} ({})", t.name, who(&fresh));
                own_peer = Some(seen.peers.len());
                seen.peers.push(peer(name.clone(), &fresh));
                seen.placement.roles.push(Role {
                    name,
                    kind: if t.proxied.unwrap_or(proxy) {
                        Kind::Proxy
                    } else {
                        Kind::Backend
                    },
                    cores: cores_of(&fresh),
                    group: String::new(),
                });
            }
        }
        if let Some(status) = admin.and_then(admin_status) {
            // The binary could not be asked (another user's): `/status` says how it was built.
            if let Some(p) = own_peer.and_then(|i| seen.peers.get_mut(i)) {
                p.build = p.build.or(match status["build"].as_str() {
                    Some("debug") => Some(Build::Debug),
                    Some("release") => Some(Build::Release),
                    _ => None,
                });
            }
            for addr in status_backends(&status) {
                let Found::Processes(ps) = coremap::listening_on(addr) else {
                    continue;
                };
                let fresh: Vec<&coremap::Process> =
                    ps.iter().filter(|p| pids.insert(p.pid)).collect();
                if fresh.is_empty() {
                    continue;
                }
                let name = format!("backend {addr} of target {} ({})", t.name, who(&fresh));
                seen.peers.push(peer(name.clone(), &fresh));
                seen.placement.roles.push(Role {
                    name,
                    kind: Kind::Backend,
                    cores: cores_of(&fresh),
                    group: String::new(),
                });
            }
        }
        seen.admins.push(admin);
    }
    seen
}

/// The admin listener of pinlb process `pid`: the one of its other listening addresses whose
/// `GET /status` answers pinlb's JSON. One with `admin.token` set answers 401 and is not found.
/// A proxy listener asked the same passes the GET to a backend: one request each, before the
/// run, for a pinlb with several listeners.
fn find_admin(pid: u32, target: SocketAddr) -> Option<SocketAddr> {
    coremap::listening_sockets_of(pid)
        .into_iter()
        .filter(|a| a.port() != target.port())
        .map(|a| {
            if a.ip().is_unspecified() {
                SocketAddr::new(target.ip(), a.port())
            } else {
                a
            }
        })
        .find(|a| admin_status(*a).is_some())
}

/// Time limit of each of the checks' own requests.
const REQUEST_TIME: Duration = Duration::from_secs(1);

/// Largest response the checks read.
const MAX_RESPONSE: usize = 8 << 20;

/// `GET /status` of a pinlb admin listener, when it answers with pinlb's JSON.
fn admin_status(addr: SocketAddr) -> Option<serde_json::Value> {
    let mut s = TcpStream::connect_timeout(&addr, REQUEST_TIME).ok()?;
    s.set_read_timeout(Some(REQUEST_TIME)).ok()?;
    s.write_all(
        format!("GET /status HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .ok()?;
    let mut buf = Vec::new();
    s.take(MAX_RESPONSE as u64).read_to_end(&mut buf).ok()?;
    let start = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    if !buf.starts_with(b"HTTP/1.1 200") {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&buf[start..]).ok()?;
    (v.get("upstreams").is_some() && v.get("version").is_some()).then_some(v)
}

/// Every backend address a `/status` lists.
fn status_backends(status: &serde_json::Value) -> Vec<SocketAddr> {
    let mut out = BTreeSet::new();
    for u in status["upstreams"].as_array().into_iter().flatten() {
        for b in u["backends"].as_array().into_iter().flatten() {
            if let Some(a) = b["address"].as_str().and_then(|a| a.parse().ok()) {
                out.insert(a);
            }
        }
    }
    out.into_iter().collect()
}

/// Each backend's `(connections_opened, connections_reused)` in a `/status`, summed over the
/// upstreams that list it.
fn status_connections(status: &serde_json::Value) -> BTreeMap<String, (u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for u in status["upstreams"].as_array().into_iter().flatten() {
        for b in u["backends"].as_array().into_iter().flatten() {
            let (Some(addr), Some(opened), Some(reused)) = (
                b["address"].as_str(),
                b["connections_opened"].as_u64(),
                b["connections_reused"].as_u64(),
            ) else {
                continue;
            };
            let e = out.entry(addr.to_string()).or_default();
            e.0 += opened;
            e.1 += reused;
        }
    }
    out
}

/// What each backend of a pinlb target took between two `/status` reads.
pub fn status_reuse(
    target: &str,
    before: &serde_json::Value,
    after: &serde_json::Value,
) -> Vec<Reuse> {
    let before = status_connections(before);
    status_connections(after)
        .into_iter()
        .map(|(backend, (opened, reused))| {
            let (o0, r0) = before.get(&backend).copied().unwrap_or_default();
            let opened = opened.saturating_sub(o0);
            Reuse {
                target: target.to_string(),
                backend,
                opened,
                requests: opened + reused.saturating_sub(r0),
            }
        })
        .collect()
}

/// What each `pinlb backend` server took over a probe, from the `x-pinlb-accepted` answers in
/// order (`address count`): between its first answer and its last it served one request per
/// answer after the first, and took the difference of the counts in new connections.
pub fn header_reuse(target: &str, answers: &[String]) -> Vec<Reuse> {
    let mut by: BTreeMap<&str, (u64, u64, u64)> = BTreeMap::new();
    for a in answers {
        let Some((addr, n)) = a.trim().rsplit_once(' ') else {
            continue;
        };
        let Ok(n) = n.parse::<u64>() else {
            continue;
        };
        by.entry(addr)
            .and_modify(|e| {
                e.1 = n;
                e.2 += 1;
            })
            .or_insert((n, n, 0));
    }
    by.into_iter()
        .map(|(backend, (first, last, requests))| Reuse {
            target: target.to_string(),
            backend: backend.to_string(),
            opened: last.saturating_sub(first),
            requests,
        })
        .collect()
}

/// What the keep-alive probe of one target saw.
#[derive(Debug, Clone, Default)]
struct Probe {
    /// The target closed a connection after a response.
    closes: bool,
    /// The mean time of one request, connects included.
    per_request: Duration,
    /// Each response's `x-pinlb-accepted`, where a `pinlb backend` answered it.
    accepted: Vec<String>,
}

/// `n` GETs of the target's path with `x-pinlb-accepted`, on one connection as long as the
/// target keeps it; `None` when the first fails.
fn probe(t: &Target, n: usize) -> Option<Probe> {
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\n{ACCEPTED}: ?\r\n\r\n",
        t.path, t.host
    );
    let started = Instant::now();
    let mut p = Probe::default();
    let mut conn: Option<Conn> = None;
    let mut done = 0;
    for _ in 0..n {
        let c = match conn.take() {
            Some(c) => c,
            None => match Conn::open(t.addr) {
                Some(c) => c,
                None => break,
            },
        };
        let Some((c, answer)) = c.exchange(request.as_bytes()) else {
            break;
        };
        done += 1;
        p.accepted.extend(answer.accepted);
        if answer.closes {
            p.closes = true;
        } else {
            conn = Some(c);
        }
    }
    if done == 0 {
        return None;
    }
    p.per_request = started.elapsed() / done;
    Some(p)
}

/// A probe's connection and what it has read but not used.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

/// One response, as the probe needs it.
struct Answer {
    closes: bool,
    accepted: Option<String>,
}

impl Conn {
    fn open(addr: SocketAddr) -> Option<Conn> {
        let stream = TcpStream::connect_timeout(&addr, REQUEST_TIME).ok()?;
        stream.set_read_timeout(Some(REQUEST_TIME)).ok()?;
        stream.set_nodelay(true).ok()?;
        Some(Conn {
            stream,
            buf: Vec::new(),
        })
    }

    /// Reads more into `buf`; `None` at the end of the stream, on an error or past the limit.
    fn fill(&mut self) -> Option<()> {
        if self.buf.len() > MAX_RESPONSE {
            return None;
        }
        let mut chunk = [0u8; 16 * 1024];
        match self.stream.read(&mut chunk) {
            Ok(0) | Err(_) => None,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                Some(())
            }
        }
    }

    /// Sends `request` and reads its response whole (Content-Length, chunked, or to the close).
    fn exchange(mut self, request: &[u8]) -> Option<(Conn, Answer)> {
        self.stream.write_all(request).ok()?;
        let (len, mut answer, framing) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut r = httparse::Response::new(&mut headers);
            match r.parse(&self.buf) {
                Ok(httparse::Status::Complete(len)) => {
                    let mut answer = Answer {
                        closes: r.version == Some(0),
                        accepted: None,
                    };
                    let mut framing = Framing::Close;
                    for h in r.headers.iter() {
                        let value = String::from_utf8_lossy(h.value);
                        if h.name.eq_ignore_ascii_case("connection") {
                            answer.closes = value.to_ascii_lowercase().contains("close");
                        } else if h.name.eq_ignore_ascii_case("content-length") {
                            framing = value.trim().parse().map_or(Framing::Close, Framing::Length);
                        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                            framing = Framing::Chunked;
                        } else if h.name.eq_ignore_ascii_case(ACCEPTED) {
                            answer.accepted = Some(value.into_owned());
                        }
                    }
                    if matches!(r.code, Some(204 | 304)) {
                        framing = Framing::Length(0);
                    }
                    break (len, answer, framing);
                }
                Ok(httparse::Status::Partial) => self.fill()?,
                Err(_) => return None,
            }
        };
        self.buf.drain(..len);
        match framing {
            Framing::Length(n) => {
                while self.buf.len() < n {
                    self.fill()?;
                }
                self.buf.drain(..n);
            }
            Framing::Chunked => self.skip_chunked()?,
            Framing::Close => {
                // Bounded by MAX_RESPONSE and the read timeout.
                while self.fill().is_some() {}
                answer.closes = true;
            }
        }
        Some((self, answer))
    }

    /// Reads a chunked body to its end (trailers included) and drops it.
    fn skip_chunked(&mut self) -> Option<()> {
        loop {
            let line = loop {
                match self.buf.windows(2).position(|w| w == b"\r\n") {
                    Some(i) => break i,
                    None => self.fill()?,
                }
            };
            let size = std::str::from_utf8(&self.buf[..line]).ok()?;
            let size = size.split(';').next().unwrap_or_default().trim();
            let size = usize::from_str_radix(size, 16).ok()?;
            self.buf.drain(..line + 2);
            if size == 0 {
                // Trailers, up to the empty line.
                loop {
                    match self.buf.windows(2).position(|w| w == b"\r\n") {
                        Some(0) => {
                            self.buf.drain(..2);
                            return Some(());
                        }
                        Some(i) => {
                            self.buf.drain(..i + 2);
                        }
                        None => self.fill()?,
                    }
                }
            }
            while self.buf.len() < size + 2 {
                self.fill()?;
            }
            self.buf.drain(..size + 2);
        }
    }
}

/// How a response's body ends.
enum Framing {
    Length(usize),
    Chunked,
    Close,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(name: &str, kind: Kind, cores: &[usize]) -> Role {
        Role {
            name: name.into(),
            kind,
            cores: cores.to_vec(),
            group: String::new(),
        }
    }

    /// A tree under a temp dir with `files` (path, contents) in it.
    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn the_load_generator_on_a_backends_core_is_warned_about_with_what_to_do() {
        let p = Placement {
            load: vec![1],
            roles: vec![
                role("the proxy", Kind::Proxy, &[0]),
                role("backend 0", Kind::Backend, &[1]),
            ],
        };
        let w = load_shares_a_core(&p);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(
            w[0].to_string(),
            "the load generator runs on core 1, which backend 0 may also run on: give it a core of its \
             own with --cpus (and pin the target off it), or its CPU is taken from what it measures"
        );
        let apart = Placement { load: vec![2], ..p };
        assert!(load_shares_a_core(&apart).is_empty());
    }

    #[test]
    fn a_debug_build_says_so_in_its_version_and_a_release_build_does_not() {
        assert_eq!(
            build_of_version("pinlb 0.1.0 (debug build)\n"),
            Some(Build::Debug)
        );
        assert_eq!(build_of_version("pinlb 0.1.0\n"), Some(Build::Release));
        assert_eq!(build_of_version("nginx version: nginx/1.24.0"), None);
        let w = debug_peers(&[
            Peer {
                name: "target proxied (pid 7, pinlb)".into(),
                build: Some(Build::Debug),
                debug_logging: None,
            },
            Peer {
                name: "target direct (pid 8, pinlb)".into(),
                build: Some(Build::Release),
                debug_logging: None,
            },
        ]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].problem
                .contains("proxied (pid 7, pinlb) is a debug build")
        );
        assert!(w[0].fix.contains("--release"));
    }

    #[test]
    fn peers_logging_at_debug_level_are_seen_where_their_settings_say_so() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let none = |_: &Path| None;
        let conf = |text: &'static str| move |_: &Path| Some(text.to_string());
        let debug_conf = conf("worker_processes 1;\n  error_log /var/log/nginx/e.log debug;\n");
        assert_eq!(
            debug_logging(
                "nginx",
                &args(&["nginx", "-c", "/t/n.conf"]),
                &[],
                &debug_conf
            ),
            Some("error_log ... debug in /t/n.conf".into())
        );
        let title = args(&["nginx: master process /usr/sbin/nginx -c /t/m.conf"]);
        assert_eq!(
            debug_logging("nginx", &title, &[], &debug_conf),
            Some("error_log ... debug in /t/m.conf".into())
        );
        let quiet = conf("# error_log x debug;\nerror_log /dev/stderr warn;\n");
        assert_eq!(debug_logging("nginx", &args(&["nginx"]), &[], &quiet), None);
        assert_eq!(
            debug_logging(
                "haproxy",
                &args(&["haproxy", "-f", "h.cfg", "-d"]),
                &[],
                &none
            ),
            Some("started with -d".into())
        );
        assert_eq!(
            debug_logging(
                "haproxy",
                &args(&["haproxy", "-db", "-f", "h.cfg"]),
                &[],
                &none
            ),
            None
        );
        assert_eq!(
            debug_logging("envoy", &args(&["envoy", "--log-level=trace"]), &[], &none),
            Some("--log-level trace".into())
        );
        let env = |v: &str| vec![("RUST_LOG".to_string(), v.to_string())];
        assert_eq!(
            debug_logging("pinlb", &[], &env("warn,pinlb::proxy=debug"), &none),
            Some("RUST_LOG=warn,pinlb::proxy=debug".into())
        );
        assert_eq!(debug_logging("pinlb", &[], &env("info"), &none), None);
        let w = debug_peers(&[Peer {
            name: "target proxied (pid 9, haproxy)".into(),
            build: None,
            debug_logging: Some("started with -d".into()),
        }]);
        assert_eq!(w.len(), 1);
        assert!(
            w[0].problem
                .contains("logs at debug level (started with -d)")
        );
    }

    #[test]
    fn a_backend_that_takes_a_connection_per_request_means_no_keep_alive() {
        let answers: Vec<String> = (1..=8)
            .map(|i| format!("127.0.0.1:8881 {i}"))
            .chain((0..8).map(|_| "127.0.0.1:8882 3".to_string()))
            .collect();
        let seen = header_reuse("proxied", &answers);
        assert_eq!(
            seen,
            vec![
                Reuse {
                    target: "proxied".into(),
                    backend: "127.0.0.1:8881".into(),
                    opened: 7,
                    requests: 7,
                },
                Reuse {
                    target: "proxied".into(),
                    backend: "127.0.0.1:8882".into(),
                    opened: 0,
                    requests: 7,
                },
            ]
        );
        let w = no_keep_alive(&seen);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].problem.starts_with(
                "target proxied opened 7 connections to backend 127.0.0.1:8881 for 7 requests"
            ),
            "{w:?}"
        );
        assert!(w[0].fix.contains("keepalive above 0"));
    }

    #[test]
    fn a_pinlb_targets_status_tells_opened_from_reused_connections() {
        let status = |opened: u64, reused: u64| {
            serde_json::json!({ "upstreams": [{ "backends": [{
                "address": "127.0.0.1:1", "connections_opened": opened, "connections_reused": reused
            }]}]})
        };
        let closes = status_reuse("p", &status(1, 0), &status(17, 0));
        assert_eq!((closes[0].opened, closes[0].requests), (16, 16));
        assert_eq!(no_keep_alive(&closes).len(), 1);
        let keeps = status_reuse("p", &status(1, 0), &status(1, 16));
        assert_eq!((keeps[0].opened, keeps[0].requests), (0, 16));
        assert!(no_keep_alive(&keeps).is_empty());
    }

    fn topology(pairs: &[(usize, &str)]) -> tempfile::TempDir {
        let files: Vec<(String, String)> = pairs
            .iter()
            .map(|(c, list)| {
                (
                    format!("sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list"),
                    format!("{list}\n"),
                )
            })
            .collect();
        let refs: Vec<(&str, &str)> = files
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        tree(&refs)
    }

    #[test]
    fn a_proxy_and_a_backend_on_two_threads_of_one_core_are_warned_about() {
        let smt = topology(&[(0, "0,2"), (1, "1,3"), (2, "0,2"), (3, "1,3")]);
        let p = Placement {
            load: vec![3],
            roles: vec![
                role("the proxy", Kind::Proxy, &[0]),
                role("backend 0", Kind::Backend, &[2]),
                role("backend 1", Kind::Backend, &[1]),
            ],
        };
        let w = smt_siblings(smt.path(), &p);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(
            w[0].problem,
            "the proxy on core 0 and backend 0 on core 2 are SMT siblings, two threads of one \
             physical core (thread_siblings_list 0,2): they share its execution units and caches"
        );
        // One thread per core: nothing to say.
        let plain = topology(&[(0, "0"), (1, "1"), (2, "2"), (3, "3")]);
        assert!(smt_siblings(plain.path(), &p).is_empty());
        // Another layout's backend never runs beside this proxy.
        let mut apart = p.clone();
        apart.roles[1].group = "other".into();
        assert!(smt_siblings(smt.path(), &apart).is_empty());
        // No topology to read: skipped.
        let empty = tree(&[]);
        assert!(smt_siblings(empty.path(), &p).is_empty());
    }

    #[test]
    fn a_governor_other_than_performance_is_warned_about_and_none_is_silent() {
        let g = |c: usize| format!("sys/devices/system/cpu/cpu{c}/cpufreq/scaling_governor");
        let (g0, g1, g2) = (g(0), g(1), g(2));
        let root = tree(&[
            (&g0, "powersave\n"),
            (&g1, "powersave\n"),
            (&g2, "performance\n"),
        ]);
        let w = governors(root.path(), &[0, 1, 2, 3]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].problem
                .starts_with("cores 0-1 use the powersave CPU frequency governor"),
            "{w:?}"
        );
        assert!(w[0].fix.contains("cpupower frequency-set -g performance"));
        assert!(governors(root.path(), &[2, 3]).is_empty());
    }

    const TCP: &str = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:22B8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:C350 0100007F:22B8 06 00000000:00000000 03:00001234 00000000     0        0 0 3 0000000000000000
   2: 0100007F:C351 0100007F:22B8 06 00000000:00000000 03:00001234 00000000     0        0 0 3 0000000000000000
";

    #[test]
    fn time_wait_sockets_are_counted_from_the_socket_table() {
        assert_eq!(count_time_wait(TCP), 2);
        let root = tree(&[
            ("proc/sys/net/ipv4/ip_local_port_range", "32768\t60999\n"),
            ("proc/sys/net/ipv4/tcp_tw_reuse", "2\n"),
            ("proc/net/tcp", TCP),
        ]);
        assert_eq!(
            Ports::read(root.path()),
            Some(Ports {
                range: (32768, 60999),
                time_wait: 2,
                tw_reuse: 2,
            })
        );
    }

    #[test]
    fn ports_run_out_when_a_minute_of_connections_exceeds_the_range() {
        let ports = Ports {
            range: (50000, 50999),
            time_wait: 0,
            tw_reuse: 0,
        };
        let load = Load {
            connections: 64,
            keep_alive: false,
            rate: Some(100.0),
            run: Duration::from_secs(3),
        };
        let (rate, why) = opened_per_second(&load, false, None).unwrap();
        assert_eq!(rate, 100.0);
        let w = port_budget(&ports, rate, &why, true);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].problem.starts_with(
                "about 100 new connections/s (--disable-keepalive, at --rate 100) would hold \
                 6000 local ports in TIME_WAIT (60 s each), more than the 1000 of \
                 ip_local_port_range 50000-50999"
            ),
            "{w:?}"
        );
        // Kept alive, 64 connections a run: 21 a second, 1280 a minute.
        let kept = Load {
            keep_alive: true,
            ..load.clone()
        };
        let (rate, why) = opened_per_second(&kept, false, None).unwrap();
        assert_eq!(port_budget(&ports, rate, &why, true).len(), 1);
        let wide = Ports {
            range: (32768, 60999),
            ..ports.clone()
        };
        assert!(port_budget(&wide, rate, &why, true).is_empty());
        // Where the kernel reuses TIME_WAIT ports, a port is back a second after its close.
        let reused = Ports {
            tw_reuse: 2,
            ..ports.clone()
        };
        assert!(port_budget(&reused, 100.0, &why, true).is_empty());
        assert_eq!(port_budget(&reused, 100.0, &why, false).len(), 1);
        // A closed loop of a connection per request is reckoned from the probe's time.
        let closed = Load {
            rate: None,
            ..load.clone()
        };
        assert!(opened_per_second(&closed, false, None).is_none());
        let (rate, _) = opened_per_second(&closed, true, Some(Duration::from_millis(1))).unwrap();
        assert!((rate - 64_000.0).abs() < 1.0, "{rate}");
    }

    #[test]
    fn a_time_wait_table_near_the_range_is_warned_about() {
        let ports = Ports {
            range: (50000, 50999),
            time_wait: 600,
            tw_reuse: 0,
        };
        let w = port_budget(&ports, 1.0, "x", true);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].problem
                .starts_with("600 connections are in TIME_WAIT already")
        );
        let few = Ports {
            time_wait: 10,
            ..ports
        };
        assert!(port_budget(&few, 1.0, "x", true).is_empty());
    }

    #[test]
    fn a_core_busy_before_the_run_is_warned_about() {
        let before = "cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 100 0 0 900 0 0 0 0 0 0\ncpu1 100 0 0 900 0 0 0 0 0 0\n";
        // Core 0: 10 busy of 100 (10%); core 1: 80 of 100.
        let after = "cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 105 0 5 990 0 0 0 0 0 0\ncpu1 170 0 10 915 5 0 0 0 0 0\n";
        let w = busy_cores(before, after, &[0, 1]);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].problem.contains("(core 1 80%)"), "{w:?}");
        assert!(busy_cores(before, after, &[0]).is_empty());
        assert!(
            busy_cores(before, before, &[0, 1]).is_empty(),
            "no time passed"
        );
    }
}

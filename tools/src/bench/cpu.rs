//! CPU per request of the processes behind each target: user plus system time (`utime` and
//! `stime` of `/proc/PID/stat`, clock ticks) of each process and its descendants, read when a
//! recorded window starts and again when it ends, added up over the rounds and divided by the
//! responses of those windows, as `benches/compare.sh` does.
//!
//! A target's processes are what answers at its address (the proxy, or the server itself) and,
//! behind a proxy, each backend. Who started them says which they are ([`Processes`]); for a
//! plain URL, [`listening`] finds the process listening on its port when the address is one
//! of this machine's. A process's descendants count with it (nginx's workers under its
//! master); a thread's time is in its process's. Ticks are 10 ms on most kernels, so figures
//! from windows of a fraction of a second are coarse.
//!
//! When the target runs in this very process (`pinlb demo` runs its proxy and backends on
//! threads of its own), whole processes would mix them up: [`Processes::tasks`] says the ids
//! are single tasks instead (threads of this process, found by name with [`threads_named`], or
//! single-threaded processes such as nginx's), and each one's own time on a CPU is read from
//! `/proc/ID/schedstat`, in nanoseconds.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::coremap::{self, Found};

/// The processes whose CPU a target's figures include.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Processes {
    /// What answers at the target's address (the proxy; the server itself for a backend
    /// benched directly); empty when unknown.
    pub server: Vec<u32>,
    /// Behind a proxy, each backend's processes, in order.
    pub backends: Vec<Vec<u32>>,
    /// When the target is pinlb with an admin listener (`bench --proxy`, `sweep`), where:
    /// each backend's learned concurrency limit is read from its `/status` ([`super::limits`]).
    pub status: Option<SocketAddr>,
    /// The ids above are single tasks, not processes with their threads: threads of this
    /// process, or single-threaded processes. Each one's own CPU time is read, and no
    /// descendants are looked for.
    pub tasks: bool,
}

/// What a target's processes used, per response of the recorded windows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuUse {
    /// µs of CPU of what answers at the target's address, per response; `None` when its
    /// processes are not known or no response came.
    pub server_us_per_request: Option<f64>,
    /// Each backend's µs of CPU per response of the target (so they add up to the backends'
    /// CPU per request); empty when not known.
    pub backends_us_per_request: Vec<Option<f64>>,
    /// The processes read for `server_us_per_request`, descendants included.
    pub server_pids: Vec<u32>,
}

/// The processes listening on `addr` when it is an address of this machine; nothing for
/// another machine's, or when `/proc` does not say.
pub fn listening(addr: SocketAddr) -> Vec<u32> {
    if !coremap::is_local(addr.ip()) {
        return Vec::new();
    }
    match coremap::listening_on(addr) {
        Found::Processes(ps) => ps.into_iter().map(|p| p.pid).collect(),
        _ => Vec::new(),
    }
}

/// The threads of this process whose names `named` accepts (`pinlb-w0`, `pinlb-be1`), by id.
pub fn threads_named(named: impl Fn(&str) -> bool) -> Vec<u32> {
    let Ok(me) = procfs::process::Process::myself() else {
        return Vec::new();
    };
    let Ok(tasks) = me.tasks() else {
        return Vec::new();
    };
    let mut out: Vec<u32> = tasks
        .flatten()
        .filter(|t| t.stat().is_ok_and(|s| named(&s.comm)))
        .filter_map(|t| u32::try_from(t.tid).ok())
        .collect();
    out.sort_unstable();
    out
}

/// Every thread of process `pid` and of its descendants, by id: what [`Processes::tasks`]
/// reads for a process run beside this one (nginx and its workers, Node.js and its helper
/// threads).
pub fn threads_of(pid: u32) -> Vec<u32> {
    let mut out: Vec<u32> = tree(&[pid])
        .into_iter()
        .filter_map(|p| procfs::process::Process::new(i32::try_from(p).ok()?).ok())
        .filter_map(|p| p.tasks().ok())
        .flat_map(|tasks| tasks.flatten().filter_map(|t| u32::try_from(t.tid).ok()))
        .collect();
    out.sort_unstable();
    out
}

/// `roots` and every descendant of theirs, sorted, each once.
fn tree(roots: &[u32]) -> Vec<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    if let Ok(all) = procfs::process::all_processes() {
        for p in all.flatten() {
            if let (Ok(stat), Ok(pid)) = (p.stat(), u32::try_from(p.pid())) {
                if let Ok(ppid) = u32::try_from(stat.ppid) {
                    children.entry(ppid).or_default().push(pid);
                }
            }
        }
    }
    let mut out: Vec<u32> = Vec::new();
    let mut todo: Vec<u32> = roots.to_vec();
    // Bounded by the processes: each is taken once (a PID can only have one parent).
    while let Some(pid) = todo.pop() {
        if out.contains(&pid) {
            continue;
        }
        out.push(pid);
        if let Some(c) = children.get(&pid) {
            todo.extend(c);
        }
    }
    out.sort_unstable();
    out
}

/// User plus system time of process `pid` so far, in ns (counted in clock ticks); `None` once
/// it is gone.
fn process_ns(pid: u32) -> Option<u64> {
    let stat = procfs::process::Process::new(i32::try_from(pid).ok()?)
        .ok()?
        .stat()
        .ok()?;
    let hz = procfs::ticks_per_second().max(1);
    Some((stat.utime + stat.stime).saturating_mul(1_000_000_000) / hz)
}

/// Time task `id` (a thread of this process, or a process's main thread) has spent on a CPU
/// so far, in ns: the first field of its `schedstat`, which is the task's own and not its
/// thread group's; `None` once it is gone.
fn task_ns(id: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{id}/schedstat")).ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// One target's processes (descendants found once, before the first round) or threads, and
/// the ns of CPU they used in its recorded windows so far.
#[derive(Debug)]
pub(super) struct Meter {
    /// The server's processes first, then each backend's.
    groups: Vec<Vec<u32>>,
    /// [`Processes::tasks`].
    tasks: bool,
    known_server: bool,
    /// Each group's ns at the start of the window under way.
    start: Vec<Vec<Option<u64>>>,
    used: Vec<u64>,
}

impl Meter {
    pub(super) fn new(p: &Processes) -> Meter {
        let found = |ids: &[u32]| {
            if p.tasks { ids.to_vec() } else { tree(ids) }
        };
        let mut groups = vec![found(&p.server)];
        groups.extend(p.backends.iter().map(|b| found(b)));
        let n = groups.len();
        Meter {
            known_server: !groups[0].is_empty(),
            groups,
            tasks: p.tasks,
            start: vec![Vec::new(); n],
            used: vec![0; n],
        }
    }

    /// CPU ns used so far by one of the groups' ids.
    fn ns(&self, id: u32) -> Option<u64> {
        if self.tasks {
            task_ns(id)
        } else {
            process_ns(id)
        }
    }

    /// Whether there is anything to read.
    fn is_empty(&self) -> bool {
        self.groups.iter().all(Vec::is_empty)
    }

    /// A recorded window starts.
    pub(super) fn window_started(&mut self) {
        if self.is_empty() {
            return;
        }
        let start: Vec<Vec<Option<u64>>> = self
            .groups
            .iter()
            .map(|g| g.iter().map(|&id| self.ns(id)).collect())
            .collect();
        self.start = start;
    }

    /// The window ended: what each process used since it started is added up. A process gone
    /// meanwhile counts nothing for that window.
    pub(super) fn window_ended(&mut self) {
        if self.is_empty() {
            return;
        }
        for (i, (g, s)) in self.groups.iter().zip(&self.start).enumerate() {
            for (&id, before) in g.iter().zip(s) {
                if let (Some(b), Some(a)) = (before, self.ns(id)) {
                    self.used[i] += a.saturating_sub(*b);
                }
            }
        }
    }

    /// Per response of the recorded windows; `None` when nothing was known to read.
    pub(super) fn per_request(&self, responses: u64) -> Option<CpuUse> {
        if self.is_empty() {
            return None;
        }
        let us = |ns: u64| (responses > 0).then(|| ns as f64 / 1e3 / responses as f64);
        Some(CpuUse {
            server_us_per_request: if self.known_server {
                us(self.used[0])
            } else {
                None
            },
            backends_us_per_request: self.used[1..]
                .iter()
                .zip(&self.groups[1..])
                .map(|(&u, g)| if g.is_empty() { None } else { us(u) })
                .collect(),
            server_pids: self.groups[0].clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spins until this thread has spent `ns` of CPU by its own `schedstat` (a wall-clock
    /// spin gets less on a busy machine), within 10 s; gives what it spent.
    fn burn_cpu(ns: u64) -> u64 {
        let spent = || {
            let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap();
            text.split_whitespace()
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        };
        let start = spent();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut x = 0u64;
        while spent() - start < ns && std::time::Instant::now() < deadline {
            for _ in 0..1000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        spent() - start
    }

    #[test]
    fn this_process_is_found_with_its_children_and_its_cpu_counts() {
        let me = std::process::id();
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let t = tree(&[me]);
        assert!(t.contains(&me) && t.contains(&child.id()), "{t:?}");
        let mut m = Meter::new(&Processes {
            server: vec![me],
            backends: vec![vec![child.id()], Vec::new()],
            status: None,
            tasks: false,
        });
        m.window_started();
        // 50 ms of CPU on this thread: at least a few ticks.
        burn_cpu(50_000_000);
        m.window_ended();
        let c = m.per_request(1000).unwrap();
        let us = c.server_us_per_request.unwrap();
        // 50 ms over 1000 responses is 50 µs each, less a tick; other tests' threads in this
        // process may add theirs.
        assert!(us >= 20.0, "{us}");
        assert_eq!(c.backends_us_per_request.len(), 2);
        assert!(c.backends_us_per_request[0].unwrap() < 20.0, "{c:?}");
        assert_eq!(c.backends_us_per_request[1], None);
        assert_eq!(m.per_request(0).unwrap().server_us_per_request, None);
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn a_named_thread_of_this_process_counts_its_own_cpu_and_no_other() {
        use std::sync::mpsc::channel;
        let (to_burner, burner_rx) = channel::<()>();
        let (to_test, test_rx) = channel::<u64>();
        let burner = std::thread::Builder::new()
            .name("cpu-test-burn".into())
            .spawn(move || {
                // Named and running; then burn when told, say so, and stay until told to go
                // (a thread that is gone has no schedstat to read).
                to_test.send(0).unwrap();
                burner_rx.recv().unwrap();
                to_test.send(burn_cpu(50_000_000)).unwrap();
                burner_rx.recv().unwrap();
            })
            .unwrap();
        test_rx.recv().unwrap();
        let tids = threads_named(|n| n == "cpu-test-burn");
        assert_eq!(tids.len(), 1, "{tids:?}");
        let mut m = Meter::new(&Processes {
            server: tids,
            backends: vec![threads_named(|n| n == "no-such-thread")],
            status: None,
            tasks: true,
        });
        m.window_started();
        to_burner.send(()).unwrap();
        let burned = test_rx.recv().unwrap();
        m.window_ended();
        to_burner.send(()).unwrap();
        burner.join().unwrap();
        let c = m.per_request(1000).unwrap();
        // What the burner spent over 1000 responses, plus its channel calls and up to a
        // scheduler tick its own last read had not yet seen; the waiting test thread counts
        // nowhere.
        let us = c.server_us_per_request.unwrap();
        let burned_us = burned as f64 / 1000.0 / 1000.0;
        assert!(
            (burned_us..burned_us + 15.0).contains(&us),
            "{us} for {burned_us}"
        );
        assert_eq!(c.backends_us_per_request, [None]);
    }

    #[test]
    fn nothing_known_is_nothing_reported() {
        let m = Meter::new(&Processes::default());
        assert!(m.per_request(10).is_none());
    }

    #[test]
    fn a_listening_socket_names_its_process() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(listening(l.local_addr().unwrap()), [std::process::id()]);
        drop(l);
        // Another machine's address is never taken for a local process on the same port.
        assert!(listening("192.0.2.1:80".parse().unwrap()).is_empty());
    }
}

//! `pinlb bench --proxy pinlb,nginx,haproxy --backend ADDR[,ADDR...] --proxy-cpus LIST`: each
//! proxy started pinned to the proxy cores in front of backends that already run, on
//! `pinlb sweep`'s configurations ([`crate::peers`]), and benched as a target of its
//! own after `direct` (the first backend alone), in the same interleaved rounds.
//!
//! The processes of every target are known, so each one's CPU per request is read: a proxy's
//! own (it is a child of this process), and each backend's, found by the port it listens on.
//! pinlb runs with its admin listener, whose `/status` gives each backend's learned
//! concurrency limit at the end of each recorded window (its `/metrics` counters are then
//! counted on its request path too: 1 to 2.5% more instructions per request, as
//! benches/RESULTS.md measured).

use std::net::SocketAddr;
use std::path::PathBuf;

use super::cpu::{Processes, listening};
use super::{BenchArgs, BenchError, Target};
use crate::launch::{self, Children};
use crate::peers::{self, Spec};
use pinlb::sys::cpus::{allowed_cpus, format_cpu_list, parse_cpu_list};

/// The proxies started, and what to bench: `direct` first, then each proxy.
pub(super) struct Started {
    /// Stops the proxies when dropped.
    pub children: Children,
    pub targets: Vec<Target>,
    pub processes: Vec<Processes>,
    /// A line for each proxy that is not installed.
    pub skipped: Vec<String>,
}

/// Where the proxies' files go when `--proxy-dir` is not given.
fn default_dir() -> PathBuf {
    std::env::temp_dir().join(format!("pinlb-bench-{}", std::process::id()))
}

/// Starts `args.proxy`'s proxies in front of `args.backend` and waits until each answers.
pub(super) fn start(args: &BenchArgs) -> Result<Started, BenchError> {
    let fail = |e: String| BenchError::Options(format!("--proxy: {e}"));
    let backends: &[SocketAddr] = &args.backend;
    let Some(first) = backends.first() else {
        return Err(fail(
            "give the backends to put the proxies in front of: --backend ADDR[,ADDR...]".into(),
        ));
    };
    let allowed = allowed_cpus().map_err(BenchError::AllowedCpus)?;
    let cores = match &args.proxy_cpus {
        Some(list) => {
            parse_cpu_list(list).map_err(|e| fail(format!("--proxy-cpus {list:?}: {e}")))?
        }
        None => vec![
            *allowed
                .first()
                .ok_or_else(|| fail("no core to run the proxies on".into()))?,
        ],
    };
    if let Some(c) = cores.iter().find(|c| !allowed.contains(c)) {
        return Err(fail(format!(
            "--proxy-cpus: core {c} is not one this process may run on ({})",
            format_cpu_list(&allowed)
        )));
    }
    let dir = args.proxy_dir.clone().unwrap_or_else(default_dir);
    let (found, skipped) = peers::available(args.proxy.as_deref().unwrap_or_default());
    let path = &args.path;
    let backend_pids: Vec<Vec<u32>> = backends.iter().map(|&b| listening(b)).collect();
    let mut children = Children::default();
    let mut targets = vec![target("direct", *first, path)?];
    let mut processes = vec![Processes {
        server: backend_pids[0].clone(),
        backends: Vec::new(),
        status: None,
        tasks: false,
    }];
    for f in &found {
        let port = launch::free_port().map_err(|e| fail(e.to_string()))?;
        let own = dir.join(f.proxy.as_str());
        // pinlb's admin listener, for each backend's learned limit from its /status.
        let admin = match f.proxy {
            peers::Proxy::Pinlb => Some(SocketAddr::from((
                [127, 0, 0, 1],
                launch::free_port().map_err(|e| fail(e.to_string()))?,
            ))),
            _ => None,
        };
        let spec = Spec {
            cores: &cores,
            port,
            backends,
            max_connections: (2 * args.connections).max(10_000),
            dir: &own,
            admin,
        };
        let command = f.command(&spec).map_err(|e| fail(e.to_string()))?;
        let what = format!(
            "{} (cores {}, port {port})",
            f.proxy.display_name(),
            format_cpu_list(&cores)
        );
        let log = own.join("stdout.log");
        let pid = launch::spawn(&what, command, &cores, &log, &mut children)
            .map_err(|e| fail(e.to_string()))?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        // Through the proxy to a backend: a 502 or 503 means it is up but not through yet.
        launch::wait_ready(&what, addr, path, &log, &mut children, |s| s < 500)
            .map_err(|e| fail(e.to_string()))?;
        targets.push(target(f.proxy.as_str(), addr, path)?);
        processes.push(Processes {
            server: vec![pid],
            backends: backend_pids.clone(),
            status: admin,
            tasks: false,
        });
    }
    Ok(Started {
        children,
        targets,
        processes,
        skipped,
    })
}

fn target(name: &str, addr: SocketAddr, path: &str) -> Result<Target, BenchError> {
    format!("{name}=http://{addr}{path}").parse()
}

/// For targets given as URLs: the processes listening on each one's address on this machine
/// (none for another machine's, or an address that does not resolve).
pub(super) fn discover(targets: &[Target]) -> Vec<Processes> {
    targets
        .iter()
        .map(|t| Processes {
            server: t.resolve().map(listening).unwrap_or_default(),
            backends: Vec::new(),
            status: None,
            tasks: false,
        })
        .collect()
}

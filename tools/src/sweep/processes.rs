//! Each layout's processes: backends (`pinlb backend`, or the user's `--cmd`), started once per
//! layout, and in front of them each proxy of `--proxy` (pinlb, nginx, HAProxy, on the
//! configurations of [`crate::peers`]), started pinned, polled until they answer, and
//! stopped when the sweep ends ([`Children`]).

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use super::{Layout, SweepArgs, SweepError};
use crate::launch::{self, Children};
use crate::peers::{self, Spec};
use pinlb::sys::cpus::format_cpu_list;

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

/// Starts a layout's backends, one per backend core, and waits until each answers; their
/// addresses and process IDs.
pub(super) fn start_backends(
    args: &SweepArgs,
    layout: &Layout,
    logs: &Path,
    children: &mut Children,
) -> Result<Vec<(SocketAddr, u32)>, SweepError> {
    let mut out = Vec::with_capacity(layout.backends.len());
    for (i, &core) in layout.backends.iter().enumerate() {
        let port = launch::free_port()?;
        let what = format!("{} backend {i} (core {core}, port {port})", layout.name);
        let log = logs.join(format!("{}-backend-{i}.log", layout.id));
        let pid = launch::spawn(
            &what,
            backend_command(args, port, core)?,
            &[core],
            &log,
            children,
        )?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        launch::wait_ready(&what, addr, &args.path, &log, children, |_| true)?;
        out.push((addr, pid));
    }
    Ok(out)
}

/// Starts `proxy` on a layout's proxy cores in front of `backends`, its files in
/// `logs/LAYOUT-PROXY/`, and waits until it answers through to a backend; its address, process
/// ID and, for pinlb, its admin listener's (whose `/status` gives each backend's learned
/// concurrency limit; its `/metrics` counters are then counted on the request path too, 1 to
/// 2.5% more instructions per request as benches/RESULTS.md measured).
pub(super) fn start_proxy(
    args: &SweepArgs,
    layout: &Layout,
    proxy: &peers::Found,
    backends: &[SocketAddr],
    logs: &Path,
    max_connections: usize,
    children: &mut Children,
) -> Result<(SocketAddr, u32, Option<SocketAddr>), SweepError> {
    let port = launch::free_port()?;
    let admin = match proxy.proxy {
        peers::Proxy::Pinlb => Some(SocketAddr::from(([127, 0, 0, 1], launch::free_port()?))),
        _ => None,
    };
    let dir = logs.join(format!("{}-{}", layout.id, proxy.proxy));
    let spec = Spec {
        cores: &layout.proxy,
        port,
        backends,
        max_connections: (2 * max_connections).max(10_000),
        dir: &dir,
        admin,
    };
    let command = proxy.command(&spec)?;
    let what = format!(
        "{} {} (cores {}, port {port})",
        layout.name,
        proxy.proxy.display_name(),
        format_cpu_list(&layout.proxy)
    );
    let log = dir.join("stdout.log");
    let pid = launch::spawn(&what, command, &layout.proxy, &log, children)?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    // Through the proxy to a backend: a 502 or 503 means the proxy is up but not through yet.
    launch::wait_ready(&what, addr, &args.path, &log, children, |s| s < 500)?;
    Ok((addr, pid, admin))
}

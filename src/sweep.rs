//! `pinlb sweep`: "how should I split my cores?" answered in one command.
//!
//! People who run an app as several pinned processes behind a balancer find the best split by
//! hand: one process alone, then a balancer on one core in front of processes on the others,
//! then two balancer cores, each at a few concurrencies, written into a table. `sweep` lays out
//! every such split that fits the cores (`plan`), starts each layout's processes pinned
//! (`child::pinned`), loads all of them through `pinlb bench`'s engine (warm-up, interleaved
//! rounds, HDR percentiles, failures by kind) at every concurrency, and prints the table and a
//! recommendation with its margin; it writes the same as Markdown, JSON and an SVG chart.
//!
//! Every process is a child, the proxy too (`pinlb serve` on a generated configuration), rather
//! than a `Server` on a thread of this process: the load generator's threads and the proxy's
//! workers are then separate processes, each pinned to its own cores by the kernel before it
//! runs, so nothing of the bench runs on (or is accounted to) a proxy core, and a layout is the
//! same processes a user would run by hand.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use plotters::prelude::*;
use serde::Serialize;

use crate::bench::{self, BenchError, BenchOptions, Errors, Latency, Spread, Target};
use crate::cpus::{allowed_cpus, format_cpu_list, parse_cpu_list};

/// How long a started process may take to answer its first request.
const READY_TIME: Duration = Duration::from_secs(15);
/// After SIGTERM, how long a child has to exit before it is killed.
const STOP_TIME: Duration = Duration::from_secs(2);

/// `pinlb sweep`'s command line.
#[derive(Debug, Clone, clap::Args)]
pub struct SweepArgs {
    /// The backend to run, one process per backend core: `{port}` in it is replaced by the
    /// port that process must listen on, which is also in its PORT environment variable
    /// ("node app.js", "php -S 127.0.0.1:{port}") [default: pinlb backend --work WORK].
    #[arg(long, value_name = "COMMAND")]
    pub cmd: Option<String>,
    /// The cores to split ("0-3", "0,2,4") [default: every core this process may run on].
    // `std::vec::Vec`: clap reads a plain `Vec` as a list of values, not one value parsed
    // into a list.
    #[arg(long, value_name = "LIST", value_parser = parse_cpus)]
    pub cores: Option<std::vec::Vec<usize>>,
    /// Client connections open at once, one bench per value (ab's -c).
    #[arg(
        long,
        value_name = "N,N,...",
        value_delimiter = ',',
        default_value = "10,100"
    )]
    pub concurrency: Vec<usize>,
    /// Recorded length of each run.
    #[arg(short, long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Unrecorded load before each recorded run, on the same connections.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Rounds; each runs every layout once, in turn.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// CPU each `pinlb backend` burns per request, standing in for the app's work (not with
    /// --cmd).
    #[arg(long, default_value = "100us", value_parser = humantime::parse_duration)]
    pub work: Duration,
    /// The path requested.
    #[arg(long, default_value = "/")]
    pub path: String,
    /// Per request, like wrk's --timeout.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Where sweep.md, sweep.json, sweep.svg and the processes' logs go.
    #[arg(long, value_name = "DIR", default_value = "pinlb-sweep")]
    pub out: PathBuf,
}

fn parse_cpus(s: &str) -> Result<Vec<usize>, String> {
    parse_cpu_list(s)
}

/// Why a sweep could not run.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("{0}")]
    Options(String),
    #[error("cannot read the cores this process may run on: {0}")]
    AllowedCpus(nix::Error),
    #[error("cannot start {what}: {reason}")]
    Start { what: String, reason: String },
    #[error("{what} did not answer within {limit:?}: {reason} (its log: {log})")]
    NotReady {
        what: String,
        limit: Duration,
        reason: String,
        log: String,
    },
    #[error("bench at c={concurrency}: {source}")]
    Bench {
        concurrency: usize,
        source: BenchError,
    },
    #[error("cannot write {path}: {reason}")]
    Write { path: PathBuf, reason: String },
}

/// One split of the cores: a backend alone, or a proxy in front of backends.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// Short and stable, for JSON and file names: `direct`, `p1b3`.
    pub id: String,
    /// For people: "direct (1 backend)", "1 proxy core + 3 backends".
    pub name: String,
    /// The proxy's cores, one worker each; empty for direct.
    pub proxy: Vec<usize>,
    /// The core of each backend process.
    pub backends: Vec<usize>,
}

impl Layout {
    fn direct(core: usize) -> Layout {
        Layout {
            id: "direct".into(),
            name: "direct (1 backend)".into(),
            proxy: Vec::new(),
            backends: vec![core],
        }
    }

    fn proxied(proxy: Vec<usize>, backends: Vec<usize>) -> Layout {
        let (p, b) = (proxy.len(), backends.len());
        Layout {
            id: format!("p{p}b{b}"),
            name: format!(
                "{p} proxy core{} + {b} backend{}",
                if p == 1 { "" } else { "s" },
                if b == 1 { "" } else { "s" }
            ),
            proxy,
            backends,
        }
    }

    fn cores(&self) -> Vec<usize> {
        let mut c: Vec<usize> = self.proxy.iter().chain(&self.backends).copied().collect();
        c.sort_unstable();
        c.dedup();
        c
    }
}

/// The layouts to measure on some cores, and where the load generator runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Plan {
    pub layouts: Vec<Layout>,
    /// The load generator's cores.
    pub load: Vec<usize>,
    /// What shares a core, said plainly; empty when nothing does.
    pub notes: Vec<String>,
}

/// Lays out `cores`. With three or more, the load generator gets the last quarter of them (at
/// least one) to itself and the layouts split the rest: direct (one backend on the first), and
/// for every p from 1 to all but one, p proxy cores followed by one backend on each core left.
/// With fewer there is no core to spare: the layouts use every core and the load generator
/// runs on the last one beside them, which the notes say.
pub fn plan(cores: &[usize]) -> Plan {
    let n = cores.len();
    let mut notes = Vec::new();
    let (app, load) = if n >= 3 {
        let l = (n / 4).max(1);
        (cores[..n - l].to_vec(), cores[n - l..].to_vec())
    } else {
        (cores.to_vec(), vec![cores[n - 1]])
    };
    let mut layouts = vec![Layout::direct(app[0])];
    if app.len() == 1 {
        layouts.push(Layout::proxied(vec![app[0]], vec![app[0]]));
        notes.push(format!(
            "only core {} is available: the proxy, the backend and the load generator all share it, so the numbers show contention more than capacity",
            app[0]
        ));
    } else {
        for p in 1..app.len() {
            layouts.push(Layout::proxied(app[..p].to_vec(), app[p..].to_vec()));
        }
    }
    if n == 2 {
        let shared: Vec<&str> = layouts
            .iter()
            .filter(|l| l.cores().iter().any(|c| load.contains(c)))
            .map(|l| l.name.as_str())
            .collect();
        notes.push(format!(
            "only 2 cores: the load generator shares core {} with {}; the CPU it uses there is taken from what it measures, so those layouts are understated (with 3 cores or more it gets one to itself)",
            format_cpu_list(&load),
            shared.join(", ")
        ));
    }
    Plan {
        layouts,
        load,
        notes,
    }
}

/// One layout at one concurrency.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// The layout's id.
    pub layout: String,
    pub concurrency: usize,
    /// Responses per second of each round: median, min and max.
    pub requests_per_sec: Spread,
    /// Half the range of the rounds, in percent of the median: "rounds within ±4%".
    pub rounds_within_pct: f64,
    /// Of the recorded windows of every round; `mean_us` is ab's "time per request".
    pub latency: Latency,
    /// Responses in the recorded windows.
    pub responses: u64,
    pub failures: Errors,
    /// requests/s ÷ direct's at the same concurrency, paired per round; `None` for direct.
    pub vs_direct: Option<f64>,
}

/// The best layout, and by how much.
#[derive(Debug, Clone, Serialize)]
pub struct Recommendation {
    /// The layout's id and name.
    pub layout: String,
    pub name: String,
    pub concurrency: usize,
    pub requests_per_sec: f64,
    /// Against direct at the same concurrency; `None` when the best is direct.
    pub vs_direct: Option<f64>,
    pub rounds_within_pct: f64,
    /// The best cell of any other layout: its name, concurrency and requests/s.
    pub runner_up: Option<(String, usize, f64)>,
    /// Whether the best's slowest round beat the runner-up's fastest: a clear win, not noise.
    pub clear: bool,
    /// Whether cells with failures had to be considered (no cell was free of them).
    pub with_failures: bool,
}

/// The best cell (highest median requests/s among cells without failures, or among all when
/// every cell has some), with its ratio to direct and the runner-up from another layout.
pub fn recommend(layouts: &[Layout], cells: &[Cell]) -> Option<Recommendation> {
    let clean: Vec<&Cell> = cells
        .iter()
        .filter(|c| c.failures.total() == 0 && c.requests_per_sec.median > 0.0)
        .collect();
    let with_failures = clean.is_empty();
    let pool: Vec<&Cell> = if with_failures {
        cells
            .iter()
            .filter(|c| c.requests_per_sec.median > 0.0)
            .collect()
    } else {
        clean
    };
    let by_rate = |a: &&&Cell, b: &&&Cell| {
        a.requests_per_sec
            .median
            .total_cmp(&b.requests_per_sec.median)
    };
    let best = *pool.iter().max_by(by_rate)?;
    let name_of = |id: &str| {
        layouts
            .iter()
            .find(|l| l.id == id)
            .map_or_else(|| id.to_string(), |l| l.name.clone())
    };
    let runner = pool
        .iter()
        .filter(|c| c.layout != best.layout)
        .max_by(by_rate);
    Some(Recommendation {
        layout: best.layout.clone(),
        name: name_of(&best.layout),
        concurrency: best.concurrency,
        requests_per_sec: best.requests_per_sec.median,
        vs_direct: best.vs_direct,
        rounds_within_pct: best.rounds_within_pct,
        runner_up: runner.map(|r| (name_of(&r.layout), r.concurrency, r.requests_per_sec.median)),
        clear: runner.is_none_or(|r| best.requests_per_sec.min > r.requests_per_sec.max),
        with_failures,
    })
}

impl Recommendation {
    /// "best: 1 proxy core + 3 backends, 2,471 req/s at c=1000, 1.9× direct (rounds within
    /// ±4%); runner-up: ...".
    pub fn sentence(&self) -> String {
        let mut s = format!(
            "best: {}, {} req/s at c={}",
            self.name,
            grouped(self.requests_per_sec),
            self.concurrency
        );
        if let Some(r) = self.vs_direct {
            let _ = write!(s, ", {r:.2}× direct");
        }
        let _ = write!(s, " (rounds within ±{:.0}%)", self.rounds_within_pct.ceil());
        if let Some((name, c, rps)) = &self.runner_up {
            let _ = write!(
                s,
                "; runner-up: {name}, {} req/s at c={c}, {:.2}× less",
                grouped(*rps),
                bench::stats::ratio(self.requests_per_sec, *rps).unwrap_or(f64::NAN)
            );
            if !self.clear {
                s.push_str(
                    " — their rounds overlap: a tie within this run's noise, measure longer to split them",
                );
            }
        }
        if self.with_failures {
            s.push_str(" — every cell had failures: see the table");
        }
        s
    }
}

/// Everything a sweep measured, with what it ran.
#[derive(Debug, Clone, Serialize)]
pub struct Sweep {
    /// The command that reproduces this run.
    pub command: String,
    pub pinlb_version: String,
    pub cores: Vec<usize>,
    /// The backend: `--cmd`, or `pinlb backend` with its work per request.
    pub backend: String,
    pub concurrency: Vec<usize>,
    pub duration_s: f64,
    pub warmup_s: f64,
    pub rounds: usize,
    pub plan: Plan,
    pub cells: Vec<Cell>,
    pub recommendation: Option<Recommendation>,
}

/// Runs `pinlb sweep`; see the module documentation.
pub fn main(args: SweepArgs) -> ExitCode {
    match run(&args) {
        Ok(sweep) => {
            if sweep.recommendation.is_some() {
                ExitCode::SUCCESS
            } else {
                eprintln!("pinlb sweep: no layout completed a request: no recommendation");
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("pinlb sweep: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The command line that reproduces a sweep of `args` on `cores`.
pub fn command(args: &SweepArgs, cores: &[usize]) -> String {
    let list: Vec<String> = args.concurrency.iter().map(|c| c.to_string()).collect();
    let mut s = format!(
        "pinlb sweep --cores {} --concurrency {} --duration {} --warmup {} --rounds {}",
        format_cpu_list(cores),
        list.join(","),
        humantime::format_duration(args.duration),
        humantime::format_duration(args.warmup),
        args.rounds
    );
    match &args.cmd {
        Some(cmd) => {
            let _ = write!(s, " --cmd {}", quote(cmd));
        }
        None => {
            let _ = write!(s, " --work {}", humantime::format_duration(args.work));
        }
    }
    if args.path != "/" {
        let _ = write!(s, " --path {}", quote(&args.path));
    }
    let _ = write!(
        s,
        " --timeout {} --out {}",
        humantime::format_duration(args.timeout),
        quote(&args.out.display().to_string())
    );
    s
}

/// `s` quoted for a POSIX shell when it needs it.
fn quote(s: &str) -> String {
    shlex::try_quote(s).map_or_else(|_| s.to_string(), |q| q.into_owned())
}

fn check(args: &SweepArgs) -> Result<Vec<usize>, SweepError> {
    let bad = |s: &str| Err(SweepError::Options(s.to_string()));
    if args.concurrency.is_empty() || args.concurrency.contains(&0) {
        return bad("--concurrency: every value must be at least 1");
    }
    if args.rounds == 0 {
        return bad("--rounds must be at least 1");
    }
    if args.duration.is_zero() || args.timeout.is_zero() {
        return bad("--duration and --timeout must be greater than 0");
    }
    if !args.path.starts_with('/') {
        return bad("--path must start with /");
    }
    if let Some(cmd) = &args.cmd {
        if shlex::split(cmd).is_none_or(|v| v.is_empty()) {
            return bad("--cmd: not a command (empty, or an unclosed quote)");
        }
    }
    let allowed = allowed_cpus().map_err(SweepError::AllowedCpus)?;
    let cores = match &args.cores {
        None => allowed,
        Some(c) => {
            if let Some(x) = c.iter().find(|x| !allowed.contains(x)) {
                return Err(SweepError::Options(format!(
                    "--cores: core {x} is not one this process may run on ({})",
                    format_cpu_list(&allowed)
                )));
            }
            c.clone()
        }
    };
    if cores.is_empty() {
        return bad("no core to run on");
    }
    Ok(cores)
}

fn run(args: &SweepArgs) -> Result<Sweep, SweepError> {
    let cores = check(args)?;
    let plan = plan(&cores);
    let command = command(args, &cores);
    let logs = args.out.join("logs");
    std::fs::create_dir_all(&logs).map_err(|e| SweepError::Write {
        path: logs.clone(),
        reason: e.to_string(),
    })?;
    println!("pinlb sweep: {command}");
    println!(
        "cores {}; load generator on {}",
        format_cpu_list(&cores),
        format_cpu_list(&plan.load)
    );
    for l in &plan.layouts {
        if l.proxy.is_empty() {
            println!("  {}: backend on core {}", l.name, l.backends[0]);
        } else {
            println!(
                "  {}: proxy on {}, backends on {}",
                l.name,
                format_cpu_list(&l.proxy),
                format_cpu_list(&l.backends)
            );
        }
    }
    for n in &plan.notes {
        println!("note: {n}");
    }

    let mut children = Children::default();
    let mut targets = Vec::with_capacity(plan.layouts.len());
    let max_c = args.concurrency.iter().copied().max().unwrap_or(1);
    for layout in &plan.layouts {
        let addr = start_layout(args, layout, &logs, max_c, &mut children)?;
        let url = format!("{}=http://{addr}{}", layout.id, args.path);
        targets.push(
            url.parse::<Target>()
                .map_err(|e| SweepError::Options(e.to_string()))?,
        );
    }

    let mut cells = Vec::new();
    for &c in &args.concurrency {
        println!(
            "\nc={c}: {} layout(s), {} round(s) of {} after {} of warm-up, interleaved",
            targets.len(),
            args.rounds,
            humantime::format_duration(args.duration),
            humantime::format_duration(args.warmup)
        );
        let opts = BenchOptions {
            targets: targets.clone(),
            connections: c,
            threads: plan.load.len().min(c),
            duration: args.duration,
            requests: None,
            request: bench::RequestSpec::default(),
            warmup: args.warmup,
            rounds: args.rounds,
            rate: None,
            websocket: None,
            http2: None,
            cpus: plan.load.clone(),
            timeout: args.timeout,
            trust: bench::Trust::default(),
            progress: true,
        };
        let report = bench::run(&opts).map_err(|source| SweepError::Bench {
            concurrency: c,
            source,
        })?;
        cells.extend(report.targets.iter().map(|t| Cell {
            layout: t.name.clone(),
            concurrency: c,
            requests_per_sec: t.requests_per_sec,
            rounds_within_pct: within_pct(&t.requests_per_sec),
            latency: t.latency,
            responses: t.requests.responses,
            failures: t.requests.errors,
            vs_direct: t.vs_first.as_ref().and_then(|o| o.throughput_ratio),
        }));
    }
    drop(children);

    let recommendation = recommend(&plan.layouts, &cells);
    let sweep = Sweep {
        command,
        pinlb_version: env!("CARGO_PKG_VERSION").to_string(),
        cores,
        backend: match &args.cmd {
            Some(c) => c.clone(),
            None => format!(
                "pinlb backend --work {}",
                humantime::format_duration(args.work)
            ),
        },
        concurrency: args.concurrency.clone(),
        duration_s: args.duration.as_secs_f64(),
        warmup_s: args.warmup.as_secs_f64(),
        rounds: args.rounds,
        plan,
        cells,
        recommendation,
    };
    println!("\n{}", sweep.table());
    match &sweep.recommendation {
        Some(r) => println!("{}", r.sentence()),
        None => println!("no recommendation: no layout completed a request"),
    }
    sweep.write(&args.out)?;
    println!(
        "\nwrote {0}/sweep.md, {0}/sweep.json, {0}/sweep.svg",
        args.out.display()
    );
    println!("reproduce: {}", sweep.command);
    Ok(sweep)
}

/// Half the range of the rounds in percent of their median.
fn within_pct(s: &Spread) -> f64 {
    if s.median > 0.0 {
        (s.max - s.min) / 2.0 / s.median * 100.0
    } else {
        0.0
    }
}

/// The children a sweep started; each is stopped (SIGTERM, then SIGKILL) when this is dropped,
/// however the sweep ends. They are also `child::pinned`: killed by the kernel if pinlb dies.
#[derive(Default)]
struct Children(Vec<Child>);

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
    crate::child::pinned(&mut command, cpus).map_err(|e| fail(e.to_string()))?;
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
fn start_layout(
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

/// 2471.3 as "2,471".
fn grouped(v: f64) -> String {
    let digits = format!("{:.0}", v.max(0.0));
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

fn ms(us: f64) -> String {
    format!("{:.2}", us / 1000.0)
}

impl Sweep {
    fn name(&self, id: &str) -> String {
        self.plan
            .layouts
            .iter()
            .find(|l| l.id == id)
            .map_or_else(|| id.to_string(), |l| l.name.clone())
    }

    /// The table of every layout at every concurrency, as Markdown whose columns line up in a
    /// terminal too.
    pub fn table(&self) -> String {
        let header = [
            "layout",
            "c",
            "req/s",
            "rounds",
            "mean ms",
            "p50 ms",
            "p90 ms",
            "p99 ms",
            "failures",
            "vs direct",
        ];
        let mut rows: Vec<Vec<String>> = Vec::with_capacity(self.cells.len());
        for l in &self.plan.layouts {
            for c in self.cells.iter().filter(|c| c.layout == l.id) {
                rows.push(vec![
                    l.name.clone(),
                    c.concurrency.to_string(),
                    grouped(c.requests_per_sec.median),
                    format!("±{:.1}%", c.rounds_within_pct),
                    ms(c.latency.mean_us),
                    ms(c.latency.p50_us),
                    ms(c.latency.p90_us),
                    ms(c.latency.p99_us),
                    bench::report::errors(&c.failures),
                    c.vs_direct
                        .map_or_else(|| "-".into(), |r| format!("{r:.2}×")),
                ]);
            }
        }
        let widths: Vec<usize> = (0..header.len())
            .map(|i| {
                rows.iter()
                    .map(|r| r[i].chars().count())
                    .chain([header[i].len()])
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: Vec<String>| {
            let padded: Vec<String> = cells
                .iter()
                .zip(&widths)
                .map(|(c, w)| format!("{c:<w$}"))
                .collect();
            format!("| {} |\n", padded.join(" | "))
        };
        let mut s = line(header.iter().map(|h| h.to_string()).collect());
        s.push_str(&line(widths.iter().map(|w| "-".repeat(*w)).collect()));
        for r in rows {
            s.push_str(&line(r));
        }
        s
    }

    /// The Markdown report: how it ran, the layouts, the notes, the table, the recommendation.
    pub fn markdown(&self) -> String {
        let mut s = String::from("# pinlb sweep\n\n");
        let _ = writeln!(s, "```\n{}\n```\n", self.command);
        let _ = writeln!(
            s,
            "pinlb {} · cores {} · load generator on {} · backend: `{}` · {} round(s) of {} s after {} s of warm-up, layouts interleaved\n",
            self.pinlb_version,
            format_cpu_list(&self.cores),
            format_cpu_list(&self.plan.load),
            self.backend,
            self.rounds,
            self.duration_s,
            self.warmup_s
        );
        for l in &self.plan.layouts {
            if l.proxy.is_empty() {
                let _ = writeln!(s, "- {}: backend on core {}", l.name, l.backends[0]);
            } else {
                let _ = writeln!(
                    s,
                    "- {}: proxy on cores {}, backends on cores {}",
                    l.name,
                    format_cpu_list(&l.proxy),
                    format_cpu_list(&l.backends)
                );
            }
        }
        for n in &self.plan.notes {
            let _ = writeln!(s, "\n**Note:** {n}");
        }
        let _ = writeln!(s, "\n{}", self.table());
        match &self.recommendation {
            Some(r) => {
                let _ = writeln!(s, "**{}**", r.sentence());
            }
            None => s.push_str("No recommendation: no layout completed a request.\n"),
        }
        s
    }

    /// Writes sweep.md, sweep.json and sweep.svg into `dir`.
    pub fn write(&self, dir: &Path) -> Result<(), SweepError> {
        let write = |name: &str, bytes: Vec<u8>| {
            let path = dir.join(name);
            std::fs::write(&path, bytes).map_err(|e| SweepError::Write {
                path,
                reason: e.to_string(),
            })
        };
        write("sweep.md", self.markdown().into_bytes())?;
        let json = serde_json::to_vec_pretty(self).map_err(|e| SweepError::Write {
            path: dir.join("sweep.json"),
            reason: e.to_string(),
        })?;
        write("sweep.json", json)?;
        let svg = self.svg().map_err(|reason| SweepError::Write {
            path: dir.join("sweep.svg"),
            reason,
        })?;
        write("sweep.svg", svg.into_bytes())
    }

    /// Requests/s against concurrency, a line per layout; the x axis is logarithmic when the
    /// concurrencies span a decade or more, as sweeps usually do.
    pub fn svg(&self) -> Result<String, String> {
        let lines: Vec<(String, Vec<(f64, f64)>)> = self
            .plan
            .layouts
            .iter()
            .map(|l| {
                let mut pts: Vec<(f64, f64)> = self
                    .cells
                    .iter()
                    .filter(|c| c.layout == l.id)
                    .map(|c| (c.concurrency as f64, c.requests_per_sec.median))
                    .collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                (self.name(&l.id), pts)
            })
            .collect();
        let xs = || lines.iter().flat_map(|(_, p)| p.iter().map(|q| q.0));
        let min_x = xs().fold(f64::INFINITY, f64::min).max(1.0);
        let max_x = xs().fold(0.0f64, f64::max).max(min_x * 1.01);
        let max_y = lines
            .iter()
            .flat_map(|(_, p)| p.iter().map(|q| q.1))
            .fold(0.0f64, f64::max);
        let max_y = if max_y > 0.0 { max_y * 1.1 } else { 1.0 };
        let (lo, hi) = (min_x / 1.2, max_x * 1.2);
        let subtitle = format!(
            "{} round(s) of {} s per cell · load on cores {} · pinlb {} · {}",
            self.rounds,
            self.duration_s,
            format_cpu_list(&self.plan.load),
            self.pinlb_version,
            self.backend
        );
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, (900, 560)).into_drawing_area();
            root.fill(&WHITE).map_err(|e| e.to_string())?;
            let (top, body) = root.split_vertically(48);
            top.draw(&Text::new(
                subtitle,
                (16, 30),
                ("sans-serif", 13).into_font().color(&BLACK.mix(0.75)),
            ))
            .map_err(|e| e.to_string())?;
            let mut builder = ChartBuilder::on(&body);
            builder
                .caption("throughput by concurrency", ("sans-serif", 22))
                .margin(16)
                .margin_right(40)
                .x_label_area_size(44)
                .y_label_area_size(72);
            macro_rules! draw {
                ($chart:expr) => {{
                    let mut chart = $chart;
                    chart
                        .configure_mesh()
                        .x_desc("concurrent connections")
                        .y_desc("requests/s")
                        .max_light_lines(4)
                        .draw()
                        .map_err(|e| e.to_string())?;
                    for (i, (name, pts)) in lines.iter().enumerate() {
                        let color = Palette99::pick(i).to_rgba();
                        chart
                            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
                            .map_err(|e| e.to_string())?;
                        chart
                            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                            .map_err(|e| e.to_string())?
                            .label(name.as_str())
                            .legend(move |(x, y)| {
                                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                            });
                    }
                    chart
                        .configure_series_labels()
                        .position(SeriesLabelPosition::LowerRight)
                        .background_style(WHITE.mix(0.8))
                        .border_style(BLACK)
                        .draw()
                        .map_err(|e| e.to_string())?;
                }};
            }
            if max_x / min_x >= 10.0 {
                draw!(
                    builder
                        .build_cartesian_2d((lo..hi).log_scale(), 0.0..max_y)
                        .map_err(|e| e.to_string())?
                );
            } else {
                draw!(
                    builder
                        .build_cartesian_2d(lo..hi, 0.0..max_y)
                        .map_err(|e| e.to_string())?
                );
            }
            root.present().map_err(|e| e.to_string())?;
        }
        Ok(svg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(p: &Plan) -> Vec<&str> {
        p.layouts.iter().map(|l| l.id.as_str()).collect()
    }

    #[test]
    fn one_core_shares_everything_and_says_so() {
        let p = plan(&[3]);
        assert_eq!(ids(&p), ["direct", "p1b1"]);
        assert_eq!(p.load, [3]);
        assert_eq!(p.layouts[1].proxy, [3]);
        assert_eq!(p.layouts[1].backends, [3]);
        assert!(p.notes[0].contains("all share it"), "{:?}", p.notes);
    }

    #[test]
    fn two_cores_split_between_proxy_and_backend_and_the_load_generator_shares_a_core() {
        let p = plan(&[0, 1]);
        assert_eq!(ids(&p), ["direct", "p1b1"]);
        assert_eq!(p.layouts[0].backends, [0]);
        assert_eq!(
            (&p.layouts[1].proxy[..], &p.layouts[1].backends[..]),
            (&[0][..], &[1][..])
        );
        assert_eq!(p.load, [1]);
        assert_eq!(p.notes.len(), 1);
        assert!(
            p.notes[0].contains("shares core 1 with 1 proxy core + 1 backend")
                && !p.notes[0].contains("direct"),
            "{:?}",
            p.notes
        );
    }

    #[test]
    fn four_cores_give_the_load_generator_one_and_split_the_other_three() {
        let p = plan(&[0, 1, 2, 3]);
        assert_eq!(ids(&p), ["direct", "p1b2", "p2b1"]);
        assert_eq!(p.load, [3]);
        assert!(p.notes.is_empty());
        assert_eq!(p.layouts[1].proxy, [0]);
        assert_eq!(p.layouts[1].backends, [1, 2]);
        assert_eq!(p.layouts[2].proxy, [0, 1]);
        assert_eq!(p.layouts[2].backends, [2]);
        assert_eq!(p.layouts[1].name, "1 proxy core + 2 backends");
        assert_eq!(p.layouts[2].name, "2 proxy cores + 1 backend");
    }

    #[test]
    fn eight_cores_give_the_load_generator_two() {
        let p = plan(&[0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(p.load, [6, 7]);
        assert_eq!(ids(&p), ["direct", "p1b5", "p2b4", "p3b3", "p4b2", "p5b1"]);
        for l in &p.layouts {
            assert!(l.cores().iter().all(|c| *c < 6), "{l:?}");
        }
        assert!(p.notes.is_empty());
    }

    fn cell(layout: &str, c: usize, rps: [f64; 3], failures: u64, vs: Option<f64>) -> Cell {
        let mut sorted = rps;
        sorted.sort_by(f64::total_cmp);
        let spread = Spread {
            median: sorted[1],
            min: sorted[0],
            max: sorted[2],
        };
        Cell {
            layout: layout.into(),
            concurrency: c,
            requests_per_sec: spread,
            rounds_within_pct: within_pct(&spread),
            latency: Latency {
                p50_us: 0.0,
                p90_us: 0.0,
                p99_us: 0.0,
                p999_us: 0.0,
                max_us: 0.0,
                mean_us: 0.0,
            },
            responses: 1,
            failures: Errors {
                timeout: failures,
                ..Errors::default()
            },
            vs_direct: vs,
        }
    }

    #[test]
    fn the_best_clean_cell_is_recommended_with_its_margin_over_direct_and_the_runner_up() {
        let p = plan(&[0, 1, 2, 3]);
        let cells = vec![
            cell("direct", 100, [1000.0, 1040.0, 960.0], 0, None),
            cell("p1b2", 100, [1900.0, 1980.0, 1820.0], 0, Some(1.9)),
            // Faster, but with failures: not a recommendation while clean cells exist.
            cell("p2b1", 100, [3000.0, 3000.0, 3000.0], 5, Some(3.0)),
            cell("p2b1", 10, [1200.0, 1250.0, 1150.0], 0, Some(1.2)),
        ];
        let r = recommend(&p.layouts, &cells).unwrap();
        assert_eq!((r.layout.as_str(), r.concurrency), ("p1b2", 100));
        assert_eq!(r.vs_direct, Some(1.9));
        assert!(
            (r.rounds_within_pct - 4.21).abs() < 0.01,
            "{}",
            r.rounds_within_pct
        );
        assert!(r.clear && !r.with_failures);
        assert_eq!(
            r.runner_up,
            Some(("2 proxy cores + 1 backend".to_string(), 10, 1200.0))
        );
        assert_eq!(
            r.sentence(),
            "best: 1 proxy core + 2 backends, 1,900 req/s at c=100, 1.90× direct (rounds within ±5%); runner-up: 2 proxy cores + 1 backend, 1,200 req/s at c=10, 1.58× less"
        );
    }

    #[test]
    fn overlapping_rounds_make_a_tie_not_a_win() {
        let p = plan(&[0, 1]);
        let cells = vec![
            cell("direct", 10, [1000.0, 1100.0, 900.0], 0, None),
            cell("p1b1", 10, [1050.0, 1150.0, 950.0], 0, Some(1.05)),
        ];
        let r = recommend(&p.layouts, &cells).unwrap();
        assert_eq!(r.layout, "p1b1");
        assert!(!r.clear);
        assert!(
            r.sentence().contains("a tie within this run's noise"),
            "{}",
            r.sentence()
        );
    }

    #[test]
    fn direct_can_be_the_answer_and_failures_only_count_when_nothing_is_clean() {
        let p = plan(&[0, 1]);
        let cells = vec![
            cell("direct", 10, [2000.0, 2000.0, 2000.0], 0, None),
            cell("p1b1", 10, [1000.0, 1000.0, 1000.0], 0, Some(0.5)),
        ];
        let r = recommend(&p.layouts, &cells).unwrap();
        assert_eq!(r.name, "direct (1 backend)");
        assert_eq!(r.vs_direct, None);
        assert!(!r.sentence().contains("× direct"));

        let cells = vec![
            cell("direct", 10, [2000.0, 2000.0, 2000.0], 3, None),
            cell("p1b1", 10, [1000.0, 1000.0, 1000.0], 1, Some(0.5)),
        ];
        let r = recommend(&p.layouts, &cells).unwrap();
        assert!(r.with_failures);
        assert_eq!(r.layout, "direct");
        assert!(recommend(&p.layouts, &[]).is_none());
    }

    #[test]
    fn numbers_are_grouped_by_thousands() {
        assert_eq!(grouped(2471.4), "2,471");
        assert_eq!(grouped(999.0), "999");
        assert_eq!(grouped(1234567.0), "1,234,567");
        assert_eq!(grouped(0.0), "0");
    }

    #[test]
    fn the_command_line_parses_lists_and_durations() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            sweep: SweepArgs,
        }
        let cli = <Cli as clap::Parser>::try_parse_from([
            "sweep",
            "--cores",
            "0-2,5",
            "--concurrency",
            "100,1000,3000",
            "--duration",
            "30s",
        ])
        .unwrap();
        assert_eq!(cli.sweep.cores, Some(vec![0, 1, 2, 5]));
        assert_eq!(cli.sweep.concurrency, [100, 1000, 3000]);
        assert_eq!(cli.sweep.duration, Duration::from_secs(30));
        let cli = <Cli as clap::Parser>::try_parse_from(["sweep"]).unwrap();
        assert_eq!(cli.sweep.concurrency, [10, 100]);
        assert_eq!(cli.sweep.cores, None);
    }

    #[test]
    fn the_command_reproduces_the_options() {
        let args = SweepArgs {
            cmd: Some("node app.js --port {port}".into()),
            cores: None,
            concurrency: vec![100, 1000],
            duration: Duration::from_secs(30),
            warmup: Duration::from_secs(1),
            rounds: 3,
            work: Duration::from_micros(100),
            path: "/".into(),
            timeout: Duration::from_secs(5),
            out: PathBuf::from("out dir"),
        };
        assert_eq!(
            command(&args, &[0, 1, 2, 3]),
            "pinlb sweep --cores 0-3 --concurrency 100,1000 --duration 30s --warmup 1s --rounds 3 --cmd 'node app.js --port {port}' --timeout 5s --out 'out dir'"
        );
    }

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
        let cores = crate::cpus::allowed_cpus().unwrap();
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

//! `pinlb demo`: what the proxy costs on this machine, in one command with nothing to set up.
//!
//! It reads the cores this process may use and lays out a topology ([`Layout`]: the proxies on
//! the first core, the backends on the second, the load generator on the last, which it has to
//! itself whenever there are two cores or more; what has to share a core is said), prints it as
//! a core map, and starts two backends:
//!
//! - `hello-world`: pinlb's test backend, in this process, answering at once;
//! - `work`: a backend doing the seeds' work per request, their Node.js app
//!   ([`SEEDS_APP`], `benches/overload.sh`'s) when `node` is on PATH, else pinlb's test backend
//!   standing in for it ([`SEEDS_WORK`]; `--work` sets its CPU per request).
//!
//! In front of each it starts pinlb, in this process, with `server_timing` on so that each
//! response says pinlb's own time on it, and nginx when it is on PATH (one worker on the same
//! core, `crate::peers::nginx`'s configuration; a line says how to add it when it is not).
//! For each backend it benches like with like, interleaved: the backend alone (`direct`), then
//! each proxy in front of it. Each target's CPU per request is read per thread (the proxy's
//! worker, the backend's threads, nginx's processes), so a proxy's cost is its own and not the
//! machine's. The conclusion ([`conclusion`]) says what each proxy adds: its CPU per request
//! beside each backend's ("adds X µs: Y% of a backend that spends Z µs"), the throughput kept,
//! pinlb's own time (p50, p99), and which ratio is the proxy's cost and which the shared core's.
//! Before the bench it prints the fairness checks' warnings (`fairness`; `--no-checks`), after
//! the layout's own notes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use crate::backend::{BackendSpec, Backends};
use crate::bench::cpu::{self, Processes};
use crate::bench::{BenchOptions, Report, Target, TargetReport};
use crate::fairness;
use crate::launch::{self, Children};
use crate::peers::{self, Proxy, Spec};
use pinlb::config::Config;
use pinlb::server::Server;
use pinlb::sys::cpus::{allowed_cpus, format_cpu_list};

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Length of each measured run.
    #[arg(short, long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Measured runs per target, interleaved (direct, pinlb, nginx, direct, ...).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// The `work` backend is pinlb's own test backend spending this much CPU per request
    /// ("200us") [default: the seeds' Node.js app when node is on PATH, else pinlb's backend
    /// spending 65us, which with its own HTTP work is what that app costs per request here].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub work: Option<Duration>,
    /// Keep-alive connections the load generator keeps open.
    #[arg(short, long, default_value_t = 32)]
    pub connections: usize,
    /// Write a latency-percentile chart of each backend's targets: FILE.svg for the hello-world,
    /// FILE-work.svg for the other.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Skip the fairness checks warned about before the bench (docs/performance.md): a debug
    /// build, a proxy without keep-alive, SMT siblings, the frequency governor, local ports, a
    /// core already busy.
    #[arg(long)]
    pub no_checks: bool,
}

/// The seeds' app: Node.js's `http.createServer` with their busy loop in the handler, the same
/// file `benches/overload.sh` runs. About 82 µs of CPU per request on the 2-core VM pinlb is
/// measured on (Node.js 20: `pinlb bench` of it alone, 32 connections), of which the loop is 50.
const SEEDS_APP: &str = include_str!("../../benches/peers/overload/node-busy.js");

/// What `pinlb backend` spends per request standing in for [`SEEDS_APP`] when `node` is not on
/// PATH: with its own HTTP work (about 6 µs, more when it is woken per request), about what the
/// app costs.
pub const SEEDS_WORK: Duration = Duration::from_micros(65);

/// Requests sent to the seeds' app before the bench, one connection each.
const WARM_UP_REQUESTS: usize = 500;

/// Which cores do what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The proxies' core in front of the hello-world backend.
    pub proxy: usize,
    /// The proxies' core in front of the work backend: the hello-world's, unless the machine is
    /// too small to give the proxies a core apart from the backends (2 cores), where they run
    /// beside the load generator instead, so that the work backend has its core to itself.
    pub work_proxy: usize,
    /// The backends' core.
    pub backend: usize,
    /// The load generator's cores.
    pub load: Vec<usize>,
    /// What had to share a core, for the user; empty when nothing shares.
    pub notes: Vec<String>,
}

impl Layout {
    /// Lays out a run on `cores`: the proxies get the first core, the load generator the last,
    /// the backends the second. On 2 cores the load generator keeps a core to itself; the
    /// hello-world backend shares the proxies' core, and the work backend gets that core alone
    /// while the proxies in front of it share the load generator's. On one core everything
    /// shares it.
    pub fn plan(cores: &[usize]) -> Layout {
        let proxy = cores[0];
        let mut notes = Vec::new();
        let (backend, work_proxy, load) = match cores.len() {
            1 => {
                notes.push(format!(
                    "only core {proxy} is available: the proxies, the backends and the load generator all share it, so the numbers show contention more than overhead"
                ));
                (proxy, proxy, vec![proxy])
            }
            // The load generator keeps a core of its own against the hello-world: sharing one
            // with the backend would slow the direct runs and not the proxied ones' proxy, which
            // flatters the proxy. The work backend leaves it room.
            2 => {
                let load = cores[1];
                notes.push(format!(
                    "only 2 cores: against the hello-world the load generator has core {load} to itself and the proxies share core {proxy} with the backend, so a proxy's cost shows as time taken from the backend; against the work backend the backend has core {proxy} to itself and the proxies share core {load} with the load generator"
                ));
                (proxy, load, vec![load])
            }
            n => (cores[1], proxy, vec![cores[n - 1]]),
        };
        Layout {
            proxy,
            work_proxy,
            backend,
            load,
            notes,
        }
    }

    /// Whether the proxies and the backend take turns on one core against the hello-world.
    pub fn shared(&self) -> bool {
        self.proxy == self.backend
    }

    /// Where the proxies and the backends run, for the fairness checks: one group, since they
    /// all run at once.
    pub fn placement(&self) -> fairness::Placement {
        let role = |name: &str, kind, core| fairness::Role {
            name: name.into(),
            kind,
            cores: vec![core],
            group: String::new(),
        };
        let mut roles = vec![
            role("the proxies", fairness::Kind::Proxy, self.proxy),
            role("the backends", fairness::Kind::Backend, self.backend),
        ];
        if self.work_proxy != self.proxy {
            roles.push(role(
                "the work backend's proxies",
                fairness::Kind::Proxy,
                self.work_proxy,
            ));
        }
        fairness::Placement {
            load: self.load.clone(),
            roles,
        }
    }

    /// The layout as a per-core map: `on[core]` says what runs on each core besides the load
    /// generator.
    pub fn render(&self, on: &[(usize, String)]) -> String {
        let mut cores: Vec<usize> = on.iter().map(|(c, _)| *c).collect();
        cores.extend(&self.load);
        cores.sort_unstable();
        cores.dedup();
        let mut s = String::from("core map:\n");
        for core in cores {
            let mut here: Vec<&str> = on
                .iter()
                .filter(|(c, _)| *c == core)
                .map(|(_, what)| what.as_str())
                .collect();
            if self.load.contains(&core) {
                here.push("load generator");
            }
            s.push_str(&format!("  core {core}: {}\n", here.join(", ")));
        }
        s
    }
}

/// Runs the demo; see the module documentation.
pub fn main(args: DemoArgs) -> ExitCode {
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pinlb demo: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A backend of the demo, and the threads its CPU is read from.
struct Backend {
    addr: SocketAddr,
    tasks: Vec<u32>,
    /// What it is, for the user.
    said: String,
    /// Stops it when dropped.
    running: Running,
}

enum Running {
    InProcess(Backends),
    Child(Children),
}

impl Backend {
    /// Stops it: joins its threads, or stops its process.
    fn stop(self) {
        match self.running {
            Running::InProcess(b) => b.stop(),
            Running::Child(c) => drop(c),
        }
    }

    /// pinlb's test backend in this process on `core`, spending `work` per request.
    fn in_process(core: usize, work: Duration, said: String) -> Result<Backend, String> {
        let b = Backends::start(&BackendSpec {
            listen: vec![SocketAddr::from(([127, 0, 0, 1], 0))],
            cpus: vec![core],
            work,
            ..BackendSpec::default()
        })
        .map_err(|e| format!("cannot start a backend: {e}"))?;
        Ok(Backend {
            addr: b.addrs()[0],
            tasks: b.tids().to_vec(),
            said,
            running: Running::InProcess(b),
        })
    }

    /// The seeds' Node.js app on `core`, run by `node`, its files in `dir`.
    fn seeds_app(node: &Path, core: usize, dir: &Path) -> Result<Backend, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let port = launch::free_port().map_err(|e| e.to_string())?;
        let mut command = Command::new(node);
        command
            .args(["-e", SEEDS_APP])
            .env("PORT", port.to_string());
        let mut children = Children::default();
        let what = format!("the seeds' Node.js app (core {core}, port {port})");
        let log = dir.join("node.log");
        let pid = launch::spawn(&what, command, &[core], &log, &mut children)
            .map_err(|e| e.to_string())?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        launch::wait_ready(&what, addr, "/", &log, &mut children, |s| s == 200)
            .map_err(|e| e.to_string())?;
        // Node's JIT compiles its HTTP path after some requests: warm it up before the first
        // direct round, or that round would measure the compiler.
        for _ in 0..WARM_UP_REQUESTS {
            launch::get_status(addr, "/").map_err(|e| format!("{what}: {e}"))?;
        }
        Ok(Backend {
            addr,
            tasks: cpu::threads_of(pid),
            said: format!(
                "the seeds' Node.js app ({}: http.createServer, for (var i = 0; i < 180000; i++) var j = i / 3; per request)",
                node.display()
            ),
            running: Running::Child(children),
        })
    }

    /// The `work` backend: `--work`'s stand-in, the seeds' app with `node`, the stand-in
    /// without.
    fn work(args: &DemoArgs, core: usize, dir: &Path) -> Result<Backend, String> {
        if let Some(w) = args.work {
            let said = format!(
                "pinlb's test backend spending {} µs per request (--work)",
                w.as_micros()
            );
            return Backend::in_process(core, w, said);
        }
        match peers::on_path("node") {
            Some(node) => Backend::seeds_app(&node, core, &dir.join("node")),
            None => Backend::in_process(
                core,
                SEEDS_WORK,
                format!(
                    "pinlb's test backend spending {} µs per request, standing in for the seeds' Node.js app (node is not on PATH; Debian: apt-get install nodejs)",
                    SEEDS_WORK.as_micros()
                ),
            ),
        }
    }
}

/// pinlb run in this process, pinned to one core, in front of one backend with `server_timing`
/// on, until dropped.
struct Pinlb {
    addr: SocketAddr,
    /// Its worker threads and the thread that runs it.
    tasks: Vec<u32>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<Result<(), pinlb::server::ServerError>>>,
}

impl Pinlb {
    /// Starts it and waits (bounded) for its worker; `n` names its thread (`pinlb-demo0`).
    fn start(n: usize, core: usize, backend: SocketAddr, cores: &[usize]) -> Result<Pinlb, String> {
        let workers = || cpu::threads_named(|name| name.starts_with("pinlb-w"));
        let before = workers();
        let toml = format!(
            "[runtime]\ncpus = [{core}]\nshutdown_timeout = \"2s\"\n\n[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"app\"\nserver_timing = true\n\n[upstream.app]\nbackends = [{{ address = \"{backend}\" }}]\n"
        );
        let config = Config::parse("demo.toml", &toml, cores).map_err(|e| e.to_string())?;
        let server = Server::bind(config).map_err(|e| e.to_string())?;
        let addr = server.local_addrs()[0];
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let name = format!("pinlb-demo{n}");
        let thread = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || {
                server.run(async {
                    let _ = stopped.await;
                })
            })
            .map_err(|e| format!("cannot start the proxy: {e}"))?;
        let mut pinlb = Pinlb {
            addr,
            tasks: Vec::new(),
            stop: Some(stop),
            thread: Some(thread),
        };
        // Bounded: 200 passes of 10 ms.
        for _ in 0..200 {
            let new: Vec<u32> = workers()
                .into_iter()
                .filter(|t| !before.contains(t))
                .collect();
            if !new.is_empty() {
                pinlb.tasks = new;
                pinlb.tasks.extend(cpu::threads_named(|t| t == name));
                return Ok(pinlb);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err("the proxy's worker did not start within 2 s".into())
    }

    /// Stops it and says how it ended.
    fn stop(mut self) -> Result<(), String> {
        self.halt()
    }

    /// Tells the server to stop and joins its thread, once: then there is nothing left to
    /// stop.
    fn halt(&mut self) -> Result<(), String> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match self.thread.take().map(std::thread::JoinHandle::join) {
            Some(Ok(Err(e))) => Err(format!("the proxy stopped with an error: {e}")),
            Some(Err(_)) => Err("the proxy thread panicked".into()),
            _ => Ok(()),
        }
    }
}

impl Drop for Pinlb {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

/// One backend and the proxies in front of it.
struct Scenario {
    /// "hello-world", "work".
    name: &'static str,
    backend: Backend,
    pinlb: Pinlb,
    /// nginx's address and threads, when it runs.
    nginx: Option<(SocketAddr, Vec<u32>)>,
}

impl Scenario {
    fn targets(&self) -> Result<Vec<Target>, String> {
        let target = |name: &str, addr: SocketAddr| -> Result<Target, String> {
            format!("{name}=http://{addr}/")
                .parse()
                .map_err(|e| format!("{e}"))
        };
        let mut t = vec![
            target("direct", self.backend.addr)?,
            target("pinlb", self.pinlb.addr)?,
        ];
        if let Some((addr, _)) = &self.nginx {
            t.push(target("nginx", *addr)?);
        }
        Ok(t)
    }

    /// What each target's CPU is read from: the threads of each side.
    fn processes(&self) -> Vec<Processes> {
        let backend = self.backend.tasks.clone();
        let tasks = |server: Vec<u32>, backends: Vec<Vec<u32>>| Processes {
            server,
            backends,
            status: None,
            tasks: true,
        };
        let mut p = vec![
            tasks(backend.clone(), Vec::new()),
            tasks(self.pinlb.tasks.clone(), vec![backend.clone()]),
        ];
        if let Some((_, nginx)) = &self.nginx {
            p.push(tasks(nginx.clone(), vec![backend]));
        }
        p
    }

    fn probed(&self) -> Vec<fairness::Target> {
        let checked = |name: &str, addr: SocketAddr, proxied: bool| fairness::Target {
            name: format!("{} {name}", self.name),
            addr,
            host: addr.to_string(),
            path: "/".into(),
            plain_http: true,
            proxied: Some(proxied),
        };
        let mut t = vec![
            checked("direct", self.backend.addr, false),
            checked("pinlb", self.pinlb.addr, true),
        ];
        if let Some((addr, _)) = &self.nginx {
            t.push(checked("nginx", *addr, true));
        }
        t
    }
}

/// Starts nginx pinned to `core` in front of `backend` in `dir`; its address and threads.
fn start_nginx(
    found: &peers::Found,
    core: usize,
    backend: SocketAddr,
    dir: &Path,
    children: &mut Children,
) -> Result<(SocketAddr, Vec<u32>), String> {
    let port = launch::free_port().map_err(|e| e.to_string())?;
    let spec = Spec {
        cores: &[core],
        port,
        backends: &[backend],
        max_connections: 1024,
        dir,
        admin: None,
    };
    let command = found.command(&spec).map_err(|e| e.to_string())?;
    let what = format!("nginx (core {core}, port {port})");
    let log = dir.join("stdout.log");
    let pid = launch::spawn(&what, command, &[core], &log, children).map_err(|e| e.to_string())?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    launch::wait_ready(&what, addr, "/", &log, children, |s| s < 500).map_err(|e| e.to_string())?;
    Ok((addr, cpu::threads_of(pid)))
}

fn run(args: &DemoArgs) -> Result<(), String> {
    let cores = allowed_cpus().map_err(|e| format!("cannot read the allowed cores: {e}"))?;
    if cores.is_empty() {
        return Err("no core is allowed for this process".into());
    }
    let layout = Layout::plan(&cores);
    println!(
        "pinlb demo: {} core(s) allowed ({})",
        cores.len(),
        format_cpu_list(&cores)
    );
    let dir = std::env::temp_dir().join(format!("pinlb-demo-{}", std::process::id()));
    let result = with_dir(args, &layout, &cores, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    result
}

/// The demo, its files (nginx's, Node.js's log) in `dir`.
fn with_dir(args: &DemoArgs, layout: &Layout, cores: &[usize], dir: &Path) -> Result<(), String> {
    let hello = Backend::in_process(
        layout.backend,
        Duration::ZERO,
        "pinlb's test backend answering at once".into(),
    )?;
    let work = Backend::work(args, layout.backend, dir)?;
    let (found, skipped) = peers::available(&[Proxy::Nginx]);
    let mut children = Children::default();
    let mut scenarios = Vec::new();
    for (n, (name, backend, core)) in [
        ("hello-world", hello, layout.proxy),
        ("work", work, layout.work_proxy),
    ]
    .into_iter()
    .enumerate()
    {
        let pinlb = Pinlb::start(n, core, backend.addr, cores)?;
        let nginx = match found.first() {
            Some(f) => Some(start_nginx(
                f,
                core,
                backend.addr,
                &dir.join(name),
                &mut children,
            )?),
            None => None,
        };
        scenarios.push(Scenario {
            name,
            backend,
            pinlb,
            nginx,
        });
    }

    let mut on = Vec::new();
    for (s, core) in scenarios.iter().zip([layout.proxy, layout.work_proxy]) {
        on.push((core, format!("pinlb {}", s.pinlb.addr)));
        if let Some((addr, _)) = &s.nginx {
            on.push((core, format!("nginx {addr}")));
        }
        on.push((
            layout.backend,
            format!("{} backend {}", s.name, s.backend.addr),
        ));
    }
    on.sort_by_key(|(core, _)| *core);
    print!("{}", layout.render(&on));
    for n in &layout.notes {
        println!("note: {n}");
    }
    for s in &skipped {
        println!("note: no nginx row: {s}");
    }
    for s in &scenarios {
        println!("{} backend: {}", s.name, s.backend.said);
    }
    let warmup = (args.duration / 4).min(Duration::from_secs(1));
    if !args.no_checks {
        let load = fairness::Load {
            connections: args.connections,
            keep_alive: true,
            rate: None,
            run: warmup + args.duration,
        };
        let probed: Vec<fairness::Target> = scenarios.iter().flat_map(Scenario::probed).collect();
        let placement = layout.placement();
        for w in fairness::check(&probed, &load, &layout.load, Some(&placement), true) {
            println!("warning: {w}");
        }
    }
    println!(
        "\nbench: for each backend, direct = the backend alone, then each proxy in front of it; {} connections, {} interleaved round(s) of {:?} after {:?} of warm-up; CPU per request read per thread\n",
        args.connections, args.rounds, args.duration, warmup
    );
    let mut reports = Vec::new();
    for s in &scenarios {
        let opts = BenchOptions {
            targets: s.targets()?,
            connections: args.connections,
            threads: layout.load.len(),
            duration: args.duration,
            requests: None,
            request: crate::bench::RequestSpec::default(),
            warmup,
            rounds: args.rounds.max(1),
            rate: None,
            websocket: None,
            http2: None,
            cpus: layout.load.clone(),
            timeout: Duration::from_secs(2),
            trust: crate::bench::Trust::default(),
            start_at: None,
            progress: true,
        };
        let report = crate::bench::run_metered(&opts, &s.processes())
            .map_err(|e| format!("bench failed: {e}"))?;
        println!("{} backend:\n{}", s.name, table(&report));
        if let Some(f) = report.failures().first() {
            return Err(f.clone());
        }
        reports.push(report);
    }
    drop(children);
    let mut stopped = Ok(());
    for s in scenarios {
        stopped = stopped.and(s.pinlb.stop());
        s.backend.stop();
    }
    stopped?;
    print!("{}", conclusion(layout, &reports[0], &reports[1]));
    if let Some(path) = &args.plot {
        let work_path = path.with_file_name(format!(
            "{}-work.svg",
            path.file_stem().unwrap_or_default().to_string_lossy()
        ));
        for (report, path) in reports.iter().zip([path.clone(), work_path]) {
            report
                .write_svg(&path)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            println!("latency chart: {}", path.display());
        }
    }
    Ok(())
}

/// A percentage, to a tenth below 10%.
fn percent(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.1}%")
    } else {
        format!("{v:.0}%")
    }
}

/// µs, to a tenth below 100.
fn us(v: f64) -> String {
    if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

fn cpu_of(t: &TargetReport) -> (Option<f64>, Option<f64>) {
    match &t.cpu {
        Some(c) => (
            c.server_us_per_request,
            c.backends_us_per_request.first().copied().flatten(),
        ),
        None => (None, None),
    }
}

/// The CPU of a proxy per request and its backend's; for `direct`, the backend's is the
/// server's.
fn proxy_and_backend(t: &TargetReport, direct: bool) -> (Option<f64>, Option<f64>) {
    let (server, backend) = cpu_of(t);
    if direct {
        (None, server)
    } else {
        (server, backend)
    }
}

/// One backend's targets side by side: throughput, latency, each side's CPU, pinlb's own time.
pub fn table(r: &Report) -> String {
    let mut out = String::from(
        "| target | req/s | × direct | p50 µs | p99 µs | proxy CPU µs/req | backend CPU µs/req | proxy's own time p50 / p99 µs | errors |\n|---|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    let opt = |v: Option<f64>| v.map_or_else(|| "–".to_string(), us);
    for (i, t) in r.targets.iter().enumerate() {
        let (proxy, backend) = proxy_and_backend(t, i == 0);
        let ratio = t
            .vs_first
            .as_ref()
            .and_then(|o| o.throughput_ratio)
            .map_or_else(|| "–".into(), |x| format!("{x:.2}×"));
        let own = match (&t.pinlb_time, i) {
            (Some(p), _) => format!("{:.0} / {:.0}", p.p50_us, p.p99_us),
            (None, 0) => "–".into(),
            (None, _) => "not reported".into(),
        };
        out.push_str(&format!(
            "| {} | {:.0} | {ratio} | {} | {} | {} | {} | {own} | {} |\n",
            t.name,
            t.requests_per_sec.median,
            us(t.latency.p50_us),
            us(t.latency.p99_us),
            opt(proxy),
            opt(backend),
            crate::bench::report::errors(&t.requests.errors),
        ));
    }
    out
}

/// What the proxies add, said in numbers: each one's CPU per request beside each backend's, the
/// throughput it keeps, its own time, and which ratio is the proxy's cost and which the
/// machine's.
pub fn conclusion(layout: &Layout, hello: &Report, work: &Report) -> String {
    let mut out = String::from("\nwhat the proxy costs:\n");
    for name in ["pinlb", "nginx"] {
        for (backend, r) in [("work", work), ("hello-world", hello)] {
            let (Some(direct), Some(t)) = (
                r.targets.first(),
                r.targets.iter().skip(1).find(|t| t.name == name),
            ) else {
                continue;
            };
            let (Some(x), Some(z)) = (cpu_of(t).0, cpu_of(direct).0) else {
                continue;
            };
            let ratio = t
                .vs_first
                .as_ref()
                .and_then(|o| o.throughput_ratio)
                .map_or_else(|| "n/a".into(), |x| format!("{x:.2}×"));
            out.push_str(&format!(
                "- {name} adds {} µs of CPU per request: {} of a backend that spends {} µs per request ({backend}); proxied throughput {ratio} direct.\n",
                us(x),
                percent(100.0 * x / z),
                us(z),
            ));
        }
        let own: Vec<String> = [("work", work), ("hello-world", hello)]
            .iter()
            .filter_map(|(backend, r)| {
                let t = r.targets.iter().skip(1).find(|t| t.name == name)?;
                let p = t.pinlb_time.as_ref()?;
                Some(format!(
                    "p50 {:.0} µs, p99 {:.0} µs ({backend})",
                    p.p50_us, p.p99_us
                ))
            })
            .collect();
        if !own.is_empty() {
            out.push_str(&format!(
                "- {name}'s own time per request (Server-Timing): {}.\n",
                own.join("; ")
            ));
        }
    }
    out.push_str(&which_is_which(layout));
    if hello.targets.iter().any(|t| t.name == "nginx") {
        out.push_str("nginx reports no time of its own per request (its $upstream_* times are whole milliseconds).\n");
    }
    out
}

/// Which throughput ratio is the proxy's cost and which the machine's, for this layout.
pub fn which_is_which(layout: &Layout) -> String {
    let (p, b, w) = (layout.proxy, layout.backend, layout.work_proxy);
    if layout.load.contains(&p) {
        return format!(
            "Everything ran on core {p}: each ratio is that core shared three ways, and only the CPU per request is the proxy's cost.\n"
        );
    }
    if layout.shared() {
        return format!(
            "Which figure is which: behind the hello-world the proxies shared core {p} with a backend whose requests cost less than theirs, so that ratio is the shared core's, not the proxy's cost. Behind the work backend the backend had core {b} to itself and the proxies ran on core {w} beside the load generator: that ratio, and the CPU per request, are the proxy's cost.\n"
        );
    }
    format!(
        "The proxies ran on core {p}, the backends on core {b}: a ratio below 1× means a proxy did not keep up with the backend, and its CPU per request is what it costs.\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_two_core_machine_gives_the_load_generator_a_core_of_its_own_and_the_work_backend_one_too()
    {
        let l = Layout::plan(&[0, 1]);
        assert_eq!(
            (l.proxy, l.work_proxy, l.backend, l.load.clone()),
            (0, 1, 0, vec![1])
        );
        assert!(l.shared());
        assert_eq!(l.notes.len(), 1, "{:?}", l.notes);
        assert!(
            l.notes[0].contains("core 1 to itself") && l.notes[0].contains("share core 0"),
            "{:?}",
            l.notes
        );
        let said = which_is_which(&l);
        assert!(
            said.contains("shared core's, not the proxy's cost")
                && said.contains("backend had core 0 to itself"),
            "{said}"
        );
    }

    #[test]
    fn a_large_machine_gives_every_role_its_own_cores() {
        let l = Layout::plan(&[0, 1, 2, 3, 4, 5]);
        assert_eq!(
            (l.proxy, l.work_proxy, l.backend, l.load.clone()),
            (0, 0, 1, vec![5])
        );
        assert!(l.notes.is_empty() && !l.shared());
        assert!(which_is_which(&l).contains("did not keep up"));
        let l = Layout::plan(&[2, 5, 7]);
        assert_eq!((l.proxy, l.backend, l.load), (2, 5, vec![7]));
    }

    #[test]
    fn one_core_runs_everything_and_says_so() {
        let l = Layout::plan(&[3]);
        assert_eq!(
            (l.proxy, l.work_proxy, l.backend, l.load.clone()),
            (3, 3, 3, vec![3])
        );
        assert!(l.notes[0].contains("share it"), "{:?}", l.notes);
        assert!(which_is_which(&l).contains("shared three ways"));
    }

    #[test]
    fn the_fairness_placement_is_the_layout_and_two_cores_keep_the_load_generator_apart() {
        let p = Layout::plan(&[0, 1]).placement();
        assert_eq!(p.load, [1]);
        let roles: Vec<(&str, &[usize])> = p
            .roles
            .iter()
            .map(|r| (r.name.as_str(), &r.cores[..]))
            .collect();
        assert_eq!(
            roles,
            [
                ("the proxies", &[0][..]),
                ("the backends", &[0][..]),
                ("the work backend's proxies", &[1][..])
            ]
        );
    }

    #[test]
    fn the_map_lists_every_role_on_its_core() {
        let l = Layout::plan(&[0, 1]);
        let map = l.render(&[
            (0, "pinlb 127.0.0.1:3".into()),
            (0, "hello-world backend 127.0.0.1:1".into()),
            (1, "pinlb 127.0.0.1:4".into()),
        ]);
        assert_eq!(
            map,
            "core map:\n  core 0: pinlb 127.0.0.1:3, hello-world backend 127.0.0.1:1\n  core 1: pinlb 127.0.0.1:4, load generator\n"
        );
    }
}

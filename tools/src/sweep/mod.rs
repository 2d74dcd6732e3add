//! `pinlb sweep`: "how should I split my cores?" answered in one command.
//!
//! People who run an app as several pinned processes behind a balancer find the best split by
//! hand: one process alone, then a balancer on one core in front of processes on the others,
//! then two balancer cores, each at a few concurrencies, written into a table. `sweep` lays out
//! every such split that fits the cores (`plan`), starts each layout's processes pinned
//! (`child::pinned`), loads all of them through `pinlb bench`'s engine (warm-up, interleaved
//! rounds, HDR percentiles, failures by kind) at every concurrency, and prints the table and a
//! recommendation with its margin; it writes the same as Markdown, JSON and an SVG chart.
//! Before the runs it prints the fairness checks' warnings (`fairness`; `--no-checks`).
//!
//! `--proxy pinlb,nginx,haproxy` puts each of those proxies in front of the same backends in
//! every proxied layout, on configurations equivalent to pinlb's ([`crate::peers`]: the
//! same worker count pinned to the same cores, upstream keep-alive, the same timeouts, no
//! access log), and runs them in the same interleaved rounds; nginx and HAProxy come from
//! PATH, and one that is not there is skipped with a line that says how to install it. Every
//! cell has the CPU per request of the proxy's processes and of each backend process, read
//! from `/proc` over the recorded windows (`bench::cpu`), and a pinlb cell each backend's learned
//! concurrency limit (from its `/status`, `bench::limits`); the report gives the best layout
//! per proxy and whether pinlb beats each peer here, by requests/s and by CPU per request.
//!
//! Every process is a child, the proxy too (`pinlb serve` on a generated configuration), rather
//! than a `Server` on a thread of this process: the load generator's threads and the proxy's
//! workers are then separate processes, each pinned to its own cores by the kernel before it
//! runs, so nothing of the bench runs on (or is accounted to) a proxy core, and a layout is the
//! same processes a user would run by hand.
//!
//! - [`plan`]: which layouts fit the cores, and where the load generator runs.
//! - [`processes`]: each layout's backends and proxies, started pinned and stopped at the end.
//! - [`report`]: the cells, the recommendation and its margin, the best layout per proxy and
//!   pinlb against each peer, and the table, Markdown, JSON and SVG made from them.

mod plan;
mod processes;
mod report;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::bench::{self, BenchError, BenchOptions, Processes, Target};
use crate::fairness;
use crate::launch::{Children, LaunchError};
use crate::peers::{self, Proxy};
use pinlb::sys::cpus::{allowed_cpus, format_cpu_list, parse_cpu_list};

pub use plan::{Layout, Plan, plan};
use processes::{start_backends, start_proxy};
use report::within_pct;
pub use report::{Cell, Recommendation, Sweep, Versus, recommend, versus};

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
    /// Where sweep.md, sweep.json, sweep.svg and the processes' logs (and the proxies'
    /// configurations) go.
    #[arg(long, value_name = "DIR", default_value = "pinlb-sweep")]
    pub out: PathBuf,
    /// Skip the fairness checks warned about before the runs (docs/performance.md): a debug
    /// build of pinlb, a proxy without keep-alive, SMT siblings, the frequency governor, local
    /// ports, a core already busy.
    #[arg(long)]
    pub no_checks: bool,
    /// The proxies to compare: pinlb, nginx, haproxy, comma-separated. Every proxied layout
    /// runs once per proxy, in front of the same backends and in the same interleaved rounds
    /// (direct once), each proxy on a configuration equivalent to pinlb's: a worker per proxy
    /// core pinned to it, upstream keep-alive, pinlb's timeouts, no access log. nginx and
    /// HAProxy are found on PATH; one that is not is skipped with a line saying how to install
    /// it. The run takes about (1 + proxied layouts × proxies) × concurrencies × rounds ×
    /// (duration + warm-up): with the defaults on 2 cores and all three proxies, 4 × 2 × 3 ×
    /// 2.5 s = 60 s, plus starting the processes.
    #[arg(long, value_name = "LIST", value_parser = parse_proxies, default_value = "pinlb")]
    pub proxy: std::vec::Vec<Proxy>,
}

fn parse_cpus(s: &str) -> Result<Vec<usize>, String> {
    parse_cpu_list(s)
}

fn parse_proxies(s: &str) -> Result<Vec<Proxy>, String> {
    Proxy::parse_list(s)
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
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error("bench at c={concurrency}: {source}")]
    Bench {
        concurrency: usize,
        source: BenchError,
    },
    #[error("cannot write {path}: {reason}")]
    Write { path: PathBuf, reason: String },
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
    if args.proxy != [Proxy::Pinlb] {
        let names: Vec<&str> = args.proxy.iter().map(|p| p.as_str()).collect();
        let _ = write!(s, " --proxy {}", names.join(","));
    }
    let _ = write!(
        s,
        " --timeout {} --out {}",
        humantime::format_duration(args.timeout),
        quote(&args.out.display().to_string())
    );
    s
}

/// A bench target named `name` for `addr`.
fn target(name: &str, addr: std::net::SocketAddr, path: &str) -> Result<Target, SweepError> {
    format!("{name}=http://{addr}{path}")
        .parse::<Target>()
        .map_err(|e| SweepError::Options(e.to_string()))
}

/// What the fairness checks are told of one target: direct or proxied.
fn checked_target(
    name: &str,
    addr: std::net::SocketAddr,
    path: &str,
    proxied: bool,
) -> fairness::Target {
    fairness::Target {
        name: name.to_string(),
        addr,
        host: addr.to_string(),
        path: path.to_string(),
        plain_http: true,
        proxied: Some(proxied),
    }
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
    if args.proxy.is_empty() {
        return bad("--proxy: give at least one of pinlb, nginx, haproxy");
    }
    Ok(cores)
}

/// Where a plan's processes run, for the fairness checks: each layout's proxy and backends, a
/// group of their own (layouts run one at a time).
fn placement(plan: &Plan) -> fairness::Placement {
    let mut roles = Vec::new();
    for l in &plan.layouts {
        if !l.proxy.is_empty() {
            roles.push(fairness::Role {
                name: format!("the proxy of {}", l.name),
                kind: fairness::Kind::Proxy,
                cores: l.proxy.clone(),
                group: l.id.clone(),
            });
        }
        for (i, &core) in l.backends.iter().enumerate() {
            roles.push(fairness::Role {
                name: format!("backend {i} of {}", l.name),
                kind: fairness::Kind::Backend,
                cores: vec![core],
                group: l.id.clone(),
            });
        }
    }
    fairness::Placement {
        load: plan.load.clone(),
        roles,
    }
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

    let (found, skipped) = peers::available(&args.proxy);
    for line in &skipped {
        println!("note: {line}");
    }
    if found.is_empty() {
        return Err(SweepError::Options(
            "--proxy: none of the proxies given can run here (see the notes above)".into(),
        ));
    }
    for f in &found {
        println!(
            "proxy {} {} ({})",
            f.proxy.display_name(),
            f.version,
            f.program.display()
        );
    }

    let mut children = Children::default();
    // A target per direct layout and per proxied layout and proxy, in the order of the rounds.
    let mut targets = Vec::new();
    let mut keys: Vec<(String, Option<Proxy>)> = Vec::new();
    let mut metered = Vec::new();
    let mut checked = Vec::new();
    let max_c = args.concurrency.iter().copied().max().unwrap_or(1);
    for layout in &plan.layouts {
        let backends = start_backends(args, layout, &logs, &mut children)?;
        let addrs: Vec<_> = backends.iter().map(|b| b.0).collect();
        let pids: Vec<Vec<u32>> = backends.iter().map(|b| vec![b.1]).collect();
        if layout.proxy.is_empty() {
            targets.push(target(&layout.id, addrs[0], &args.path)?);
            checked.push(checked_target(&layout.id, addrs[0], &args.path, false));
            keys.push((layout.id.clone(), None));
            metered.push(Processes {
                server: pids[0].clone(),
                backends: Vec::new(),
                status: None,
                tasks: false,
            });
            continue;
        }
        for f in &found {
            let (addr, pid, admin) =
                start_proxy(args, layout, f, &addrs, &logs, max_c, &mut children)?;
            let name = format!("{}-{}", layout.id, f.proxy);
            targets.push(target(&name, addr, &args.path)?);
            checked.push(checked_target(&name, addr, &args.path, true));
            keys.push((layout.id.clone(), Some(f.proxy)));
            metered.push(Processes {
                server: vec![pid],
                backends: pids.clone(),
                status: admin,
                tasks: false,
            });
        }
    }

    if !args.no_checks {
        let load = fairness::Load {
            connections: max_c,
            keep_alive: true,
            rate: None,
            run: args.warmup + args.duration,
        };
        let placement = placement(&plan);
        for w in fairness::check(&checked, &load, &plan.load, Some(&placement), true) {
            println!("warning: {w}");
        }
    }

    let mut cells = Vec::new();
    for &c in &args.concurrency {
        println!(
            "\nc={c}: {} target(s), {} round(s) of {} after {} of warm-up, interleaved",
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
            // Each run starts as soon as the previous one ends.
            start_at: None,
        };
        let report = bench::run_metered(&opts, &metered).map_err(|source| SweepError::Bench {
            concurrency: c,
            source,
        })?;
        cells.extend(
            report
                .targets
                .iter()
                .zip(&keys)
                .map(|(t, (layout, proxy))| {
                    let (server, backends) = match &t.cpu {
                        Some(u) => (u.server_us_per_request, u.backends_us_per_request.clone()),
                        None => (None, Vec::new()),
                    };
                    // Direct's server is its backend.
                    let (proxy_cpu, backend_cpu) = match proxy {
                        None => (None, vec![server]),
                        Some(_) => (server, backends),
                    };
                    Cell {
                        layout: layout.clone(),
                        proxy: *proxy,
                        concurrency: c,
                        requests_per_sec: t.requests_per_sec,
                        rounds_within_pct: within_pct(&t.requests_per_sec),
                        latency: t.latency,
                        responses: t.requests.responses,
                        failures: t.requests.errors,
                        vs_direct: t.vs_first.as_ref().and_then(|o| o.throughput_ratio),
                        proxy_cpu_us_per_request: proxy_cpu,
                        backend_cpu_us_per_request: backend_cpu,
                        backend_concurrency_limit: t.backends_concurrency_limit.clone(),
                    }
                }),
        );
    }
    drop(children);

    let several = found.len() > 1;
    let recommendation = recommend(&plan.layouts, &cells, several);
    let best_per_proxy: Vec<Recommendation> = found
        .iter()
        .filter_map(|f| {
            let own: Vec<Cell> = cells
                .iter()
                .filter(|c| c.proxy == Some(f.proxy))
                .cloned()
                .collect();
            recommend(&plan.layouts, &own, false)
        })
        .collect();
    let versus = versus(&plan.layouts, &cells, &best_per_proxy);
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
        proxies: found,
        skipped,
        cells,
        recommendation,
        best_per_proxy,
        versus,
    };
    println!("\n{}", sweep.table());
    for line in sweep.conclusions() {
        println!("{line}");
    }
    sweep.write(&args.out)?;
    println!(
        "\nwrote {0}/sweep.md, {0}/sweep.json, {0}/sweep.svg",
        args.out.display()
    );
    println!("reproduce: {}", sweep.command);
    Ok(sweep)
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(!cli.sweep.no_checks);
        let cli = <Cli as clap::Parser>::try_parse_from(["sweep", "--no-checks"]).unwrap();
        assert!(cli.sweep.no_checks, "the fairness checks turned off");
        let cli = <Cli as clap::Parser>::try_parse_from(["sweep"]).unwrap();
        assert_eq!(cli.sweep.concurrency, [10, 100]);
        assert_eq!(cli.sweep.cores, None);
        assert_eq!(cli.sweep.proxy, [Proxy::Pinlb]);
        let cli =
            <Cli as clap::Parser>::try_parse_from(["sweep", "--proxy", "pinlb,nginx,haproxy"])
                .unwrap();
        assert_eq!(
            cli.sweep.proxy,
            [Proxy::Pinlb, Proxy::Nginx, Proxy::Haproxy]
        );
        assert!(<Cli as clap::Parser>::try_parse_from(["sweep", "--proxy", "envoy"]).is_err());
    }

    #[test]
    fn each_layouts_processes_are_checked_for_fairness_as_a_group_of_their_own() {
        let p = placement(&plan(&[0, 1, 2, 3]));
        assert_eq!(p.load, [3]);
        let group = |g: &str| -> Vec<(String, Vec<usize>)> {
            p.roles
                .iter()
                .filter(|r| r.group == g)
                .map(|r| (r.name.clone(), r.cores.clone()))
                .collect()
        };
        assert_eq!(
            group("direct"),
            [("backend 0 of direct (1 backend)".to_string(), vec![0])]
        );
        let p1b2 = group("p1b2");
        assert_eq!(
            p1b2[0],
            ("the proxy of 1 proxy core + 2 backends".into(), vec![0])
        );
        assert_eq!(
            p1b2[2],
            ("backend 1 of 1 proxy core + 2 backends".into(), vec![2])
        );
        assert!(fairness::load_shares_a_core(&p).is_empty());
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
            no_checks: false,
            proxy: vec![Proxy::Pinlb],
        };
        assert_eq!(
            command(&args, &[0, 1, 2, 3]),
            "pinlb sweep --cores 0-3 --concurrency 100,1000 --duration 30s --warmup 1s --rounds 3 --cmd 'node app.js --port {port}' --timeout 5s --out 'out dir'"
        );
        let args = SweepArgs {
            proxy: vec![Proxy::Pinlb, Proxy::Nginx, Proxy::Haproxy],
            path: "/a b".into(),
            ..args
        };
        assert!(
            command(&args, &[0, 1])
                .contains(" --path '/a b' --proxy pinlb,nginx,haproxy --timeout"),
            "{}",
            command(&args, &[0, 1])
        );
    }
}

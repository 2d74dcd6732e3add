//! `pinlb demo`: the whole story in one command, with nothing to set up.
//!
//! It reads the cores this process may use, lays out a topology (the proxy on the first core,
//! backends on the others, the load generator on the last one, which it has to itself whenever
//! there are two cores or more; what has to share a core is said), prints that layout as a core
//! map, starts the backends and the proxy in this process on loopback ports the kernel picks,
//! and benches like with like: backend 0 direct, then pinlb in front of that same backend 0
//! alone. With more than one backend a third target, pinlb balancing over all of them, is
//! measured too and labelled as what it is: not the same backends as direct. Before the bench
//! it prints the fairness checks' warnings (`fairness`; `--no-checks`), after the
//! layout's own notes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use crate::backend::{BackendSpec, Backends};
use crate::bench::{BenchOptions, Target};
use crate::fairness;
use pinlb::config::Config;
use pinlb::server::Server;
use pinlb::sys::cpus::{allowed_cpus, format_cpu_list};

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Length of each measured run.
    #[arg(short, long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Measured runs per target, interleaved (direct, proxied, direct, ...).
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Number of backends (default: one per core left for backends, at least two).
    #[arg(long)]
    pub backends: Option<usize>,
    /// CPU each backend burns per request, like a business loop ("200us").
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pub work: Duration,
    /// Keep-alive connections the load generator keeps open.
    #[arg(short, long, default_value_t = 32)]
    pub connections: usize,
    /// Write a latency-percentile chart of both targets to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Skip the fairness checks warned about before the bench (docs/performance.md): a debug
    /// build, a proxy without keep-alive, SMT siblings, the frequency governor, local ports, a
    /// core already busy.
    #[arg(long)]
    pub no_checks: bool,
}

/// Which cores do what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub proxy: usize,
    /// The core of each backend.
    pub backends: Vec<usize>,
    /// The load generator's cores.
    pub load: Vec<usize>,
    /// What had to share a core, for the user; empty when nothing shares.
    pub notes: Vec<String>,
}

impl Layout {
    /// Lays out `backends` backends (default: one per spare core, at least two) on `cores`:
    /// the proxy gets the first core, the load generator the last, backends the ones between.
    /// On a small machine the load generator shares the backends' cores, and on one core
    /// everything shares it.
    pub fn plan(cores: &[usize], backends: Option<usize>) -> Layout {
        let proxy = cores[0];
        let mut notes = Vec::new();
        let (backend_cores, load): (Vec<usize>, Vec<usize>) = match cores.len() {
            1 => {
                notes.push(format!(
                    "only core {proxy} is available: the proxy, the backends and the load generator all share it, so the numbers show contention more than overhead"
                ));
                (vec![proxy], vec![proxy])
            }
            // The load generator keeps a core of its own: sharing one with the backends would
            // slow the direct runs and not the proxied ones' proxy, which flatters the proxy.
            2 => {
                notes.push(format!(
                    "only 2 cores: the load generator has core {} to itself, the proxy and the backends share core {proxy}, so the proxy's cost shows as time taken from the backends",
                    cores[1]
                ));
                (vec![proxy], vec![cores[1]])
            }
            n => (cores[1..n - 1].to_vec(), vec![cores[n - 1]]),
        };
        let count = backends.unwrap_or(backend_cores.len().max(2)).max(1);
        if count > backend_cores.len() && cores.len() > 2 {
            notes.push(format!(
                "{count} backends on {} core(s): backends share cores {}",
                backend_cores.len(),
                format_cpu_list(&backend_cores)
            ));
        }
        let backends = (0..count)
            .map(|i| backend_cores[i % backend_cores.len()])
            .collect();
        Layout {
            proxy,
            backends,
            load,
            notes,
        }
    }

    /// Where the proxy and the backends run, for the fairness checks: one group, since they
    /// all run at once.
    pub fn placement(&self) -> fairness::Placement {
        let mut roles = vec![fairness::Role {
            name: "the proxy".into(),
            kind: fairness::Kind::Proxy,
            cores: vec![self.proxy],
            group: String::new(),
        }];
        for (i, &core) in self.backends.iter().enumerate() {
            roles.push(fairness::Role {
                name: format!("backend {i}"),
                kind: fairness::Kind::Backend,
                cores: vec![core],
                group: String::new(),
            });
        }
        fairness::Placement {
            load: self.load.clone(),
            roles,
        }
    }

    /// The layout as a per-core map.
    pub fn render(&self, addrs: &[SocketAddr], proxy: SocketAddr) -> String {
        let mut cores: Vec<usize> = self.backends.clone();
        cores.push(self.proxy);
        cores.extend(&self.load);
        cores.sort_unstable();
        cores.dedup();
        let mut s = String::from("core map:\n");
        for core in cores {
            let mut on = Vec::new();
            if core == self.proxy {
                on.push(format!("pinlb proxy {proxy}"));
            }
            for (i, (c, a)) in self.backends.iter().zip(addrs).enumerate() {
                if *c == core {
                    on.push(format!("backend {i} {a}"));
                }
            }
            if self.load.contains(&core) {
                on.push("load generator".into());
            }
            s.push_str(&format!("  core {core}: {}\n", on.join(", ")));
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

/// One of the demo's targets, as the fairness checks probe it.
fn checked(name: &str, addr: SocketAddr, proxied: bool) -> fairness::Target {
    fairness::Target {
        name: name.into(),
        addr,
        host: addr.to_string(),
        path: "/".into(),
        plain_http: true,
        proxied: Some(proxied),
    }
}

fn run(args: &DemoArgs) -> Result<(), String> {
    let cores = allowed_cpus().map_err(|e| format!("cannot read the allowed cores: {e}"))?;
    if cores.is_empty() {
        return Err("no core is allowed for this process".into());
    }
    let layout = Layout::plan(&cores, args.backends);
    println!(
        "pinlb demo: {} core(s) allowed ({})",
        cores.len(),
        format_cpu_list(&cores)
    );

    let spec = BackendSpec {
        listen: vec!["127.0.0.1:0".parse().map_err(|e| format!("{e}"))?; layout.backends.len()],
        cpus: layout.backends.clone(),
        work: args.work,
        ..BackendSpec::default()
    };
    let backends = Backends::start(&spec).map_err(|e| format!("cannot start backends: {e}"))?;

    let list: String = backends
        .addrs()
        .iter()
        .map(|a| format!("{{ address = \"{a}\" }}, "))
        .collect();
    // Listener 0 fronts backend 0 alone (like with like against direct); listener 1 balances
    // over every backend.
    let toml = format!(
        "[runtime]\ncpus = [{}]\nshutdown_timeout = \"2s\"\n\n[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"one\"\n\n[[listener]]\naddress = \"127.0.0.1:0\"\nupstream = \"all\"\n\n[upstream.one]\nbackends = [{{ address = \"{}\" }}]\n\n[upstream.all]\nbackends = [{list}]\n",
        layout.proxy,
        backends.addrs()[0]
    );
    let config = Config::parse("demo.toml", &toml, &cores).map_err(|e| e.to_string())?;
    let server = Server::bind(config).map_err(|e| e.to_string())?;
    let (proxy, balanced) = (server.local_addrs()[0], server.local_addrs()[1]);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let proxy_thread = std::thread::Builder::new()
        .name("pinlb-demo-proxy".into())
        .spawn(move || {
            server.run(async {
                let _ = stopped.await;
            })
        })
        .map_err(|e| format!("cannot start the proxy: {e}"))?;

    print!("{}", layout.render(backends.addrs(), proxy));
    for n in &layout.notes {
        println!("note: {n}");
    }
    let direct = backends.addrs()[0];
    let n = layout.backends.len();
    let warmup = (args.duration / 4).min(Duration::from_secs(1));
    if !args.no_checks {
        let load = fairness::Load {
            connections: args.connections,
            keep_alive: true,
            rate: None,
            run: warmup + args.duration,
        };
        let mut probed = vec![
            checked("direct", direct, false),
            checked("proxied", proxy, true),
        ];
        if n > 1 {
            probed.push(checked("balanced", balanced, true));
        }
        let placement = layout.placement();
        for w in fairness::check(&probed, &load, &layout.load, Some(&placement), true) {
            println!("warning: {w}");
        }
    }
    let mut plan =
        "direct = backend 0 alone, proxied = pinlb in front of that same backend 0".to_string();
    if n > 1 {
        plan.push_str(&format!(
            "; balanced = pinlb over all {n} backends (more backends than direct: not like with like, shown for scale)"
        ));
    }
    println!(
        "\nbench: {plan}; {} connections, {} round(s) of {:?} each, interleaved\n",
        args.connections, args.rounds, args.duration
    );
    let target = |name: &str, addr: SocketAddr| -> Result<Target, String> {
        format!("{name}=http://{addr}/")
            .parse()
            .map_err(|e| format!("{e}"))
    };
    let mut targets = vec![target("direct", direct)?, target("proxied", proxy)?];
    if n > 1 {
        targets.push(target("balanced", balanced)?);
    }
    let opts = BenchOptions {
        targets,
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
    let result = crate::bench::run(&opts);

    let _ = stop.send(());
    let joined = proxy_thread.join();
    backends.stop();
    let report = result.map_err(|e| format!("bench failed: {e}"))?;
    print!("{}", report.table());
    if let Some(path) = &args.plot {
        report
            .write_svg(path)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        println!("latency chart: {}", path.display());
    }
    match joined {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(format!("the proxy stopped with an error: {e}")),
        Err(_) => Err("the proxy thread panicked".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_two_core_machine_gives_the_load_generator_a_core_of_its_own_and_says_so() {
        let l = Layout::plan(&[0, 1], None);
        assert_eq!(l.proxy, 0);
        assert_eq!(l.backends, vec![0, 0]);
        assert_eq!(l.load, vec![1]);
        assert_eq!(l.notes.len(), 1, "{:?}", l.notes);
        assert!(
            l.notes[0].contains("core 1 to itself") && l.notes[0].contains("share core 0"),
            "{:?}",
            l.notes
        );
    }

    #[test]
    fn a_large_machine_gives_every_role_its_own_cores() {
        let l = Layout::plan(&[0, 1, 2, 3, 4, 5], None);
        assert_eq!(l.proxy, 0);
        assert_eq!(l.backends, vec![1, 2, 3, 4]);
        assert_eq!(l.load, vec![5]);
        assert!(l.notes.is_empty());
        let l = Layout::plan(&[2, 5, 7], Some(3));
        assert_eq!((l.proxy, l.backends, l.load), (2, vec![5, 5, 5], vec![7]));
    }

    #[test]
    fn one_core_runs_everything_and_says_so() {
        let l = Layout::plan(&[3], Some(2));
        assert_eq!(
            (l.proxy, l.backends.clone(), l.load.clone()),
            (3, vec![3, 3], vec![3])
        );
        assert!(l.notes[0].contains("share it"), "{:?}", l.notes);
    }

    #[test]
    fn the_fairness_placement_is_the_layout_and_two_cores_keep_the_load_generator_apart() {
        let p = Layout::plan(&[0, 1], None).placement();
        assert_eq!(p.load, [1]);
        let roles: Vec<(&str, &[usize])> = p
            .roles
            .iter()
            .map(|r| (r.name.as_str(), &r.cores[..]))
            .collect();
        assert_eq!(
            roles,
            [
                ("the proxy", &[0][..]),
                ("backend 0", &[0][..]),
                ("backend 1", &[0][..])
            ]
        );
        assert!(fairness::load_shares_a_core(&p).is_empty());
    }

    #[test]
    fn the_map_lists_every_role_on_its_core() {
        let l = Layout::plan(&[0, 1], None);
        let addrs: Vec<SocketAddr> = vec![
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
        ];
        let map = l.render(&addrs, "127.0.0.1:3".parse().unwrap());
        assert_eq!(
            map,
            "core map:\n  core 0: pinlb proxy 127.0.0.1:3, backend 0 127.0.0.1:1, backend 1 127.0.0.1:2\n  core 1: load generator\n"
        );
    }
}

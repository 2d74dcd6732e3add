//! The `pinlb` command: argument parsing only; the work is in the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pinlb::server::{Hangups, Signals};
use pinlb::{Config, Server};
use tracing_subscriber::EnvFilter;

/// What `--version` prints after the name: a debug build says so, because `pinlb bench`'s
/// fairness checks ask a target's binary (`/proc/PID/exe --version`) whether it is one.
const VERSION: &str = if cfg!(debug_assertions) {
    concat!(env!("CARGO_PKG_VERSION"), " (debug build)")
} else {
    env!("CARGO_PKG_VERSION")
};

#[derive(Parser)]
#[command(
    name = "pinlb",
    version = VERSION,
    about = "A pinned, TOML-configured reverse proxy and load balancer: HTTP/1.1 and HTTP/2, TLS, WebSocket"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy.
    Serve {
        /// The configuration file [default: /etc/pinlb/pinlb.toml, else ./pinlb.toml].
        #[arg(short, long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Take over the listening sockets of the pinlb listening on this upgrade socket (what
        /// `pinlb upgrade` starts the new binary with).
        #[arg(long, value_name = "SOCKET", hide = true)]
        upgrade_from: Option<PathBuf>,
    },
    /// Replace the running pinlb with a new binary without refusing a connection: the new
    /// process takes over the listening sockets, the old one drains and exits.
    Upgrade {
        /// The configuration file the new process runs [default: /etc/pinlb/pinlb.toml, else
        /// ./pinlb.toml]; its runtime.upgrade_socket names the running process's socket.
        #[arg(short, long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// The new binary [default: this pinlb].
        #[arg(long, value_name = "PATH")]
        binary: Option<PathBuf>,
        /// The running process's upgrade socket [default: runtime.upgrade_socket of the file,
        /// which is then not read otherwise: the new binary validates it].
        #[arg(long, value_name = "PATH")]
        socket: Option<PathBuf>,
        /// How long the new process has to start serving before it is killed and the old one
        /// keeps serving.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
    },
    /// Validate a configuration file and print the resolved plan (exit 0 if valid, 1 if not).
    Check {
        /// The configuration file [default: /etc/pinlb/pinlb.toml, else ./pinlb.toml].
        #[arg(short, long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Also fail (exit 1) when a backend's DNS name does not resolve now; without it that
        /// is a line of the report, and `serve` would start with no backends from the name.
        #[arg(long)]
        strict: bool,
    },
    /// Read an nginx configuration (following its includes) and print it as a pinlb one; what
    /// has no equivalent is listed on stderr with its file:line.
    Import {
        /// The nginx configuration file.
        #[arg(value_name = "NGINX_CONF")]
        file: PathBuf,
        /// Print the configuration even where a directive left out makes pinlb less strict
        /// than nginx (deny/allow, auth_basic, limit_req, a regex location that returns 403,
        /// TLS settings...); without it such an import exits 1 listing them.
        #[arg(long)]
        allow_less_strict: bool,
    },
    /// Run pinned test backends.
    Backend(pinlb_tools::backend::BackendArgs),
    /// Compare targets side by side under load.
    Bench(Box<pinlb_tools::bench::BenchArgs>),
    /// Start backends and a proxy on this machine's cores and measure direct against proxied.
    Demo(pinlb_tools::demo::DemoArgs),
    /// Measure every split of the cores between proxy and backends, and recommend one.
    Sweep(pinlb_tools::sweep::SweepArgs),
}

/// Where `serve` and `check` look without `-c`, in this order: the system's file first, as
/// nginx reads its compiled-in path, then one in the working directory.
const DEFAULT_CONFIGS: [&str; 2] = ["/etc/pinlb/pinlb.toml", "pinlb.toml"];

/// The file given, or the first of [`DEFAULT_CONFIGS`] that exists; says which on stderr when
/// it was not given, since the user did not name it.
fn config_path(given: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(p) = given {
        return Ok(p);
    }
    let found = DEFAULT_CONFIGS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or_else(|| {
            format!(
                "pinlb: no configuration file: give one with -c FILE, or put one at {} or ./{}",
                DEFAULT_CONFIGS[0], DEFAULT_CONFIGS[1]
            )
        })?;
    eprintln!("pinlb: reading {} (no -c given)", found.display());
    Ok(found)
}

/// [`config_path`], or the exit after saying why there is none.
fn config_or_exit(given: Option<PathBuf>) -> Result<PathBuf, ExitCode> {
    config_path(given).map_err(|e| {
        eprintln!("{e}");
        ExitCode::FAILURE
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo's output is its results: the proxy and backends it runs in this process would
    // otherwise interleave their start and stop lines with them.
    let level = match cli.command {
        Command::Demo(_) | Command::Sweep(_) => "warn",
        _ => "info",
    };
    // Colour only for a person at a terminal: escape codes are noise in files, pipes and
    // `docker logs`. NO_COLOR (no-color.org) turns it off there too.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level)),
        )
        .with_writer(std::io::stderr)
        .with_ansi(colour)
        .init();
    match cli.command {
        Command::Backend(args) => pinlb_tools::backend::main(args),
        Command::Bench(args) => pinlb_tools::bench::main(*args),
        Command::Demo(args) => pinlb_tools::demo::main(args),
        Command::Sweep(args) => pinlb_tools::sweep::main(args),
        Command::Import {
            file,
            allow_less_strict,
        } => match pinlb_import::import(&file, allow_less_strict) {
            Ok((toml, notes)) => {
                print!("{toml}");
                for n in &notes {
                    eprintln!("{n}");
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                for n in e.lines() {
                    eprintln!("{n}");
                }
                eprintln!("pinlb import: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Check { config, strict } => {
            let config = match config_or_exit(config) {
                Ok(p) => p,
                Err(code) => return code,
            };
            check(&config, strict)
        }
        Command::Serve {
            config,
            upgrade_from,
        } => {
            let config = match config_or_exit(config) {
                Ok(p) => p,
                Err(code) => return code,
            };
            serve(config, upgrade_from)
        }
        Command::Upgrade {
            config,
            binary,
            socket,
            timeout,
        } => {
            let config = match config_or_exit(config) {
                Ok(p) => p,
                Err(code) => return code,
            };
            upgrade(&config, binary, socket, timeout)
        }
    }
}

fn check(config: &std::path::Path, strict: bool) -> ExitCode {
    match Config::load(config) {
        Ok(c) => {
            let names = pinlb_tools::check::resolve_names(&c);
            let mut out = String::new();
            for line in &names.lines {
                out.push_str(line);
                out.push('\n');
            }
            out += &pinlb_tools::check::report(&names.config, config);
            // Written at once and without print!'s panic on a closed pipe (`check | head`).
            let _ = std::io::Write::write_all(&mut std::io::stdout(), out.as_bytes());
            if strict && !names.unresolved.is_empty() {
                eprintln!(
                    "{}: --strict: backend names that do not resolve: {}",
                    config.display(),
                    names.unresolved.join(", ")
                );
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(config: PathBuf, upgrade_from: Option<PathBuf>) -> ExitCode {
    // An upgrade connects first, so that the old process knows it started, and hears why if
    // the file is bad.
    let inherited = match upgrade_from.map(|p| pinlb::process::handover::inherit(&p)) {
        None => None,
        Some(Ok(i)) => Some(i),
        Some(Err(e)) => {
            eprintln!("pinlb: {e}");
            return ExitCode::FAILURE;
        }
    };
    let c = match Config::load(&config) {
        Ok(c) => c,
        Err(e) => {
            if let Some(i) = &inherited {
                i.failed(&e.to_string());
            }
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    // Signal handlers go in before the sockets are bound: from then on a SIGTERM must
    // mean a graceful stop, not the default action.
    let control = match pinlb::server::control_runtime() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("pinlb: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    let signals = match control.block_on(async { Signals::register() }) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pinlb: cannot listen for SIGTERM/SIGINT: {e}");
            return ExitCode::FAILURE;
        }
    };
    let hangups = match control.block_on(async { Hangups::register() }) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("pinlb: cannot listen for SIGHUP/SIGUSR1: {e}");
            return ExitCode::FAILURE;
        }
    };
    let bound = match inherited {
        Some(i) => Server::bind_inherited(c, i),
        None => Server::bind(c),
    };
    let result = bound.and_then(|s| {
        s.reload_from(config)
            .on_signals(hangups)
            .run_on(control, signals.wait())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pinlb: {e}{}", held_by(&e));
            ExitCode::FAILURE
        }
    }
}

/// `pinlb upgrade`: paths made absolute (the running process may run elsewhere), the socket
/// from the file unless given.
fn upgrade(
    config: &std::path::Path,
    binary: Option<PathBuf>,
    socket: Option<PathBuf>,
    timeout: std::time::Duration,
) -> ExitCode {
    let absolute = |p: &std::path::Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let binary = match binary.map(Ok).unwrap_or_else(std::env::current_exe) {
        Ok(b) => absolute(&b),
        Err(e) => {
            eprintln!("pinlb: cannot find this binary's path, give one with --binary: {e}");
            return ExitCode::FAILURE;
        }
    };
    let socket = match socket {
        Some(s) => s,
        None => match Config::load(config) {
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
            Ok(c) => match c.runtime.upgrade_socket {
                Some(s) => s,
                None => {
                    eprintln!(
                        "pinlb: {} has no runtime.upgrade_socket, so no running pinlb listens for an upgrade (set it, or give --socket)",
                        config.display()
                    );
                    return ExitCode::FAILURE;
                }
            },
        },
    };
    match pinlb::process::handover::request(&socket, &binary, &absolute(config), timeout) {
        Ok(pid) => {
            println!("upgraded: pid {pid} serves now; the old process drains and exits");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pinlb: {e}");
            ExitCode::FAILURE
        }
    }
}

/// For an address already in use, "; held by pid 42 (nginx)": who to stop, or to move.
fn held_by(e: &pinlb::ServerError) -> String {
    match e {
        pinlb::ServerError::Bind(b) if b.source.kind() == std::io::ErrorKind::AddrInUse => {
            pinlb_tools::coremap::describe_holders(&pinlb_tools::coremap::listening_on(b.address))
                .map(|who| format!("; held by {who}"))
                .unwrap_or_default()
        }
        _ => String::new(),
    }
}

// glibc malloc showed up in request-path profiles; mimalloc's per-thread heaps suit one runtime per
// core, where every allocation is freed on the thread that made it.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

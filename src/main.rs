//! The `pinlb` command: argument parsing only; the work is in the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use pinlb::server::{Hangups, Signals};
use pinlb::{Config, Server};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "pinlb",
    version,
    about = "A pinned, TOML-configured HTTP/1.1 load balancer"
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
    },
    /// Validate a configuration file and print the resolved plan (exit 0 if valid, 1 if not).
    Check {
        /// The configuration file [default: /etc/pinlb/pinlb.toml, else ./pinlb.toml].
        #[arg(short, long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Run pinned test backends.
    Backend(pinlb::backend::BackendArgs),
    /// Compare targets side by side under load.
    Bench(Box<pinlb::bench::BenchArgs>),
    /// Start backends and a proxy on this machine's cores and measure direct against proxied.
    Demo(pinlb::demo::DemoArgs),
    /// Measure every split of the cores between proxy and backends, and recommend one.
    Sweep(pinlb::sweep::SweepArgs),
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
        Command::Backend(args) => pinlb::backend::main(args),
        Command::Bench(args) => pinlb::bench::main(*args),
        Command::Demo(args) => pinlb::demo::main(args),
        Command::Sweep(args) => pinlb::sweep::main(args),
        Command::Check { config } => {
            let config = match config_path(config) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            check(&config)
        }
        Command::Serve { config } => {
            let config = match config_path(config) {
                Ok(p) => p,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::FAILURE;
                }
            };
            serve(config)
        }
    }
}

fn check(config: &std::path::Path) -> ExitCode {
    match Config::load(config) {
        Ok(c) => {
            let out = pinlb::check::report(&c, config);
            // Written at once and without print!'s panic on a closed pipe (`check | head`).
            let _ = std::io::Write::write_all(&mut std::io::stdout(), out.as_bytes());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(config: PathBuf) -> ExitCode {
    let c = match Config::load(&config) {
        Ok(c) => c,
        Err(e) => {
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
    let result = Server::bind(c).and_then(|s| {
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

/// For an address already in use, "; held by pid 42 (nginx)": who to stop, or to move.
fn held_by(e: &pinlb::ServerError) -> String {
    match e {
        pinlb::ServerError::Bind(b) if b.source.kind() == std::io::ErrorKind::AddrInUse => {
            pinlb::coremap::describe_holders(&pinlb::coremap::listening_on(b.address))
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
